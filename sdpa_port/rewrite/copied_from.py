"""Remove `# Copied from` markers from the definitions a port changed, unless the copy provably still matches.

Each removal is a warning of the result (never silent); inside a checkout the edge puts a marker back where the
whole tree shows it still holds.

`make fix-copies` in transformers would otherwise overwrite the port with its (eager) source, and `make
repo-consistency` would fail. Only the top-level definitions that differ between the original and the ported
module are looked at; the markers are located with `ast` and removed from the libcst tree (which is parsed only
when there is one to remove).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import TypeVar

import libcst as cst

from sdpa_port.discover.modular import Marker, find_markers
from sdpa_port.result import PortResult
from sdpa_port.rewrite.targeted import top_level_name, transform_named

MARKER_TEXT = "Copied from"


@dataclass(frozen=True)
class Decision:
    marker: Marker
    kept: bool  # the copy still matches its source (same file, replacements applied) after the port


def reconcile_copied_from(
    original: str, result: PortResult, filename: str | None = None, before: ast.Module | None = None
) -> PortResult:
    """`result` (a successful port of `original`, whose ast `before` may be passed) with stale markers removed and
    the upstreams of the ported classes reported."""
    if MARKER_TEXT not in original:
        return result
    before = before if before is not None else ast.parse(original)
    before_markers = find_markers(before, original.splitlines())
    if not before_markers:
        return result
    notes = [
        f"{marker.owner} is copied from {marker.copied.described}: port the upstream class as well"
        for marker in before_markers
        if marker.method is None and marker.owner in result.attention_classes
    ]
    after = ast.parse(result.source)
    decisions = decide(before, after, result.source, this_module(filename))
    stale = [d.marker for d in decisions if not d.kept]
    source = remove_markers(cst.parse_module(result.source), stale).code if stale else result.source
    removed: list[str] = []
    for decision in decisions:
        marker = decision.marker
        if decision.kept:
            notes.append(f"kept the `# Copied from` marker on {marker.where}: it still matches {marker.copied.described}")
        else:
            removed.append(
                f"removed the `# Copied from {marker.copied.qualified}` marker on {marker.where}: "
                "the port changed it, so it no longer matches its source"
            )
    return replace(result, source=source, notes=result.notes + tuple(notes), warnings=result.warnings + tuple(removed))


def this_module(filename: str | None) -> str | None:
    """The module name markers use for this file's own code: its stem (`modeling_bert`)."""
    return PurePath(filename).stem if filename else None


def decide(before: ast.Module, after: ast.Module, after_source: str, module: str | None) -> list[Decision]:
    """A decision for each marker of the ported module that sits on a definition the port changed."""
    old = _definitions(before)
    new = _definitions(after)
    decisions: list[Decision] = []
    for marker in find_markers(after, after_source.splitlines()):
        key = (marker.owner, marker.method)
        if key not in new or (key in old and _same(old[key], new[key])):
            continue
        decisions.append(Decision(marker, _still_matches(marker, new, after_source, module)))
    return decisions


Key = tuple[str, "str | None"]


def _definitions(tree: ast.Module) -> dict[Key, ast.AST]:
    out: dict[Key, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out[(node.name, None)] = node
            if isinstance(node, ast.ClassDef):
                for inner in node.body:
                    if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        out[(node.name, inner.name)] = inner
    return out


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _still_matches(marker: Marker, definitions: dict[Key, ast.AST], source: str, module: str | None) -> bool:
    """Provable only when the source is in this same file: its ported code, replaced, must equal the copy's."""
    parts = marker.copied.target.split(".")
    if module is None or module not in parts[:-1]:
        return False
    parts = parts[parts.index(module) + 1 :]
    if len(parts) > 2:
        return False
    upstream = definitions.get((parts[0], parts[1] if len(parts) == 2 else None))
    copy = definitions.get((marker.owner, marker.method))
    if upstream is None or copy is None or upstream is copy:
        return False
    upstream_code = ast.get_source_segment(source, upstream)
    copy_code = ast.get_source_segment(source, copy)
    return upstream_code is not None and copy_code is not None and marker.copied.apply(upstream_code) == copy_code


def remove_markers(module: cst.Module, markers: list[Marker]) -> cst.Module:
    """Drop each marker's comment line from its definition (top-level statements named by the markers only)."""
    if not markers:
        return module
    module = transform_named(module, {m.owner for m in markers}, _RemoveMarkers(markers))
    first = top_level_name(module.body[0]) if module.body else None
    header = {m.copied.text for m in markers if m.owner == first and m.method is None}
    if header:  # comments above the first statement of a file belong to the module's header
        kept = [line for line in module.header if line.comment is None or line.comment.value.strip() not in header]
        module = module.with_changes(header=kept)
    return module


class _RemoveMarkers(cst.CSTTransformer):
    def __init__(self, markers: list[Marker]) -> None:
        self.comments: dict[Key, set[str]] = {}
        for marker in markers:
            self.comments.setdefault((marker.owner, marker.method), set()).add(marker.copied.text)
        self.stack: list[tuple[bool, str]] = []  # (is a class, name) of the definitions we are inside

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.append((True, node.name.value))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.append((False, node.name.value))

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        return self._leave(updated)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        return self._leave(updated)

    def _leave(self, node: Definition) -> Definition:
        _, name = self.stack.pop()
        if not self.stack:
            key: Key = (name, None)
        elif len(self.stack) == 1 and self.stack[0][0]:
            key = (self.stack[0][1], name)
        else:
            return node
        comments = self.comments.get(key)
        if not comments:
            return node

        def keep(line: cst.EmptyLine) -> bool:
            return line.comment is None or line.comment.value.strip() not in comments

        return node.with_changes(
            leading_lines=[line for line in node.leading_lines if keep(line)],
            lines_after_decorators=[line for line in node.lines_after_decorators if keep(line)],
        )


Definition = TypeVar("Definition", cst.ClassDef, cst.FunctionDef)
