"""The files of a checkout as text, read from a directory with pending edits laid over it or not.

The copy checker and the family planner read sources through `Sources` only, so they can judge a tree before it is
written (an `Overlay`) and run in tests on a dict of strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Protocol

# what `make repo-consistency` checks for copies: the library and the model tests
SCANNED = ("src/transformers", "tests/models")


class Sources(Protocol):
    def read(self, path: str) -> str | None:
        """The text of a file given relative to the checkout root with `/` separators, or None when absent."""
        ...

    def paths(self) -> list[str]:
        """Every Python file under `SCANNED`, sorted."""
        ...


@dataclass
class Directory:
    """A checkout on disk; texts are cached once read."""

    root: Path
    _cache: dict[str, str | None] = field(default_factory=dict, repr=False)

    def read(self, path: str) -> str | None:
        if path not in self._cache:
            try:
                self._cache[path] = (self.root / path).read_text(encoding="utf-8")
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                self._cache[path] = None
        return self._cache[path]

    def paths(self) -> list[str]:
        found: list[str] = []
        for top in SCANNED:
            base = self.root / top
            if base.is_dir():
                found.extend(p.relative_to(self.root).as_posix() for p in base.rglob("*.py") if p.is_file())
        return sorted(found)


@dataclass
class Overlay:
    """`base` with some files replaced or added by in-memory texts."""

    base: Sources
    edits: Mapping[str, str]

    def read(self, path: str) -> str | None:
        return self.edits[path] if path in self.edits else self.base.read(path)

    def paths(self) -> list[str]:
        extra = [p for p in self.edits if p.startswith(tuple(f"{top}/" for top in SCANNED)) and p.endswith(".py")]
        return sorted(set(self.base.paths()) | set(extra))


@dataclass(frozen=True)
class Texts:
    """A tree given as a dict of texts, for tests and pure callers."""

    files: Mapping[str, str]

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def paths(self) -> list[str]:
        return sorted(p for p in self.files if p.endswith(".py") and p.startswith(tuple(f"{t}/" for t in SCANNED)))


def module_path(dotted: str, sources: Sources, base: str = "src/transformers") -> tuple[str, list[str]] | None:
    """The file a dotted name's module lies in, and the names inside it.

    `models.bert.modeling_bert.BertAttention.forward` -> (`src/.../modeling_bert.py`, [`BertAttention`, `forward`]):
    the shortest leading part of the dotted name that is a file under `base`.
    """
    parts = dotted.split(".")
    for index in range(1, len(parts)):
        candidate = f"{base}/{'/'.join(parts[:index])}.py"
        if sources.read(candidate) is not None:
            return candidate, parts[index:]
    return None


def relative_module(path: str, base: str = "src/transformers") -> str | None:
    """The dotted module of a path under `base`, or None outside it.

    `src/transformers/models/bert/modeling_bert.py` -> `models.bert.modeling_bert`.
    """
    prefix = f"{base}/"
    if not path.startswith(prefix) or not path.endswith(".py"):
        return None
    return path[len(prefix) : -len(".py")].replace("/", ".")


def changed(before: Sources, after: Sources, paths: Iterable[str]) -> list[str]:
    return [p for p in paths if before.read(p) != after.read(p)]
