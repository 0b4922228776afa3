"""Specialise a function for the SDPA path: branches on `output_attentions` and on a head mask being given fold away."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import all_assigned_names


@dataclass(frozen=True)
class Known:
    """Parameter facts that hold on the SDPA path (the eager fallback handles the other cases)."""

    falsy: frozenset[str] = frozenset()
    none: frozenset[str] = frozenset()


Decision = Union[bool, None]


def decide(test: cst.BaseExpression, known: Known) -> Decision:
    """True/False when the test's value follows from the known facts, None otherwise."""
    if isinstance(test, cst.Name):
        if test.value in known.falsy or test.value in known.none:
            return False
        return None
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = decide(test.expression, known)
        return None if inner is None else not inner
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        if isinstance(test.left, cst.Name) and m.matches(target.comparator, m.Name("None")):
            if test.left.value in known.none:
                if isinstance(target.operator, cst.Is):
                    return True
                if isinstance(target.operator, cst.IsNot):
                    return False
        return None
    if isinstance(test, cst.BooleanOperation):
        left, right = decide(test.left, known), decide(test.right, known)
        if isinstance(test.operator, cst.And):
            if left is False or right is False:
                return False
            if left is True and right is True:
                return True
            return None
        if left is True or right is True:
            return True
        if left is False and right is False:
            return False
        return None
    return None


class _Specialise(cst.CSTTransformer):
    def __init__(self, known: Known) -> None:
        self.known = known

    def leave_If(
        self, original: cst.If, updated: cst.If
    ) -> Union[cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement], cst.RemovalSentinel]:
        decision = decide(updated.test, self.known)
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
        decision = decide(updated.test, self.known)
        if decision is None:
            return updated
        chosen = updated.body if decision else updated.orelse
        return chosen.with_changes(lpar=updated.lpar, rpar=updated.rpar) if updated.lpar else chosen

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


def specialise(function: cst.FunctionDef, known: Known) -> cst.FunctionDef:
    """Fold the branches that the known facts decide. Names the function rebinds are left alone."""
    rebound = all_assigned_names(function.body.body) if isinstance(function.body, cst.IndentedBlock) else set()
    usable = Known(
        falsy=frozenset(n for n in known.falsy if n not in rebound),
        none=frozenset(n for n in known.none if n not in rebound),
    )
    if not usable.falsy and not usable.none:
        return function
    result = function.visit(_Specialise(usable))
    assert isinstance(result, cst.FunctionDef)
    return result
