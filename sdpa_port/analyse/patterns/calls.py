"""Read a call: its arguments, the method it calls, the `self.` attribute it names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.patterns.functions import DTYPE_CASTS, RESHAPE_METHODS

if TYPE_CHECKING:
    from sdpa_port.analyse.module_facts import Binding

is_self = m.Name("self")


class Scope(Protocol):
    """What the recognisers need to know about names in the function being read."""

    def qualify(self, node: cst.CSTNode) -> str | None: ...

    def self_attribute(self, name: str) -> cst.BaseExpression | None: ...

    def local_value(self, name: str) -> cst.BaseExpression | None: ...

    def local_is_scalar(self, name: str) -> bool: ...

    def local_is_optional_scalar(self, name: str) -> bool:
        """The name holds a number or None (`qk_scale=None`, a constructor's override of a number)."""
        ...

    def self_attribute_values(self, name: str) -> tuple[cst.BaseExpression, ...]: ...

    def self_attribute_bindings(self, name: str) -> tuple[Binding, ...]: ...

    def module_function(self, name: str) -> cst.FunctionDef | None: ...

    def class_init(self, name: str) -> cst.FunctionDef | None:
        """The `__init__` of a class of the file."""
        ...

    def class_methods(self) -> tuple[cst.FunctionDef, ...]:
        """The methods the class being read runs: its own and those of its in-file bases it does not override."""
        ...


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
    """The receiver and method name of `x.name(...)`, when the name is in `names` or `names` is None."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        name = node.func.attr.value
        if names is None or name in names:
            return node.func.value, name
    return None


def self_attribute_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Attribute) and m.matches(node.value, is_self):
        return node.attr.value
    return None


def reshape_args(node: cst.BaseExpression) -> tuple[cst.BaseExpression, list[cst.Arg]] | None:
    found = method_call(node, RESHAPE_METHODS)
    if found is None:
        return None
    assert isinstance(node, cst.Call)
    return found[0], list(node.args)


def cast_operand(term: cst.BaseExpression) -> str | None:
    """The name an additive term adds, through dtype casts.

    `mask`, `mask.to(dtype)`, `mask.type_as(x)` -> "mask".
    """
    while isinstance(term, cst.Call) and isinstance(term.func, cst.Attribute) and term.func.attr.value in DTYPE_CASTS:
        term = term.func.value
    return term.value if isinstance(term, cst.Name) else None
