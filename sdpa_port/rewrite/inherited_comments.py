"""Leave the comments of statements an SDPA class copies unchanged with the eager class it inherits from.

The SDPA class is read beside its parent: a statement both forwards run as written is explained where it was first
written, and the SDPA class keeps comments only on what it changes. A statement counts as unchanged when, comments
aside, it is one of the eager forward's statements at any depth (a compound statement with all its body):

    # if cross_attention save Tuple(torch.Tensor, torch.Tensor) ...      (in BertSelfAttention.forward)
    # ...
    past_key_value = (key_layer, value_layer)

    past_key_value = (key_layer, value_layer)                            (in BertSdpaSelfAttention.forward)

A comment heading a block the port changed stays, on whatever statement opens the block: it speaks for the block.
Blank lines, trailing comments and tool directives (`# fmt:`, `# type:`, `# noqa`, `# pylint:`, `# pragma`) stay.
"""

from __future__ import annotations

import libcst as cst

DIRECTIVES = ("# fmt:", "# type:", "# noqa", "# pylint:", "# pragma")


def without_inherited_comments(function: cst.FunctionDef, eager: cst.FunctionDef) -> cst.FunctionDef:
    """`function` with the comment lines dropped above each statement it shares, comments aside, with `eager`."""
    shared = _Statements.keys(eager)
    result = function.visit(_Dropper(shared))
    assert isinstance(result, cst.FunctionDef)
    return result


def _key(statement: cst.BaseStatement) -> str:
    """The statement's code with every comment and blank line removed."""
    bare = statement.visit(_Uncommented())
    assert isinstance(bare, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
    return cst.Module(body=[bare]).code


class _Uncommented(cst.CSTTransformer):
    def leave_EmptyLine(self, original: cst.EmptyLine, updated: cst.EmptyLine) -> cst.RemovalSentinel:
        return cst.RemoveFromParent()

    def leave_TrailingWhitespace(
        self, original: cst.TrailingWhitespace, updated: cst.TrailingWhitespace
    ) -> cst.TrailingWhitespace:
        return updated.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)


class _Statements(cst.CSTVisitor):
    """Every statement of a function's body, at any depth, by its comment-free code."""

    def __init__(self) -> None:
        self.found: set[str] = set()

    @classmethod
    def keys(cls, function: cst.FunctionDef) -> set[str]:
        visitor = cls()
        function.body.visit(visitor)
        return visitor.found

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseStatement):
            self.found.add(_key(node))
        return not isinstance(node, (cst.FunctionDef, cst.ClassDef))  # nested scopes are not the forward's


class _Dropper(cst.CSTTransformer):
    def __init__(self, shared: set[str]) -> None:
        self.shared = shared
        self.heads: set[cst.CSTNode] = set()  # the first statement of each block the port changed
        self.keys: dict[cst.CSTNode, bool] = {}  # whether each statement visited is one of eager's, by its key

    def is_shared(self, statement: cst.BaseStatement) -> bool:
        """`statement` is one of eager's, comments aside (read once per statement, on the way down)."""
        if statement not in self.keys:
            self.keys[statement] = _key(statement) in self.shared
        return self.keys[statement]

    def on_visit(self, node: cst.CSTNode) -> bool:
        # the forward itself is no block here: in the SDPA class its statements follow the fallback to eager
        block = isinstance(node, cst.BaseStatement) and not isinstance(node, cst.FunctionDef)
        if block and not self.is_shared(node):  # type: ignore[arg-type]
            for suite in _suites(node):
                if isinstance(suite, cst.IndentedBlock) and suite.body:
                    self.heads.add(suite.body[0])
        return True

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        lines = getattr(updated, "leading_lines", None)
        if not isinstance(updated, cst.BaseStatement) or not lines or original in self.heads:
            return updated
        if not self.is_shared(original):  # type: ignore[arg-type]
            return updated
        kept = [line for line in lines if line.comment is None or line.comment.value.startswith(DIRECTIVES)]
        return updated.with_changes(leading_lines=kept) if len(kept) != len(lines) else updated


def _suites(node: cst.CSTNode) -> list[cst.BaseSuite]:
    """The blocks a compound statement holds directly: its body, and each `elif`, `else`, handler and `finally`."""
    out: list[cst.BaseSuite] = []
    current: cst.CSTNode | None = node
    while current is not None:
        node = current
        body = getattr(node, "body", None)
        if isinstance(body, cst.BaseSuite):
            out.append(body)
        out.extend(handler.body for handler in getattr(node, "handlers", ()))
        final = getattr(node, "finalbody", None)
        if final is not None:
            out.append(final.body)
        current = getattr(node, "orelse", None)
    return out
