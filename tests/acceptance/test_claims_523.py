"""Flex attention and fullgraph compile, claimed by an interface-style port only after each ran and matched eager.

Run inside 5.23.0. Each check compiles one tiny model (half a minute or so on a CPU), so only XGLM is run here; the
census runs the checks on every port.
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

FLEX = "_supports_flex_attn"
COMPILE = "_can_compile_fullgraph"
FLASH = "_supports_flash_attn"
# a port handed to `verify_port` as text alone carries no static proof: flash attention is withheld, whatever its run
UNPROVEN = "not a plain masked attention: the port's plan made no proof"


def test_a_port_claims_flex_after_it_ran(tmp_path: Path) -> None:
    """`sdpa-port xglm --verify` writes `_supports_flex_attn` and says flex ran (XGLM's file claims compile itself);
    the written file builds with flex attention (5.23.0 raises a ValueError for a class without the flag)."""
    written = tmp_path / "modeling_xglm.py"
    command = [sys.executable, "-m", "sdpa_port", "xglm", "-o", str(written), "--no-tests", "--json", "--verify"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.splitlines()[-1])
    assert any(f"{FLEX} = True (flex attention ran" in note for note in report["notes"]), report["notes"]
    assert not any(COMPILE in line for line in report["notes"] + report["warnings"]), report
    assert any("flex_attention executed: ok" in line for line in report["verification"]), report["verification"]
    module = load("xglm", written.read_text(encoding="utf-8"), tmp_path, tag="claimed")
    assert module.XGLMPreTrainedModel._supports_flex_attn is True
    from sdpa_port.verify.checks import build
    from sdpa_port.verify.configs import tiny_config

    build(module.XGLMModel, tiny_config(module.XGLMConfig), "flex_attention")


@pytest.mark.parametrize("model", ["bloom", "gpt_neo"])
def test_terms_handed_as_position_bias_run_under_flex(model: str, tmp_path: Path) -> None:
    """Terms of a broadcast shape handed over as `position_bias` (BLOOM's ALiBi, `(batch, heads, 1, k)`; GPT-Neo's
    causal and local-window buffer, `(1, 1, q, k)`) reach flex expanded, so flex runs, matches eager, and is
    claimed (handed as they are, flex's kernel indexed out of bounds and the flag was withheld)."""
    written = tmp_path / f"modeling_{model}.py"
    command = [sys.executable, "-m", "sdpa_port", model, "-o", str(written), "--no-tests", "--json", "--verify"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.splitlines()[-1])
    assert any("flex_attention == eager: ok" in line for line in report["verification"]), report["verification"]
    assert any(f"{FLEX} = True (flex attention ran" in note for note in report["notes"]), report["notes"]
    assert "position_bias=dispatch_bias" in written.read_text(encoding="utf-8")


def test_without_the_claim_checks_the_port_sets_no_flag(tmp_path: Path) -> None:
    """--no-claims skips the checks, and the port then sets none of their flags: CodeGen's, which claims flex and
    flash once they ran (`test_flash_523.py`), and whose file claims compile itself."""
    written = tmp_path / "modeling_codegen.py"
    command = [sys.executable, "-m", "sdpa_port", "codegen", "-o", str(written), "--no-tests", "--verify"]
    command.append("--no-claims")
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    text = written.read_text(encoding="utf-8")
    assert FLEX not in text and FLASH not in text and "_supports_sdpa = True" in text


def test_a_port_claims_compile_after_it_ran() -> None:
    """RemBERT's file does not claim fullgraph compile: its port does, once the compiled SDPA model matched eager."""
    from sdpa_port.edge.after_port import verify_port

    path = modeling_path("rembert")
    ported = PortResult(Status.PORTED, port_file("rembert"), Style.INTERFACE)
    verification = verify_port(path, path.read_text(encoding="utf-8"), ported, claims=True)
    assert verification.passed, verification.lines
    assert dict(verification.claimed)[COMPILE] == ("RemBertPreTrainedModel",), verification.lines
    assert any("torch.compile(fullgraph=True) == eager: ok" in line for line in verification.lines)


@pytest.mark.parametrize(
    "model,kind,flag,expected",
    [
        ("xglm", "flex_scale", FLEX, "flex_attention == eager: FAILED"),
        ("xglm", "flex_bypass", FLEX, "flex_attention executed: FAILED"),
        ("rembert", "graph_break", COMPILE, "torch.compile(fullgraph=True) == eager: FAILED"),
    ],
)
def test_a_path_that_is_wrong_is_not_claimed(model: str, kind: str, flag: str, expected: str) -> None:
    """A port right under SDPA and eager but wrong under flex attention (its scaling halved there only), one whose
    flex attention runs past the dispatch the check counts, or one with a graph break in its forward: verified, but
    that flag is not claimed (any other still is), and why is said."""
    from sdpa_port.edge.after_port import verify_port
    from sdpa_port.edge.runner import claim_flags

    path = modeling_path(model)
    ported = PortResult(Status.PORTED, sabotage_interface(port_file(model), kind), Style.INTERFACE)
    verification = verify_port(path, path.read_text(encoding="utf-8"), ported, claims=True)
    assert verification.passed, verification.lines
    assert flag not in dict(verification.claimed), verification.claimed
    reasons = dict(verification.not_claimed)
    assert set(reasons) == {flag, FLASH} and reasons[FLASH].startswith(UNPROVEN), reasons
    missing, why = flag, reasons[flag]
    assert missing == flag and expected in why, why
    claimed, _ = claim_flags(replace(ported, warnings=()), None, verification.claimed, verification.not_claimed)
    assert f"{flag} = True" not in claimed.source
    assert set(claimed.warnings) == {f"{flag} not claimed: {why}", f"{FLASH} not claimed: {reasons[FLASH]}"}


def test_a_claim_check_that_crashes_its_process_costs_only_the_flags() -> None:
    """The claim checks run in a child process: one dying there (CanineModel's compile ends in a native double free;
    here the port aborts when loaded in that child) leaves the verification standing and both flags unset, saying
    why."""
    from sdpa_port.edge.after_port import verify_port

    path = modeling_path("xglm")
    abort = 'import os as _os, sys as _sys\nif _sys.argv[0].endswith("claims_child.py"):\n    _os.abort()\n'
    ported = PortResult(Status.PORTED, abort + port_file("xglm"), Style.INTERFACE)
    verification = verify_port(path, path.read_text(encoding="utf-8"), ported, claims=True)
    assert verification.passed, verification.lines
    assert verification.claimed == ()
    reasons = dict(verification.not_claimed)
    assert "the checks' process died" in reasons[FLEX] and "the checks' process died" in reasons[COMPILE], reasons


def test_a_driven_port_claims_flex_after_it_ran() -> None:
    """LiLT's forward takes boxes beside the ids, so it is driven on inputs built from its signature: its port runs
    under flex attention and compiled on the drive its SDPA check passed on, and claims both flags once each matched."""
    from sdpa_port.edge.after_port import verify_port

    path = modeling_path("lilt")
    ported = PortResult(Status.PORTED, port_file("lilt"), Style.INTERFACE)
    verification = verify_port(path, path.read_text(encoding="utf-8"), ported, claims=True)
    assert verification.passed, verification.lines
    assert dict(verification.claimed) == {FLEX: ("LiltPreTrainedModel",), COMPILE: ("LiltPreTrainedModel",)}, (
        verification.lines
    )
    assert set(dict(verification.not_claimed)) == {FLASH}, verification.not_claimed
    assert dict(verification.not_claimed)[FLASH].startswith(UNPROVEN)
    lines = "\n".join(verification.lines)
    assert "LiltModel[text+boxes][right] flex_attention == eager: ok" in lines, lines
    assert "LiltModel[text+boxes][right] flex_attention executed: ok" in lines, lines
    assert "LiltModel[text+boxes][right] torch.compile(fullgraph=True) == eager: ok" in lines, lines


def test_a_driven_port_whose_flex_path_is_wrong_is_not_claimed() -> None:
    """The same port with the mask dropped under flex attention alone: verified (eager and SDPA are right), compile
    still claimed, flex not, and why is said."""
    from sdpa_port.edge.after_port import verify_port

    path = modeling_path("lilt")
    ported = PortResult(Status.PORTED, sabotage_interface(port_file("lilt"), "flex_mask"), Style.INTERFACE)
    verification = verify_port(path, path.read_text(encoding="utf-8"), ported, claims=True)
    assert verification.passed, verification.lines
    assert dict(verification.claimed) == {COMPILE: ("LiltPreTrainedModel",)}, verification.lines
    reasons = dict(verification.not_claimed)
    assert set(reasons) == {FLEX, FLASH}, reasons
    assert "LiltModel[text+boxes][right] flex_attention == eager: FAILED" in reasons[FLEX], reasons
