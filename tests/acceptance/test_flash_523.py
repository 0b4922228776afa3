"""`_supports_flash_attn`, claimed by an interface-style port only where it is a plain masked attention (the static
proof, `plan/flash_proof.py`) and transformers' own flash path ran it and matched eager, on a CPU, with a stand-in
for the flash-attn kernel (`verify/flash_claim.py`, `verify/flash_standin.py`): not flash-attn itself.

Run inside 5.23.0. Nothing compiles here: each check is a few forwards of a tiny model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness import load, modeling_path, original
from sdpa_port.result import PortResult, Status

pytestmark = pytest.mark.tf523

FLASH = "_supports_flash_attn"


# ------------------------------------------------------------------ the stand-in kernel against a plain softmax


def _reference(q, k, v, causal, scale=None, window=(-1, -1), softcap=0.0):  # type: ignore[no-untyped-def]
    """Attention written out per (batch, head, query, key), (batch, seq, heads, dim) in: the diagonal bottom-right."""
    batch, q_len, heads, _ = q.shape
    k_len, groups = k.shape[1], heads // k.shape[2]
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    out = torch.zeros(batch, q_len, heads, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(q_len):
                seen = [
                    j
                    for j in range(k_len)
                    if (not causal or j <= i + k_len - q_len)
                    and (window[0] < 0 or j >= i + k_len - q_len - window[0])
                    and (window[1] < 0 or j <= i + k_len - q_len + window[1])
                ]
                if not seen:
                    continue
                scores = torch.stack([(q[b, i, h].double() @ k[b, j, h // groups].double()) * scale for j in seen])
                if softcap:
                    scores = softcap * torch.tanh(scores / softcap)
                weights = scores.softmax(0)
                out[b, i, h] = sum(w * v[b, j, h // groups].double() for w, j in zip(weights, seen))
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_len,k_len", [(5, 5), (2, 6), (6, 3)], ids=["square", "fewer-queries", "fewer-keys"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_the_stand_in_is_a_softmax_with_flash_attn_s_conventions(  # type: ignore[no-untyped-def]
    causal, q_len, k_len, heads, kv_heads
) -> None:
    """Causal aligned bottom-right (flash-attn 2.1 on: with fewer queries than keys, the last query sees every key;
    a query seeing none gives zeros), query heads grouped over key heads."""
    from sdpa_port.verify.flash_standin import FlashStandIn

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, q_len, heads, 8, generator=generator)
    k = torch.randn(2, k_len, kv_heads, 8, generator=generator)
    v = torch.randn(2, k_len, kv_heads, 8, generator=generator)
    stand_in = FlashStandIn()
    found = stand_in.func(q, k, v, causal=causal)
    assert found.shape == (2, q_len, heads, 8) and stand_in.calls == 1
    torch.testing.assert_close(found.double(), _reference(q, k, v, causal), atol=1e-5, rtol=1e-5)


def test_the_stand_in_s_window_and_softcap() -> None:
    from sdpa_port.verify.flash_standin import FlashStandIn

    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 6, 2, 4, generator=generator) for _ in range(3))
    found = FlashStandIn().func(q, k, v, softmax_scale=0.3, causal=True, window_size=(2, 2), softcap=5.0)
    expected = _reference(q, k, v, True, scale=0.3, window=(2, 0), softcap=5.0)
    torch.testing.assert_close(found.double(), expected, atol=1e-5, rtol=1e-5)


def test_the_stand_in_s_packed_sequences_are_each_their_own() -> None:
    """Varlen: sequences of different lengths packed along the first axis, queries fewer than keys in one."""
    from sdpa_port.verify.flash_standin import FlashStandIn

    generator = torch.Generator().manual_seed(2)
    q_lens, k_lens = [3, 1, 4], [3, 5, 4]
    q = torch.randn(sum(q_lens), 4, 8, generator=generator)
    k = torch.randn(sum(k_lens), 2, 8, generator=generator)
    v = torch.randn(sum(k_lens), 2, 8, generator=generator)
    cu_q = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 8, 12], dtype=torch.int32)
    found = FlashStandIn().varlen(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=True)
    pieces = []
    for index in range(3):
        qs, ks = slice(int(cu_q[index]), int(cu_q[index + 1])), slice(int(cu_k[index]), int(cu_k[index + 1]))
        pieces.append(_reference(q[None, qs], k[None, ks], v[None, ks], True)[0])
    torch.testing.assert_close(found.double(), torch.cat(pieces), atol=1e-5, rtol=1e-5)


def test_the_stand_in_models_no_dropout() -> None:
    from sdpa_port.verify.flash_standin import FlashStandIn

    q = torch.randn(1, 2, 1, 4)
    with pytest.raises(NotImplementedError, match="dropout"):
        FlashStandIn().func(q, q, q, dropout_p=0.1)


# ------------------------------------------------------------------ transformers' flash path, run with it


def _flash_checks(model: str, source: str, tmp_path: Path, padding: str = "left"):  # type: ignore[no-untyped-def]
    """The flash checks of `source`, a port of `model`'s file, on its base model padded as its SDPA checks are."""
    from sdpa_port.verify.auto import pick_targets, token_config
    from sdpa_port.verify.claims import check_flash

    targets = pick_targets(original(model))
    assert targets is not None
    port = load(model, source, tmp_path)
    return check_flash(targets.base, port, token_config(targets, {}), padding, targets.kind)


def _codegen() -> PortResult:
    from sdpa_port.api import port_source
    from sdpa_port.discover.release import target_release

    path = modeling_path("codegen")
    return port_source(path.read_text(encoding="utf-8"), filename=path.name, release=target_release(path))


def test_codegen_claims_flash_once_proven_and_run(tmp_path: Path) -> None:
    """CodeGen's port is a plain masked attention, and transformers' flash path (the stand-in reached through
    `lazy_import_flash_attention`, the 2-D mask unpadded into packed sequences, a cached step of two queries over
    ten keys) matches eager: the flag is set, as the maintainers' hand port in 5.25.0 sets it, saying how it ran."""
    from sdpa_port.edge.after_port import with_flash_proof
    from sdpa_port.edge.runner import claim_flags
    from sdpa_port.verify.claims import verdicts

    result = _codegen()
    assert result.status is Status.PORTED and result.no_flash == "", result.no_flash
    checks = _flash_checks("codegen", result.source, tmp_path)
    lines = "\n".join(str(c) for c in checks)
    assert all(c.passed for c in checks), lines
    assert "CodeGenModel[left, cached step] flash_attention_2 (CPU stand-in kernel) == eager: ok" in lines, lines
    assert "executed: ok" in lines and "a CPU stand-in for the flash-attn kernel (not flash-attn itself)" in lines
    reasons = with_flash_proof(verdicts(checks), result)  # type: ignore[arg-type]
    assert reasons == {FLASH: ""}
    claimed, _ = claim_flags(result, None, ((FLASH, ("CodeGenPreTrainedModel",)),), ())
    assert f"{FLASH} = True" in claimed.source
    assert any("CPU stand-in for the flash-attn kernel, not flash-attn itself" in note for note in claimed.notes)
    module = load("codegen", claimed.source, tmp_path, tag="claimed")
    assert module.CodeGenPreTrainedModel._supports_flash_attn is True


def test_the_flash_path_is_left_as_it_was() -> None:
    """On leaving, transformers refuses flash without flash-attn and a GPU again, and has forgotten the stand-in."""
    from transformers import modeling_flash_attention_utils as utils

    from sdpa_port.verify.flash_claim import flash_path

    before = utils._lazy_imports
    with flash_path() as stand_in:
        assert utils._lazy_imports is not before
    assert utils._lazy_imports is before and utils._flash_fn is not stand_in.func
    assert not utils.FLASH_ATTENTION_COMPATIBILITY_MATRIX[2]["general_availability_check"]()


def test_a_port_with_terms_flash_drops_is_refused_the_claim(tmp_path: Path) -> None:
    """BLOOM's ALiBi goes as `position_bias`, which transformers' flash path drops: not proven, and its run under
    the stand-in is wrong too (the claim would not follow from the run alone either way)."""
    from sdpa_port.edge.after_port import with_flash_proof
    from sdpa_port.verify.claims import verdicts

    path = modeling_path("bloom")
    from sdpa_port.api import port_source
    from sdpa_port.discover.release import target_release

    result = port_source(path.read_text(encoding="utf-8"), filename=path.name, release=target_release(path))
    assert "`position_bias`" in (result.no_flash or ""), result.no_flash
    checks = _flash_checks("bloom", result.source, tmp_path)
    assert any(c.name.endswith("== eager") and not c.passed for c in checks), [str(c) for c in checks]
    why = with_flash_proof(verdicts(checks), result)[FLASH]  # type: ignore[arg-type]
    assert why.startswith("not a plain masked attention:") and "FAILED" in why, why


@pytest.mark.parametrize(
    "sabotage,failing",
    [("stand-in top-left", "[left, cached step]"), ("is_causal dropped", "[left] flash")],
)
def test_a_wrong_flash_path_is_seen(
    sabotage: str, failing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks fail where the causality goes wrong: a stand-in aligning its diagonal top-left (as flash-attn
    before 2.1; only the cached step, two queries over ten keys, tells), or CodeGen's port built not causal."""
    from sdpa_port.verify import flash_standin

    source = _codegen().source
    if sabotage == "is_causal dropped":
        assert source.count("self.is_causal = True") == 1
        source = source.replace("self.is_causal = True", "self.is_causal = False")
    else:
        def top_left(q_len, k_len, causal, window, device):  # type: ignore[no-untyped-def]
            allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
            return allowed.tril() if causal else allowed

        monkeypatch.setattr(flash_standin, "visible", top_left)
    checks = _flash_checks("codegen", source, tmp_path)
    failed = [str(c) for c in checks if not c.passed]
    assert any(failing in line and "== eager: FAILED" in line for line in failed), failed
