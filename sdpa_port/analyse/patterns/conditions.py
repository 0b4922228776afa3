"""Read and build the tests of branches: settings of the module, `and` joins, optional modules."""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.patterns.calls import self_attribute_name


def reads_settings_only(node: cst.BaseExpression) -> bool:
    """An expression of the module's settings alone.

    Attributes of `self` (`self.training`, `self.config.flag`), combined by `not`, `and` and `or`; no call, no local.
    """
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        return reads_settings_only(node.expression)
    if isinstance(node, cst.BooleanOperation):
        return reads_settings_only(node.left) and reads_settings_only(node.right)
    if isinstance(node, cst.Attribute):
        value: cst.BaseExpression = node
        while isinstance(value, cst.Attribute):
            value = value.value
        return isinstance(value, cst.Name) and value.value == "self"
    return False


def conjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The terms of a test joined by `and`, or the test itself when it is not such a join."""
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And) and not node.lpar:
        return [*conjuncts(node.left), *conjuncts(node.right)]
    return [node]


def joined(tests: Sequence[cst.BaseExpression]) -> cst.BaseExpression:
    """Tests joined by `and`, each parenthesised where it needs to be."""
    out = tests[0]
    for test in tests[1:]:
        out = cst.BooleanOperation(left=_grouped(out), operator=cst.And(), right=_grouped(test))
    return out


def _grouped(node: cst.BaseExpression) -> cst.BaseExpression:
    if (isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or)) or isinstance(node, cst.IfExp):
        return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node


def optional_module_test(test: cst.BaseExpression) -> str | None:
    """The attribute `X` of an `if self.X is not None` test, alone."""
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and m.matches(test.comparisons[0].comparator, m.Name("None"))
    ):
        return self_attribute_name(test.left)
    return None
