"""Transformer-XL (4.40.2, deprecated) lays its scores out (query, key, batch, heads): an einsum
`ibnd,jbnd->ijbn` of the content query and the keys, a second einsum with the relative embeddings shifted by
`_rel_shift` added to it, the sum scaled in place, filled where the causal mask (query, key, 1) is set, a softmax over
dimension 1 and `ijbn,jbnd->ibnd` with the values. The port hands SDPA the operands permuted to (batch, heads, length,
dim) and the relative term and the mask fill permuted the same way.

The model itself cannot run in 4.40.2 under the pinned torch (`TransfoXLModel.forward` calls `type_as(dtype=...)`),
so the census calls the port "not verifiable"; this test drives the decoder layers the model builds, with the inputs
the model would give them (relative position embeddings, the causal mask, memories of earlier segments): the port's
eager outputs are the original's, its SDPA class runs and matches eager, and a halved scale or a dropped mask (the
relative term and the causal fill) in that class is seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import load, modeling_path, original, sabotage

from sdpa_port import Status, port_source

pytestmark = pytest.mark.tf440

MODEL = "deprecated/transfo_xl"
QUERIES, MEMORIES, BATCH = 5, 3, 2


def _outputs(module, implementation: str, memories: bool, state=None):  # type: ignore[no-untyped-def]
    import torch
    from transformers import TransfoXLConfig

    from sdpa_port.verify.checks import sharpen
    from sdpa_port.verify.diagnose import PortCalls

    config = TransfoXLConfig(
        vocab_size=64, cutoffs=[16, 32], d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=64, n_layer=2,
        mem_len=4, div_val=1, dropout=0.0, dropatt=0.0,
    )
    model = module.TransfoXLModel._from_config(config, attn_implementation=implementation).eval()
    if state is None:
        sharpen(model)
    else:
        model.load_state_dict(state)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(QUERIES, BATCH, 32, generator=generator)
    past = MEMORIES if memories else 0
    keys = QUERIES + past
    # what TransfoXLModel.forward hands its layers: positions counted down, the causal mask shifted by the memories
    positions = model.pos_emb(torch.arange(keys - 1, -1, -1.0))
    mask = torch.triu(torch.ones(QUERIES, keys, dtype=torch.bool), diagonal=1 + past)[:, :, None]
    outputs = []
    with PortCalls(module.__name__) as calls, torch.no_grad():
        for layer in model.layers:
            mems = torch.randn(past, BATCH, 32, generator=generator) if memories else None
            hidden = layer(hidden, positions, dec_attn_mask=mask, mems=mems)[0]
            outputs.append(hidden)
    return torch.stack(outputs), model.state_dict(), calls.from_port


def _gaps(source: str, tmp_path: Path, tag: str, memories: bool) -> tuple[float, float, int]:
    ported = load(MODEL, source, tmp_path, tag)
    expected, state, _ = _outputs(original(MODEL), "eager", memories)
    eager, _, _ = _outputs(ported, "eager", memories, state)
    sdpa, _, calls = _outputs(ported, "sdpa", memories, state)
    return float((expected - eager).abs().max()), float((expected - sdpa).abs().max()), calls


def _port() -> str:
    result = port_source(modeling_path(MODEL).read_text(encoding="utf-8"), filename="modeling_transfo_xl.py")
    assert result.status is Status.PORTED, result.reasons
    return result.source


@pytest.mark.parametrize("memories", [False, True], ids=["segment", "with-memories"])
def test_the_port_keeps_eager_and_matches_it_with_sdpa(memories: bool, tmp_path: Path) -> None:
    eager_gap, sdpa_gap, calls = _gaps(_port(), tmp_path, "port", memories)
    assert eager_gap == 0.0
    assert calls == 2 and sdpa_gap < 1e-4, (calls, sdpa_gap)


@pytest.mark.parametrize("kind", ["scale", "mask"])
def test_a_broken_sdpa_class_is_seen(kind: str, tmp_path: Path) -> None:
    _, sdpa_gap, calls = _gaps(sabotage(_port(), kind), tmp_path, f"broken_{kind}", True)
    assert calls == 2 and sdpa_gap > 1e-2, (kind, sdpa_gap)
