"""Read the number a literal or a fill value stands for.

`-inf`, `torch.finfo(dtype).min`, `-1e4`, through 0-d tensors, casts, locals and `self.` attributes.
"""

from __future__ import annotations

import math

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.patterns.calls import Scope, arg, method_call, self_attribute_name
from sdpa_port.analyse.patterns.functions import INFINITIES, SCALAR_TENSOR_FUNCTIONS

VERY_NEGATIVE_LIMIT = -1e4

# at or below this a fill value absorbs any score it is added to (s + F == F in float32 for |s| < 1e22), so adding
# it equals replacing the score with it
ABSORBING_LIMIT = -1e30

# `torch.finfo(...).min`
FINFO_MIN = m.Attribute(
    value=m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("finfo"))), attr=m.Name("min")
)


def number(node: cst.BaseExpression) -> float | None:
    """The value of a numeric literal, `-x`, `+x`, or `float("-inf")`."""
    if isinstance(node, cst.Integer):
        return float(node.evaluated_value)
    if isinstance(node, cst.Float):
        return float(node.evaluated_value)
    if isinstance(node, cst.UnaryOperation):
        inner = number(node.expression)
        if inner is None:
            return None
        if isinstance(node.operator, cst.Minus):
            return -inner
        if isinstance(node.operator, cst.Plus):
            return inner
        return None
    if isinstance(node, cst.Call) and m.matches(node.func, m.Name("float")) and len(node.args) == 1:
        value = node.args[0].value
        if isinstance(value, cst.SimpleString):
            try:
                return float(value.evaluated_value)
            except ValueError:
                return None
    return None


def is_very_negative(node: cst.BaseExpression, scope: Scope) -> bool:
    """A fill value that masks a score out.

    `finfo(...).min`, -inf, `-finfo(...).max`, or a literal <= -1e4.
    """
    value = fill_number(node, scope)
    return value is not None and value <= VERY_NEGATIVE_LIMIT


def is_absorbing(node: cst.BaseExpression, scope: Scope) -> bool:
    """A fill value F with s + F == F for every realistic score s.

    -inf, `finfo(dtype).min`, `-finfo(dtype).max`, <= -1e30. Replacing a score by such a value and adding the value to
    it give the same softmax, even in a row where every key is masked; for a merely very negative value (-1e4, -1e9)
    they differ there.
    """
    value = fill_number(node, scope)
    return value is not None and value <= ABSORBING_LIMIT


def is_minus_infinity(node: cst.BaseExpression, scope: Scope) -> bool:
    """A fill value that is -inf itself, below every finite score, however masked.

    `float("-inf")`, `-math.inf`, a 0-d tensor of it.
    """
    return fill_number(node, scope) == -math.inf


# finfo(dtype).min or -finfo(dtype).max, of the scores' dtype: absorbing in that dtype, yet finite
_FINFO_EXTREME = -1e38


def fill_number(node: cst.BaseExpression, scope: Scope) -> float | None:
    """The number a fill value stands for, or None.

    `0.0`, `torch.scalar_tensor(0, ...)`, -inf for `-math.inf`, _FINFO_EXTREME for `torch.finfo(dtype).min`.
    """
    leaf = _fill_value(node, scope)
    if leaf is None:
        return None
    value = number(leaf)
    if value is not None:
        return value
    if isinstance(leaf, cst.UnaryOperation) and isinstance(leaf.operator, cst.Minus):
        inner = leaf.expression
        if scope.qualify(inner) in INFINITIES:
            return -math.inf
        if isinstance(inner, cst.Attribute) and inner.attr.value == "max" and _is_finfo(inner.value, scope):
            return _FINFO_EXTREME
    if isinstance(leaf, cst.Attribute) and leaf.attr.value == "min" and _is_finfo(leaf.value, scope):
        return _FINFO_EXTREME
    return None


def _fill_value(node: cst.BaseExpression, scope: Scope, depth: int = 0) -> cst.BaseExpression | None:
    """The expression a fill value stands for, followed through what holds it.

    Through 0-d tensor constructors, dtype casts, locals and `self.` attributes; None where one of those cannot be
    followed.
    """
    if depth > 6:
        return None
    if isinstance(node, cst.Call):
        qualified = scope.qualify(node.func)
        if qualified in SCALAR_TENSOR_FUNCTIONS:
            wrapped = arg(node, 1 if qualified == "torch.full" else 0, "fill_value" if qualified == "torch.full" else "data")
            return None if wrapped is None else _fill_value(wrapped, scope, depth + 1)
        receiver = method_call(node, {"to", "type", "type_as"})
        if receiver is not None:
            return _fill_value(receiver[0], scope, depth + 1)
        if qualified == "float" and len(node.args) == 1 and not isinstance(node.args[0].value, cst.SimpleString):
            return _fill_value(node.args[0].value, scope, depth + 1)  # `float(torch.finfo(dtype).min)`: the same number
        return node
    if isinstance(node, cst.Name):
        if scope.qualify(node) in INFINITIES:
            return node
        local = scope.local_value(node.value)
        return None if local is None else _fill_value(local, scope, depth + 1)
    attribute = self_attribute_name(node)
    if attribute is not None:
        value = scope.self_attribute(attribute)
        return None if value is None else _fill_value(value, scope, depth + 1)
    return node


def _is_finfo(node: cst.BaseExpression, scope: Scope) -> bool:
    return isinstance(node, cst.Call) and scope.qualify(node.func) in {"torch.finfo", "numpy.finfo", "np.finfo"}
