"""The wiring cases of issue 35 run inside transformers 4.40.2: a model's own mask helper of another signature, and
causality its caller chooses per call (`tests/unit/wiring_sources.py`), each eager against SDPA on sharpened random
weights, for the calls the port once got wrong."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from wiring_sources import PER_CALL, QFORMER  # noqa: E402

from sdpa_port import Status, port_source  # noqa: E402

pytestmark = pytest.mark.tf440

TOLERANCE = 1e-4
PACKAGE = "transformers.models.gpt2"  # the sources import transformers absolutely; any package serves


def _models(source: str, tag: str, directory: Path):  # type: ignore[no-untyped-def]
    from sdpa_port.verify.checks import sharpen
    from sdpa_port.verify.loader import load_source_in_package

    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    original = load_source_in_package(source, PACKAGE, directory, f"tiny_{tag}_original")
    ported = load_source_in_package(result.source, PACKAGE, directory, f"tiny_{tag}_ported")
    reference = original.TinyModel._from_config(original.TinyConfig(), attn_implementation="eager")
    sharpen(reference)
    sdpa = ported.TinyModel._from_config(ported.TinyConfig(), attn_implementation="sdpa")
    sdpa.load_state_dict(reference.state_dict())
    assert sdpa.config._attn_implementation == "sdpa"
    return reference.eval(), sdpa.eval()


def _inputs(padding: str):  # type: ignore[no-untyped-def]
    import torch

    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    if padding == "right":
        mask[1, 5:] = 0
    return ids, mask


def _gap(reference, sdpa, padding: str, **call) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """The largest difference over the unpadded positions, and how many SDPA calls the port made."""
    import torch

    ids, mask = _inputs(padding)
    real = torch.nn.functional.scaled_dot_product_attention
    calls = []

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    with torch.no_grad():
        expected = reference(ids, attention_mask=mask, **call).last_hidden_state
        with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", spy):
            got = sdpa(ids, attention_mask=mask, **call).last_hidden_state
    keep = mask.bool()
    return float((expected - got).abs()[keep].max()), len(calls)


@pytest.mark.parametrize("padding", ["right", "none"])
@pytest.mark.parametrize("is_decoder", [False, True])
def test_a_models_own_extended_helper_keeps_its_masks(padding: str, is_decoder: bool, tmp_path: Path) -> None:
    """Swapped for `_prepare_4d_attention_mask_for_sdpa(attention_mask, is_decoder, tgt_len=1)`, every padded call
    raised (the caller's flag taken for a dtype) and an unpadded decoder call lost its causal mask (None, read as no
    mask)."""
    reference, sdpa = _models(QFORMER, "qformer", tmp_path)
    gap, calls = _gap(reference, sdpa, padding, is_decoder=is_decoder)
    assert calls and gap <= TOLERANCE, gap


@pytest.mark.parametrize("padding", ["right", "none"])
@pytest.mark.parametrize("is_decoder", [False, True])
def test_causality_chosen_by_the_caller(padding: str, is_decoder: bool, tmp_path: Path) -> None:
    """With the causal helper's None read as causal by a module marked `is_causal = True`, the plain helper's None
    for an unpadded bidirectional call was read so too (wrong by 10.7 here)."""
    reference, sdpa = _models(PER_CALL, "per_call", tmp_path)
    gap, calls = _gap(reference, sdpa, padding, is_decoder=is_decoder)
    assert calls and gap <= TOLERANCE, gap
