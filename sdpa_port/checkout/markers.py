"""The `# Copied from` lines a port removed, found by comparing texts, and put back on their definitions."""

from __future__ import annotations

import ast

import libcst as cst

from sdpa_port.checkout import copies
from sdpa_port.checkout.text_facts import definition_at


def removed_markers(original: str, ported: str, path: str) -> list[str]:
    """The marker lines of `original` that its port no longer has."""
    kept = {line.strip() for line in ported.splitlines() if "Copied from" in line}
    lines = copies.split_lines(original)
    return [
        lines[m.line].rstrip("\n") for m in copies.find_markers(path, original) if lines[m.line].strip() not in kept
    ]


def lost_markers(original: str, final: str, path: str) -> list[str]:
    """The markers of `original` of which `final` keeps no form, not even with more replacements."""
    present = [line.strip() for line in final.splitlines() if "Copied from" in line]
    lines = copies.split_lines(original)
    out = []
    for marker in copies.find_markers(path, original):
        head = f"# Copied from {marker.qualified}"
        if not any(line == head or line.startswith(head + " ") for line in present):
            out.append(lines[marker.line].strip())
    return out


def drop_marker(text: str, comment: str) -> str:
    lines = copies.split_lines(text)
    return "".join(line for line in lines if line.strip() != comment)


def marked_definition(text: str, comment: str) -> tuple[str, str | None] | None:
    lines = copies.split_lines(text)
    tree = ast.parse(text)
    for index, line in enumerate(lines):
        if line.strip() == comment.strip():
            return definition_at(tree, index + 2)
    return None


def add_marker(text: str, where: tuple[str, str | None], comment: str) -> str | None:
    module = cst.parse_module(text)
    top, method = where
    line = cst.EmptyLine(comment=cst.Comment(comment.strip()))

    def marked(node: cst.ClassDef | cst.FunctionDef) -> cst.ClassDef | cst.FunctionDef:
        # right above `def`/`class`: the copy checker reads the definition from the line after the marker, so on a
        # decorated definition the marker goes after the decorators (where transformers puts it)
        if node.decorators:
            return node.with_changes(lines_after_decorators=[*node.lines_after_decorators, line])
        return node.with_changes(leading_lines=[*node.leading_lines, line])

    body = list(module.body)
    for index, statement in enumerate(body):
        if not isinstance(statement, (cst.ClassDef, cst.FunctionDef)) or statement.name.value != top:
            continue
        if method is None:
            body[index] = marked(statement)
            return module.with_changes(body=body).code
        if isinstance(statement, cst.ClassDef) and isinstance(statement.body, cst.IndentedBlock):
            inner = list(statement.body.body)
            for position, member in enumerate(inner):
                if isinstance(member, cst.FunctionDef) and member.name.value == method:
                    inner[position] = marked(member)
                    body[index] = statement.with_changes(body=statement.body.with_changes(body=inner))
                    return module.with_changes(body=body).code
    return None
