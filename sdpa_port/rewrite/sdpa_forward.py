"""Build the SDPA version of an attention module's forward from its SDPA side: emit each chain, write out helpers.

The analysis (`analyse/sdpa_side.py`) has specialised forward and read the chain of forward or of each helper call;
this pass only emits: the chain becomes one SDPA call, a helper call becomes the helper's statements.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import libcst as cst

from sdpa_port.analyse.closures import Closure
from sdpa_port.analyse.cstutil import block_body, walk_names
from sdpa_port.analyse.helpers import bind_arguments
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.rewrite.edit import replace_nodes
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.patterns import function_names
from sdpa_port.analyse.recognise import ClassAnalysis
from sdpa_port.analyse.sdpa_side import SdpaSide, WrittenOut, written_out_as_is
from sdpa_port.rewrite.cleanup import remove_dead
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.sdpa_body import SdpaEmitter
from sdpa_port.rewrite.sdpa_state import EmitOptions, MaskContract, SideNames
from sdpa_port.rewrite.walk import StatementWalker


def build_sdpa_forward(facts: ModuleFacts, side: SdpaSide, contract: MaskContract) -> cst.FunctionDef:
    """The SDPA forward: the specialised forward with its chain (or each written-out helper's) one SDPA call."""
    special = side.forward
    taken = function_names(special)
    for written in side.calls.values():
        taken |= function_names(written.function)
    options = EmitOptions(SideNames.avoiding(taken), contract)
    if side.closure is not None:
        return _closure_ported(facts, special, *side.closure, options)
    if side.path is not None:
        emitter = SdpaEmitter(side.path, options)
        body = emitter.emit(block_body(special.body))
        removable = emitter.removed_reads
    else:
        inliner = Inliner(side.calls, options)
        body = inliner.block(block_body(special.body))
        removable = inliner.removed_reads
    body = remove_dead(body, removable, facts.imports)
    return special.with_changes(body=special.body.with_changes(body=body))


def _closure_ported(
    facts: ModuleFacts, special: cst.FunctionDef, closure: Closure, path: SdpaPath, options: EmitOptions
) -> cst.FunctionDef:
    """forward with the function it defines computing with SDPA where it stands; its calls are as they were."""
    for call in closure.calls:
        bound = bind_arguments(closure.function, call)
        assert bound is not None  # `read_closure` bound each
        options = Inliner.with_aliases(options, bound)
    emitter = SdpaEmitter(path, options)
    body = remove_dead(emitter.emit(block_body(path.function.body)), emitter.removed_reads, facts.imports)
    ported = path.function.with_changes(body=path.function.body.with_changes(body=body))
    new = replace_nodes(special, {path.function: ported})
    assert isinstance(new, cst.FunctionDef)
    return new


def inline_helpers(facts: ModuleFacts, analysis: ClassAnalysis, forward: cst.FunctionDef) -> cst.FunctionDef:
    """forward with each call of an attention helper replaced by the helper's body, as written."""
    inliner = Inliner(written_out_as_is(facts, analysis, forward), None)
    body = inliner.block(block_body(forward.body))
    return forward.with_changes(body=forward.body.with_changes(body=remove_dead(body, set(), facts.imports)))


class Inliner(StatementWalker):
    """Replace calls of the attention helpers in forward by their bodies (SDPA-rewritten when given options)."""

    def __init__(self, calls: Mapping[cst.SimpleStatementLine, WrittenOut], options: EmitOptions | None) -> None:
        """With `options` None the helper body is inlined as written (no SDPA rewrite)."""
        self.calls = calls
        self.options = options
        self.removed_reads: set[str] = set()

    def line(self, statement: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        found = self.calls.get(statement)
        return [statement] if found is None else self.inline(statement, found)

    def inline(self, statement: cst.SimpleStatementLine, written: WrittenOut) -> list[cst.BaseStatement]:
        method = written.method
        if self.options is not None:
            assert written.path is not None
            emitter = SdpaEmitter(written.path, self.with_aliases(self.options, dict(written.bound)))
            body = emitter.emit(block_body(written.function.body))
            self.removed_reads |= emitter.removed_reads | set(written.bound)
        else:
            body = list(block_body(written.function.body))
        if not body or not _is_final_return(body[-1]):
            raise Refuse(Code.HELPER_CALL, f"`{method}` does not end with its only return statement")
        returns = [node for node in _returns(body[:-1])]
        if returns:
            raise Refuse(Code.HELPER_CALL, f"`{method}` returns early")
        final = body[-1]
        assert isinstance(final, cst.SimpleStatementLine)
        returned = final.body[0]
        assert isinstance(returned, cst.Return)
        value = returned.value if returned.value is not None else cst.Name("None")
        replaced = replace_nodes(statement, {written.call: value})
        out: list[cst.BaseStatement] = [*written.prelude, *body[:-1]]
        if out and hasattr(out[0], "leading_lines"):
            # the comments above the call now sit above the inlined computation
            out[0] = out[0].with_changes(leading_lines=statement.leading_lines)
            replaced = replaced.with_changes(leading_lines=[])
        return [*out, replaced]

    @staticmethod
    def with_aliases(options: EmitOptions, bound: dict[str, cst.BaseExpression]) -> EmitOptions:
        """Helper parameters that receive a nullable mask parameter are nullable too; those receiving a value read
        from a name whose dtype is not proven are not proven either."""
        nullable, unproven = options.contract.nullable, options.contract.unproven
        aliases = {name for name, value in bound.items() if isinstance(value, cst.Name) and value.value in nullable}
        unproven_aliases = {name for name, value in bound.items() if walk_names(value) & unproven}
        if not aliases - nullable and not unproven_aliases - unproven:
            return options
        contract = replace(options.contract, nullable=nullable | aliases, unproven=unproven | unproven_aliases)
        return replace(options, contract=contract)


def _is_final_return(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Return)
    )


def _returns(statements: Sequence[cst.BaseStatement]) -> list[cst.Return]:
    finder = _ReturnFinder()
    for statement in statements:
        statement.visit(finder)
    return finder.found


class _ReturnFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[cst.Return] = []

    def visit_Return(self, node: cst.Return) -> None:
        self.found.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

