"""Named structural patterns: the call forms eager attention is written with.

Every recogniser takes CST nodes and a `Scope` (what names and `self.` attributes mean) and returns a small
typed description or None. Nothing here looks at source text.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Protocol, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse.cstutil import binary, is_docstring, parenthesized, precedence, primary
from sdpa_port.analyse.cstutil import function_names as function_names  # read as `patterns.function_names` too
from sdpa_port.analyse.cstutil import walk_names as walk_names  # read as `patterns.walk_names` too
from sdpa_port.rewrite.edit import replace_names

SOFTMAX_FUNCTIONS = frozenset({"torch.nn.functional.softmax", "torch.softmax", "torch.Tensor.softmax"})
SOFTMAX_MODULES = frozenset({"torch.nn.Softmax"})
DROPOUT_FUNCTIONS = frozenset({"torch.nn.functional.dropout", "torch.dropout"})
DROPOUT_MODULES = frozenset({"torch.nn.Dropout"})
MATMUL_FUNCTIONS = frozenset({"torch.matmul", "torch.bmm"})
BADDBMM_FUNCTIONS = frozenset({"torch.baddbmm"})
EINSUM_FUNCTIONS = frozenset({"torch.einsum"})
# tensor factories whose positional arguments are the sizes (`torch.randn(heads, dim)`, `torch.zeros((n, d))`)
SIZED_FACTORIES = frozenset(
    f"torch.{name}" for name in ("zeros", "ones", "randn", "rand", "empty", "Tensor", "FloatTensor", "HalfTensor")
)
WHERE_FUNCTIONS = frozenset({"torch.where"})
MAXIMUM_FUNCTIONS = frozenset({"torch.max", "torch.maximum", "torch.clamp", "torch.clamp_min"})
CAT_FUNCTIONS = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})
ZEROS_FUNCTIONS = frozenset({"torch.zeros", "torch.empty", "torch.zeros_like", "torch.empty_like"})
SCALAR_TENSOR_FUNCTIONS = frozenset({"torch.full", "torch.tensor", "torch.as_tensor", "torch.scalar_tensor"})
SCALAR_FUNCTIONS = frozenset(
    {
        "math.sqrt", "math.pow", "math.log", "math.exp", "float", "int", "abs", "min", "max", "numpy.sqrt", "np.sqrt",
        # on numbers (0-d tensors), the same numbers: `torch.sqrt(torch.tensor(head_dim, dtype=torch.float32))`
        "torch.sqrt", "torch.rsqrt", "torch.pow", "torch.exp", "torch.log",
    }
)
# functions whose result is a Python number whatever they are given (or they raise): math.sqrt(n) of any n
NUMBER_FUNCTIONS = frozenset({"math.sqrt", "math.pow", "math.log", "math.exp", "float", "int"})
# keywords that place or type a number without changing it
PLACING_KEYWORDS = frozenset({"dtype", "device", "requires_grad"})
# methods of a 0-d tensor that keep its number: dtype casts, moves and reading it out
SCALAR_KEEPING_METHODS = frozenset({"to", "type", "type_as", "float", "double", "half", "bfloat16", "item", "detach"})
CAST_METHODS = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "contiguous"})
RESHAPE_METHODS = frozenset({"view", "reshape"})
VERY_NEGATIVE_LIMIT = -1e4
# at or below this a fill value absorbs any score it is added to (s + F == F in float32 for |s| < 1e22), so adding
# it equals replacing the score with it
ABSORBING_LIMIT = -1e30

is_self = m.Name("self")


class Scope(Protocol):
    """What the recognisers need to know about names in the function being read."""

    def qualify(self, node: cst.CSTNode) -> str | None: ...

    def self_attribute(self, name: str) -> cst.BaseExpression | None: ...

    def local_value(self, name: str) -> cst.BaseExpression | None: ...

    def local_is_scalar(self, name: str) -> bool: ...

    def self_attribute_values(self, name: str) -> tuple[cst.BaseExpression, ...]: ...

    def module_function(self, name: str) -> cst.FunctionDef | None: ...


def arg(call: cst.Call, index: int, keyword: str | None = None) -> cst.BaseExpression | None:
    """The positional argument `index` or the keyword argument `keyword` of a call."""
    positional = [a for a in call.args if a.keyword is None and a.star == ""]
    if keyword is not None:
        for a in call.args:
            if a.keyword is not None and a.keyword.value == keyword:
                return a.value
    if 0 <= index < len(positional):
        return positional[index].value
    return None


def has_star_args(call: cst.Call) -> bool:
    return any(a.star != "" for a in call.args)


def method_call(node: cst.BaseExpression, names: frozenset[str] | set[str] | None = None) -> tuple[cst.BaseExpression, str] | None:
    """`x.name(...)` -> (x, name) when name is in `names` (or any when None)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        name = node.func.attr.value
        if names is None or name in names:
            return node.func.value, name
    return None


def self_attribute_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Attribute) and m.matches(node.value, is_self):
        return node.attr.value
    return None


# ---------------------------------------------------------------- numbers


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


INFINITIES = frozenset({"math.inf", "torch.inf", "numpy.inf", "np.inf"})


def is_very_negative(node: cst.BaseExpression, scope: Scope) -> bool:
    """A fill value that masks a score out: finfo(...).min, -inf, -finfo(...).max, or a literal <= -1e4."""
    value = fill_number(node, scope)
    return value is not None and value <= VERY_NEGATIVE_LIMIT


def is_absorbing(node: cst.BaseExpression, scope: Scope) -> bool:
    """A fill value F with s + F == F for every realistic score s: -inf, finfo(dtype).min, -finfo(dtype).max, <= -1e30.

    Replacing a score by such a value and adding the value to it give the same softmax, even in a row where every
    key is masked; for a merely very negative value (-1e4, -1e9) they differ there.
    """
    value = fill_number(node, scope)
    return value is not None and value <= ABSORBING_LIMIT


def is_minus_infinity(node: cst.BaseExpression, scope: Scope) -> bool:
    """-inf itself (`float("-inf")`, `-math.inf`, a 0-d tensor of it): below every finite score, however masked."""
    return fill_number(node, scope) == -math.inf


# finfo(dtype).min or -finfo(dtype).max, of the scores' dtype: absorbing in that dtype, yet finite
_FINFO_EXTREME = -1e38


def fill_number(node: cst.BaseExpression, scope: Scope) -> float | None:
    """The number a fill value stands for (`0.0`, `torch.scalar_tensor(0, ...)`, -inf for `-math.inf`,
    _FINFO_EXTREME for `torch.finfo(dtype).min`), or None."""
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
    """The expression a fill value stands for, followed through 0-d tensor constructors, dtype casts, locals and
    `self.` attributes; None where one of those cannot be followed."""
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


# ---------------------------------------------------------------- scalars


@dataclass(frozen=True)
class Scalar:
    """An expression known to be a Python number at run time, with the node to use for SDPA's `scale=`."""

    node: cst.BaseExpression


def scalar(
    node: cst.BaseExpression, scope: Scope, depth: int = 0, attributes: frozenset[str] = frozenset()
) -> Scalar | None:
    """Prove that an expression is a plain number (or a 0-d tensor wrapping one) and give the number's expression."""
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
    return None


# elementwise functions of one tensor: the result has the operand's shape
ELEMENTWISE_FUNCTIONS = frozenset(
    {"torch.clamp", "torch.clip", "torch.exp", "torch.log", "torch.sqrt", "torch.rsqrt", "torch.sigmoid", "torch.abs"}
)
ELEMENTWISE_METHODS = frozenset({"clamp", "clip", "exp", "log", "sqrt", "rsqrt", "sigmoid", "abs"}) | CAST_METHODS
FILLED_TENSOR_FUNCTIONS = frozenset({"torch.ones", "torch.zeros", "torch.full", "torch.rand", "torch.randn", "torch.empty"})
# functions whose result has the shape of their first argument
SHAPE_KEEPING_FUNCTIONS = ELEMENTWISE_FUNCTIONS | {"torch.nn.functional.normalize", "torch.nn.functional.layer_norm"}
PARAMETER_WRAPPERS = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})


def constant_along_last(node: cst.BaseExpression, scope: Scope, depth: int = 0, attributes: frozenset[str] = frozenset()) -> bool:
    """Prove that a tensor's last dimension has size 1 (a factor the same for every key, like Swin V2's per-head
    `logit_scale` of shape (heads, 1, 1)), so that `(q @ k.T) * f == (q * f) @ k.T`. Numbers qualify too."""
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
        values = scope.self_attribute_values(attribute)
        init = _InitScope(scope)
        return bool(values) and all(
            constant_along_last(v, init, depth + 1, attributes | {attribute}) for v in values
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


def _scalar_attribute_value(
    node: cst.BaseExpression, scope: Scope, depth: int, attributes: frozenset[str]
) -> bool:
    """Values assigned to `self.x` in __init__: numbers, config fields, and __init__'s own names."""
    return scalar(node, _InitScope(scope), depth + 1, attributes) is not None


class _InitScope:
    """Names inside `self.x = ...` belong to __init__ (embed_dim, num_heads, config): they carry numbers."""

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
    """What a call of one of the file's module-level functions returns, its parameters replaced by the call's
    arguments, when the function is a single `return <expression>` (after an optional docstring) that reads only its
    parameters, imported names and number builtins; otherwise None."""
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



# ---------------------------------------------------------------- forms


class SoftmaxForm(enum.Enum):
    FUNCTIONAL = "functional"  # nn.functional.softmax(x, dim), torch.softmax(x, dim)
    METHOD = "method"  # x.softmax(dim)
    MODULE = "module"  # nn.Softmax(dim)(x)
    MODULE_ATTRIBUTE = "module_attribute"  # self.softmax(x) with self.softmax = nn.Softmax(dim)


@dataclass(frozen=True)
class SoftmaxCall:
    operand: cst.BaseExpression
    form: SoftmaxForm
    dim: cst.BaseExpression | None
    upcast: bool


def softmax_call(node: cst.BaseExpression, scope: Scope) -> SoftmaxCall | None:
    if not isinstance(node, cst.Call):
        return None
    qualified = scope.qualify(node.func)
    if qualified in SOFTMAX_FUNCTIONS:
        operand = arg(node, 0, "input")
        if operand is None:
            return None
        return SoftmaxCall(operand, SoftmaxForm.FUNCTIONAL, arg(node, 1, "dim"), arg(node, 2, "dtype") is not None)
    func = node.func
    attribute = self_attribute_name(func)
    if attribute is not None:
        value = scope.self_attribute(attribute)
        if isinstance(value, cst.Call) and scope.qualify(value.func) in SOFTMAX_MODULES and len(node.args) == 1:
            return SoftmaxCall(node.args[0].value, SoftmaxForm.MODULE_ATTRIBUTE, arg(value, 0, "dim"), False)
        return None
    receiver = method_call(node, {"softmax"})
    if receiver is not None:
        return SoftmaxCall(receiver[0], SoftmaxForm.METHOD, arg(node, 0, "dim"), arg(node, 1, "dtype") is not None)
    if isinstance(func, cst.Call) and scope.qualify(func.func) in SOFTMAX_MODULES and len(node.args) == 1:
        return SoftmaxCall(node.args[0].value, SoftmaxForm.MODULE, arg(func, 0, "dim"), False)
    return None


@dataclass(frozen=True)
class DropoutCall:
    operand: cst.BaseExpression
    # expression for SDPA's dropout_p when training, and the expression that says whether it is active
    probability: cst.BaseExpression
    training: cst.BaseExpression
    module: str | None = None  # the `self.` attribute holding the Dropout module, when it is one


def dropout_call(node: cst.BaseExpression, scope: Scope) -> DropoutCall | None:
    if not isinstance(node, cst.Call):
        return None
    qualified = scope.qualify(node.func)
    if qualified in DROPOUT_FUNCTIONS:
        operand = arg(node, 0, "input")
        probability = arg(node, 1, "p")
        training = arg(node, 2, "training" if qualified.endswith("functional.dropout") else "train")
        if operand is None:
            return None
        if probability is None:
            probability = cst.Float("0.5")
        if training is None:
            training = cst.Name("True")
        return DropoutCall(operand, probability, training)
    attribute = self_attribute_name(node.func)
    if attribute is not None and len(node.args) == 1:
        values = [a for v in scope.self_attribute_values(attribute) for a in _alternatives(v)]
        modules = [v for v in values if isinstance(v, cst.Call) and scope.qualify(v.func) in DROPOUT_MODULES]
        nones = [v for v in values if isinstance(v, cst.Name) and v.value == "None"]
        if modules and len(modules) + len(nones) == len(values):
            # a module `__init__` leaves None without dropout (CPM-Ant): called, it is the Dropout; its rate is 0.0
            # where it is None, which SDPA's `dropout_p` must read without calling it
            text = f"self.{attribute}.p" if not nones else f"(self.{attribute}.p if self.{attribute} is not None else 0.0)"
            probability = cst.parse_expression(text)
            return DropoutCall(node.args[0].value, probability, cst.parse_expression("self.training"), attribute)
    return None


def reads_settings_only(node: cst.BaseExpression) -> bool:
    """An expression of the module's settings alone: attributes of `self` (`self.training`, `self.config.flag`),
    combined by `not`, `and` and `or`; no call, no local."""
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


def guarded_dropout(call: DropoutCall, guard: cst.BaseExpression) -> DropoutCall:
    """The dropout call run only where `guard` holds, as one whose `training` says when it is active: the guard and
    the call's own `training` (the guard alone where that is True or one of the guard's `and` terms)."""
    own = call.training
    if (isinstance(own, cst.Name) and own.value == "True") or any(own.deep_equals(c) for c in conjuncts(guard)):
        training: cst.BaseExpression = guard
    else:
        training = joined([guard, own])
    return replace(call, training=training)


def conjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The terms of a test joined by `and` (the test itself when it is not such a join)."""
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


def _alternatives(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values a conditional expression may give (`nn.Dropout(p) if p else None`: both arms)."""
    if isinstance(node, cst.IfExp):
        return _alternatives(node.body) + _alternatives(node.orelse)
    return [node]


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


class ProductForm(enum.Enum):
    MATMUL = "matmul"  # torch.matmul(a, b), a.matmul(b)
    BMM = "bmm"  # torch.bmm(a, b), a.bmm(b)
    OPERATOR = "operator"  # a @ b
    EINSUM = "einsum"  # torch.einsum(spec, a, b)
    BADDBMM = "baddbmm"  # torch.baddbmm(input, a, b, beta=, alpha=)


@dataclass(frozen=True)
class Product:
    """A batched product of two tensors: scores (left=query, right=key^T) or output (left=probs, right=value)."""

    form: ProductForm
    left: cst.BaseExpression
    right: cst.BaseExpression
    rank: int | None  # 3 for bmm/baddbmm, from the einsum spec, None for matmul
    alpha: cst.BaseExpression | None = None
    beta: cst.BaseExpression | None = None
    initial: cst.BaseExpression | None = None  # baddbmm's input
    spec: str | None = None


def product(node: cst.BaseExpression, scope: Scope) -> Product | None:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return Product(ProductForm.OPERATOR, node.left, node.right, None)
    if not isinstance(node, cst.Call) or has_star_args(node):
        return None
    qualified = scope.qualify(node.func)
    if qualified in MATMUL_FUNCTIONS:
        left, right = arg(node, 0, "input"), arg(node, 1, "mat2" if qualified == "torch.bmm" else "other")
        if left is None or right is None:
            return None
        bmm = qualified == "torch.bmm"
        return Product(ProductForm.BMM if bmm else ProductForm.MATMUL, left, right, 3 if bmm else None)
    receiver = method_call(node, {"matmul", "bmm"})
    if receiver is not None and len(node.args) == 1:
        form = ProductForm(receiver[1])
        return Product(form, receiver[0], node.args[0].value, 3 if form is ProductForm.BMM else None)
    if qualified in EINSUM_FUNCTIONS:
        spec = einsum_spec(node)
        operands = _einsum_operands(node)
        if spec is None or operands is None:
            return None
        return Product(ProductForm.EINSUM, operands[0], operands[1], None, spec=spec)
    if qualified in BADDBMM_FUNCTIONS or method_call(node, {"baddbmm"}) is not None:
        if qualified in BADDBMM_FUNCTIONS:
            initial = arg(node, 0, "input")
            left, right = arg(node, 1, "batch1"), arg(node, 2, "batch2")
        else:
            initial = node.func.value  # type: ignore[attr-defined]
            left, right = arg(node, 0, "batch1"), arg(node, 1, "batch2")
        if left is None or right is None or initial is None:
            return None
        beta = _keyword(node, "beta")
        alpha = _keyword(node, "alpha")
        return Product(ProductForm.BADDBMM, left, right, 3, alpha=alpha, beta=beta, initial=initial)
    return None


def einsum_spec(call: cst.Call) -> str | None:
    """The equation of `einsum("ibnd, jbnd -> ijbn", ...)` without its spaces, None where it is not a literal."""
    spec = arg(call, 0, "equation")
    return str(spec.evaluated_value).replace(" ", "") if isinstance(spec, cst.SimpleString) else None


def _einsum_operands(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The two operands of `einsum(spec, a, b)` or of `einsum(spec, [a, b])` (a list or tuple of exactly two)."""
    if any(a.keyword is not None for a in call.args):
        return None
    if len(call.args) == 3:
        return call.args[1].value, call.args[2].value
    if len(call.args) == 2 and isinstance(call.args[1].value, (cst.List, cst.Tuple)):
        elements = call.args[1].value.elements
        if len(elements) == 2 and all(isinstance(e, cst.Element) for e in elements):
            return elements[0].value, elements[1].value
    return None


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a.value
    return None


class EinsumRole(enum.Enum):
    SCORES = "scores"  # ...qd,...kd->...qk
    OUTPUT = "output"  # ...qk,...kd->...qd


Order = tuple[int, ...]


@dataclass(frozen=True)
class EinsumRoles:
    """How an einsum spec maps to attention: scores (`...qd,...kd->...qk`) or output (`...qk,...kd->...qd`).

    4-D operands may hold their dimensions in any order (`bind,bjnd->bnij`, `ibnd,jbnd->bnij`), and so may the
    scores (`ibnd,jbnd->ijbn`: Transformer-XL's (query, key, batch, heads)); the orders say how to bring each operand
    to SDPA's layout. `left` and `right` permute the operands to (lead, lead, length, dim), `result` permutes SDPA's
    (lead, lead, query, dim) output to the spec's, `scores` the scores as the spec lays them out to SDPA's (lead,
    lead, query, key); None where the operand already is so."""

    kind: EinsumRole
    rank: int
    left: Order | None = None
    right: Order | None = None
    result: Order | None = None
    scores: Order | None = None


def einsum_roles(spec: str, kind: EinsumRole, scores: Order | None = None) -> EinsumRoles | None:
    """The spec read as the product of that kind, None where it is not one. An output product's first operand is
    the probabilities laid out as `scores` says the chain's scores are (SDPA's layout where None)."""
    if "->" not in spec or "." in spec:
        return None
    inputs, out = spec.split("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        return None
    a, b = parts
    if not (len(a) == len(b) == len(out)) or len(a) not in (3, 4) or any(len(set(x)) != len(x) for x in (a, b, out)):
        return None
    if kind is EinsumRole.SCORES:
        return _einsum_scores(a, b, out)
    if scores is not None and len(scores) != len(a):
        return None
    return _einsum_output(a if scores is None else "".join(a[i] for i in scores), b, out)


def _einsum_scores(a: str, b: str, out: str) -> EinsumRoles | None:
    """Scores `a,b->out` (3-D or 4-D): out holds the leads (read by both operands), q (by a alone) and k (by b
    alone) in any order; a holds the leads, q and the contracted d; b the leads, k and d, each in any order."""
    q = "".join(c for c in out if c in a and c not in b)
    k = "".join(c for c in out if c in b and c not in a)
    lead = "".join(c for c in out if c in a and c in b)
    contracted = set(a) - set(out)
    if len(q) != 1 or len(k) != 1 or len(contracted) != 1:
        return None
    if set(a) != {*lead, q, *contracted} or set(b) != {*lead, k, *contracted}:
        return None
    (d,) = contracted
    left, right = _order(a, f"{lead}{q}{d}"), _order(b, f"{lead}{k}{d}")
    scores = _order(out, f"{lead}{q}{k}")
    if scores is not None and b != a.replace(q, k):
        # scores laid out otherwise are read only from operands laid out alike (`ibnd,jbnd`): XLNet's segment term
        # `ijbs,ibns->bnij` pairs a length with the heads, which no query-key product does
        return None
    return EinsumRoles(EinsumRole.SCORES, len(out), left, right, scores=scores)


def _einsum_output(a: str, b: str, out: str) -> EinsumRoles | None:
    """The product with V `a,b->out` (3-D or 4-D): a = (leads, q, k) as SDPA lays out the scores; b holds the
    leads, k and the value's d, out the leads, q and d, each in any order."""
    lead, q, k = a[:-2], a[-2], a[-1]
    width = set(b) - set(a)
    if len(width) != 1 or k in out or set(b) != {*lead, k, *width} or set(out) != {*lead, q, *width}:
        return None
    (d,) = width
    return EinsumRoles(EinsumRole.OUTPUT, len(a), right=_order(b, f"{lead}{k}{d}"), result=_order(f"{lead}{q}{d}", out))


def _order(source: str, target: str) -> Order | None:
    """The permutation taking dimensions labelled `source` to `target`, None where it keeps them in place."""
    order = tuple(source.index(c) for c in target)
    return None if order == tuple(range(len(order))) else order


def permuted(node: cst.BaseExpression, order: Order | None) -> cst.BaseExpression:
    """`node.transpose(i, j)` for a swap of two dimensions, `node.permute(...)` for any other order."""
    if order is None or order == tuple(range(len(order))):
        return node
    moved = [i for i, o in enumerate(order) if i != o]
    if len(moved) == 2:
        args = [cst.Arg(cst.Integer(str(i))) for i in moved]
        method = "transpose"
    else:
        args = [cst.Arg(cst.Integer(str(i))) for i in order]
        method = "permute"
    return cst.Call(func=cst.Attribute(value=primary(node), attr=cst.Name(method)), args=args)


def then(first: Order, second: Order) -> Order:
    """The order `x.permute(first).permute(second)` takes `x`'s dimensions in."""
    return tuple(first[i] for i in second)


def inverse(order: Order) -> Order:
    """The order that undoes `order`: `then(order, inverse(order))` keeps every dimension in place."""
    out = [0] * len(order)
    for i, o in enumerate(order):
        out[o] = i
    return tuple(out)


def least_rank(node: cst.BaseExpression) -> int | None:
    """The fewest dimensions `x[None, :, :, None]` can have, whatever `x`'s rank: one per slice and per `None` of
    an index of slices, `None`s and integers without an Ellipsis; None for any other expression."""
    if not isinstance(node, cst.Subscript):
        return None
    least = 0
    for element in node.slice:
        index = element.slice
        if isinstance(index, cst.Slice) or m.matches(index, m.Index(m.Name("None"))):
            least += 1
        elif not m.matches(index, m.Index(m.Integer() | m.UnaryOperation(operator=m.Minus(), expression=m.Integer()))):
            return None
    return least


def transposed_last_two(node: cst.BaseExpression, rank: int | None) -> cst.BaseExpression | None:
    """`k.transpose(-1, -2)` / `k.transpose(2, 3)` / `k.permute(0, 1, 3, 2)` / `k.mT` -> k."""
    found = method_call(node, {"transpose", "permute"})
    if found is not None:
        receiver, name = found
        assert isinstance(node, cst.Call)
        values = [number(a.value) for a in node.args]
        if any(v is None for v in values) or any(a.keyword is not None for a in node.args):
            return None
        dims = [int(v) for v in values]  # type: ignore[arg-type]
        if name == "transpose" and len(dims) == 2:
            pair = set(dims)
            if pair == {-1, -2}:
                return receiver
            if rank in (None, 4) and pair == {2, 3}:
                return receiver
            if rank == 3 and pair == {1, 2}:
                return receiver
        if name == "permute":
            if dims == [0, 1, 3, 2] or dims == [0, 2, 1]:
                return receiver
        return None
    if isinstance(node, cst.Attribute) and node.attr.value == "mT":
        return node.value
    return None


def cast_operand(term: cst.BaseExpression) -> str | None:
    """The name an additive term adds, through dtype casts: `mask`, `mask.to(dtype)`, `mask.type_as(x)` -> "mask"."""
    while isinstance(term, cst.Call) and isinstance(term.func, cst.Attribute) and term.func.attr.value in DTYPE_CASTS:
        term = term.func.value
    return term.value if isinstance(term, cst.Name) else None


DTYPE_CASTS = frozenset({"to", "type", "type_as"})


def features_second_last(node: cst.BaseExpression) -> bool:
    """`k.permute(0, 2, 3, 1)`: a permutation that puts the last (feature) dimension second to last, so the result is
    a key laid out for `query @ key` (..., dim, length) without an explicit transpose."""
    found = method_call(node, {"permute"})
    if found is None:
        return False
    assert isinstance(node, cst.Call)
    dims = [number(a.value) for a in node.args]
    if len(dims) < 3 or any(d is None for d in dims) or any(a.keyword is not None or a.star for a in node.args):
        return False
    order = [int(d) % len(dims) for d in dims if d is not None]
    last = len(order) - 1
    return sorted(order) == list(range(len(order))) and order[-2] == last and order[-1] != last


def reshape_args(node: cst.BaseExpression) -> tuple[cst.BaseExpression, list[cst.Arg]] | None:
    found = method_call(node, RESHAPE_METHODS)
    if found is None:
        return None
    assert isinstance(node, cst.Call)
    return found[0], list(node.args)
