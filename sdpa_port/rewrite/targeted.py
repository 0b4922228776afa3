"""Apply a transformer to selected top-level statements only (a whole-module visit costs a second per file)."""

from __future__ import annotations

import libcst as cst


def top_level_name(statement: cst.BaseStatement) -> str | None:
    if isinstance(statement, (cst.ClassDef, cst.FunctionDef)):
        return statement.name.value
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            return small.targets[0].target.value
    return None


def transform_named(
    module: cst.Module, names: set[str] | frozenset[str], transformer: cst.CSTTransformer
) -> cst.Module:
    """Run `transformer` over the top-level statements whose name is in `names`."""
    body = []
    changed = False
    for statement in module.body:
        if top_level_name(statement) in names:
            new = statement.visit(transformer)
            changed = changed or new is not statement
            body.append(new)
        else:
            body.append(statement)
    return module.with_changes(body=body) if changed else module


def visit_named(module: cst.Module, names: set[str] | frozenset[str], visitor: cst.CSTVisitor) -> None:
    for statement in module.body:
        if top_level_name(statement) in names:
            statement.visit(visitor)


class ScopedTransformer(cst.CSTTransformer):
    """A transformer that knows the enclosing top-level class and the innermost function as it goes."""

    def __init__(self) -> None:
        self.classes: list[str] = []
        self.functions: list[cst.FunctionDef] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.functions.pop()
        return updated

    @property
    def owner(self) -> str:
        return self.classes[0] if self.classes else "<module>"

    def parameter_in_scope(self, name: str) -> bool:
        """The innermost enclosing function has a parameter of that name."""
        if not self.functions:
            return False
        params = self.functions[-1].params
        return any(p.name.value == name for p in [*params.posonly_params, *params.params, *params.kwonly_params])
