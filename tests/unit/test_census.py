"""scripts/census.py classes the tool's JSON records (no torch, nothing run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("census", ROOT / "scripts" / "census.py")
assert _spec and _spec.loader
census = importlib.util.module_from_spec(_spec)
sys.modules["census"] = census  # dataclasses look their module up
_spec.loader.exec_module(census)


def record(status: str = "ported", verification: list[str] | None = None, verified: bool | None = None, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {"path": "/tmp/x/transformers/models/m/modeling_m.py", "status": status, "detail": "", "reasons": [],
            "verification": verification or [], "verified": verified, **extra}


def test_statuses_of_files_not_ported() -> None:
    assert census.classify(record("unchanged", detail="already supports SDPA")).status == "already supports SDPA"
    assert census.classify(record("unchanged", detail="no eager attention found")).status == "nothing to port"
    refused = census.classify(record("refused", reasons=["m.py:3: sparse attention"]))
    assert (refused.status, refused.reason) == ("refused", "m.py:3: sparse attention")


def test_verified_names_the_model_and_inputs() -> None:
    lines = [
        "MModel[audio] driven: ok config: tiny; inputs: input_values[2, 170]; gain 2; attn_implementation also set",
        "MModel[audio][unpadded] sdpa == eager: ok max|diff|=1e-06",
        "MTextModel[text] driven: ok config: tiny; inputs: input_ids[2, 8] long; gain 2",
    ]
    entry = census.classify(record(verification=lines, verified=True))
    assert entry.verification == "verified"
    assert entry.reason.startswith("MModel[audio] on input_values[2, 170] (tiny config)")
    assert "attn_implementation also set" in entry.reason and "also MTextModel[text]" in entry.reason
    tokens = census.classify(record(verification=["BertModel[left] eager unchanged: ok max|diff|=0"], verified=True))
    assert tokens.reason == "BertModel on token ids"


def test_attention_verified_module_by_module_says_so_and_why() -> None:
    alone = [
        "attention modules checked on their own: ok MModel: needs detectron2 (ImportError: ...)",
        "MSdpaSelfAttention alone: ok max|diff|=1e-06 (hidden 32, 4 heads, gain 2; padded keys)",
    ]
    entry = census.classify(record(verification=alone, verified=True))
    assert entry.reason == "MSdpaSelfAttention checked alone as module(s): MModel: needs detectron2 (ImportError: ...)"
    driven = ["MModel[image] driven: ok config: tiny; inputs: pixel_values[2, 3, 64, 64]; gain 2", *alone]
    entry = census.classify(record(verification=driven, verified=True))
    assert entry.reason.startswith("MModel[image] on pixel_values") and "MSdpaSelfAttention checked alone" in entry.reason
    # a file checked in place with no model to say anything of: the classes alone, no dangling colon
    entry = census.classify(record(verification=["Attention in place: ok max|diff|=1e-06"], verified=True))
    assert entry.reason == "Attention checked alone as module(s)"


def test_not_verifiable_gives_the_reason_and_is_never_a_pass() -> None:
    entry = census.classify(record(verification=["not verified: MModel: needs timm (ImportError: ...)"], verified=False))
    assert (entry.verification, entry.reason) == ("not verifiable", "MModel: needs timm (ImportError: ...)")


def test_a_failure_outweighs_what_could_not_be_checked() -> None:
    lines = ["M[x] sdpa == eager: FAILED max|diff|=0.5", "not verified: MOther of the port: built by no model"]
    entry = census.classify(record(verification=lines, verified=False))
    assert entry.verification == "failed"
    assert "FAILED max|diff|=0.5" in entry.reason and "not verified: MOther" in entry.reason


def test_checks_that_could_not_run_are_errors() -> None:
    entry = census.classify(record(verification=["could not run the checks: MemoryError: "], verified=False))
    assert entry.verification == "error"


def test_a_worker_that_died_on_a_ported_file_is_a_verification_error(tmp_path: Path) -> None:
    source = sorted((ROOT / "fixtures" / "class_style").glob("modeling_*.py"))[0]
    path = tmp_path / "transformers" / "models" / "m" / source.name
    path.parent.mkdir(parents=True)
    path.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    died = {**record("error", reasons=[f"{path}: internal error: the worker process died"]), "path": str(path)}
    entry = census.classify(died)
    assert (entry.status, entry.verification) == ("ported", "error")
    assert "worker process died" in entry.reason


def test_a_section_is_replaced_and_others_kept(tmp_path: Path) -> None:
    out = tmp_path / "census.md"
    census.write_section(out, "1.0", "<!-- census 1.0 -->\nold\n<!-- /census 1.0 -->\n")
    census.write_section(out, "2.0", "<!-- census 2.0 -->\nother\n<!-- /census 2.0 -->\n")
    census.write_section(out, "1.0", "<!-- census 1.0 -->\nnew\n<!-- /census 1.0 -->\n")
    text = out.read_text()
    assert "new" in text and "old" not in text and "other" in text and text.startswith("# Census")


def test_the_claims_table_reads_the_runners_own_words() -> None:
    """Each claim flag is read from what `claim_flags` writes, one flag's verdict or all at once, flash included."""
    from sdpa_port.edge.runner import claim_flags
    from sdpa_port.result import PortResult, Status, Style

    source = "class MPreTrainedModel:\n    _supports_sdpa = True\n"
    ported = PortResult(Status.PORTED, source, style=Style.INTERFACE)
    result, _ = claim_flags(
        ported, None, (("_supports_flash_attn", ("MPreTrainedModel",)),), (("_supports_flex_attn", "flex failed"),)
    )
    one = {"notes": list(result.notes), "warnings": list(result.warnings)}
    assert census._claim(one, "_supports_flash_attn") == "set"
    assert census._claim(one, "_supports_flex_attn") == "not set: flex failed"
    assert census._claim(one, "_can_compile_fullgraph") == ""
    result, _ = claim_flags(ported, None, (), (("", "no model was driven"),))
    everything = {"notes": list(result.notes), "warnings": list(result.warnings)}
    assert [census._claim(everything, flag) for flag in census.CLAIMS] == ["not set: no model was driven"] * 3
