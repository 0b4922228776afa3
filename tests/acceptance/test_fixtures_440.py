"""The golden ports of the fixtures run, inside transformers 4.40.2, with parity to the fixtures themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf440

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = [
    ("modeling_tiny_decoder.py", "TinyDecoderModel", "decoder", {}),
    ("modeling_tiny_decoder.py", "TinyDecoderModel", "decoder", {"scale_by_layer": True}),
    ("modeling_tiny_encoder.py", "TinyEncoderModel", "encoder", {}),
    ("modeling_tiny_windows.py", "TinyWindowsModel", "encoder", {}),  # a per-window mask on regrouped scores
    ("modeling_tiny_zeroed.py", "TinyZeroedModel", "encoder", {}),  # probabilities zeroed after the softmax
    # a key divided by a number a file function returns; a relative term on flat scores, under a None check
    ("modeling_tiny_disentangled.py", "TinyDisentangledModel", "encoder", {}),
    # ... which is the number 0 when no term kind is configured
    ("modeling_tiny_disentangled.py", "TinyDisentangledModel", "encoder", {"term_kinds": ()}),
    ("modeling_tiny_disentangled.py", "TinyDisentangledModel", "encoder", {"relative_attention": False}),
    # two streams sharing one score matrix: one SDPA call per stream's values
    ("modeling_tiny_streams.py", "TinyStreamsModel", "encoder", {}),
    # four score blocks joined by torch.cat: one SDPA call on operands joined along the head dimension ...
    ("modeling_tiny_blocks.py", "TinyBlocksModel", "encoder", {}),
    # ... and, where the config builds no blocks, the other branch's one product
    ("modeling_tiny_blocks.py", "TinyBlocksModel", "encoder", {"block_queries": False}),
    # relative scores a helper method computes, written out in the SDPA forward: a position term joins the mask ...
    ("modeling_tiny_conformer.py", "TinyConformerModel", "encoder", {}),
    # ... and under the other setting forward's own product, scaled in its own branch
    ("modeling_tiny_conformer.py", "TinyConformerModel", "encoder", {"position_type": "plain"}),
    # scores laid out (query, key, batch, heads): the relative term, the per-head bias and the fill permuted
    ("modeling_tiny_laid_out.py", "TinyLaidOutModel", "encoder", {}),
    # one key and value for every head, expanded to the query's; a bias a file function adds in place past a token
    ("modeling_tiny_shared_key.py", "TinySharedKeyModel", "encoder", {}),
    # two helpers chosen by a setting, one flattening the heads for baddbmm on float32 copies: one SDPA call for both
    ("modeling_tiny_twin.py", "TinyTwinModel", "decoder", {}),
    ("modeling_tiny_twin.py", "TinyTwinModel", "decoder", {"reorder_and_upcast": True}),
    ("modeling_tiny_twin.py", "TinyTwinModel", "decoder", {"reorder_and_upcast": True, "scale_by_layer": True}),
    ("modeling_tiny_twin.py", "TinyTwinModel", "decoder", {"scale_by_layer": True}),
]


@pytest.mark.parametrize("name,model,kind,overrides", CASES)
@pytest.mark.parametrize("padding", ["padded", "none"])
def test_golden_fixture_parity(name: str, model: str, kind: str, overrides: dict, padding: str) -> None:
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_in_package

    package = "transformers.models.gpt2"  # any package two levels below transformers resolves `...` imports
    original = load_in_package(FIXTURES / "class_style" / name, package, alias=f"fixture_{Path(name).stem}")
    ported = load_in_package(FIXTURES / "golden" / name, package, alias=f"golden_{Path(name).stem}")
    config = getattr(original, model).config_class(**overrides)
    side = ("left" if kind == "decoder" else "right") if padding == "padded" else "none"
    checks = parity.check_forward(getattr(original, model), getattr(ported, model), config, side, kind=kind)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


def test_a_configured_talking_heads_projection_falls_back_to_eager() -> None:
    """With the projections built the SDPA class runs the eager computation: equal outputs, no SDPA call."""
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_in_package

    name = "modeling_tiny_disentangled.py"
    package = "transformers.models.gpt2"
    original = load_in_package(FIXTURES / "class_style" / name, package, alias="fixture_talking")
    ported = load_in_package(FIXTURES / "golden" / name, package, alias="golden_talking")
    config = original.TinyDisentangledConfig(talking_head=True)
    checks = {c.name.split(" ", 1)[1]: c for c in parity.check_forward(
        original.TinyDisentangledModel, ported.TinyDisentangledModel, config, "right", kind="encoder"
    )}
    assert checks["eager unchanged"].passed and checks["sdpa == eager"].passed, checks
    assert not checks["sdpa executed"].passed, checks["sdpa executed"]


def _blocks_parity(source: str, tag: str, directory: Path) -> list:  # type: ignore[type-arg]
    """Parity of a port of the blocks fixture (its source given) against the fixture, on padded inputs."""
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_in_package

    package = "transformers.models.gpt2"
    original = load_in_package(FIXTURES / "class_style" / "modeling_tiny_blocks.py", package, alias=f"fixture_blocks_{tag}")
    written = directory / f"modeling_tiny_blocks_{tag}.py"
    written.write_text(source, encoding="utf-8")
    ported = load_in_package(written, package, alias=f"ported_blocks_{tag}")
    config = original.TinyBlocksConfig()
    return parity.check_forward(original.TinyBlocksModel, ported.TinyBlocksModel, config, "right", kind="encoder")


@pytest.mark.parametrize(
    "sabotage",
    [
        # a block's query on another block's slice
        (
            "memory_token_query,\n                            memory_query,\n",
            "memory_query,\n                            memory_token_query,\n",
        ),
        # the memory rows read the tokens' keys (as if the memory-to-token block shared them)
        ("[recall_key, recall_key.new_zeros", "[token_key, recall_key.new_zeros"),
    ],
    ids=["slice", "shared"],
)
def test_the_joined_blocks_parity_sees_a_misplaced_block(sabotage: tuple[str, str], tmp_path: Path) -> None:
    golden = (FIXTURES / "golden" / "modeling_tiny_blocks.py").read_text(encoding="utf-8")
    assert golden.count(sabotage[0]) == 1
    checks = _blocks_parity(golden.replace(*sabotage), "sabotaged", tmp_path)
    assert any(c.name.endswith("sdpa == eager") and not c.passed for c in checks), [str(c) for c in checks]


def test_keys_taken_for_one_tensor_would_be_seen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The rule that lets rows of blocks share their keys (the same tensors) guards exactness: a port made believing
    every key alike (the memory rows' recall keys taken for the tokens' keys) fails parity."""
    from sdpa_port import Status, port_source
    from sdpa_port.analyse.cstutil import code
    from sdpa_port.analyse.forms import blocks

    monkeypatch.setattr(blocks, "_identity", lambda tracer, node: "alike" if "key" in code(node) else None)
    source = (FIXTURES / "class_style" / "modeling_tiny_blocks.py").read_text(encoding="utf-8")
    result = port_source(source, filename="modeling_tiny_blocks.py")
    assert result.status is Status.PORTED, result.reasons
    # the statement read whole: a long one is laid out over several lines
    assert "recall_key" not in ast.unparse(ast.parse(result.source)).split("sdpa_key = ")[1].split("\n")[0]
    checks = _blocks_parity(result.source, "alike", tmp_path)
    assert any(c.name.endswith("sdpa == eager") and not c.passed for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize(
    "sabotage",
    [
        # the helper's position term left out of the mask
        (
            '            sdpa_mask = torch.einsum("bhqd,hqkd->bhqk", query_1, embedded)\n',
            '            sdpa_mask = torch.zeros_like(torch.einsum("bhqd,hqkd->bhqk", query_1, embedded))\n',
        ),
        # the relative branch's scale applied to the term only
        ("            sdpa_scale = sdpa_scale / math.sqrt(self.head_size)\n            sdpa_mask", "            sdpa_mask"),
        # the query shifted by the position bias handed over instead of the content-biased one
        ("            sdpa_query = content_query\n", "            sdpa_query = query_1\n"),
    ],
    ids=["term", "scale", "query"],
)
def test_the_written_out_helper_parity_sees_a_wrong_branch(sabotage: tuple[str, str], tmp_path: Path) -> None:
    """The relative branch's port, broken in its term, its scale or its query, fails parity: the fixture's biases are
    drawn large enough (randn) that the scores are far from uniform."""
    checks = _broken_golden_checks("conformer", "TinyConformer", sabotage, tmp_path)
    assert any(c.name.endswith("sdpa == eager") and not c.passed for c in checks), [str(c) for c in checks]


def _broken_golden_checks(stem: str, model: str, sabotage: tuple[str, str], directory: Path):  # type: ignore[no-untyped-def]
    """Parity, on right-padded inputs, of fixture `modeling_tiny_<stem>.py` against its golden port with one
    replacement made (`sabotage`, whose text the golden port holds once)."""
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_in_package

    golden = (FIXTURES / "golden" / f"modeling_tiny_{stem}.py").read_text(encoding="utf-8")
    assert golden.count(sabotage[0]) == 1, sabotage[0]
    package = "transformers.models.gpt2"
    original = load_in_package(FIXTURES / "class_style" / f"modeling_tiny_{stem}.py", package, alias=f"fixture_{stem}")
    written = directory / f"modeling_tiny_{stem}_broken.py"
    written.write_text(golden.replace(*sabotage), encoding="utf-8")
    ported = load_in_package(written, package, alias=f"broken_{stem}_{directory.name}")
    config = getattr(original, f"{model}Config")()
    models = getattr(original, f"{model}Model"), getattr(ported, f"{model}Model")
    return parity.check_forward(*models, config, "right", kind="encoder")


@pytest.mark.parametrize(
    "sabotage",
    [
        # the relative term with its query and key dimensions swapped (it still broadcasts: square scores)
        ("position.permute(2, 3, 0, 1)", "position.permute(2, 3, 1, 0)"),
        # the relative term left as the einsum lays it out
        ("position.permute(2, 3, 0, 1)", "position"),
        # the per-head bias left as written (it then runs along the keys)
        ("self.head_bias[(None,) * (4 - self.head_bias.dim())].permute(2, 3, 0, 1)", "self.head_bias"),
        # the padded keys' fill laid along the queries
        ("padded[None, :, :, None].permute(2, 3, 0, 1)", "padded[None, :, :, None].permute(2, 3, 1, 0)"),
    ],
    ids=["swapped", "term", "bias", "fill"],
)
def test_the_laid_out_parity_sees_an_unpermuted_term(sabotage: tuple[str, str], tmp_path: Path) -> None:
    """Each thing added to scores laid out (query, key, batch, heads) must be permuted as they are: permuted
    otherwise, the port fails parity; left as written, it fails parity or does not run."""
    try:
        checks = _broken_golden_checks("laid_out", "TinyLaidOut", sabotage, tmp_path)
    except RuntimeError as error:  # shapes that do not broadcast
        assert "must match the size" in str(error), error
        return
    assert any(c.name.endswith("sdpa == eager") and not c.passed for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize(
    "sabotage",
    [
        # the value handed over as the key: each head reads the shared key twice
        ("            v.unsqueeze(1).expand(-1, q.size(1), -1, -1),\n", "            sdpa_key,\n"),
        # the bias the file function adds past the first token left out of the mask
        ("sdpa_mask = add_positions_past_first(", "sdpa_mask = 0 * add_positions_past_first("),
        # the function given the scores, not zeros: they are counted twice
        (
            "add_positions_past_first(sdpa_key.new_zeros(scores_shape),",
            "add_positions_past_first(q @ sdpa_key.transpose(-1, -2),",
        ),
    ],
    ids=["value", "bias", "scores"],
)
def test_the_shared_key_parity_sees_a_wrong_port(sabotage: tuple[str, str], tmp_path: Path) -> None:
    """A shared key's port, broken in its value or in the term a function of the file adds in place, fails parity."""
    checks = _broken_golden_checks("shared_key", "TinySharedKey", sabotage, tmp_path)
    assert any(c.name.endswith("sdpa == eager") and not c.passed for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize("overrides", [{"scale_by_layer": True}, {"scale_by_layer": True, "reorder_and_upcast": True}])
def test_the_one_call_parity_sees_a_dropped_layer_scale(overrides: dict, tmp_path: Path) -> None:
    """The twin helpers' one SDPA call without its layer scale fails parity under either helper's setting."""
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_in_package

    golden = (FIXTURES / "golden" / "modeling_tiny_twin.py").read_text(encoding="utf-8")
    dropped = "        if self.scale_by_layer:\n            sdpa_scale = sdpa_scale / float(self.layer_idx + 1)\n"
    assert golden.count(dropped) == 1 and golden.count("scaled_dot_product_attention(") == 1
    written = tmp_path / "modeling_tiny_twin_broken.py"
    written.write_text(golden.replace(dropped, ""), encoding="utf-8")
    package = "transformers.models.gpt2"
    original = load_in_package(FIXTURES / "class_style" / "modeling_tiny_twin.py", package, alias="fixture_twin")
    ported = load_in_package(written, package, alias=f"broken_twin_{tmp_path.name}")
    config = original.TinyTwinConfig(**overrides)
    checks = parity.check_forward(original.TinyTwinModel, ported.TinyTwinModel, config, "left", kind="decoder")
    assert any(c.name.endswith("sdpa == eager") and not c.passed for c in checks), [str(c) for c in checks]
