"""Ported decoders inside transformers 5.25.0, whose continuous batching leaves the paged cache to the model: it
arrives as the model's own `cache`, which its attention updates with the kwargs (`cache.update(..., kwargs=kwargs)`)
and on which it may call only what the paged cache has. A port claims `_supports_attention_backend` only where that
holds, and then passes its serving checks; elsewhere it says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import load, modeling_path, original, port_file, record

pytestmark = pytest.mark.tf525

LM = {"gpt_neox_japanese": "GPTNeoXJapaneseForCausalLM", "clvp": "ClvpForCausalLM"}


def _classes(model: str, ported) -> tuple[type, type, object]:  # type: ignore[no-untyped-def]
    from sdpa_port.verify.configs import tiny_config

    original_class = getattr(original(model), LM[model])
    return original_class, getattr(ported, LM[model]), tiny_config(original_class.config_class)


@pytest.mark.parametrize("model", LM)
def test_a_claimed_port_passes_every_serving_check(model: str, tmp_path: Path) -> None:
    from sdpa_port.verify import serving

    ported = load(model, port_file(model), tmp_path, tag="serving525")
    assert getattr(ported, LM[model])._supports_attention_backend is True
    checks = serving.serving_checks(*_classes(model, ported))
    for check in checks:
        record("serving-525", f"{model}: {check.name}", check.max_diff if check.max_diff is not None else check.detail)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


def test_the_attention_passes_its_kwargs_to_the_cache_update_and_the_check_sees_it_missing(tmp_path: Path) -> None:
    """GPT-NeoX-Japanese's own 5.25.0 attention updates its cache without the kwargs; the port passes them, and
    without them continuous batching fails."""
    from sdpa_port.verify import serving

    source = modeling_path("gpt_neox_japanese").read_text(encoding="utf-8")
    assert "layer_past.update(key, value, self.layer_idx)\n" in source
    ported = port_file("gpt_neox_japanese")
    assert "layer_past.update(key, value, self.layer_idx, kwargs=kwargs)" in ported
    broken = ported.replace("layer_past.update(key, value, self.layer_idx, kwargs=kwargs)", "layer_past.update(key, value, self.layer_idx)")
    module = load("gpt_neox_japanese", broken, tmp_path, tag="no_update_kwargs")
    checks = serving.check_continuous_batching(*_classes("gpt_neox_japanese", module))
    assert not checks[0].passed and "kwargs" in checks[0].detail, checks[0]


@pytest.mark.parametrize(
    "model,reason",
    [
        ("xglm", "calls `cache.get_seq_length()`"),
        ("rembert", "calls `cache.get_seq_length()`"),
        ("trocr", "calls `cache.get_seq_length()`"),
        ("roformer", "builds no position_ids"),
        ("big_bird", "hands position_ids on only when its caller gives them"),
        ("git", "hands position_ids on only when its caller gives them"),
        ("megatron_bert", "hands position_ids on only when its caller gives them"),
    ],
)
def test_decoders_whose_serving_checks_fail_are_not_flagged(model: str, reason: str) -> None:
    """Their base models call `cache.get_seq_length()` on continuous batching's path (the paged cache has none) or
    hand position_ids on only when given them: warned, never flagged."""
    from sdpa_port import port_source
    from sdpa_port.discover.release import target_release

    path = modeling_path(model)
    result = port_source(path.read_text(encoding="utf-8"), filename=path.name, release=target_release(path))
    assert "_supports_attention_backend" not in result.source
    assert any(reason in w for w in result.warnings), result.warnings
