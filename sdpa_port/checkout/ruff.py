"""The checkout's pinned ruff, run on texts: its findings and its formatting, judged against the original file.

A port must not add what `make quality` (ruff check, ruff format --check) would reject. Findings are compared with
those of the original text (a rule already broken before the port is not the port's), and formatting changes are
reported by the lines of the port they touch. This runs processes: it belongs to the edge and the tests.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


class RuffError(Exception):
    """ruff could not be run or did not understand its input."""


@dataclass(frozen=True)
class Finding:
    code: str
    line: int  # 1-based
    message: str

    def __str__(self) -> str:
        return f"{self.line}: {self.code} {self.message}"


@dataclass(frozen=True)
class Review:
    """What the pinned ruff says about a port that it did not say about the original."""

    path: str
    findings: tuple[Finding, ...]  # lint findings the port added
    reformatted: tuple[int, ...]  # 1-based lines of the port that `ruff format` would change

    @property
    def clean(self) -> bool:
        return not self.findings and not self.reformatted

    def lines(self, named: bool = True) -> list[str]:
        """One line per finding and one for formatting.

        A finding reads `path:line: CODE message`; `named=False` drops the path.
        """
        where = f"{self.path}:" if named else "line "
        out = [f"{where}{f}" for f in self.findings]
        if self.reformatted:
            shown = ", ".join(str(n) for n in self.reformatted[:12]) + (" ..." if len(self.reformatted) > 12 else "")
            out.append(f"{self.path + ': ' if named else ''}ruff format would change line(s) {shown}")
        return out


@dataclass(frozen=True)
class Ruff:
    executable: str
    config: Path | None  # the checkout's pyproject.toml
    cwd: Path  # the checkout root: per-file ignores are written relative to it

    def _run(self, arguments: list[str], text: str | None = None) -> subprocess.CompletedProcess[str]:
        config = ["--config", str(self.config)] if self.config else []
        command = [self.executable, *arguments[:1], *config, *arguments[1:]]
        try:
            return subprocess.run(command, input=text, capture_output=True, text=True, cwd=self.cwd, check=False)
        except OSError as error:
            raise RuffError(f"cannot run {self.executable}: {error}") from None

    def version(self) -> str:
        completed = subprocess.run([self.executable, "--version"], capture_output=True, text=True, check=False)
        return completed.stdout.strip().split()[-1] if completed.returncode == 0 else ""

    def check(self, path: str, text: str) -> list[Finding]:
        completed = self._run(["check", "--stdin-filename", path, "--output-format", "json", "--exit-zero", "-"], text)
        try:
            items = json.loads(completed.stdout or "[]")
        except ValueError:
            raise RuffError(f"ruff check on {path}: {completed.stderr.strip() or completed.stdout[:200]}") from None
        return sorted(Finding(i["code"] or "E999", i["location"]["row"], i["message"]) for i in items)

    def format(self, path: str, text: str) -> str:
        completed = self._run(["format", "--stdin-filename", path, "-"], text)
        if completed.returncode != 0:
            raise RuffError(f"ruff format on {path}: {completed.stderr.strip()}")
        return completed.stdout

    def format_modules(self, modules: Sequence[str]) -> list[str]:
        """Many snippets formatted in one run, as the copy checker's formatting step needs."""
        if not modules:
            return []
        with tempfile.TemporaryDirectory(prefix="sdpa-port-ruff-") as directory:
            paths = [Path(directory) / f"snippet_{index}.py" for index in range(len(modules))]
            for path, text in zip(paths, modules):
                path.write_text(text, encoding="utf-8")
            completed = self._run(["format", "--silent", directory])
            if completed.returncode != 0:
                raise RuffError(f"ruff format: {completed.stderr.strip()}")
            return [path.read_text(encoding="utf-8") for path in paths]

    def review(self, path: str, before: str | None, after: str) -> Review:
        """The findings `after` adds to `before`, and the lines of `after` that formatting changes.

        `before` is None for a new file.
        """
        old = Counter((f.code, f.message) for f in self.check(path, before)) if before is not None else Counter()
        added: list[Finding] = []
        for finding in self.check(path, after):
            key = (finding.code, finding.message)
            if old[key]:
                old[key] -= 1
            else:
                added.append(finding)
        return Review(path, tuple(added), tuple(changed_lines(after, self.format(path, after))))


def changed_lines(text: str, formatted: str) -> list[int]:
    """1-based lines of `text` that differ in `formatted`."""
    lines: list[int] = []
    matcher = difflib.SequenceMatcher(a=text.splitlines(), b=formatted.splitlines(), autojunk=False)
    for tag, start, end, _, _ in matcher.get_opcodes():
        if tag != "equal":
            lines.extend(range(start + 1, end + 1) if end > start else [max(start, 1)])
    return sorted(set(lines))


def find_ruff(version: str | None, config: Path | None, cwd: Path) -> Ruff | None:
    """A ruff of exactly `version`, or None when absent or of another version.

    `$SDPA_PORT_RUFF`, else `ruff` on PATH.
    """
    if version is None:
        return None
    for candidate in (os.environ.get("SDPA_PORT_RUFF"), shutil.which("ruff")):
        if candidate:
            ruff = Ruff(candidate, config, cwd)
            if ruff.version() == version:
                return ruff
    return None
