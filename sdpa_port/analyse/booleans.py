"""Whether a mask is proven boolean, and the boolean a masking condition keeps.

`torch.where` and `masked_fill` take only boolean conditions, so eager's `mask == 0` on an integer or float 0/1 mask
is a comparison the port must keep: `masked_fill(mask == 0, f)` keeps the scores where `mask != 0`, which is `mask`
itself only when `mask` is boolean. A tensor is proven boolean by its construction: a comparison, a logical
operation, `.bool()` or `.to(torch.bool)`, a factory given `dtype=torch.bool`, or a view or slice of one of those
(through locals and registered buffers).
"""

from __future__ import annotations

from typing import Callable

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.cstutil import COMPARISON, code, parenthesized, precedence

# methods whose result is boolean whatever the receiver
_BOOLEAN_METHODS = frozenset(
    {
        "bool", "logical_not", "logical_and", "logical_or", "logical_xor", "eq", "ne", "lt", "le", "gt", "ge",
        "isinf", "isnan", "isfinite", "isneginf", "isposinf", "any", "all",
    }
)
_BOOLEAN_FUNCTIONS = frozenset(f"torch.{name}" for name in _BOOLEAN_METHODS - {"bool"})
# methods and functions whose result has the dtype of their (first) tensor operand
_DTYPE_KEEPING_METHODS = frozenset(
    {
        "view", "reshape", "unsqueeze", "squeeze", "expand", "expand_as", "transpose", "permute", "contiguous",
        "flip", "repeat", "clone", "detach", "narrow", "tril", "triu", "flatten", "unflatten", "cpu", "cuda",
    }
)
_DTYPE_KEEPING_FUNCTIONS = frozenset({"torch.tril", "torch.triu", "torch.flip", "torch.narrow"})
_FACTORIES = frozenset({"torch.ones", "torch.zeros", "torch.empty", "torch.full", "torch.ones_like", "torch.zeros_like"})
_BITWISE_FUNCTIONS = frozenset({"torch.bitwise_and", "torch.bitwise_or", "torch.bitwise_xor"})
_TORCH_FUNCTIONS = _BOOLEAN_FUNCTIONS | _DTYPE_KEEPING_FUNCTIONS | _FACTORIES | _BITWISE_FUNCTIONS
_LOGICAL_OPERATORS = (cst.BitAnd, cst.BitOr, cst.BitXor)

# what a local may hold on each path (a local's expressions), and a registered buffer's value with the locals of the
# method that registered it
Locals = Callable[[str], "tuple[cst.BaseExpression, ...]"]
Buffer = Callable[[str], "tuple[cst.BaseExpression, dict[str, list[cst.BaseExpression]]] | None"]


class BooleanReader:
    """Reads whether an expression of the function being traced is a boolean tensor by its construction."""

    def __init__(self, scope: p.Scope, local_values: Locals, buffer: Buffer) -> None:
        self.scope = scope
        self.local_values = local_values
        self.buffer = buffer

    def is_boolean(self, node: cst.BaseExpression) -> bool:
        """True when `node` is proven boolean (see the module's docstring); False when unknown."""
        return self._read(node, self.local_values, frozenset(), 0)

    def _read(self, node: cst.BaseExpression, local_values: Locals, resolving: frozenset[str], depth: int) -> bool:
        if depth > 12:
            return False

        def read(inner: cst.BaseExpression) -> bool:
            return self._read(inner, local_values, resolving, depth + 1)

        if isinstance(node, cst.Comparison):
            return True
        if isinstance(node, cst.Name):
            if node.value in ("True", "False"):
                return True
            values = local_values(node.value)
            if node.value in resolving:  # `bias = f(bias)`: inside it, `bias` is one of the values before it
                values = tuple(v for v in values if node.value not in p.walk_names(v))
            deeper = resolving | {node.value}
            return bool(values) and all(self._read(v, local_values, deeper, depth + 1) for v in values)
        if isinstance(node, cst.Attribute):
            name = p.self_attribute_name(node)
            found = None if name is None else self.buffer(name)
            if found is None:
                return False
            value, locals_ = found
            return self._read(value, lambda local: tuple(locals_.get(local, ())), frozenset(), depth + 1)
        if isinstance(node, cst.UnaryOperation):
            return isinstance(node.operator, cst.BitInvert) and read(node.expression)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, _LOGICAL_OPERATORS):
            return read(node.left) and read(node.right)
        if isinstance(node, cst.Subscript):
            return read(node.value)
        if isinstance(node, cst.Call):
            return self._call(node, read)
        return False

    def _call(self, node: cst.Call, read: Callable[[cst.BaseExpression], bool]) -> bool:
        qualified = self.scope.qualify(node.func)
        if qualified in _TORCH_FUNCTIONS:
            assert qualified is not None
            return self._torch_function(node, qualified, read)
        method = p.method_call(node)
        if method is None:
            return False
        receiver, name = method
        if name in _BOOLEAN_METHODS:
            return True
        if name in ("to", "type"):
            dtype = p.arg(node, 0, "dtype")
            if dtype is not None and code(dtype) in ("torch.bool", "bool"):
                return True
            # `.to(device)` keeps the dtype; any other argument may change it
            return all(_is_device(a.value) for a in node.args) and read(receiver)
        return name in _DTYPE_KEEPING_METHODS and read(receiver)

    def _torch_function(self, node: cst.Call, qualified: str, read: Callable[[cst.BaseExpression], bool]) -> bool:
        if qualified in _BOOLEAN_FUNCTIONS:
            return True
        if qualified in _BITWISE_FUNCTIONS and len(node.args) == 2:
            return all(read(a.value) for a in node.args)
        if qualified in _DTYPE_KEEPING_FUNCTIONS and node.args:
            return read(node.args[0].value)
        if qualified not in _FACTORIES:
            return False
        dtype = p.arg(node, -1, "dtype")
        if dtype is not None:
            return code(dtype) in ("torch.bool", "bool")
        if qualified == "torch.full":
            fill = p.arg(node, 1, "fill_value")
            return isinstance(fill, cst.Name) and fill.value in ("True", "False")
        return qualified.endswith("_like") and bool(node.args) and read(node.args[0].value)

    def kept_where(self, operand: cst.BaseExpression) -> cst.BaseExpression:
        """The boolean that holds where a negation of `operand` (`operand == 0`, `operand.logical_not()`) does not:
        `operand` when it is proven boolean, `operand != 0` otherwise."""
        return operand if self.is_boolean(operand) else nonzero(operand)


def _is_device(node: cst.BaseExpression) -> bool:
    """`x.device`, `device`, `"cpu"`: an argument of `.to` that names a device, not a dtype."""
    if isinstance(node, cst.Attribute):
        return node.attr.value == "device"
    if isinstance(node, cst.Name):
        return node.value == "device"
    return isinstance(node, cst.SimpleString) and node.evaluated_value in ("cpu", "cuda", "meta")


def nonzero(node: cst.BaseExpression) -> cst.Comparison:
    """`node != 0`: where a mask of any dtype is not zero (a boolean for any mask; `mask` itself for a boolean)."""
    left = parenthesized(node) if precedence(node) <= COMPARISON else node
    return cst.Comparison(left=left, comparisons=[cst.ComparisonTarget(cst.NotEqual(), cst.Integer("0"))])


def zero_one_threshold(node: cst.BaseExpression) -> tuple[cst.BaseExpression, bool] | None:
    """A 0/1 tensor compared with a number that splits 0 from 1: (the tensor, whether the comparison holds at 1).

    `x != 0`, `x > 0`, `x > 0.5`, `x >= 1`, `x == 1` hold where `x` is 1; `x == 0`, `x < 0.5`, `x <= 0`, `x != 1`
    where it is 0. Only for tensors whose entries are known to be 0 or 1 (a triangle buffer)."""
    if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
        return None
    target = node.comparisons[0]
    value = p.number(target.comparator)
    if value is None:
        return None
    operator = target.operator
    at_one = {
        cst.Equal: (value == 1.0, value == 0.0),
        cst.NotEqual: (value == 0.0, value == 1.0),
        cst.GreaterThan: (0.0 <= value < 1.0, False),
        cst.GreaterThanEqual: (0.0 < value <= 1.0, False),
        cst.LessThan: (False, 0.0 < value <= 1.0),
        cst.LessThanEqual: (False, 0.0 <= value < 1.0),
    }.get(type(operator))
    if at_one is None:
        return None
    holds_at_one, holds_at_zero = at_one
    if holds_at_one == holds_at_zero:
        return None
    return node.left, holds_at_one
