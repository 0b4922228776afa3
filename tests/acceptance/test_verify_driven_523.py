"""`--verify` drives 5.23.0 models by their forward signature and config: boxes, region features, video, time
series, ids with pixels or video; and says plainly when it cannot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from driven import (
    MISPLACED_BLOCKS,
    assert_alone_sabotage_seen,
    assert_checked_alone,
    assert_driven_and_passed,
    assert_misplaced_blocks_seen,
    assert_sabotage_seen,
    broken,
    port_for_kind,
    verify,
)

pytestmark = pytest.mark.tf523

CASES = {
    "bros": "text+boxes",  # bbox; BROS needs the wider "small" config level
    "lxmert": "text+regions",  # visual_feats, visual_pos
    "timesformer": "video",
    "patchtsmixer": "time-series",  # attention is off at its defaults: the check switches self_attn on
    "vilt": "text+image",
    "tvp": "text+video",  # one example per batch; its ResNet backbone has no SDPA
    "blip": "text+image",  # its text model (another file) has no SDPA
    "cvt": "image",  # class style in 5.x too: amplifies rounding, judged against its response to it
    "git": "text+image",  # a text and a vision tower in one file; the text attention is causal however it is built
    # transformers 5 detection configs default to a timm backbone: without timm, the ResNet one they also offer
    "table_transformer": "image",
    "dab_detr": "image",  # DETR's weights bookkeeping after the product with V (F602 before)
    # a softmax through an autograd Function (XSoftmax: fill, softmax, zero again) on flat scores; StableDropout
    "sew_d": "audio",
    # CogView's PB-Relax softmax in a method (`(x / a - max) * a`); its image size is named `input_size`
    "layoutlmv3": "text+boxes+image",
    # keypoint matches kept at a threshold: outputs that jump, judged at the attention modules
    "superglue": "image",
    # its decoder layer asks its self-attention for weights it reads only under its own output_attentions
    "mask2former": "image",
    # one score matrix for its text and layout streams: one dispatch per stream's values
    "lilt": "text+boxes",
    # entity ids beside the tokens: its four word and entity score blocks joined into one matrix for the dispatch
    "luke": "text+entities",
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("driven523")


@pytest.mark.parametrize("model", CASES)
def test_driven_models_verify(model: str, workdir: Path) -> None:
    source = port_for_kind(model, CASES[model])
    assert_driven_and_passed(verify(model, source, workdir), CASES[model])


def test_attention_switched_on_by_a_config_flag_is_said(workdir: Path) -> None:
    checks = verify("patchtsmixer", port_for_kind("patchtsmixer", "time-series"), workdir, "flag")
    assert "config self_attn=True" in checks[0].detail, checks[0]


@pytest.mark.parametrize(
    "model,kind",
    [
        ("bros", "scale"), ("lxmert", "scale"), ("timesformer", "scale"), ("patchtsmixer", "scale"), ("vilt", "attn_mask"),
        ("tvp", "scale"), ("git", "scale"), ("dab_detr", "scale"), ("sew_d", "scale"), ("sew_d", "mask"),
        ("layoutlmv3", "scale"), ("superglue", "scale"),
        ("mask2former", "scale"), ("lilt", "scale"), ("lilt", "attn_mask"),
        ("luke", "scale"), ("luke", "attn_mask"),
    ],
)
def test_driven_checks_see_sabotage(model: str, kind: str, workdir: Path) -> None:
    """A halved scale, or a mask withheld from SDPA, fails the check of every new input kind."""
    source = broken(model, port_for_kind(model, CASES[model]), kind)
    assert_sabotage_seen(verify(model, source, workdir, f"sabotage_{kind}"))


def test_a_helper_keeping_a_step_for_the_weights_it_returns_ports_and_verifies(workdir: Path) -> None:
    """XLNet (class style in 5.x too): its attention helper, given forward's `output_attentions`, returns the weights
    permuted under `if output_attentions:`; the SDPA class returns to eager for that request, so the port is exact.
    Checked on its token path, and a mask withheld from SDPA is seen."""
    source = port_for_kind("xlnet", "text")
    checks = verify("xlnet", source, workdir, "xlnet")
    lines = "\n".join(str(c) for c in checks)
    assert checks and all(c.passed for c in checks), lines
    assert any(c.name.endswith("sdpa executed") for c in checks), lines
    assert_sabotage_seen(verify("xlnet", broken("xlnet", source, "mask"), workdir, "xlnet_mask"))


# models the harness cannot build or drive, and why; the attention classes of their ports, checked alone
OUT_OF_REACH = {
    "layoutlmv2": ("needs detectron2", ["LayoutLMv2SdpaSelfAttention"]),  # an optional package
    "omdet_turbo": ("which this harness cannot build", ["OmDetTurboMultiheadAttention"]),  # class and task prompts
}


def _skip_if_installed(why: str) -> None:
    """The check of a model out of reach for a missing package does not apply where that package is installed."""
    if why.startswith("needs ") and importlib.util.find_spec(why.split()[1]) is not None:
        pytest.skip(f"{why.split()[1]} is installed here")


@pytest.mark.parametrize("model", OUT_OF_REACH)
def test_a_model_out_of_reach_says_why_and_its_attention_is_checked_alone(model: str, workdir: Path) -> None:
    why, classes = OUT_OF_REACH[model]
    _skip_if_installed(why)
    assert_checked_alone(verify(model, port_for_kind(model, "inputs out of reach"), workdir), classes, why)


@pytest.mark.parametrize("model,kind", [("layoutlmv2", "scale"), ("layoutlmv2", "mask"), ("omdet_turbo", "scale"), ("omdet_turbo", "attn_mask")])
def test_attention_checked_alone_sees_sabotage(model: str, kind: str, workdir: Path) -> None:
    """A halved scale, or a mask (LayoutLMv2: with its relative position terms) withheld from SDPA."""
    _skip_if_installed(OUT_OF_REACH[model][0])
    source = broken(model, port_for_kind(model, "inputs out of reach"), kind)
    assert_alone_sabotage_seen(verify(model, source, workdir, f"alone_{kind}"))


def test_sdpa_calls_of_other_files_do_not_count_for_the_port(workdir: Path) -> None:
    """ZoeDepth's BEiT backbone runs SDPA; the ported patch-transformer attention is not built at the defaults (one
    bin configuration). The model's check says the port made no SDPA call and why, judges the outputs against the
    original whose backbone runs SDPA too, and the attention class is checked alone; a halved scale fails there."""
    source = port_for_kind("zoedepth", "pixels")
    checks = verify("zoedepth", source, workdir)
    executed = [c for c in checks if c.name.endswith("sdpa executed")]
    assert executed and "0 from the port's attention" in executed[0].detail, [str(c) for c in checks]
    assert "builds none of the port's attention classes" in executed[0].detail, executed[0]
    compared = [c for c in checks if c.name.endswith("sdpa == eager")]
    assert compared and all("against the original whose sub-models run SDPA" in c.detail or c.max_diff == 0 for c in compared)
    assert_checked_alone(checks[len(checks) - 2 :], ["ZoeDepthSdpaMultiheadAttention"], "built by no model")
    assert_alone_sabotage_seen(verify("zoedepth", broken("zoedepth", source, "scale"), workdir, "alone_scale"))


def test_a_pinned_is_causal_that_only_bidirectional_masks_reach_becomes_false(workdir: Path) -> None:
    """BridgeTower's cross-modal self-attention is built with `is_causal=True` and given bidirectional masks or
    none; eager never read the flag. The port passes False there and verifies; with True put back, SDPA makes the
    unpadded batch causal and the check fails."""
    source = port_for_kind("bridgetower", "text+image")
    unpinned = "self.attention = BridgeTowerAttention(config, is_causal=False, layer_idx=layer_idx)"
    assert unpinned in source
    assert_driven_and_passed(verify("bridgetower", source, workdir), "text+image")
    pinned = source.replace(unpinned, unpinned.replace("is_causal=False", "is_causal=True"))
    assert_sabotage_seen(verify("bridgetower", pinned, workdir, "pinned"))


@pytest.mark.parametrize("sabotage", MISPLACED_BLOCKS, ids=["swapped", "ones"])
def test_luke_checks_see_a_misplaced_block(sabotage: tuple[str, str], workdir: Path) -> None:
    """The entity path runs in the check (entity ids are built): a port that joins the blocks wrongly fails it."""
    assert_misplaced_blocks_seen(sabotage, port_for_kind("luke", CASES["luke"]), workdir)
