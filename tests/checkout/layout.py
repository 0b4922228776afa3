"""A contributor's Transformers checkout, laid out from a release's source distribution, and what runs in it.

The sdist has `src/` and `pyproject.toml`; for 4.40.2 the repository's own tests at that tag are laid over it
(`$SDPA_PORT_TRANSFORMERS_TESTS`). Every step runs in a subprocess with `PYTHONPATH=src`, as a contributor runs
`python -m pytest tests/models/...` in a clone; the hub is off (tests that need it fail before and after alike).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# the sdpa-port under test, wherever it is imported from here (an editable install or a worktree on sys.path)
TOOL = str(Path(__import__("sdpa_port").__file__).resolve().parents[1])


@dataclass
class Timings:
    steps: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, command: list[str], cwd: Path, timeout: int, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        completed = subprocess.run(
            command,
            cwd=cwd,
            env={**os.environ, **OFFLINE, "PYTHONPATH": os.pathsep.join([str(cwd / "src"), TOOL]), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        self.steps[name] = self.steps.get(name, 0.0) + time.perf_counter() - started
        return completed


def sdist(version: str, cache: Path) -> Path:
    """The release's source distribution, downloaded once into `cache` with pip."""
    archive = cache / f"transformers-{version}.tar.gz"
    if not archive.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-q",
                "-d",
                str(cache),
                f"transformers=={version}",
            ],
            check=True,
        )
    return archive


def model_folder(entry: str) -> str:
    """`blip/blip_text` (a second modeling file of a model folder) -> `blip`; `bert` -> `bert`."""
    return entry.split("/")[0]


def model_file(entry: str) -> str:
    """`blip/blip_text` -> `blip_text`, the name in `modeling_blip_text.py`; `bert` -> `bert`."""
    return entry.split("/")[-1]


def lay_out(archive: Path, destination: Path, overlay: Path | None, models: list[str]) -> Path:
    """Extract the sdist into `destination`, lay the repository's tests over it, and make sure `tests/models/<m>`
    exists for every model folder (the emitted tests go there)."""
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        tar.extractall(destination.parent, filter="data")
    shutil.move(str(destination.parent / top), destination)
    if overlay is not None:
        for name in ("conftest.py", "tests", "utils"):
            source = overlay / name
            if source.is_dir():
                shutil.copytree(source, destination / name, dirs_exist_ok=True)
            elif source.is_file():
                shutil.copy2(source, destination / name)
    for model in models:
        folder = destination / "tests" / "models" / model_folder(model)
        folder.mkdir(parents=True, exist_ok=True)
        for package in (destination / "tests" / "models", folder):
            (package / "__init__.py").touch()
    return destination


def snapshot(root: Path) -> dict[str, str]:
    """Every Python file under src/ and tests/, by relative path."""
    out = {}
    for top in ("src", "tests"):
        for path in (root / top).rglob("*.py"):
            out[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return out


@dataclass(frozen=True)
class PytestRun:
    outcomes: dict[str, str]  # test id -> passed / failed / skipped / error
    messages: dict[str, str]  # test id -> first line of the failure
    returncode: int
    tail: str

    def ids(self, outcome: str) -> set[str]:
        return {test for test, state in self.outcomes.items() if state == outcome}


def run_pytest(timings: Timings, name: str, root: Path, paths: list[str], report: Path, extra: list[str]) -> PytestRun:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *paths, f"--junitxml={report}", *extra]
    completed = timings.run(name, command, root, timeout=3000)
    outcomes, messages = read_junit(report) if report.is_file() else ({}, {})
    return PytestRun(outcomes, messages, completed.returncode, (completed.stdout + completed.stderr)[-4000:])


def read_junit(report: Path) -> tuple[dict[str, str], dict[str, str]]:
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
                messages[test] = (child.get("message") or "").splitlines()[0][:300] if child.get("message") else ""
            elif child.tag == "skipped":
                state = "skipped"
        outcomes[test] = state
    return outcomes, messages
