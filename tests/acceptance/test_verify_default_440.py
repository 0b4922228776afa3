"""Verifying by default (4.40.2): one file of the installed transformers is verified before it is written; a file
from anywhere else is not executed unless --verify is given. Run through the command line, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdpa_port.edge.trust import UNTRUSTED

pytestmark = pytest.mark.tf440

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"


def sdpa_port(*arguments: object) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "sdpa_port", *map(str, arguments)],
        capture_output=True, text=True, env=environment, timeout=600, check=False,
    )


def test_a_file_of_the_installed_transformers_is_verified_before_it_is_written(tmp_path: Path) -> None:
    from harness import modeling_path

    run = sdpa_port(modeling_path("distilbert"), "-o", tmp_path / "out.py", "--no-tests", "--json")
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["verified"] is True and record["unverified"] is None, record
    assert any("driven: ok" in line or "sdpa == eager: ok" in line for line in record["verification"]), record
    assert record["written"] == str(tmp_path / "out.py") and (tmp_path / "out.py").is_file()


def test_a_file_from_elsewhere_runs_only_with_verify(tmp_path: Path) -> None:
    """A modeling file whose top level leaves a marker when it is imported: ported by default without running it,
    executed (and verified) once --verify is given."""
    marker = tmp_path / "imported"
    target = tmp_path / "models" / "gpt2" / "modeling_gpt2.py"  # loaded in transformers.models.gpt2 when verified
    target.parent.mkdir(parents=True)
    source = (FIXTURES / "class_style" / "modeling_tiny_decoder.py").read_text(encoding="utf-8")
    target.write_text(f"{source}\nopen({str(marker)!r}, 'a').close()\n", encoding="utf-8")

    run = sdpa_port(target, "-o", tmp_path / "out.py", "--no-tests", "--json")
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert (record["status"], record["verified"], record["unverified"]) == ("ported", None, UNTRUSTED), record
    assert (tmp_path / "out.py").is_file() and not marker.exists()

    run = sdpa_port(target, "-o", tmp_path / "out.py", "--no-tests")
    assert run.returncode == 0 and not marker.exists()
    assert run.stderr.splitlines() == [f"not verified: {target}: {UNTRUSTED}"]

    run = sdpa_port(target, "-o", tmp_path / "verified.py", "--no-tests", "--json", "--verify")
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["verified"] is True, record
    assert marker.exists()
