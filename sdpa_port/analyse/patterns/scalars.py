"""Prove an expression is a plain number at run time, and give the number's expression."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse.cstutil import (
    assigned_values,
    binary,
    is_docstring,
    nodes_of_type,
    parenthesized,
    precedence,
    walk_names,
)
from sdpa_port.analyse.patterns.calls import Scope, arg, has_star_args, method_call, self_attribute_name
from sdpa_port.analyse.patterns.functions import (
    BUFFER_WRAPPERS,
    NUMBER_FUNCTIONS,
    PLACING_KEYWORDS,
    SCALAR_FUNCTIONS,
    SCALAR_KEEPING_METHODS,
    SCALAR_TENSOR_FUNCTIONS,
)
from sdpa_port.analyse.patterns.numbers import number
from sdpa_port.analyse.patterns.view_sizes import SIZE_OPERATORS, attribute_sizes
from sdpa_port.rewrite.edit import replace_names

if TYPE_CHECKING:
    from sdpa_port.analyse.module_facts import Binding


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
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
        # `qk_scale or head_dim ** -0.5`: the left operand where it is true, else the right
        left_ok = _optional_scalar(node.left, scope, depth, attributes)
        if left_ok and scalar(node.right, scope, depth + 1, attributes) is not None:
            return Scalar(node)
        return None
    if isinstance(node, cst.IfExp):
        # `a if condition else b`; `qk_scale if qk_scale is not None else d ** -0.5` reads `qk_scale` where not None
        body_ok, orelse_ok = (
            _optional_scalar(side, scope, depth, attributes)
            if _tested_not_none(node.test, side, negated=side is node.orelse)
            else scalar(side, scope, depth + 1, attributes) is not None
            for side in (node.body, node.orelse)
        )
        return Scalar(node) if body_ok and orelse_ok else None
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
    if qualified in BUFFER_WRAPPERS:
        # `nn.Buffer(torch.tensor(d ** -0.5))`: a buffer holds its tensor, not learnt
        data = arg(node, 0, "data")
        return None if data is None else scalar(data, scope, depth + 1, attributes)
    if qualified in SCALAR_TENSOR_FUNCTIONS:
        requires_grad = arg(node, -1, "requires_grad")
        if requires_grad is not None and not m.matches(requires_grad, m.Name("False")):
            return None  # a learnt value: SDPA's `scale=` takes no tensor that requires a gradient
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
    """`self.x` whose every binding gives a number, or a configuration value `config.x`."""
    attribute = self_attribute_name(node)
    if attribute is not None:
        if attribute in attributes:
            # `self.n = self.n - len(pruned)`: a number if its other bindings are numbers
            return Scalar(node)
        bindings = scope.self_attribute_bindings(attribute)
        visiting = attributes | {attribute}
        if bindings and all(
            b.value is not None and scalar(b.value, MethodScope(scope, b.method), depth + 1, visiting) is not None
            for b in bindings
        ):
            return Scalar(node)
        return None
    # config.x / self.config.x: configuration values are numbers
    full = get_full_name_for_node(node) or ""
    if full.startswith("config.") or full.startswith("self.config."):
        return Scalar(node)
    return None


def _optional_scalar(node: cst.BaseExpression, scope: Scope, depth: int, attributes: frozenset[str]) -> bool:
    """A number, `None`, or a name that holds one of them."""
    if m.matches(node, m.Name("None")):
        return True
    if isinstance(node, cst.Name) and scope.local_is_optional_scalar(node.value):
        return True
    return scalar(node, scope, depth + 1, attributes) is not None


def _tested_not_none(test: cst.BaseExpression, name: cst.BaseExpression, negated: bool) -> bool:
    """`test` is `name is not None` (or `name is None`, where `negated`): the name is not None where it holds."""
    operator = m.IsNot() if not negated else m.Is()
    return isinstance(name, cst.Name) and m.matches(
        test,
        m.Comparison(
            left=m.Name(name.value), comparisons=[m.ComparisonTarget(operator=operator, comparator=m.Name("None"))]
        ),
    )


# what a parameter of `__init__` is declared to hold
NUMBER, OPTIONAL = "number", "number or None"

# layers whose arguments at these positions or keywords are sizes: integers, or the layer cannot be built
_LAYER_SIZES: dict[str, tuple[tuple[int, str], ...]] = {
    "torch.nn.Linear": ((0, "in_features"), (1, "out_features")),
    "torch.nn.Conv1d": ((0, "in_channels"), (1, "out_channels")),
    "torch.nn.Conv2d": ((0, "in_channels"), (1, "out_channels")),
    "torch.nn.Conv3d": ((0, "in_channels"), (1, "out_channels")),
    "torch.nn.Embedding": ((0, "num_embeddings"), (1, "embedding_dim")),
    "torch.nn.BatchNorm1d": ((0, "num_features"),),
    "torch.nn.BatchNorm2d": ((0, "num_features"),),
}


@dataclass(frozen=True)
class MethodNames:
    """What a method's names are bound to: each binding of a local (None: not a plain `name = value`), and what each
    parameter is declared to hold (NUMBER, OPTIONAL or None)."""

    locals: dict[str, list[cst.BaseExpression | None]]
    params: dict[str, str | None]
    # parameters the method binds again before any other statement reads them: `embed_dim = embed_dim or dim` first
    rebound: frozenset[str] = frozenset()


class MethodScope:
    """The names of a method that binds `self.x`, as the value it binds reads them.

    A local holds a number when each of the method's bindings of it gives one. Parameters hold what callers pass, so
    only `__init__`'s hold numbers, where the constructor declares them numbers: a number as the default, `int` or
    `float` as the annotation, or used in an integer size (`nn.Linear(dim, dim * 3)`, `_layer_sizes`, or a view's
    size in a method through the `self.` attribute `__init__` alone binds to it, `view_sizes.py`). A parameter
    defaulting to None (or annotated `Optional[float]`) holds a number or None: a number only behind `or` or a test
    (`qk_scale or head_dim ** -0.5`). Other names (globals, builtins) are not followed.

    These are what the constructor declares, as configuration values are numbers by what a config declares: a caller
    can pass anything. Where a scale so read is not a number after all, SDPA refuses it (its `scale=` takes a float,
    or a 0-d tensor that needs no gradient, as the float it holds) rather than compute something else.
    """

    def __init__(self, scope: Scope, method: cst.FunctionDef) -> None:
        self.scope = scope
        self.names = method_names(method, scope)
        self._evaluating: dict[str, str] = {}  # name -> what it is being proved to hold (NUMBER, OPTIONAL)

    def qualify(self, node: cst.CSTNode) -> str | None:
        return self.scope.qualify(node)

    def self_attribute(self, name: str) -> cst.BaseExpression | None:
        return self.scope.self_attribute(name)

    def self_attribute_values(self, name: str) -> tuple[cst.BaseExpression, ...]:
        return self.scope.self_attribute_values(name)

    def self_attribute_bindings(self, name: str) -> tuple[Binding, ...]:
        return self.scope.self_attribute_bindings(name)

    def module_function(self, name: str) -> cst.FunctionDef | None:
        return None if name in self.names.locals or name in self.names.params else self.scope.module_function(name)

    def class_init(self, name: str) -> cst.FunctionDef | None:
        return None if name in self.names.locals or name in self.names.params else self.scope.class_init(name)

    def class_methods(self) -> tuple[cst.FunctionDef, ...]:
        return self.scope.class_methods()

    def local_value(self, name: str) -> cst.BaseExpression | None:
        """The one value the method binds a local to (`scale = torch.ones(heads, 1, 1)`); None for a parameter."""
        values = self.names.locals.get(name, [])
        if name in self.names.params or not values or values[0] is None:
            return None
        first = values[0]
        return first if all(v is not None and v.deep_equals(first) for v in values) else None

    def local_is_scalar(self, name: str) -> bool:
        return self._holds(name, optional=False)

    def local_is_optional_scalar(self, name: str) -> bool:
        return self._holds(name, optional=True)

    def _holds(self, name: str, optional: bool) -> bool:
        """Every value the name may hold is a number (or None, where `optional`)."""
        state = self._evaluating.get(name)
        if state == _PARAMETER:
            # inside the statement that first binds a parameter again (`embed_dim = embed_dim or dim`): the argument
            return self._declared(name, optional)
        if state is not None:
            # `n = n - 1`: decided by its other bindings, unless a number is asked of what may be None
            return optional or state == NUMBER
        values = self.names.locals.get(name, [])
        if name in self.names.params:
            if name in self.names.rebound:
                # every read of the argument is in the statement that binds the name again
                self._evaluating[name] = _PARAMETER
                try:
                    if not self._held(values[0], optional):
                        return False
                finally:
                    del self._evaluating[name]
                values = values[1:]
            elif not self._declared(name, optional):
                return False
        elif not values:
            return False
        self._evaluating[name] = OPTIONAL if optional else NUMBER
        try:
            return all(self._held(value, optional) for value in values)
        finally:
            del self._evaluating[name]

    def _declared(self, name: str, optional: bool) -> bool:
        declared = self.names.params.get(name)
        return declared == NUMBER or (declared == OPTIONAL and optional)

    def _held(self, value: cst.BaseExpression | None, optional: bool) -> bool:
        if value is None:
            return False
        return _optional_scalar(value, self, 0, frozenset()) if optional else scalar(value, self) is not None


# a parameter read inside the statement that first binds it again
_PARAMETER = "parameter"


@lru_cache(maxsize=256)
def _bound_locals(method: cst.FunctionDef) -> dict[str, list[cst.BaseExpression | None]]:
    return assigned_values([method.body])


def method_names(method: cst.FunctionDef, scope: Scope) -> MethodNames:
    """The locals a method binds and what its parameters are declared to hold."""
    bound = _bound_locals(method)
    params = method.params
    declared: dict[str, str | None] = {}
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        declared[param.name.value] = None
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            declared[star.name.value] = None
    if method.name.value == "__init__":
        sized = _layer_sizes(method, scope)
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            name = param.name.value
            declared[name] = NUMBER if name in sized and name not in bound else _declared(param)
    return MethodNames(bound, declared, _rebound_first(method, frozenset(declared) & frozenset(bound)))


def _rebound_first(method: cst.FunctionDef, names: frozenset[str]) -> frozenset[str]:
    """The names whose first mention in the method's body is a statement of its own, `name = value`, so that only
    `value` reads what the name held before."""
    first: set[str] = set()
    pending = set(names)
    for statement in method.body.body if isinstance(method.body, cst.IndentedBlock) else ():
        if not pending:
            break
        mentioned = walk_names(statement) & pending
        if not mentioned:
            continue
        pending -= mentioned
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                first.update(mentioned & {small.targets[0].target.value})
    return frozenset(first)


def _declared(param: cst.Param) -> str | None:
    """What a parameter's annotation, or else its default, declares it holds."""
    default = param.default
    none_default = default is not None and m.matches(default, m.Name("None"))
    if param.annotation is not None:
        kind = _annotated(param.annotation.annotation)
    elif default is not None and number(default) is not None:
        kind = NUMBER
    else:
        kind = OPTIONAL if none_default else None
    return OPTIONAL if kind == NUMBER and none_default else kind


def _annotated(annotation: cst.BaseExpression) -> str | None:
    """`int`, `float`: NUMBER; `Optional[float]`, `float | None`, `Union[int, None]`: OPTIONAL; others None."""
    if m.matches(annotation, m.Name("int") | m.Name("float")):
        return NUMBER
    optional = m.Name("Optional") | m.Attribute(attr=m.Name("Optional"))
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        members = [annotation.left, annotation.right]
    elif isinstance(annotation, cst.Subscript) and m.matches(
        annotation.value, optional | m.Name("Union") | m.Attribute(attr=m.Name("Union"))
    ):
        members = [e.slice.value for e in annotation.slice if isinstance(e.slice, cst.Index)]
        if m.matches(annotation.value, optional):
            members.append(cst.Name("None"))
    else:
        return None
    kinds = [OPTIONAL if m.matches(e, m.Name("None")) else _annotated(e) for e in members]
    if any(k is None for k in kinds):
        return None
    return OPTIONAL if OPTIONAL in kinds else NUMBER


def _layer_sizes(method: cst.FunctionDef, scope: Scope, visiting: frozenset[cst.FunctionDef] = frozenset()) -> frozenset[str]:
    """The names `method` computes an integer size from: the size of a layer (`dim` in `nn.Linear(dim, dim * 3)`),
    the shape of a new tensor, a `range`, or a size of a module of the file, given as one, or through sums, products
    and floor divisions, the locals and the `self.` attributes the method binds (`self.n = heads * dim`, then
    `Projection(self.n)`). Each operand of such a size is one integer: anything else makes the size a float, a
    sequence or a tensor of several values, and building the layer fails. For the class's own `__init__`, the
    `self.` attributes its methods' views take as sizes are sizes too (`view_sizes.py`)."""
    locals_ = _bound_locals(method)
    attributes: dict[str, list[cst.BaseExpression]] = {}
    for assign in nodes_of_type(method.body, cst.Assign):
        for target in assign.targets:
            attribute = self_attribute_name(target.target)
            if attribute is not None:
                attributes.setdefault(attribute, []).append(assign.value)
    pending = [size for call in nodes_of_type(method.body, cst.Call) for size in _sizes(call, scope, visiting | {method})]
    if not visiting:
        pending.extend(attribute_sizes(method, scope))
    names: set[str] = set()
    seen: set[str] = set()
    while pending:
        node = pending.pop()
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, SIZE_OPERATORS):
            pending.extend((node.left, node.right))
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            pending.append(node.expression)
        elif isinstance(node, cst.Name) and node.value not in seen:
            seen.add(node.value)
            names.add(node.value)
            pending.extend(v for v in locals_.get(node.value, ()) if v is not None)
        elif (attribute := self_attribute_name(node)) is not None and f"self.{attribute}" not in seen:
            seen.add(f"self.{attribute}")
            pending.extend(attributes.get(attribute, ()))
    return frozenset(names)


def sized_parameters(init: cst.FunctionDef, scope: Scope) -> frozenset[str]:
    """The parameters of a class's `__init__` it computes an integer size from (`_layer_sizes`): `key_channels` in
    `nn.Conv2d(in_channels, key_channels, 1)`, `dim` in `nn.Linear(dim, dim * 3)`."""
    params = init.params
    names = {param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)}
    return _layer_sizes(init, scope) & frozenset(names)


# new tensors whose positional arguments, or the one sequence given, are their shape
_SHAPED = frozenset({"torch.zeros", "torch.ones", "torch.empty", "torch.randn", "torch.rand"})


def _sizes(call: cst.Call, scope: Scope, visiting: frozenset[cst.FunctionDef]) -> list[cst.BaseExpression]:
    """The arguments of a call that must be integers."""
    if has_star_args(call):
        return []
    qualified = scope.qualify(call.func) or ""
    if qualified in _LAYER_SIZES:
        return [size for index, keyword in _LAYER_SIZES[qualified] if (size := arg(call, index, keyword)) is not None]
    positional = [a.value for a in call.args if a.keyword is None]
    if qualified in _SHAPED:
        if len(positional) == 1 and isinstance(positional[0], (cst.Tuple, cst.List)):
            return [e.value for e in positional[0].elements if not isinstance(e, cst.StarredElement)]
        return positional
    if m.matches(call.func, m.Name("range")):
        return positional
    init = scope.class_init(call.func.value) if isinstance(call.func, cst.Name) else None
    if init is None or init in visiting or init.params.star_arg is not cst.MaybeSentinel.DEFAULT:
        return []
    # a module of the file: the arguments its `__init__` gives a layer as sizes
    sized = _layer_sizes(init, scope, visiting)
    params = [param.name.value for param in (*init.params.posonly_params, *init.params.params)][1:]  # after self
    out = [value for name, value in zip(params, positional) if name in sized]
    out.extend(a.value for a in call.args if a.keyword is not None and a.keyword.value in sized)
    return out


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
