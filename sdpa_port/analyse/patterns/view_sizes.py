"""The `self.` attributes a class's methods give a tensor as sizes, bound by its `__init__` alone.

Before, a constructor whose `num_heads` reaches no layer, only the views of `forward`:

    def __init__(self, hidden_dim, num_heads):
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(hidden_dim, hidden_dim * 3)

    def forward(self, x):
        q = x.reshape(b, s, self.num_heads, self.head_dim)

After, `self.num_heads` and `self.head_dim` are sizes of `__init__` as the layer's are: each is an integer, or the
view fails (`view`, `reshape`, `expand` and `repeat` take integers), so `num_heads` and `hidden_dim` are declared
numbers, and `self.scale` is one. An attribute counts only where every statement of the class's in-file MRO binding
it is in this `__init__`, the class's own (not a base's one it overrides): the view then reads what `__init__` bound.
A one-argument `view(x)` may be given a dtype, and counts only with a tuple or list of sizes.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse.cstutil import assigned_values, nodes_of_type
from sdpa_port.analyse.patterns.calls import Scope, has_star_args, method_call, self_attribute_name

# tensor methods whose positional arguments, or the one sequence given, are integer sizes
_SIZED_METHODS = frozenset({"view", "reshape", "expand", "repeat"})
# operators an integer size is computed with: each operand is an integer too
SIZE_OPERATORS = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Modulo)


def attribute_sizes(init: cst.FunctionDef, scope: Scope) -> list[cst.Attribute]:
    """The `self.x` that the class's methods give a view as a size (or as an operand of one), where `init` is the
    class's `__init__` and binds `self.x` alone."""
    methods = scope.class_methods()
    if not any(method is init for method in methods):
        return []
    found: list[cst.Attribute] = []
    for method in methods:
        names = _method_names(method)
        for call in nodes_of_type(method.body, cst.Call):
            if not _tensor_method(call, names):
                continue
            for size in _view_sizes(call):
                found.extend(_operands(size))
    return [node for node in found if _bound_only_in(init, node, scope)]


def _method_names(method: cst.FunctionDef) -> frozenset[str]:
    """The names a method binds: its parameters and locals."""
    params = method.params
    declared = [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]
    declared.extend(star.name.value for star in (params.star_arg, params.star_kwarg) if isinstance(star, cst.Param))
    return frozenset(declared) | frozenset(assigned_values([method.body]))


def _tensor_method(call: cst.Call, names: frozenset[str]) -> bool:
    """A method called on a value, not a function of a module (`itertools.repeat(x, n)`, `torch.reshape(x, s)`):
    the receiver is computed (`q.transpose(1, 2).view(...)`), or a dotted name whose head the method binds."""
    if not isinstance(call.func, cst.Attribute):
        return False
    receiver = get_full_name_for_node(call.func.value)
    return receiver is None or receiver.partition(".")[0] in names


def _view_sizes(call: cst.Call) -> list[cst.BaseExpression]:
    if method_call(call, _SIZED_METHODS) is None or has_star_args(call):
        return []
    positional = [a.value for a in call.args if a.keyword is None]
    if len(positional) == 1 and isinstance(positional[0], (cst.Tuple, cst.List)):
        return [e.value for e in positional[0].elements if not isinstance(e, cst.StarredElement)]
    if len(positional) == 1 and method_call(call, {"view"}) is not None:
        return []  # `x.view(dtype)`
    return positional


def _operands(size: cst.BaseExpression) -> list[cst.Attribute]:
    """The `self.x` a size is computed from through sums, products and floor divisions."""
    out: list[cst.Attribute] = []
    pending = [size]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, SIZE_OPERATORS):
            pending.extend((node.left, node.right))
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            pending.append(node.expression)
        elif isinstance(node, cst.Attribute) and self_attribute_name(node) is not None:
            out.append(node)
    return out


def _bound_only_in(init: cst.FunctionDef, node: cst.Attribute, scope: Scope) -> bool:
    bindings = scope.self_attribute_bindings(node.attr.value)
    return bool(bindings) and all(b.method is init for b in bindings)
