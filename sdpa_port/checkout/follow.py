"""How a stale copy follows its ported source: the replacements, dicts and imports it needs, then the edit."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Sequence

import libcst as cst

from sdpa_port.checkout import copies
from sdpa_port.checkout.copies import Formatter, Inconsistency, Replacement, apply_replacements, marker_text
from sdpa_port.checkout.definitions import dict_statement, insert_before, replace_definition
from sdpa_port.checkout.text_facts import (
    BUILTINS,
    absolute_import,
    definition_at,
    dict_entries,
    dict_for,
    gains_flag,
    names_used,
    relative_to,
    sets_sdpa_flag,
    top_level,
)
from sdpa_port.checkout.tree import Sources
from sdpa_port.rewrite.imports import add_import_from


@dataclass(frozen=True)
class Follow:
    """How one stale copy follows its source: the replacements to use, and what its file must gain."""

    item: Inconsistency
    replacements: tuple[Replacement, ...]
    dicts: tuple[tuple[str, str], ...]  # (source dict name in the upstream file, name in this file) to add
    imports: tuple[tuple[int, str, str], ...]  # (relative level, module, name)

    def describe(self) -> str:
        marker = self.item.marker
        parts = [f"copy of {marker.qualified} (line {marker.line + 1}) follows its ported source"]
        added = [str(r) for r in self.replacements if r not in marker.replacements]
        if added:
            parts.append(f"marker gains {', '.join(added)}")
        parts.extend(f"added {name} (the entries this model has)" for _, name in self.dicts)
        parts.extend(f"imported {name}" for _, _, name in self.imports)
        return "; ".join(parts)


def follow_plan(item: Inconsistency, tree: Sources, text: str, marker_only: bool = False) -> Follow | None:
    """A plan that makes `item`'s copy hold without changing what the copying model does, or None.

    `marker_only`: the file is a port, whose code stays as the engine wrote it; only the marker's replacements may
    change (the copy must already equal its source under them, up to formatting).
    """
    marker = item.marker
    supports_sdpa = sets_sdpa_flag(text)
    if marker.test:
        return None
    try:
        upstream = copies.locate(marker.target, tree)
    except copies.Unresolved:
        return None
    lines = copies.split_lines(text)
    comparison = copies.prepare(marker, tree, lines)
    copied = "".join(lines[comparison.copy_start : comparison.copy_end])
    if copies.IGNORE in copied or "# End copy" in "".join(lines[comparison.copy_start : comparison.copy_end + 1]):
        return None
    upstream_text = tree.read(upstream.path) or ""
    upstream_names = top_level(upstream_text)
    local_names = top_level(text)
    replacements = marker.replacements
    dicts: list[tuple[str, str]] = []
    imports: list[tuple[int, str, str]] = []
    for _ in range(4):  # each added replacement may reveal another name to resolve
        code = apply_replacements(upstream.code, replacements)
        if gains_flag(code, copied):
            return None
        renamed = {
            apply_replacements(name, replacements): name for name in upstream_names.defined | upstream_names.imported
        }
        missing = sorted(
            name
            for name in names_used(code)
            if name in renamed and name not in local_names.all and name not in BUILTINS
        )
        dicts, imports, extra = [], [], ()
        for name in missing:
            source_name = renamed[name]
            if source_name in upstream_names.imported:
                module = absolute_import(upstream_text, upstream.path, source_name)
                if module is None:
                    return None
                level, dotted = relative_to(module, marker.path)
                imports.append((level, dotted, source_name))
                continue
            entries = dict_entries(upstream_text, source_name)
            if entries is None or "eager" not in entries:
                return None
            eager_here = apply_replacements(entries["eager"], replacements)
            if eager_here not in local_names.defined:
                return None
            existing = dict_for(text, eager_here)
            wanted = existing or dict_name(eager_here)
            extension = _extension(name, wanted, replacements)
            if extension:
                extra = extension
                break
            if existing is None:
                dicts.append((source_name, wanted))
        if not extra:
            if dicts and supports_sdpa:
                return None  # a dict of this model's classes without its "sdpa" entry would break it
            if marker_only and (dicts or imports or not copies.same_up_to_formatting(comparison.observed, code)):
                return None
            return Follow(item, replacements, tuple(dicts), tuple(imports))
        replacements = replacements + extra
    return None


def _extension(current: str, wanted: str, replacements: Sequence[Replacement]) -> tuple[Replacement, ...]:
    """Replacements to append so that `current`, a name after the marker's replacements, reads `wanted`.

    The repository's own form first: the upper-case spelling of a replaced name (`BERT->CLAP_TEXT` beside
    `Bert->ClapText`); else the whole name.
    """
    if current == wanted:
        return ()
    for item in replacements:
        upper = item.old.upper()
        if upper == item.old or not re.fullmatch(r"[A-Za-z0-9_]+", item.old) or upper not in current:
            continue
        before, _, after = current.partition(upper)
        if wanted.startswith(before) and wanted.endswith(after) and len(wanted) > len(before) + len(after):
            new = wanted[len(before) : len(wanted) - len(after)]
            if re.fullmatch(r"[A-Z0-9_]+", new):
                return (Replacement(upper, new),)
    return (Replacement(re.escape(current), wanted),)


def dict_name(eager_class: str) -> str:
    """The name the engine gives the dict of a class's implementations.

    `ClapTextSelfAttention` -> `CLAP_TEXT_SELF_ATTENTION_CLASSES`, so that porting this model later registers into the
    same dict.
    """
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", eager_class).upper() + "_CLASSES"


def apply_follow(text: str, follow: Follow, tree: Sources, formatter: Formatter | None) -> str | None:
    marker = follow.item.marker
    # the marker may have moved since it was found (an earlier edit of this file): find it again by its text
    found = [
        m for m in copies.find_markers(marker.path, text) if (m.target, m.pattern) == (marker.target, marker.pattern)
    ]
    if not found:
        return None
    current = min(found, key=lambda m: abs(m.line - marker.line))
    upstream = copies.locate(marker.target, tree)
    code = apply_replacements(upstream.code, follow.replacements)
    if formatter is not None and follow.replacements:
        code = copies.from_module(formatter([copies.to_module(code)])[0], code)
    module = cst.parse_module(text)
    tree_ast = ast.parse(text)
    lines = copies.split_lines(text)
    comparison = copies.prepare(current, tree, lines)
    owner = definition_at(tree_ast, comparison.copy_start + 1)
    if owner is None:
        return None
    new_marker = marker_text(current.indent, current.target, follow.replacements)
    module = replace_definition(module, owner, code, current, new_marker)
    if module is None:
        return None
    upstream_text = tree.read(upstream.path) or ""
    for source_name, name in follow.dicts:
        if name in top_level(module.code).defined:
            continue  # added for an earlier copy in this file
        statement = dict_statement(upstream_text, source_name, name, follow.replacements, top_level(text).defined)
        if statement is None:
            return None
        module = insert_before(module, owner[0], statement)
    for level, dotted, name in follow.imports:
        module = add_import_from(module, level, dotted, name)
    return module.code
