"""Where a file's code comes from: the modular file a modeling file is generated from, and `# Copied from` markers.

Transformers writes a banner at the top of every modeling file it generates from a `modular_*.py`, and marks code
kept in sync with another model by `# Copied from transformers.<module>.<Name> with A->B` (checked by its
`make fix-copies`). Both are comments, so they are read from the text; nothing here edits anything.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from pathlib import PurePath

from sdpa_port.result import PortResult

_BANNER = re.compile(r"This file was automatically generated from (\S+?\.py)")
_MARKER = re.compile(r"^\s*#\s*Copied from\s+transformers\.(\S+\.\S+)\s*(.*)$")
_REPLACEMENT = re.compile(r"^\s*(\S+)->(\S+)(\s+all-casing)?\s*$")


def generated_from(source: str) -> str | None:
    """The modular file named in the generated-file banner of the leading comment block, else None."""
    for line in source.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return None
        found = _BANNER.search(stripped)
        if found:
            return found.group(1)
    return None


def is_modular(filename: str | None) -> bool:
    return filename is not None and PurePath(filename).name.startswith("modular_")


@dataclass(frozen=True)
class CopiedFrom:
    """One `# Copied from transformers.<target> [with A->B, C->D all-casing]` marker."""

    target: str  # dotted, below `transformers.`: models.bert.modeling_bert.BertSelfAttention
    replacements: tuple[tuple[str, str, bool], ...]  # (old, new, all casings)
    text: str  # the comment as written, stripped

    @property
    def qualified(self) -> str:
        return f"transformers.{self.target}"

    @property
    def described(self) -> str:
        if not self.replacements:
            return self.qualified
        pairs = ", ".join(f"{a}->{b}{' all-casing' if every else ''}" for a, b, every in self.replacements)
        return f"{self.qualified} with {pairs}"

    def apply(self, code: str) -> str:
        """The upstream code as the copy should read it: the replacements `make fix-copies` applies, in order."""
        for old, new, every in self.replacements:
            code = code.replace(old, new)
            if every:
                code = code.replace(old.lower(), new.lower()).replace(old.upper(), new.upper())
        return code


def parse_marker(comment: str) -> CopiedFrom | None:
    """The marker in a comment line, or None. Parts after `with` that are no `A->B` are ignored, as transformers'
    own copy checker does."""
    found = _MARKER.match(comment)
    if found is None:
        return None
    target, rest = found.group(1), found.group(2).strip()
    replacements: list[tuple[str, str, bool]] = []
    if rest.startswith("with "):
        for part in rest[len("with ") :].split(","):
            pair = _REPLACEMENT.match(part)
            if pair is not None:
                replacements.append((pair.group(1), pair.group(2), pair.group(3) is not None))
    return CopiedFrom(target, tuple(replacements), comment.strip())


@dataclass(frozen=True)
class Marker:
    """A marker on a top-level class or function (`method` None) or on a method of a top-level class."""

    owner: str
    method: str | None
    copied: CopiedFrom

    @property
    def where(self) -> str:
        return self.owner if self.method is None else f"{self.owner}.{self.method}"


Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def find_markers(tree: ast.Module, lines: list[str]) -> list[Marker]:
    """Markers in the comment lines right above each top-level definition and each method (or its decorators)."""
    out: list[Marker] = []
    for node in tree.body:
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        out.extend(Marker(node.name, None, copied) for copied in _markers_above(node, lines))
        if isinstance(node, ast.ClassDef):
            for inner in node.body:
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.extend(Marker(node.name, inner.name, copied) for copied in _markers_above(inner, lines))
    return out


def _markers_above(node: Definition, lines: list[str]) -> list[CopiedFrom]:
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    found: list[CopiedFrom] = []
    # comment lines between the decorators and the definition
    for number in range(first, node.lineno):
        copied = parse_marker(lines[number - 1])
        if copied is not None:
            found.append(copied)
    # the comment block directly above
    number = first - 1
    while number >= 1 and lines[number - 1].strip().startswith("#"):
        copied = parse_marker(lines[number - 1])
        if copied is not None:
            found.append(copied)
        number -= 1
    return found


def note_modular_origin(source: str, result: PortResult, filename: str | None) -> PortResult:
    """A port of a generated modeling file warns that the change belongs in its modular file; a port of a modular
    file notes that the modeling file is to be regenerated from it."""
    modular = generated_from(source)
    if modular is not None:
        warning = (
            f"this file is generated from {modular}: make the change there and regenerate this file "
            "(utils/modular_model_converter.py), or the next regeneration undoes it"
        )
        return replace(result, warnings=result.warnings + (warning,))
    if is_modular(filename):
        generated = PurePath(filename or "").name.replace("modular_", "modeling_", 1)
        note = f"ported a modular file: regenerate {generated} from it (utils/modular_model_converter.py)"
        return replace(result, notes=result.notes + (note,))
    return result
