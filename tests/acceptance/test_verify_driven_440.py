"""`--verify` drives 4.40.2 models by their forward signature and config: audio, mel features, boxes, region
features, video, time series, ids with pixels; and says plainly when it cannot."""

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

pytestmark = pytest.mark.tf440

# one ported model per input kind; the bracket in the check names lists the kinds the harness built
CASES = {
    "wav2vec2": "audio",  # raw input_values sized from the convolution strides, padded by attention_mask
    "audio_spectrogram_transformer": "spectrogram",  # input_values as a fixed-length spectrogram
    "speech_to_text": "features+text",  # input_features and decoder_input_ids
    "bros": "text+boxes",  # bbox
    "lxmert": "text+regions",  # visual_feats, visual_pos
    "videomae": "video",  # (batch, frames, channels, height, width)
    "patchtst": "time-series",  # past_values, past_observed_mask, future_values
    "time_series_transformer": "time-series",  # past and future values and time features, lags
    "vilt": "text+image",  # ids and pixels
    "detr": "image",  # a transformers backbone where timm is missing
    "vit_mae": "image",  # random masking, drawn alike in every model
    "sam": "image",  # the vision neck's channels are the prompt decoder's width: sizes tied across sub-configs
    "idefics2": "text+image",  # image placeholder tokens, one per resampler latent and image; images per example
    "lilt": "text+boxes",  # one score matrix for its text and layout streams: one SDPA call per stream's values
    # entity ids beside the tokens: its four word and entity score blocks joined into one matrix, one SDPA call
    "luke": "text+entities",
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("driven440")


@pytest.mark.parametrize("model", CASES)
def test_driven_models_verify(model: str, workdir: Path) -> None:
    source = port_for_kind(model, CASES[model])
    assert_driven_and_passed(verify(model, source, workdir), CASES[model])


@pytest.mark.parametrize(
    "model,kind",
    [
        ("wav2vec2", "scale"),
        ("wav2vec2", "mask"),
        ("speech_to_text", "scale"),
        ("speech_to_text", "mask"),
        ("bros", "scale"),
        ("lxmert", "scale"),
        ("videomae", "scale"),
        ("patchtst", "scale"),
        ("time_series_transformer", "scale"),
        ("vilt", "mask"),
        ("detr", "scale"),
        ("idefics2", "scale"),
        ("sam", "scale"),
        ("lilt", "scale"),
        ("lilt", "mask"),
        ("luke", "scale"),
        ("luke", "mask"),
    ],
)
def test_driven_checks_see_sabotage(model: str, kind: str, workdir: Path) -> None:
    """A halved scale, or a dropped mask on padded inputs, fails the check of every new input kind."""
    source = broken(model, port_for_kind(model, CASES[model]), kind)
    assert_sabotage_seen(verify(model, source, workdir, f"sabotage_{kind}"))


# models needing an optional package not installed here; the attention classes of their ports, checked alone
OUT_OF_REACH = {
    "layoutlmv2": ("detectron2", ["LayoutLMv2SdpaSelfAttention"]),
    "deta": ("torchvision", ["DetaSdpaMultiheadAttention"]),
}


@pytest.mark.parametrize("model", OUT_OF_REACH)
def test_a_missing_package_is_named_and_the_attention_checked_alone(model: str, workdir: Path) -> None:
    package, classes = OUT_OF_REACH[model]
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    checks = verify(model, port_for_kind(model, "a missing package"), workdir)
    assert_checked_alone(checks, classes, "needs ")
    assert f"needs {package}" in checks[0].detail.lower(), checks[0]


@pytest.mark.parametrize("model,kind", [("layoutlmv2", "scale"), ("layoutlmv2", "mask"), ("deta", "scale"), ("deta", "mask")])
def test_attention_checked_alone_sees_sabotage(model: str, kind: str, workdir: Path) -> None:
    """A halved scale, or the mask (LayoutLMv2: with its relative position terms) dropped from SDPA."""
    if importlib.util.find_spec(OUT_OF_REACH[model][0]) is not None:
        pytest.skip(f"{OUT_OF_REACH[model][0]} is installed here")
    source = broken(model, port_for_kind(model, "a missing package"), kind)
    assert_alone_sabotage_seen(verify(model, source, workdir, f"alone_{kind}"))


def test_a_port_that_raises_where_the_original_runs_fails_the_module_check(workdir: Path) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    source = port_for_kind("deta", "a missing package")
    assert source.count("dropout_p=") == 1
    raising = source.replace("dropout_p=", "unknown_option=None, dropout_p=")  # SDPA raises TypeError at every call
    checks = verify("deta", raising, workdir, "raises")
    alone = [c for c in checks if c.name.endswith(" alone")]
    assert alone and not alone[0].passed and "the port raised TypeError" in alone[0].detail, [str(c) for c in checks]


def test_sdpa_never_reached_is_a_failure_that_says_why(workdir: Path) -> None:
    """ERNIE-M's layers ask their attention for weights on every call through a layer parameter defaulting to True;
    written as a call (`bool(1)`), the static W406 check cannot read that default and the port is written, so
    --verify must say that SDPA never ran and why."""
    from harness import modeling_path

    from sdpa_port import Status, port_source

    model = "ernie_m"
    path = modeling_path(model)
    default = "output_attentions: Optional[bool] = True"
    source = path.read_text(encoding="utf-8").replace(default, "output_attentions=bool(1)")
    result = port_source(source, filename=path.name)
    assert result.status is Status.PORTED, (result.status, result.reasons)
    checks = verify(model, result.source, workdir)
    executed = [c for c in checks if c.name.endswith("sdpa executed")]
    assert executed and not any(c.passed for c in executed), [str(c) for c in checks]
    assert "always with output_attentions=True" in executed[0].detail, executed[0]


@pytest.mark.parametrize("model", ["ernie_m"])
def test_every_call_asking_for_weights_is_refused_before_porting(model: str) -> None:
    """ERNIE-M's layer defaults output_attentions to True and its encoder never passes it: W406."""
    from harness import modeling_path

    from sdpa_port import Status, port_source

    path = modeling_path(model)
    result = port_source(path.read_text(encoding="utf-8"), filename=path.name)
    assert result.status is Status.REFUSED and "[W406]" in " ".join(result.reasons), result.reasons


def test_weights_asked_for_and_read_only_under_the_callers_flag_are_no_longer_asked_for(workdir: Path) -> None:
    """Mask2Former's decoder layer passes output_attentions=True to its self-attention and reads the weights only
    under its own output_attentions: the port passes that flag on, and SDPA runs (it was W406)."""
    from harness import modeling_path

    from sdpa_port import Status, port_source

    path = modeling_path("mask2former")
    result = port_source(path.read_text(encoding="utf-8"), filename=path.name)
    assert result.status is Status.PORTED, result.reasons
    assert "output_attentions=True" not in result.source.split("class Mask2FormerMaskedAttentionDecoderLayer")[1].split("\nclass ")[0]
    checks = verify("mask2former", result.source, workdir)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed and any(c.name.endswith("sdpa executed") for c in checks), failed


def test_verify_port_loads_a_second_file_of_a_model_folder(workdir: Path) -> None:
    """verify_port (what --verify runs) loads data2vec/modeling_data2vec_audio.py inside transformers.models.data2vec
    and passes the lines on."""
    from harness import modeling_path

    from sdpa_port import port_source
    from sdpa_port.edge.after_port import verify_port

    path = modeling_path("hubert").parents[1] / "data2vec" / "modeling_data2vec_audio.py"
    source = path.read_text(encoding="utf-8")
    report = verify_port(path, source, port_source(source, filename=str(path)))
    assert report.passed, report.lines
    assert any("Data2VecAudioModel[audio] driven: ok" in line for line in report.lines), report.lines



@pytest.mark.parametrize("copied", ["blip_text", "fixture"])
def test_verify_port_places_a_file_copied_out_of_its_folder_by_its_imports(copied: str, tmp_path: Path) -> None:
    """A modeling file outside a `models/<name>/` tree is loaded where its relative imports resolve: the copy of
    blip/modeling_blip_text.py (`.configuration_blip`) in transformers.models.blip, a fixture (`...` imports only)
    in a model package; `transformers.models.blip_text` or `...tiny_decoder`, which its name gives, do not exist."""
    from harness import modeling_path

    from sdpa_port import port_source
    from sdpa_port.edge.after_port import package_of, verify_port

    if copied == "blip_text":
        original = modeling_path("blip").with_name("modeling_blip_text.py")
        expected = "BlipTextModel"
    else:
        original = Path(__file__).resolve().parents[2] / "fixtures" / "class_style" / "modeling_tiny_decoder.py"
        expected = "TinyDecoderModel"
    path = tmp_path / original.name
    path.write_text(original.read_text(encoding="utf-8"), encoding="utf-8")
    assert not importlib.util.find_spec(package_of(path))  # the package the name gives is no installed one
    source = path.read_text(encoding="utf-8")
    report = verify_port(path, source, port_source(source, filename=str(path)))
    assert report.passed, report.lines
    assert any(line.startswith(expected) and "sdpa executed: ok" in line for line in report.lines), report.lines

def test_a_worker_dying_while_verifying_is_an_error_for_that_file_only(tmp_path: Path) -> None:
    """A modeling file that kills its process when executed (as the OOM killer would): --verify executes it in a
    worker; that file is an error, the batch goes on and verifies the others. (Run through the command line, as
    the census does: the batch pool forks, which a test process that imported torch must not do.)"""
    import json
    import os
    import subprocess
    import sys

    from harness import modeling_path

    for model, tail in (("bert", "\nimport os\nos._exit(9)\n"), ("hubert", ""), ("vit", "")):
        folder = tmp_path / "models" / model
        folder.mkdir(parents=True)
        (folder / f"modeling_{model}.py").write_text(modeling_path(model).read_text(encoding="utf-8") + tail)
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "sdpa_port", str(tmp_path / "models"), "--verify", "--check", "--json", "--jobs", "2"]
    run = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    records = {Path(r["path"]).parent.name: r for r in map(json.loads, run.stdout.splitlines())}
    assert records["bert"]["status"] == "error", records["bert"]
    assert "the worker process died" in records["bert"]["reasons"][0]
    for model in ("hubert", "vit"):
        assert records[model]["status"] == "ported" and records[model]["verified"] is True, records[model]
        assert any("driven: ok" in line for line in records[model]["verification"])
    assert run.returncode == 2  # an error among the outcomes


@pytest.mark.parametrize("model", ["align", "clvp"])
def test_composite_models_built_eager_run_no_sdpa_inside(
    model: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A composite model builds its sub-models from sub-configs; each must take the parent's implementation (a
    sub-model built on its own picks SDPA once its class supports it). Without the pass that hands it on, the
    eager build of the port runs SDPA and verification fails."""
    from sdpa_port.rewrite import sub_models

    assert all(c.passed for c in verify(model, port_for_kind(model, "sub-configs"), workdir))
    monkeypatch.setattr(sub_models, "pass_implementation", lambda module, composites, built: (module, []))
    checks = verify(model, port_for_kind(model, "sub-configs"), workdir, "without_pass")
    failed = [str(c) for c in checks if not c.passed]
    assert failed and any("eager" in line for line in failed), [str(c) for c in checks]


@pytest.mark.parametrize("sabotage", MISPLACED_BLOCKS, ids=["swapped", "ones"])
def test_luke_checks_see_a_misplaced_block(sabotage: tuple[str, str], workdir: Path) -> None:
    """The entity path runs in the check (entity ids are built): a port that joins the blocks wrongly fails it."""
    assert_misplaced_blocks_seen(sabotage, port_for_kind("luke", CASES["luke"]), workdir)


@pytest.mark.parametrize("kind", ["none", "scale"])
def test_a_class_asking_for_weights_by_default_is_checked_alone_on_its_sdpa_side(kind: str, workdir: Path) -> None:
    """Graphormer's attention defaults to `need_weights=True`, which sends its SDPA class back to eager: checked on
    its own (no model class whose inputs the harness builds), it is given the values its fallback test reads as the
    SDPA side, so SDPA runs and a halved scale is seen."""
    source = port_for_kind("graphormer", "graph inputs the harness cannot build")
    assert "if need_weights or before_softmax or need_head_weights:" in source
    checks = verify("graphormer", source if kind == "none" else broken("graphormer", source, kind), workdir, f"g_{kind}")
    alone = [c for c in checks if c.name.endswith(" alone")]
    lines = "\n".join(str(c) for c in checks)
    if kind == "none":
        assert alone and all(c.passed for c in alone) and "SDPA call(s) from the port" in alone[0].detail, lines
    else:
        assert_alone_sabotage_seen(checks)


def test_the_sdpa_class_called_on_an_eager_module_falls_back_through_super(workdir: Path) -> None:
    """The module checks call the SDPA class's forward on the eager module they built: where the call asks for
    weights, its `super().forward` needs the module seen as the SDPA class (it failed with `super(type, obj)`)."""
    import torch

    from harness import load
    from sdpa_port.verify.attention_calls import sdpa_call

    ported = load("graphormer", port_for_kind("graphormer", "graph inputs the harness cannot build"), workdir, "g_super")
    config = ported.GraphormerConfig(embedding_dim=32, num_attention_heads=4)
    module = ported.GraphormerMultiheadAttention(config).eval()
    states = torch.randn(5, 2, 32)
    with torch.no_grad():
        expected = module(states, states, states, attn_bias=None, need_weights=True)[0]
        found = sdpa_call(module, ported.GraphormerSdpaMultiheadAttention, (states, states, states, None), {})[0]
    assert type(module) is ported.GraphormerMultiheadAttention  # seen as the SDPA class for the call only
    torch.testing.assert_close(found, expected)
