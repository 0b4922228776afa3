"""Specialise a function for the SDPA path: branches on `output_attentions` and on a head mask being given fold away,
and so do the branches the file decides for certain (`analyse/certain.py`: a side that can never run)."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence, Union

import libcst as cst

from sdpa_port.analyse.cstutil import block_body, nodes_of_type, single_target
from sdpa_port.analyse.known import Decision, Known, bound_to_false, decide, holding

__all__ = ["Known", "decide", "specialise"]


# a test's certain value (`certain.Certain.decide`, read in the class being ported): None where not certain
Certainty = Callable[[cst.BaseExpression], Decision]


class _Specialise(cst.CSTTransformer):
    def __init__(self, known: Known, certain: Certainty | None) -> None:
        self.known = known
        self.certain = certain

    def decision(self, test: cst.BaseExpression) -> Decision:
        decision = decide(test, self.known)
        if decision is None and self.certain is not None:
            decision = self.certain(test)
        return decision

    def leave_If(
        self, original: cst.If, updated: cst.If
    ) -> Union[cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement], cst.RemovalSentinel]:
        decision = self.decision(updated.test)
        if decision is None:
            return updated
        if decision:
            return _flatten(updated.body)
        orelse = updated.orelse
        if orelse is None:
            return cst.RemoveFromParent()
        if isinstance(orelse, cst.If):
            # an `elif` becomes a plain `if`
            return orelse
        return _flatten(orelse.body)

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        decision = self.decision(updated.test)
        if decision is None:
            return updated
        chosen = updated.body if decision else updated.orelse
        # the brackets around the conditional stay where the chosen side may need them (`(a + b)`), not around
        # a name, a call or a literal (`(None)`)
        atomic = isinstance(chosen, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.BaseNumber, cst.BaseString))
        return chosen.with_changes(lpar=updated.lpar, rpar=updated.rpar) if updated.lpar and not atomic else chosen

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        if not updated.body:
            return updated.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
        return updated


def _flatten(suite: cst.BaseSuite) -> Union[cst.FlattenSentinel[cst.BaseStatement], cst.RemovalSentinel]:
    if isinstance(suite, cst.IndentedBlock):
        statements: Sequence[cst.BaseStatement] = suite.body
    else:
        assert isinstance(suite, cst.SimpleStatementSuite)
        statements = [cst.SimpleStatementLine(body=suite.body)]
    if not statements:
        return cst.RemoveFromParent()
    return cst.FlattenSentinel(statements)


def specialise(function: cst.FunctionDef, known: Known, certain: Certainty | None = None) -> cst.FunctionDef:
    """Fold the branches that the known facts decide, and those `certain` decides. Names the function rebinds are
    left alone (a certain test reads none a function can rebind)."""
    usable = holding(known, function.body.body) if isinstance(function.body, cst.IndentedBlock) else Known()
    if not usable.falsy and not usable.none and not _decides_any(function, certain):
        return function
    result = function.visit(_Specialise(usable, certain))
    assert isinstance(result, cst.FunctionDef)
    return _without_unread_bindings(result, bound_to_false(usable, block_body(function.body)))


def _without_unread_bindings(function: cst.FunctionDef, names: frozenset[str]) -> cst.FunctionDef:
    """`function` without the top-level bindings of `names` (tests the facts decide) that nothing reads any more: the
    branches that read `is_tpu` folded away, `is_tpu = query.device.type == "xla"` goes too."""
    if not names:
        return function
    uses = Counter(node.value for node in nodes_of_type(function.body, cst.Name) if node.value in names)
    unread = {name for name in names if uses[name] == 1}  # the binding's own target is its one use
    body = block_body(function.body)
    kept = [statement for statement in body if single_target(statement) not in unread]
    if len(kept) == len(body):
        return function
    return function.with_changes(body=function.body.with_changes(body=kept))


def _decides_any(function: cst.FunctionDef, certain: Certainty | None) -> bool:
    """Some branch test of the function is certain."""
    if certain is None:
        return False
    tests = [node.test for node in nodes_of_type(function.body, cst.If)]
    tests += [node.test for node in nodes_of_type(function.body, cst.IfExp)]
    return any(certain(test) is not None for test in tests)
