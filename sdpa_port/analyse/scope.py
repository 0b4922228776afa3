"""The names of the function being traced, as the recognisers of `patterns` read them.

`FunctionScope` answers `patterns.Scope` for the tracer: a local holds what the tracer's environment says, a
`self.` attribute what the class's methods assign it, a qualified name what the module imports.
"""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import AnyExpr, ExprVal, ScalarVal, Value
from sdpa_port.analyse.module_facts import Binding, ModuleFacts
from sdpa_port.analyse.product_modules import module_product


class FunctionScope:
    """Names as the tracer currently knows them, plus `self.` attributes from the class's methods."""

    def __init__(self, facts: ModuleFacts, class_name: str | None, env: dict[str, Value]) -> None:
        self.facts = facts
        self.class_name = class_name
        self.env = env
        self._evaluating: set[str] = set()

    def qualify(self, node: cst.CSTNode) -> str | None:
        return self.facts.imports.qualify(node)

    def self_attribute(self, name: str) -> cst.BaseExpression | None:
        if self.class_name is None:
            return None
        return self.facts.find_attribute(self.class_name, name)

    def self_attribute_values(self, name: str) -> tuple[cst.BaseExpression, ...]:
        if self.class_name is None:
            return ()
        return self.facts.find_attribute_values(self.class_name, name)

    def self_attribute_bindings(self, name: str) -> tuple[Binding, ...]:
        if self.class_name is None:
            return ()
        return self.facts.find_attribute_bindings(self.class_name, name)

    def product(self, node: cst.BaseExpression) -> p.Product | None:
        """The product of two tensors `node` computes: written out, or by a module of the file that only multiplies."""
        return p.product(node, self) or module_product(node, self.facts, self.class_name, self)

    def local_value(self, name: str) -> cst.BaseExpression | None:
        value = self.env.get(name)
        return value.node if isinstance(value, ExprVal) else None

    def module_function(self, name: str) -> cst.FunctionDef | None:
        return None if name in self.env else self.facts.functions.get(name)

    def class_init(self, name: str) -> cst.FunctionDef | None:
        found = None if name in self.env or name not in self.facts.classes else self.facts.find_method(name, "__init__")
        return None if found is None else found[1]

    def class_methods(self) -> tuple[cst.FunctionDef, ...]:
        if self.class_name is None:
            return ()
        resolved: dict[str, cst.FunctionDef] = {}
        for info in self.facts.mro(self.class_name):
            for name, method in info.methods.items():
                resolved.setdefault(name, method)
        return tuple(resolved.values())

    def local_values(self, name: str) -> tuple[cst.BaseExpression, ...]:
        """What a local may hold: its one expression, or each of the expressions its paths assign."""
        value = self.env.get(name)
        if isinstance(value, ExprVal):
            return (value.node,)
        return value.nodes if isinstance(value, AnyExpr) else ()

    def local_is_scalar(self, name: str) -> bool:
        value = self.env.get(name)
        if isinstance(value, ScalarVal):
            return True
        if not isinstance(value, ExprVal) or name in self._evaluating:
            return False
        self._evaluating.add(name)
        try:
            return p.scalar(value.node, self) is not None
        finally:
            self._evaluating.discard(name)

    def local_is_optional_scalar(self, name: str) -> bool:
        """Only numbers are known of the traced function's names: a parameter defaulting to None holds what the
        caller passes."""
        return self.local_is_scalar(name)
