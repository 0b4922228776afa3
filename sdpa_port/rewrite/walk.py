"""The one statement walker the rewriters share: rebuild a block statement by statement.

Simple lines go through `line`; `if` chains through `if_statement` (each branch rebuilt, an emptied branch becomes
`pass`, an `if` whose every branch empties disappears); `with` and loops keep their header around their rebuilt
body (an emptied `with` disappears); any other statement through `other`. Subclasses override the hooks they need.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from sdpa_port.analyse.cstutil import block_body, if_chain, rebuild_if

class StatementWalker:
    def block(self, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for statement in statements:
            out.extend(self.statement(statement))
        return out

    def statement(self, statement: cst.BaseStatement) -> list[cst.BaseStatement]:
        match statement:
            case cst.SimpleStatementLine():
                return self.line(statement)
            case cst.If():
                return self.if_statement(statement)
            case cst.With() | cst.For() | cst.While():
                return self.compound(statement)
            case _:
                return self.other(statement)

    def line(self, statement: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        return [statement]

    def if_statement(self, node: cst.If) -> list[cst.BaseStatement]:
        branches = [(branch, self.block(block_body(branch.body))) for branch in if_chain(node)]
        if all(not body for _, body in branches):
            return []
        return [rebuild_if(branches)]

    def compound(self, statement: cst.With | cst.For | cst.While) -> list[cst.BaseStatement]:
        body = self.block(block_body(statement.body))
        if not body:
            if isinstance(statement, cst.With):
                return []
            body = [cst.SimpleStatementLine(body=[cst.Pass()])]
        return [statement.with_changes(body=statement.body.with_changes(body=body))]

    def other(self, statement: cst.BaseStatement) -> list[cst.BaseStatement]:
        return [statement]
