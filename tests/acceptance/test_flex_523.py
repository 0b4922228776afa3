"""Flex attention, claimed by an interface-style port only after it ran and matched eager inside 5.23.0.

Each test compiles flex attention for one tiny model (half a minute or so on a CPU), so only XGLM is run here; the
census runs the check on every port.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness import load, modeling_path, port_file, sabotage_interface
from sdpa_port.result import PortResult, Status, Style

pytestmark = pytest.mark.tf523


def test_a_port_claims_flex_after_it_ran(tmp_path: Path) -> None:
    """`sdpa-port xglm --verify` writes `_supports_flex_attn = True` and says flex ran; the written file builds with
    flex attention (5.23.0 raises a ValueError for a class without the flag)."""
    written = tmp_path / "modeling_xglm.py"
    command = [sys.executable, "-m", "sdpa_port", "xglm", "-o", str(written), "--no-tests", "--json", "--verify"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.splitlines()[-1])
    assert any("_supports_flex_attn = True (flex attention ran" in note for note in report["notes"]), report["notes"]
    assert any("flex_attention executed: ok" in line for line in report["verification"]), report["verification"]
    module = load("xglm", written.read_text(encoding="utf-8"), tmp_path, tag="flex")
    assert module.XGLMPreTrainedModel._supports_flex_attn is True
    from sdpa_port.verify.checks import build
    from sdpa_port.verify.configs import tiny_config

    build(module.XGLMModel, tiny_config(module.XGLMConfig), "flex_attention")


def test_without_flex_the_port_does_not_claim_it(tmp_path: Path) -> None:
    """--no-flex skips the check, and the port then sets no `_supports_flex_attn`."""
    written = tmp_path / "modeling_xglm.py"
    command = [sys.executable, "-m", "sdpa_port", "xglm", "-o", str(written), "--no-tests", "--verify", "--no-flex"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "_supports_flex_attn" not in written.read_text(encoding="utf-8")
    assert "_supports_sdpa = True" in written.read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", ["flex_scale", "flex_bypass"])
def test_a_flex_path_that_is_wrong_is_not_claimed(kind: str) -> None:
    """A port right under SDPA and eager but wrong under flex attention (its scaling halved there only), or one whose
    flex attention runs past the dispatch the check counts: verified, but flex is not claimed, and why is said."""
    from sdpa_port.edge.after_port import verify_port
    from sdpa_port.edge.runner import claim_flex

    path = modeling_path("xglm")
    source = path.read_text(encoding="utf-8")
    ported = PortResult(Status.PORTED, sabotage_interface(port_file("xglm"), kind), Style.INTERFACE)
    verification = verify_port(path, source, ported, flex=True)
    assert verification.passed, verification.lines
    assert verification.flex_classes == ()
    expected = "flex_attention == eager: FAILED" if kind == "flex_scale" else "flex_attention executed: FAILED"
    assert expected in verification.flex_why, verification.flex_why
    claimed, _ = claim_flex(replace(ported, warnings=()), None, verification.flex_classes, verification.flex_why)
    assert "_supports_flex_attn" not in claimed.source
    assert any(w.startswith("flex attention not claimed") for w in claimed.warnings), claimed.warnings
