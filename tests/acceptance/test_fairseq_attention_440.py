"""fairseq's multi-head attention as Graphormer (4.40.2) carries it: `need_weights` on by default, `before_softmax`
returning the scores, `need_head_weights` turning `need_weights` on. The harness cannot synthesise graph inputs (the
census calls the port "not verifiable"), so this test builds them: the port, loaded inside 4.40.2, keeps eager
outputs unchanged, its SDPA class runs and matches eager on a batch with padded nodes, and a halved scale or a
dropped mask in that class is seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import load, modeling_path, original, sabotage

from sdpa_port import Status, port_source

pytestmark = pytest.mark.tf440


def _graph_inputs():  # type: ignore[no-untyped-def]
    import torch

    generator = torch.Generator().manual_seed(0)
    batch, nodes = 2, 6
    inputs = {
        "input_nodes": torch.randint(1, 32, (batch, nodes, 1), generator=generator),
        "input_edges": torch.randint(1, 32, (batch, nodes, nodes, 3, 1), generator=generator),
        "attn_bias": torch.randn(batch, nodes + 1, nodes + 1, generator=generator),
        "in_degree": torch.randint(1, 8, (batch, nodes), generator=generator),
        "out_degree": torch.randint(1, 8, (batch, nodes), generator=generator),
        "spatial_pos": torch.randint(1, 8, (batch, nodes, nodes), generator=generator),
        "attn_edge_type": torch.randint(1, 32, (batch, nodes, nodes, 1), generator=generator),
    }
    inputs["input_nodes"][1, 4:] = 0  # the second graph has two padding nodes
    return inputs


def _outputs(module, implementation: str, state=None):  # type: ignore[no-untyped-def]
    import torch
    from transformers import GraphormerConfig

    from sdpa_port.verify.checks import sharpen
    from sdpa_port.verify.diagnose import PortCalls

    config = GraphormerConfig(
        num_hidden_layers=2, embedding_dim=32, ffn_embedding_dim=32, num_attention_heads=4, num_atoms=32,
        num_edges=32, num_in_degree=8, num_out_degree=8, num_spatial=8, num_edge_dis=8, multi_hop_max_dist=3,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )
    model = module.GraphormerModel._from_config(config, attn_implementation=implementation).eval()
    if state is None:
        sharpen(model)
    else:
        model.load_state_dict(state)
    with PortCalls(module.__name__) as calls, torch.no_grad():
        hidden = model(**_graph_inputs()).last_hidden_state
    return hidden, model.state_dict(), calls.from_port


def _gaps(source: str, tmp_path: Path, tag: str) -> tuple[float, float, int]:
    ported = load("graphormer", source, tmp_path, tag)
    expected, state, _ = _outputs(original("graphormer"), "eager")
    eager, _, _ = _outputs(ported, "eager", state)
    sdpa, _, calls = _outputs(ported, "sdpa", state)
    return float((expected - eager).abs().max()), float((expected - sdpa).abs().max()), calls


def _port() -> str:
    result = port_source(modeling_path("graphormer").read_text(encoding="utf-8"), filename="modeling_graphormer.py")
    assert result.status is Status.PORTED, result.reasons
    assert "if need_weights or before_softmax or need_head_weights:" in result.source
    return result.source


def test_the_port_keeps_eager_and_matches_it_with_sdpa(tmp_path: Path) -> None:
    eager_gap, sdpa_gap, calls = _gaps(_port(), tmp_path, "port")
    assert eager_gap == 0.0
    assert calls == 2 and sdpa_gap < 1e-4, (calls, sdpa_gap)


@pytest.mark.parametrize("kind", ["scale", "mask"])
def test_a_broken_sdpa_class_is_seen(kind: str, tmp_path: Path) -> None:
    _, sdpa_gap, calls = _gaps(sabotage(_port(), kind), tmp_path, f"broken_{kind}")
    assert calls == 2 and sdpa_gap > 1e-2, (kind, sdpa_gap)
