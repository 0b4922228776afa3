"""Ported 5.23.0 decoders serve and export like the models transformers already supports.

Continuous batching (paged cache, packed prompts) gives each prompt's greedy tokens; a kernel registered through
`AttentionInterface` is called in every layer with `position_ids`; `torch.export` with a static cache decodes the
original's tokens; with executorch installed (`nox -s serving`), the program lowered to XNNPACK and run from its
`.pte` buffer gives the eager logits, and ExecuTorch's custom_sdpa registered as optimum-executorch does gives the
original's tokens (not claimed for bloom, whose ALiBi it would drop).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import load, original, port_file, record

pytestmark = pytest.mark.tf523

LM = {
    "xglm": "XGLMForCausalLM",
    "codegen": "CodeGenForCausalLM",
    "gptj": "GPTJForCausalLM",
    "bloom": "BloomForCausalLM",
    "gpt_neox_japanese": "GPTNeoXJapaneseForCausalLM",
}
BIAS = {"bloom"}  # hands ALiBi over as position_bias


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    directory: Path = tmp_path_factory.mktemp("serving523")
    return {model: load(model, port_file(model), directory, tag="serving") for model in LM}


def _classes(model: str, ported: dict[str, object]) -> tuple[type, type, object]:
    from sdpa_port.verify.configs import tiny_config

    original_class = getattr(original(model), LM[model])
    return original_class, getattr(ported[model], LM[model]), tiny_config(original_class.config_class)


def _assert(checks, model: str) -> None:  # type: ignore[no-untyped-def]
    for check in checks:
        record("serving-523", f"{model}: {check.name}", check.max_diff if check.max_diff is not None else check.detail)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("model", LM)
def test_continuous_batching_gives_each_prompts_tokens(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    from sdpa_port.verify import serving

    _assert(serving.check_continuous_batching(*_classes(model, ported), "sdpa"), model)


@pytest.mark.parametrize("model", [m for m in LM if m not in BIAS])
def test_continuous_batching_with_paged_eager(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    from sdpa_port.verify import serving

    _assert(serving.check_continuous_batching(*_classes(model, ported), "eager"), model)


def test_paged_eager_drops_position_bias_so_bloom_is_not_claimed(ported) -> None:  # type: ignore[no-untyped-def]
    """transformers' paged|eager ignores position_bias: bloom's tokens differ there, and the port says so."""
    from harness import modeling_path

    from sdpa_port import port_source
    from sdpa_port.discover.release import target_release
    from sdpa_port.verify import serving

    checks = serving.check_continuous_batching(*_classes("bloom", ported), "eager")
    assert not checks[0].passed, "paged|eager now applies position_bias: bloom could claim it"
    result = port_source(modeling_path("bloom").read_text(encoding="utf-8"), release=target_release(modeling_path("bloom")))
    assert any("position_bias" in w and "paged|eager" in w for w in result.warnings)
    assert "_supports_attention_backend" not in result.source


@pytest.mark.parametrize("model", LM)
def test_a_registered_kernel_gets_position_ids_in_every_layer(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    from sdpa_port.verify import serving

    _assert(serving.check_registered_kernel(*_classes(model, ported)), model)


@pytest.mark.parametrize("model", LM)
def test_static_cache_export_decodes_the_originals_tokens(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    from sdpa_port.verify import serving

    _assert(serving.check_static_export(*_classes(model, ported)), model)


@pytest.mark.executorch
@pytest.mark.parametrize("model", LM)
def test_executorch_pte_matches_eager_logits(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    from sdpa_port.verify import serving

    missing = serving.executorch_missing()
    if missing is not None:
        pytest.skip(missing)
    _assert(serving.check_executorch(*_classes(model, ported)), model)


@pytest.mark.executorch
@pytest.mark.parametrize("model", LM)
def test_executorch_custom_sdpa_registered_as_optimum_executorch_does(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    """The kernel finds the cache position in position_ids; it ignores position_bias, so bloom is not claimed."""
    from sdpa_port.verify import serving

    missing = serving.executorch_missing()
    if missing is not None:
        pytest.skip(missing)
    checks = serving.check_custom_sdpa(*_classes(model, ported))
    _assert(checks, model)
    assert checks[0].skipped == (model in BIAS), checks[0]


@pytest.mark.parametrize("model", [m for m in LM if m not in BIAS])
def test_the_attention_backend_flag_is_set(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    assert getattr(ported[model], LM[model])._supports_attention_backend is True


@pytest.mark.parametrize(
    "model,reason",
    [
        ("trocr", "positions come from the cache length"),
        ("rembert", "hands position_ids on only when its caller gives them"),
        ("roformer", "builds no position_ids"),
        ("gpt_neo", "position_bias"),
    ],
)
def test_decoders_that_would_fail_a_check_are_not_flagged(model: str, reason: str) -> None:
    """TrOCR places tokens by the cache length (continuous batching packs prompts), RemBERT leaves position_ids None,
    RoFormer has none, GPT-Neo hands its local-attention window over as position_bias: warned, never flagged."""
    from harness import modeling_path

    from sdpa_port import port_source
    from sdpa_port.discover.release import target_release

    result = port_source(modeling_path(model).read_text(encoding="utf-8"), release=target_release(modeling_path(model)))
    assert "_supports_attention_backend" not in result.source
    assert any(reason in w for w in result.warnings), result.warnings


def test_the_checks_see_an_unthreaded_port(tmp_path: Path) -> None:
    """The serving checks fail on a port whose dispatch drops the kwargs (the 5.23.0 ports before threading)."""
    import libcst as cst

    from sdpa_port.verify import serving

    class DropKwargs(cst.CSTTransformer):
        """`attention_interface(...)` without `**kwargs` and `position_ids=`, as the ports were."""

        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
            if not (isinstance(updated_node.func, cst.Name) and updated_node.func.value == "attention_interface"):
                return updated_node
            kept = [
                a
                for a in updated_node.args
                if a.star != "**" and not (a.keyword is not None and a.keyword.value == "position_ids")
            ]
            return updated_node.with_changes(args=kept)

    broken = cst.parse_module(port_file("codegen")).visit(DropKwargs()).code
    module = load("codegen", broken, tmp_path, tag="unthreaded")
    original_class = getattr(original("codegen"), LM["codegen"])
    from sdpa_port.verify.configs import tiny_config

    config = tiny_config(original_class.config_class)
    batching = serving.check_continuous_batching(original_class, getattr(module, LM["codegen"]), config)
    kernel = serving.check_registered_kernel(original_class, getattr(module, LM["codegen"]), config)
    assert not batching[0].passed
    assert not next(c for c in kernel if "position_ids" in c.name).passed


def test_what_a_port_does_not_claim_is_reported_not_failed(tmp_path: Path) -> None:
    """RemBERT's port sets no _supports_attention_backend (its base model names position_ids but never builds
    them): --verify reports its continuous batching failure as not claimed instead of failing the port; xglm,
    which claims it, is judged."""
    from sdpa_port.verify import serving
    from sdpa_port.verify.configs import tiny_config

    rembert = load("rembert", port_file("rembert"), tmp_path, tag="unclaimed")
    original_class = getattr(original("rembert"), "RemBertForCausalLM")
    checks = serving.serving_checks(original_class, rembert.RemBertForCausalLM, tiny_config(original_class.config_class))
    assert all(c.passed for c in checks), [str(c) for c in checks]
    assert any(c.skipped and "not claimed" in c.detail for c in checks), [str(c) for c in checks]
