"""Fill values a method of the class returns: `masked_fill(mask, self._get_mask_value())`, read as what it returns.

`forms/fills.py` judges a fill by the values `helper_fill_values` gives (all very negative, all absorbing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.cstutil import nodes_of_type

if TYPE_CHECKING:
    from sdpa_port.analyse.module_facts import Binding
    from sdpa_port.analyse.tracing import TracerView


def helper_fill_values(
    tracer: TracerView, fill: cst.BaseExpression
) -> tuple[tuple[cst.BaseExpression, ...], p.Scope] | None:
    """What a fill value returned by a method of the class may be, and the scope to read it in; None when `fill` is
    no call of such a method (it is then read as it is).

    `self._get_mask_value(...)`: every expression the method returns, a name the method assigns once read as its
    value, and `self.x` as each value the class assigns `self.x` but `None` (a fill of None raises: eager never runs
    with it), as GPTBigCode's cached `torch.full([], torch.finfo(dtype).min, ...)`. A method with no return, or one
    returning anything else, gives an expression the fill tests then refuse (M201). The values are read without the
    caller's locals: a name of the method is not one of the caller's.
    """
    if isinstance(fill, cst.Name):
        local = tracer.scope.local_value(fill.value)  # `mask_value = self._get_mask_value(...)`, then the fill
        fill = local if local is not None else fill
    if not isinstance(fill, cst.Call) or tracer.class_name is None:
        return None
    method = p.self_attribute_name(fill.func)
    found = tracer.facts.find_method(tracer.class_name, method) if method is not None else None
    if found is None:
        return None
    function = found[1]
    assigned: dict[str, list[cst.BaseExpression]] = {}
    for assign in nodes_of_type(function, cst.Assign):
        for target in assign.targets:
            if isinstance(target.target, cst.Name):
                assigned.setdefault(target.target.value, []).append(assign.value)
    values: list[cst.BaseExpression] = []
    returned = [node.value for node in nodes_of_type(function, cst.Return)]
    for value in returned or [None]:
        if isinstance(value, cst.Name) and len(assigned.get(value.value, [])) == 1:
            value = assigned[value.value][0]
        attribute = p.self_attribute_name(value) if value is not None else None
        if attribute is not None:
            held = [v for v in tracer.scope.self_attribute_values(attribute) if not m.matches(v, m.Name("None"))]
            values.extend(held or [cst.Name("None")])
        else:
            values.append(value if value is not None else cst.Name("None"))
    return tuple(values), _MethodScope(tracer.scope)


class _MethodScope:
    """Names as a method of the class reads them: imports and `self.` attributes, none of the caller's locals."""

    def __init__(self, scope: p.Scope) -> None:
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
        return False

    def local_is_optional_scalar(self, name: str) -> bool:
        return False

    def self_attribute_bindings(self, name: str) -> tuple[Binding, ...]:
        return self.scope.self_attribute_bindings(name)

    def module_function(self, name: str) -> cst.FunctionDef | None:
        return self.scope.module_function(name)

    def class_init(self, name: str) -> cst.FunctionDef | None:
        return self.scope.class_init(name)

    def class_methods(self) -> tuple[cst.FunctionDef, ...]:
        return self.scope.class_methods()
