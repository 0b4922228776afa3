"""Prove an expression is a plain number at run time, and give the number's expression."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse.cstutil import binary, is_docstring, parenthesized, precedence, walk_names
from sdpa_port.analyse.patterns.calls import Scope, arg, has_star_args, method_call, self_attribute_name
from sdpa_port.analyse.patterns.functions import (
    NUMBER_FUNCTIONS,
    PLACING_KEYWORDS,
    SCALAR_FUNCTIONS,
    SCALAR_KEEPING_METHODS,
    SCALAR_TENSOR_FUNCTIONS,
)
from sdpa_port.analyse.patterns.numbers import number
from sdpa_port.rewrite.edit import replace_names


@dataclass(frozen=True)


class Scalar:
    """An expression known to be a Python number at run time, with the node to use for SDPA's `scale=`."""

    node: cst.BaseExpression


def scalar(
    node: cst.BaseExpression, scope: Scope, depth: int = 0, attributes: frozenset[str] = frozenset()
) -> Scalar | None:
    """Prove that an expression is a plain number, or a 0-d tensor wrapping one, and give the number's expression."""
    if depth > 8:
        return None
    if number(node) is not None:
        return Scalar(node)
    if isinstance(node, cst.BinaryOperation):
        left = scalar(node.left, scope, depth + 1, attributes)
        right = scalar(node.right, scope, depth + 1, attributes)
        if left is None or right is None:
            return None
        if left.node is node.left and right.node is node.right:
            return Scalar(node)
        return Scalar(binary(left.node, node.operator, right.node))
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        inner = scalar(node.expression, scope, depth + 1, attributes)
        if inner is None:
            return None
        operand = inner.node if precedence(inner.node) >= precedence(node) else parenthesized(inner.node)
        return Scalar(node.with_changes(expression=operand))
    if isinstance(node, cst.Call):
        return _scalar_call(node, scope, depth, attributes)
    if isinstance(node, cst.Subscript):
        # x.shape[-1], x.size()[2]
        value = node.value
        if isinstance(value, cst.Attribute) and value.attr.value == "shape":
            return Scalar(node)
        if isinstance(value, cst.Call) and method_call(value, {"size"}) is not None:
            return Scalar(node)
        return None
    if isinstance(node, cst.Name):
        if scope.local_is_scalar(node.value):
            return Scalar(node)
        return None
    if isinstance(node, cst.Attribute):
        return _scalar_attribute(node, scope, depth, attributes)
    return None


def _scalar_call(node: cst.Call, scope: Scope, depth: int, attributes: frozenset[str]) -> Scalar | None:
    """A call that gives a number.

    A math function of numbers, a 0-d tensor of one, a size, or a helper's number.
    """
    qualified = scope.qualify(node.func)
    if qualified in NUMBER_FUNCTIONS and not has_star_args(node):
        return Scalar(node)
    if (qualified in SCALAR_FUNCTIONS or (qualified or "").endswith(".torch_float")) and not has_star_args(node):
        operands = [a for a in node.args if a.keyword is None or a.keyword.value not in PLACING_KEYWORDS]
        if operands and all(scalar(a.value, scope, depth + 1, attributes) is not None for a in operands):
            return Scalar(node)
        return None
    if qualified in SCALAR_TENSOR_FUNCTIONS:
        if qualified == "torch.full":
            size = arg(node, 0, "size")
            if not (isinstance(size, (cst.List, cst.Tuple)) and not size.elements):
                return None
            wrapped = arg(node, 1, "fill_value")
        else:
            wrapped = arg(node, 0, "data")
        return None if wrapped is None else scalar(wrapped, scope, depth + 1, attributes)
    # tensor.size(i) / x.dim() / len(...)
    kept = method_call(node, SCALAR_KEEPING_METHODS)
    if kept is not None and scalar(kept[0], scope, depth + 1, attributes) is not None:
        return Scalar(node)  # `number_tensor.to(torch.get_default_dtype())`
    receiver = method_call(node, {"size", "dim", "numel", "item"})
    if receiver is not None:
        _, name = receiver
        if name == "size" and not node.args:
            return None
        return Scalar(node)
    if m.matches(node.func, m.Name("len")):
        return Scalar(node)
    returned = _returned_expression(node, scope)
    if returned is not None and scalar(returned, scope, depth + 1, attributes) is not None:
        return Scalar(node)  # `scaled_size_sqrt(query, factor)`: the file's function returns a number
    return None


def _scalar_attribute(node: cst.Attribute, scope: Scope, depth: int, attributes: frozenset[str]) -> Scalar | None:
    """`self.x` whose every assignment is a number, or a configuration value `config.x`."""
    attribute = self_attribute_name(node)
    if attribute is not None:
        if attribute in attributes:
            # `self.n = self.n - len(pruned)`: a number if its other assignments are numbers
            return Scalar(node)
        values = scope.self_attribute_values(attribute)
        visiting = attributes | {attribute}
        if values and all(_scalar_attribute_value(v, scope, depth, visiting) for v in values):
            return Scalar(node)
        return None
    # config.x / self.config.x: configuration values are numbers
    full = get_full_name_for_node(node) or ""
    if full.startswith("config.") or full.startswith("self.config."):
        return Scalar(node)
    return None


def _scalar_attribute_value(
    node: cst.BaseExpression, scope: Scope, depth: int, attributes: frozenset[str]
) -> bool:
    """Values assigned to `self.x` in __init__: numbers, config fields, and __init__'s own names."""
    return scalar(node, InitScope(scope), depth + 1, attributes) is not None


class InitScope:
    """Names inside `self.x = ...` belong to __init__ and carry numbers.

    `embed_dim`, `num_heads`, `config`: __init__'s own names.
    """

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def qualify(self, node: cst.CSTNode) -> str | None:
        return self.scope.qualify(node)

    def self_attribute(self, name: str) -> cst.BaseExpression | None:
        return self.scope.self_attribute(name)

    def self_attribute_values(self, name: str) -> tuple[cst.BaseExpression, ...]:
        return self.scope.self_attribute_values(name)

    def local_value(self, name: str) -> cst.BaseExpression | None:
        return None

    def local_is_scalar(self, name: str) -> bool:
        return True

    def module_function(self, name: str) -> cst.FunctionDef | None:
        return self.scope.module_function(name)


# names a helper's returned expression may read besides its parameters: builtins that compute numbers
_NUMBER_BUILTINS = frozenset({"float", "int", "len", "abs", "min", "max", "round"})


def _returned_expression(call: cst.Call, scope: Scope) -> cst.BaseExpression | None:
    """What a call of one of the file's module-level functions returns, its parameters replaced by the arguments.

    The function must be a single `return <expression>` (after an optional docstring) that reads only its parameters,
    imported names and number builtins; otherwise None.
    """
    if not isinstance(call.func, cst.Name) or has_star_args(call):
        return None
    function = scope.module_function(call.func.value)
    if function is None or function.asynchronous is not None or function.decorators:
        return None
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
    statements = [s for s in body if not is_docstring(s)]
    if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
        return None
    (small,) = statements[0].body if len(statements[0].body) == 1 else (None,)
    if not isinstance(small, cst.Return) or small.value is None:
        return None
    params = function.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg is not None or params.kwonly_params:
        return None
    names = [param.name.value for param in (*params.posonly_params, *params.params)]
    bound: dict[str, cst.BaseExpression] = {}
    positional = [a.value for a in call.args if a.keyword is None]
    if len(positional) > len(names):
        return None
    bound.update(zip(names, positional))
    for a in call.args:
        if a.keyword is not None:
            if a.keyword.value not in names or a.keyword.value in bound:
                return None
            bound[a.keyword.value] = a.value
    for param in (*params.posonly_params, *params.params):
        if param.name.value not in bound and param.default is not None:
            bound[param.name.value] = param.default
    if set(bound) != set(names):
        return None
    for name in walk_names(small.value):
        if name not in bound and name not in _NUMBER_BUILTINS and scope.qualify(cst.Name(name)) is None:
            return None  # a global of the file: not followed
    returned: cst.BaseExpression = replace_names(small.value, {name: parenthesized(value) for name, value in bound.items()})
    return returned
