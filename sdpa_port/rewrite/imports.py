"""Add the imports a port needs by editing top-level import lines only.

libcst's AddImportsVisitor would do the same with a whole-module visit, which costs more than the rest of a port.
"""

from __future__ import annotations

from typing import Iterable

import libcst as cst
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse.names import ImportMap


def sibling_module(imports: ImportMap, basename: str) -> tuple[str, int]:
    """Where a transformers top-level module (e.g. `modeling_attn_mask_utils`) is imported from in this file."""
    for known in (basename, "modeling_utils", "utils", "activations"):
        source = imports.package_of(known)
        if source is None:
            continue
        level, dotted = source
        parts = dotted.split(".")
        parts[-1] = basename
        if known == basename:
            return dotted, level
        return ".".join(parts), level
    return f"transformers.{basename}", 0


def add_imports(module: cst.Module, imports: ImportMap, needed: Iterable[tuple[str, str | None]]) -> cst.Module:
    """`needed` holds (transformers module basename or plain module, name or None for `import module`).

    A name joins an existing `from <module> import ...` when there is one; otherwise a new import line goes after the
    last leading import of its kind.
    """
    for basename, obj in needed:
        if obj is None:
            if basename in imports.aliases:
                continue
            statement = _line(f"import {basename}")
        else:
            if obj in imports.aliases:
                continue
            dotted, level = sibling_module(imports, basename)
            extended = _extend_existing(module, dotted, level, obj)
            if extended is not None:
                module = extended
                continue
            statement = _line(f"from {'.' * level}{dotted} import {obj}")
        module = _insert_import(module, statement)
    return module


def _line(text: str) -> cst.SimpleStatementLine:
    statement = cst.parse_statement(text)
    assert isinstance(statement, cst.SimpleStatementLine)
    return statement


def _insert_import(module: cst.Module, statement: cst.SimpleStatementLine) -> cst.Module:
    body = list(module.body)
    plain = isinstance(statement.body[0], cst.Import)
    position = 0
    last_plain: int | None = None
    for index, existing in enumerate(body):
        if isinstance(existing, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in existing.body
        ):
            position = index + 1
            if isinstance(existing.body[0], cst.Import):
                last_plain = index + 1
        elif isinstance(existing, (cst.ClassDef, cst.FunctionDef)):
            break
    if plain and last_plain is not None:
        position = last_plain
    body.insert(position, statement)
    return module.with_changes(body=body)


def _extend_existing(module: cst.Module, dotted: str, level: int, obj: str) -> cst.Module | None:
    """Add `obj` to an existing top-level `from <dotted> import ...` of the same relative level."""
    body = list(module.body)
    for index, statement in enumerate(body):
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            continue
        small = statement.body[0]
        if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
            continue
        if len(small.relative) != level or small.module is None:
            continue
        if get_full_name_for_node(small.module) != dotted:
            continue
        names = list(small.names)
        last = names[-1]
        alias = cst.ImportAlias(name=cst.Name(obj), comma=last.comma)
        if small.lpar is not None and len(names) > 1 and isinstance(names[0].comma, cst.Comma):
            separator = names[0].comma
        else:
            separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        names[-1] = last.with_changes(comma=separator)
        names.append(alias)
        body[index] = statement.with_changes(body=[small.with_changes(names=names)])
        return module.with_changes(body=body)
    return None
