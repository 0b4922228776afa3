"""The batch runs the corpus tests look at: the CLI in a subprocess, its JSON records, exit code and stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RELEASES = ("4.40.2", "5.23.0")
RUN_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Run:
    code: int
    records: list[dict]
    stderr: str

    def by_status(self, status: str) -> list[dict]:
        return [r for r in self.records if r["status"] == status]


@dataclass(frozen=True)
class Corpus:
    version: str
    wheel: Path
    pristine: Path  # the extracted tree, never written
    tree: Path  # the copy the batch ported in place
    first: Run  # `sdpa-port TREE --json`
    second: Run  # `sdpa-port TREE --check --json`, after the first

    def relative(self, path: str) -> Path:
        return Path(path).relative_to(self.tree)


def sdpa_port(*arguments: str) -> Run:
    completed = subprocess.run(
        [sys.executable, "-m", "sdpa_port", *arguments],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )
    records = [json.loads(line) for line in completed.stdout.splitlines()]
    return Run(completed.returncode, records, completed.stderr)
