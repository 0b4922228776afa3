"""Interface-style ports inside transformers 5.10.4, whose sdpa and flex read no `position_bias` (5.17.0 on): the
T5 family's relative position biases are folded into the float mask the port hands sdpa, so its encoders give
eager's outputs; handed over as `position_bias` (the form for 5.17.0 on), sdpa drops them, and the check sees it.
Each of the family adds its mask to that bias in its own forward: every mask its stacks build takes eager's form
(`eager_attention_mask`), so whole models, decoders and generation included, give eager's outputs too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness import load, modeling_path, original, record

from sdpa_port import Status, port_source
from sdpa_port.discover.release import target_release

pytestmark = pytest.mark.tf510

ENCODERS = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel"}


def _ported(model: str, directory: Path, reads_position_bias: bool | None = None):  # type: ignore[no-untyped-def]
    path = modeling_path(model)
    release = target_release(path)
    assert release is not None and release.version == "5.10.4" and not release.sdpa_position_bias
    if reads_position_bias is not None:
        release = replace(release, sdpa_position_bias=reads_position_bias)
    result = port_source(path.read_text(encoding="utf-8"), filename=path.name, release=release)
    assert result.status is Status.PORTED, result.reasons
    return result, load(model, result.source, directory, tag="folded" if reads_position_bias is None else "bias")


def _dispatch_keywords(source: str) -> set[str]:
    """The keywords of the port's `attention_interface(...)` calls."""
    import ast

    return {
        keyword.arg
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "attention_interface"
        for keyword in node.keywords
        if keyword.arg is not None
    }


def _checks(model: str, ported):  # type: ignore[no-untyped-def]
    from sdpa_port.verify import parity
    from sdpa_port.verify.configs import tiny_config

    encoder = getattr(original(model), ENCODERS[model])
    config = tiny_config(encoder.config_class)
    return parity.check_forward(encoder, getattr(ported, ENCODERS[model]), config, "none", kind="encoder")


@pytest.mark.parametrize("model", ENCODERS)
def test_the_folded_biases_give_eager_s_outputs(model: str, tmp_path: Path) -> None:
    result, ported = _ported(model, tmp_path)
    assert "position_bias" not in _dispatch_keywords(result.source)  # (the eager function takes its own by name)
    assert "fold_additive_terms(" in result.source
    assert any("folds its additive terms" in w and "5.10.4" in w for w in result.warnings), result.warnings
    assert "_supports_attention_backend" not in result.source
    checks = _checks(model, ported)
    for check in checks:
        record("release-510", f"{model}: {check.name}", check.max_diff if check.max_diff is not None else check.detail)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


def test_handed_over_as_position_bias_5_10_4_drops_them(tmp_path: Path) -> None:
    """The form for releases whose sdpa reads `position_bias`, run in 5.10.4: the biases never reach sdpa."""
    result, ported = _ported("t5", tmp_path, reads_position_bias=True)
    assert "position_bias" in _dispatch_keywords(result.source)
    checks = [c for c in _checks("t5", ported) if c.name.endswith("sdpa == eager")]
    assert checks and not any(c.passed for c in checks), [str(c) for c in checks]


# T5's family in 5.10.4: each adds its mask to its position bias in its own forward, so every mask its stacks build
# takes eager's form (`eager_attention_mask`) and the relative biases fold into the float mask
FAMILY = ("t5", "mt5", "umt5", "udop", "pix2struct", "pop2piano", "longt5", "switch_transformers")


@pytest.mark.parametrize("model", FAMILY)
def test_the_whole_model_verifies(model: str, tmp_path: Path) -> None:
    from driven import verify

    result, _ = _ported(model, tmp_path)
    assert "eager_attention_mask(" in result.source, result.notes
    checks = verify(model, result.source, tmp_path, tag="whole")
    for check in checks:
        record("release-510", f"{model} (whole): {check.name}", check.max_diff if check.max_diff is not None else check.detail)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)
    executed = [c for c in checks if c.name.endswith("sdpa executed")]
    assert executed and all(c.passed for c in executed), [str(c) for c in checks]


@pytest.mark.parametrize(
    "broken",
    [
        ("attention_mask = attention_mask.expand(", "attention_mask = attention_mask.T.expand("),  # causality reversed
        ("if not is_causal or inputs_embeds.shape[1] == 1:", "if True:"),  # sdpa's None left as it is
        ("masked_fill(~attention_mask,", "masked_fill(attention_mask,"),  # sdpa's booleans inverted
    ],
    ids=["anticausal", "none-kept", "inverted"],
)
def test_a_wrong_eager_form_is_seen(broken: tuple[str, str], tmp_path: Path) -> None:
    """Each part of `eager_attention_mask` matters: broken, the decoder's outputs differ from eager's."""
    from driven import verify

    result, _ = _ported("t5", tmp_path)
    assert broken[0] in result.source
    checks = verify("t5", result.source.replace(*broken), tmp_path, tag="broken")
    compared = [c for c in checks if c.name.endswith("sdpa == eager") or c.name.endswith("tokens == eager")]
    assert compared and not all(c.passed for c in compared), [str(c) for c in checks]


def test_flex_is_not_tried_where_every_mask_takes_eager_s_form(tmp_path: Path) -> None:
    """The T5 family reads its mask itself, so its masks take eager's form (`eager_attention_mask`), which flex's
    BlockMask has none of: the flex claim is skipped with that reason, not run to an AttributeError."""
    from sdpa_port.verify.claims import check_flex
    from sdpa_port.verify.configs import tiny_config

    _, ported = _ported("t5", tmp_path)
    model = original("t5").T5Model
    checks = check_flex(model, ported, tiny_config(model.config_class), "right", "encoder")
    assert len(checks) == 1 and checks[0].skipped, [str(c) for c in checks]
    assert "eager's form" in checks[0].detail and "BlockMask" in checks[0].detail, checks[0].detail
