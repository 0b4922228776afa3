"""Apply a transformer to selected top-level statements only (a whole-module visit costs a second per file)."""

from __future__ import annotations

from typing import Callable

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


Predicate = Callable[[cst.BaseStatement], bool]
