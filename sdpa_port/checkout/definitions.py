"""Edits of a module's top-level definitions as trees: replace one, insert a dict before one."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from sdpa_port.checkout import copies
from sdpa_port.checkout.copies import Replacement, apply_replacements


def _parsed_definition(code: str) -> cst.ClassDef | cst.FunctionDef | None:
    module = cst.parse_module(copies.to_module(code))
    node = module.body[0]
    if copies.leading_indent(code):
        assert isinstance(node, cst.ClassDef) and isinstance(node.body, cst.IndentedBlock)
        node = node.body.body[0]
    return node if isinstance(node, (cst.ClassDef, cst.FunctionDef)) else None


def replace_definition(
    module: cst.Module, owner: tuple[str, str | None], code: str, marker: copies.Marker, new_marker: str
) -> cst.Module | None:
    replacement = _parsed_definition(code)
    if replacement is None:
        return None
    old_comment = f"# Copied from {'tests' if marker.test else 'transformers'}.{marker.target}"

    def remarked(lines: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
        return [
            line.with_changes(comment=cst.Comment(new_marker.strip()))
            if line.comment is not None and line.comment.value.startswith(old_comment)
            else line
            for line in lines
        ]

    def swap(node: cst.ClassDef | cst.FunctionDef) -> cst.ClassDef | cst.FunctionDef:
        return replacement.with_changes(
            name=node.name,
            leading_lines=remarked(node.leading_lines),
            decorators=node.decorators,
            lines_after_decorators=remarked(node.lines_after_decorators),
        )

    top, method = owner
    body = list(module.body)
    for index, statement in enumerate(body):
        if not isinstance(statement, (cst.ClassDef, cst.FunctionDef)) or statement.name.value != top:
            continue
        if method is None:
            body[index] = swap(statement)
            return module.with_changes(body=body)
        if not isinstance(statement, cst.ClassDef) or not isinstance(statement.body, cst.IndentedBlock):
            return None
        inner = list(statement.body.body)
        for position, member in enumerate(inner):
            if isinstance(member, cst.FunctionDef) and member.name.value == method:
                inner[position] = swap(member)
                body[index] = statement.with_changes(body=statement.body.with_changes(body=inner))
                return module.with_changes(body=body)
    return None


def dict_statement(
    upstream_text: str, source_name: str, name: str, replacements: Sequence[Replacement], defined: frozenset[str]
) -> cst.SimpleStatementLine | None:
    """The upstream dict under the replacements, keeping the entries whose classes this file defines."""
    for statement in cst.parse_module(upstream_text).body:
        if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(statement.body[0], cst.Assign):
            continue
        assign = statement.body[0]
        target = assign.targets[0].target
        if not (isinstance(target, cst.Name) and target.value == source_name and isinstance(assign.value, cst.Dict)):
            continue
        elements = []
        original = list(assign.value.elements)
        for element in original:
            if not isinstance(element, cst.DictElement) or not isinstance(element.value, cst.Name):
                return None
            value = apply_replacements(element.value.value, replacements)
            if value in defined:
                elements.append(element.with_changes(value=cst.Name(value)))
        if not elements:
            return None
        elements[-1] = elements[-1].with_changes(comma=original[-1].comma)
        return cst.SimpleStatementLine(
            body=[
                assign.with_changes(
                    targets=[cst.AssignTarget(cst.Name(name))], value=assign.value.with_changes(elements=elements)
                )
            ],
            leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
        )
    return None


def insert_before(module: cst.Module, top: str, statement: cst.SimpleStatementLine) -> cst.Module:
    body = list(module.body)
    for index, node in enumerate(body):
        if isinstance(node, (cst.ClassDef, cst.FunctionDef)) and node.name.value == top:
            body.insert(index, statement)
            return module.with_changes(body=body)
    return module
