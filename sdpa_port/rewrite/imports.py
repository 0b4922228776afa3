"""Add the imports a port needs where isort (ruff's `I001`) puts them, inside the file's leading import block.

A name joins an existing top-level `from <module> import ...` in its sorted place; otherwise a new import line goes
into the leading block (never after a late import, `E402`) at the place of its section and module. A statement that
grows past the line length is written in the parenthesised one-name-a-line form `ruff format` gives it.
libcst's AddImportsVisitor would do the same with a whole-module visit, which costs more than the rest of a port.
"""

from __future__ import annotations

import re
import sys
from typing import Iterable, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse.names import ImportMap

LINE_LENGTH = 119  # Transformers' ruff configuration
FIRST_PARTY = "transformers"

# isort sections, in file order
FUTURE, STANDARD, THIRD_PARTY, FIRST, LOCAL = range(5)


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
    """`needed` holds (transformers module basename or plain module, name or None for `import module`)."""
    for basename, obj in needed:
        if obj is None:
            if basename in imports.aliases:
                continue
            module = _insert_import(module, _line(f"import {basename}"))
            continue
        if obj in imports.aliases:
            continue
        dotted, level = sibling_module(imports, basename)
        extended = _extend_existing(module, dotted, level, obj)
        if extended is not None:
            module = extended
            continue
        module = _insert_import(module, _line(f"from {'.' * level}{dotted} import {obj}"))
    return module


def add_import_from(module: cst.Module, level: int, dotted: str, obj: str) -> cst.Module:
    """`from <'.' * level><dotted> import <obj>`, joined to an existing line of that module or in a new sorted line."""
    extended = _extend_existing(module, dotted, level, obj)
    if extended is not None:
        return extended
    return _insert_import(module, _line(f"from {'.' * level}{dotted} import {obj}"))


# ------------------------------------------------------------------ sort keys (ruff's isort defaults)


def _natural(text: str) -> tuple[object, ...]:
    """Case-insensitive, with runs of digits compared as numbers (`layer2` < `layer10`)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text.lower()))


def member_key(name: str) -> tuple[int, tuple[object, ...]]:
    """`order-by-type`: CONSTANTS, then Classes, then everything else."""
    cased = [c for c in name if c.isalpha()]
    if len(name) > 1 and cased and all(c.isupper() for c in cased):
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return kind, _natural(name)


def section(level: int, dotted: str) -> int:
    if level:
        return LOCAL
    top = dotted.split(".")[0]
    if top == "__future__":
        return FUTURE
    if top == FIRST_PARTY:
        return FIRST
    if top in sys.stdlib_module_names:
        return STANDARD
    return THIRD_PARTY


def statement_key(small: cst.Import | cst.ImportFrom) -> tuple[object, ...]:
    """Where a statement sorts: its section, `import x` before `from x import`, furthest relative level first."""
    if isinstance(small, cst.Import):
        dotted = get_full_name_for_node(small.names[0].name) or ""
        return section(0, dotted), 0, 0, _natural(dotted)
    dotted = (get_full_name_for_node(small.module) if small.module is not None else None) or ""
    level = len(small.relative)
    return section(level, dotted), 1, -level, _natural(dotted)


# ------------------------------------------------------------------ placing statements


def _line(text: str) -> cst.SimpleStatementLine:
    statement = cst.parse_statement(text)
    assert isinstance(statement, cst.SimpleStatementLine)
    return statement


def _import_of(statement: cst.CSTNode) -> cst.Import | cst.ImportFrom | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, (cst.Import, cst.ImportFrom)):
            return small
    return None


def leading_block(body: Sequence[cst.BaseStatement]) -> tuple[int, int]:
    """(first, end) indexes of the import statements at the top of a module, after its docstring."""
    start = 0
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr):
        if isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            start = 1
    end = start
    while end < len(body) and _import_of(body[end]) is not None:
        end += 1
    return start, end


def _insert_import(module: cst.Module, statement: cst.SimpleStatementLine) -> cst.Module:
    body = list(module.body)
    first, end = leading_block(body)
    new = _import_of(statement)
    assert new is not None
    key = statement_key(new)
    position = end
    for index in range(first, end):
        existing = _import_of(body[index])
        assert existing is not None
        if statement_key(existing) > key:
            position = index
            break
    before = _import_of(body[position - 1]) if position > first else None
    after = _import_of(body[position]) if position < end else None
    same_as_after = after is not None and statement_key(after)[0] == key[0]
    blank = [cst.EmptyLine()]
    if before is None:
        # first of the block: it takes over what separated the block from what is above
        if after is not None:
            following = body[position]
            statement = statement.with_changes(leading_lines=following.leading_lines)
            body[position] = following.with_changes(leading_lines=[] if same_as_after else blank)
        elif first > 0:
            statement = statement.with_changes(leading_lines=blank)
    elif statement_key(before)[0] != key[0]:
        # first of its section: one blank line above it, and none between it and the rest of its section
        statement = statement.with_changes(leading_lines=blank)
        if same_as_after:
            body[position] = body[position].with_changes(leading_lines=[])
    body.insert(position, statement)
    return module.with_changes(body=body)


def _extend_existing(module: cst.Module, dotted: str, level: int, obj: str) -> cst.Module | None:
    """Add `obj` in sorted place to an existing top-level `from <dotted> import ...` of the same relative level."""
    body = list(module.body)
    for index, statement in enumerate(body):
        small = _import_of(statement)
        if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
            continue
        if len(small.relative) != level or small.module is None or get_full_name_for_node(small.module) != dotted:
            continue
        assert isinstance(statement, cst.SimpleStatementLine)
        body[index] = _with_name(module, statement, small, obj)
        return module.with_changes(body=body)
    return None


def _with_name(
    module: cst.Module, statement: cst.SimpleStatementLine, small: cst.ImportFrom, obj: str
) -> cst.SimpleStatementLine:
    assert not isinstance(small.names, cst.ImportStar)
    names = [(get_full_name_for_node(a.name) or "", a.asname) for a in small.names]
    position = next((i for i, (name, _) in enumerate(names) if member_key(name) > member_key(obj)), len(names))
    if "#" in module.code_for_node(small):
        # comments inside the parentheses: keep them where they are and add the name last
        return statement.with_changes(body=[_appended(small, obj)])
    aliases = [module.code_for_node(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for a in small.names]
    aliases.insert(position, obj)
    assert small.module is not None
    head = f"from {'.' * len(small.relative)}{get_full_name_for_node(small.module)} import "
    one_line = head + ", ".join(aliases)
    multi_line = small.lpar is not None and "\n" in module.code_for_node(small)
    if not multi_line and len(one_line) <= LINE_LENGTH:
        rebuilt = _line(one_line)
    else:
        rebuilt = _line(head + "(\n" + "".join(f"    {alias},\n" for alias in aliases) + ")")
    return statement.with_changes(body=rebuilt.body)


def _appended(small: cst.ImportFrom, obj: str) -> cst.ImportFrom:
    assert not isinstance(small.names, cst.ImportStar)
    names = list(small.names)
    last = names[-1]
    alias = cst.ImportAlias(name=cst.Name(obj), comma=last.comma)
    if len(names) > 1 and isinstance(names[0].comma, cst.Comma):
        separator = names[0].comma
    else:
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    names[-1] = last.with_changes(comma=separator)
    names.append(alias)
    return small.with_changes(names=names)
