"""Insert new top-level statements (generated classes, dicts) right after a named top-level class."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

TWO_BLANK_LINES = [cst.EmptyLine(), cst.EmptyLine()]


def insert_after(module: cst.Module, anchor: str, statements: Sequence[cst.BaseStatement]) -> cst.Module:
    """Place `statements` after the top-level class or assignment named `anchor`, separated by two blank lines."""
    body: list[cst.BaseStatement] = []
    inserted = False
    for statement in module.body:
        body.append(statement)
        if not inserted and _defines(statement, anchor):
            for new in statements:
                body.append(_with_blank_lines(new))
            inserted = True
    if not inserted:
        raise KeyError(anchor)
    return module.with_changes(body=body)


def _defines(statement: cst.BaseStatement, name: str) -> bool:
    if isinstance(statement, (cst.ClassDef, cst.FunctionDef)):
        return statement.name.value == name
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    if isinstance(target.target, cst.Name) and target.target.value == name:
                        return True
    return False


def _with_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
    if isinstance(statement, (cst.ClassDef, cst.FunctionDef)):
        return statement.with_changes(leading_lines=TWO_BLANK_LINES, lines_after_decorators=[])
    if isinstance(statement, (cst.SimpleStatementLine, cst.If)):
        return statement.with_changes(leading_lines=TWO_BLANK_LINES)
    return statement
