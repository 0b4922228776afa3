"""Shared steps of the tests that drive models by their forward signature and config (verify/drive.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import load, modeling_path, original, sabotage, sabotage_interface

from sdpa_port import Status, port_source
from sdpa_port.discover.release import target_release


def port_for_kind(model: str, kinds: str) -> str:
    """The port of `model`; fails saying so when the tool no longer ports it (the test then needs another model
    of the same input kind), never skips."""
    path = modeling_path(model)
    result = port_source(path.read_text(encoding="utf-8"), filename=path.name, release=target_release(path))
    if result.status is not Status.PORTED:
        reasons = "; ".join(result.reasons[:2]) or result.detail
        pytest.fail(
            f"{model} is no longer ported ({result.status.value}: {reasons}); this test needs a ported model taking "
            f"{kinds}: choose another one"
        )
    return result.source


def verify(model: str, source: str, directory: Path, tag: str = "driven"):  # type: ignore[no-untyped-def]
    from sdpa_port.verify.auto import verify_pair

    return verify_pair(original(model), load(model, source, directory, tag))


def assert_driven_and_passed(checks, kinds: str) -> None:  # type: ignore[no-untyped-def]
    lines = [str(c) for c in checks]
    driven = [c for c in checks if c.name.endswith(" driven")]
    assert driven, "\n".join(lines)
    assert f"[{kinds}]" in driven[0].name, "\n".join(lines)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)
    executed = [c for c in checks if c.name.endswith("sdpa executed")]
    assert executed and all(c.passed for c in executed), "\n".join(lines)
    compared = [c for c in checks if c.name.endswith("sdpa == eager")]
    assert compared and all(c.max_diff is not None for c in compared), "\n".join(lines)


def broken(model: str, source: str, kind: str) -> str:
    interface = "attention_interface(" in source and "ALL_ATTENTION_FUNCTIONS" in source
    return sabotage_interface(source, kind) if interface else sabotage(source, kind)


def assert_sabotage_seen(checks, padded_only: bool = False) -> None:  # type: ignore[no-untyped-def]
    lines = "\n".join(str(c) for c in checks)
    assert not any(c.name == "not verified" for c in checks), lines
    failed = [c for c in checks if c.name.endswith("sdpa == eager") and not c.passed]
    assert failed, f"the sabotage went unnoticed:\n{lines}"
    if padded_only:
        assert all("unpadded" not in c.name for c in failed), lines


def assert_checked_alone(checks, classes: list[str], why: str) -> None:  # type: ignore[no-untyped-def]
    """Models out of reach: the first line says why (`why` in it), then every class in `classes` passes alone."""
    lines = "\n".join(str(c) for c in checks)
    assert checks[0].name == "attention modules checked on their own" and why in checks[0].detail, lines
    alone = {c.name.removesuffix(" alone"): c for c in checks if c.name.endswith(" alone")}
    assert sorted(alone) == sorted(classes), lines
    assert all(c.passed for c in checks), lines
    assert all("SDPA call(s) from the port" in c.detail for c in alone.values()), lines


def assert_alone_sabotage_seen(checks) -> None:  # type: ignore[no-untyped-def]
    lines = "\n".join(str(c) for c in checks)
    alone = [c for c in checks if c.name.endswith(" alone")]
    assert alone and not any(c.name == "not verified" for c in checks), lines
    assert any(not c.passed and c.max_diff is not None for c in alone), f"the sabotage went unnoticed:\n{lines}"


# LUKE's port with its word and entity blocks joined wrongly: (text in the port, its replacement)
MISPLACED_BLOCKS = [
    # the entities' rows with their two blocks' queries swapped
    ("torch.cat([e2w_query_layer, e2e_query_layer], dim=-1)", "torch.cat([e2e_query_layer, e2w_query_layer], dim=-1)"),
    # the word keys without the zeros that keep them off the entity blocks' slice
    ("[w2w_key_layer, w2w_key_layer.new_zeros", "[w2w_key_layer, w2w_key_layer.new_ones"),
]


def assert_misplaced_blocks_seen(sabotage: tuple[str, str], source: str, directory: Path) -> None:
    assert source.count(sabotage[0]) == 1, sabotage[0]
    assert_sabotage_seen(verify("luke", source.replace(*sabotage), directory, "blocks"))
