"""Prove a factor is the same for every key: its last dimension has size 1, or it is a number."""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse.patterns.calls import Scope, arg, has_star_args, method_call, self_attribute_name
from sdpa_port.analyse.patterns.functions import (
    ELEMENTWISE_FUNCTIONS,
    ELEMENTWISE_METHODS,
    FILLED_TENSOR_FUNCTIONS,
    PARAMETER_WRAPPERS,
    RESHAPE_METHODS,
)
from sdpa_port.analyse.patterns.numbers import number
from sdpa_port.analyse.patterns.scalars import MethodScope, scalar


def constant_along_last(node: cst.BaseExpression, scope: Scope, depth: int = 0, attributes: frozenset[str] = frozenset()) -> bool:
    """Prove that a tensor's last dimension has size 1, so that it scales every key alike.

    A factor the same for every key, like Swin V2's per-head `logit_scale` of shape (heads, 1, 1), has `(q @ k.T) * f
    == (q * f) @ k.T`. Numbers qualify too.
    """
    if depth > 8:
        return False
    if scalar(node, scope) is not None:
        return True
    if isinstance(node, cst.Name):
        value = scope.local_value(node.value)
        return value is not None and constant_along_last(value, scope, depth + 1, attributes)
    if isinstance(node, cst.BinaryOperation) and isinstance(
        node.operator, (cst.Multiply, cst.Divide, cst.Add, cst.Subtract, cst.Power)
    ):
        return all(constant_along_last(side, scope, depth + 1, attributes) for side in (node.left, node.right))
    if isinstance(node, cst.Attribute):
        attribute = self_attribute_name(node)
        if attribute is None or attribute in attributes:
            return False
        bindings = scope.self_attribute_bindings(attribute)
        return bool(bindings) and all(
            b.value is not None
            and constant_along_last(b.value, MethodScope(scope, b.method), depth + 1, attributes | {attribute})
            for b in bindings
        )
    if not isinstance(node, cst.Call) or has_star_args(node):
        return False
    qualified = scope.qualify(node.func) or ""
    if qualified in ELEMENTWISE_FUNCTIONS or qualified in PARAMETER_WRAPPERS:
        operand = arg(node, 0)
        return operand is not None and constant_along_last(operand, scope, depth + 1, attributes)
    if qualified in FILLED_TENSOR_FUNCTIONS:
        sizes = [a.value for a in node.args if a.keyword is None]
        if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
            sizes = [element.value for element in sizes[0].elements]
        return bool(sizes) and not isinstance(sizes[-1], cst.StarredElement) and number(sizes[-1]) == 1.0
    found = method_call(node, ELEMENTWISE_METHODS)
    if found is not None:
        return constant_along_last(found[0], scope, depth + 1, attributes)
    found = method_call(node, RESHAPE_METHODS)
    if found is not None:
        sizes = [a.value for a in node.args if a.keyword is None]
        return bool(sizes) and number(sizes[-1]) == 1.0
    return False
