"""Interface-style ports of real transformers 5.23.0 modeling files, checked for parity inside that release."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from harness import Case, load, original, port_file, record

pytestmark = pytest.mark.tf523

CASES = {
    "xglm": Case("XGLMModel", "XGLMForCausalLM"),
    "codegen": Case("CodeGenModel", "CodeGenForCausalLM"),
    "gptj": Case("GPTJModel", "GPTJForCausalLM"),
    "bloom": Case("BloomModel", "BloomForCausalLM"),
    "rembert": Case("RemBertModel"),
    "megatron_bert": Case("MegatronBertModel"),
    "tapas": Case("TapasModel"),
    "roformer": Case("RoFormerModel"),
    "trocr": Case("TrOCRForCausalLM", "TrOCRForCausalLM"),
    "switch_transformers": Case(
        "SwitchTransformersModel", "SwitchTransformersForConditionalGeneration", {"num_experts": 2, "expert_capacity": 8}
    ),
    # a refused block-sparse attention beside a full one, which is ported (the sparse one stays eager)
    "big_bird": Case("BigBirdModel"),
    # likewise Longformer's sliding-window encoder attention beside BART's decoder attention
    "led": Case("LEDModel", overrides={"attention_window": 4}),
    # the causal builder's mask converted to booleans for a masking fill beside ALiBi: handed over as built
    "mpt": Case("MptModel", "MptForCausalLM"),
    # no attention interface in the file: class style. A key divided by a number a file function returns, the
    # disentangled terms added to flat scores under a None check, the model's own 0/1 mask filled
    "deberta_v2": Case("DebertaV2Model", overrides={"relative_attention": True, "pos_att_type": ["c2p", "p2c"]}),
    # exact attention where the landmarks cover the sequence (the defaults), dispatched; the approximation beside it
    # stays eager and takes the mask in eager's form (fuzz regression 12p judges both sides)
    "nystromformer": Case("NystromformerModel"),
    # causal blocks built with is_causal=True and given bidirectional masks: their causal buffer is handed over
    "bark": Case("BarkSemanticModel"),
    # two helpers on the sides of `if self.reorder_and_upcast_attn:`: the plain one dispatches, the upcast one stays
    # eager and takes the mask in eager's form, from the bidirectional or the always-built causal builder
    "imagegpt": Case("ImageGPTModel"),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ported523")


@pytest.fixture(scope="module")
def ported(workdir: Path) -> dict[str, tuple[str, object]]:
    out = {}
    for model in CASES:
        source = port_file(model)
        out[model] = (source, load(model, source, workdir))
    return out


def config_for(model: str, **extra):  # type: ignore[no-untyped-def]
    from sdpa_port.verify.configs import tiny_config

    case = CASES[model]
    return tiny_config(getattr(original(model), case.base).config_class, {**case.overrides, **extra})


def _assert(checks, report: str, model: str) -> None:  # type: ignore[no-untyped-def]
    for check in checks:
        record(report, f"{model}: {check.name}", check.max_diff if check.max_diff is not None else check.detail)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("model", CASES)
@pytest.mark.parametrize("padding", ["padded", "none"])
def test_forward_parity(model: str, padding: str, ported) -> None:  # type: ignore[no-untyped-def]
    from sdpa_port.verify import parity

    case = CASES[model]
    config = config_for(model)
    kind = parity.model_kind(config, getattr(original(model), case.lm or case.base))
    side = ("left" if kind == "decoder" else "right") if padding == "padded" else "none"
    checks = parity.check_forward(
        getattr(original(model), case.base), getattr(ported[model][1], case.base), config, side, kind=kind
    )
    _assert(checks, "interface-523", model)


@pytest.mark.parametrize("model", CASES)
def test_bf16_as_loaded(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    """Every port in bf16, built as `dtype=torch.bfloat16` loads it (buffers a module makes in float32 stay so),
    within the bf16 rule of eager in bf16."""
    from sdpa_port.verify import parity

    case = CASES[model]
    config = config_for(model)
    kind = parity.model_kind(config, getattr(original(model), case.lm or case.base))
    side = "left" if kind == "decoder" else "right"
    checks = parity.check_bf16(getattr(original(model), case.base), getattr(ported[model][1], case.base), config, side, kind=kind)
    _assert(checks, "interface-523-bf16", model)


def test_bf16_sees_operands_handed_over_in_another_dtype(workdir: Path, ported) -> None:  # type: ignore[no-untyped-def]
    """CodeGen's rotary table is float32, so query and key reach the dispatch in float32 beside a bf16 value: without
    the cast to the value's dtype the bf16 check sees SDPA raise."""
    from sdpa_port.verify import parity

    source = ported["codegen"][0]
    guard = "if attention_interface is not eager_attention_forward:"
    assert guard in source
    broken = load("codegen", source.replace(guard, "if False:"), workdir, tag="uncast")
    config = config_for("codegen")
    [check] = parity.check_bf16(getattr(original("codegen"), "CodeGenModel"), broken.CodeGenModel, config, "left", kind="decoder")
    assert not check.passed and "same dtype" in check.detail, str(check)


@pytest.mark.parametrize("model", [m for m, c in CASES.items() if c.lm])
def test_greedy_generation(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    from sdpa_port.verify import parity

    case = CASES[model]
    checks = parity.check_generate(
        getattr(original(model), case.lm), getattr(ported[model][1], case.lm), config_for(model)  # type: ignore[arg-type]
    )
    _assert(checks, "interface-523", model)


@pytest.mark.parametrize(
    "model,kind",
    [
        ("bloom", "mask"), ("codegen", "scale"), ("rembert", "output"), ("big_bird", "scale"), ("led", "scale"),
        ("mpt", "mask"), ("mpt", "scale"),
    ],
)
def test_parity_sees_sabotage(model: str, kind: str, workdir: Path, ported) -> None:  # type: ignore[no-untyped-def]
    """Sabotaging the SDPA path (ALiBi dropped, scale halved, output shifted) must fail the parity check."""
    from sdpa_port.verify import parity
    from harness import sabotage_interface

    case = CASES[model]
    broken = load(model, sabotage_interface(ported[model][0], kind), workdir, tag=f"sabotage_{kind}")
    config = config_for(model)
    model_kind = parity.model_kind(config, getattr(original(model), case.lm or case.base))
    side = "left" if model_kind == "decoder" else "right"
    checks = parity.check_forward(getattr(original(model), case.base), getattr(broken, case.base), config, side, kind=model_kind)
    sdpa = next(c for c in checks if "sdpa == eager" in c.name)
    record("sabotage-523", f"{model}:{kind}", sdpa.max_diff)
    assert not sdpa.passed, f"sabotage {kind} of {model} went unnoticed: {sdpa}"


@pytest.mark.parametrize("kind", ["mask", "scale"])
def test_parity_sees_a_class_style_port_broken(kind: str, workdir: Path, ported) -> None:  # type: ignore[no-untyped-def]
    """DeBERTa-v2: without its mask (the disentangled terms and the padding) or with half its scale, parity fails."""
    from sdpa_port.verify import parity
    from harness import sabotage

    case = CASES["deberta_v2"]
    broken = load("deberta_v2", sabotage(ported["deberta_v2"][0], kind), workdir, tag=f"sabotage_{kind}")
    checks = parity.check_forward(
        getattr(original("deberta_v2"), case.base), getattr(broken, case.base), config_for("deberta_v2"), "none"
    )
    sdpa = next(c for c in checks if "sdpa == eager" in c.name)
    record("sabotage-523", f"deberta_v2:{kind}", sdpa.max_diff)
    assert not sdpa.passed, f"sabotage {kind} of deberta_v2 went unnoticed: {sdpa}"


def test_idempotent_on_real_files(ported) -> None:  # type: ignore[no-untyped-def]
    from sdpa_port import Status, port_source

    for model, (source, _) in ported.items():
        again = port_source(source)
        assert again.status is Status.UNCHANGED and again.source == source, model


@pytest.mark.parametrize("model,base", [("align", "AlignTextModel"), ("splinter", "SplinterModel")])
def test_files_already_on_the_interface_get_is_causal_and_the_flag(model: str, base: str, workdir: Path) -> None:
    """align and splinter dispatch already but set no is_causal: flagged alone, SDPA would run them causally."""
    from sdpa_port.verify import parity
    from sdpa_port.verify.configs import tiny_config

    source = port_file(model)
    assert "self.is_causal = False" in source and "_supports_sdpa = True" in source
    ported = load(model, source, workdir, tag="flag")
    config = tiny_config(getattr(original(model), base).config_class)
    for padding in ("right", "none"):
        checks = parity.check_forward(getattr(original(model), base), getattr(ported, base), config, padding, kind="encoder")
        _assert(checks, "interface-523-flag", model)


def test_a_module_pinned_causal_that_only_bidirectional_masks_reach_is_unpinned() -> None:
    """BridgeTower builds cross-modal attention with is_causal=True; with the flag alone SDPA would drift from eager
    (refused before). Eager never read the flag and only bidirectional masks reach it: the port passes False there
    and says why (`test_verify_driven_523` verifies it and sees the flag put back)."""
    from harness import modeling_path

    from sdpa_port import Status, port_source

    result = port_source(modeling_path("bridgetower").read_text(encoding="utf-8"))
    assert result.status is Status.PORTED, result.reasons
    assert "BridgeTowerAttention(config, is_causal=False, layer_idx=layer_idx)" in result.source
    assert any("only bidirectional masks reach it" in note for note in result.notes), result.notes


def test_a_registered_kernel_is_called_by_ported_models(ported) -> None:  # type: ignore[no-untyped-def]
    """AttentionInterface.register("counted_sdpa", fn): models built with that name call fn and match eager."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from sdpa_port.verify import checks

    calls: list[str] = []

    def counted_sdpa(module, query, key, value, attention_mask, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(type(module).__name__)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("counted_sdpa", counted_sdpa)
    # a registered kernel also says which mask format it takes; this one takes SDPA's
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionMaskInterface.register("counted_sdpa", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    for model in ("xglm", "rembert"):
        case = CASES[model]
        config = config_for(model)
        module = ported[model][1]
        eager = checks.build(getattr(module, case.base), config, "eager")
        checks.sharpen(eager)
        custom = checks.build(getattr(module, case.base), config, "counted_sdpa")
        custom.load_state_dict(eager.state_dict())
        kind = checks.model_kind(config, getattr(module, case.lm or case.base))
        batch = checks.make_batch(config, kind, "left" if kind == "decoder" else "right")
        before = len(calls)
        with torch.no_grad():
            difference = checks.max_difference(eager(**batch.inputs), custom(**batch.inputs), batch)
        record("registered-kernel", model, {"calls": len(calls) - before, "max_diff": difference})
        assert len(calls) - before == config.num_hidden_layers, calls
        assert difference <= 1e-4


def test_the_attention_left_eager_computes_as_before(ported) -> None:  # type: ignore[no-untyped-def]
    """BigBird's block-sparse attention stays eager (S111) while its full attention is ported: configured
    block-sparse, the ported model loaded for sdpa gives the original's eager outputs exactly, and runs no SDPA."""
    import torch

    from harness import modeling_path
    from sdpa_port import port_source
    from sdpa_port.verify.configs import tiny_config

    result = port_source(modeling_path("big_bird").read_text(encoding="utf-8"))
    assert any("BigBirdBlockSparseAttention stays eager" in w and "[S111]" in w for w in result.warnings), result.warnings
    overrides = {"attention_type": "block_sparse", "block_size": 2, "num_random_blocks": 1, "max_position_embeddings": 64}
    base = original("big_bird").BigBirdModel
    torch.manual_seed(0)
    reference = base._from_config(tiny_config(base.config_class, overrides), attn_implementation="eager").eval()
    port = getattr(ported["big_bird"][1], "BigBirdModel")
    model = port._from_config(tiny_config(base.config_class, overrides), attn_implementation="sdpa").eval()
    model.load_state_dict(reference.state_dict())
    assert type(model.encoder.layer[0].attention.self).__name__ == "BigBirdBlockSparseAttention"
    ids = torch.randint(3, 90, (2, 32))
    mask = torch.ones_like(ids)
    mask[0, 24:] = 0
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counted
    try:
        with torch.no_grad():
            expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
            got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    assert model.encoder.layer[0].attention.self.__class__.__name__ == "BigBirdBlockSparseAttention"
    assert not calls
    assert torch.equal(expected, got)


@pytest.mark.parametrize("kind", ["none", "scale"])
def test_outputs_that_jump_are_judged_at_the_attention_modules(kind: str, workdir: Path) -> None:
    """FastSpeech2 rounds predicted durations, so its outputs jump by whole frames for a rounding-sized change in
    its attention: the port is judged at its attention modules instead, and a halved scale still fails there."""
    from sdpa_port.verify import parity
    from sdpa_port.verify.configs import tiny_config
    from harness import sabotage, sabotage_interface

    model = "fastspeech2_conformer"
    source = port_file(model)
    if kind != "none":
        source = (sabotage_interface if "attention_interface(" in source else sabotage)(source, kind)
    module = load(model, source, workdir, tag=f"jumps_{kind}")
    base = getattr(original(model), "FastSpeech2ConformerModel")
    config = tiny_config(base.config_class)
    checks = parity.check_forward(base, getattr(module, "FastSpeech2ConformerModel"), config, "none")
    sdpa = next(c for c in checks if "sdpa == eager" in c.name)
    record("jumps-523", f"{model}:{kind}", sdpa.detail[-120:])
    assert "eager and SDPA on the eager model's inputs" in sdpa.detail, sdpa
    assert sdpa.passed is (kind == "none"), sdpa


def test_a_module_causal_for_some_calls_takes_its_causality_from_always_built_masks(workdir: Path) -> None:
    """BLIP's text model picks `create_causal_mask` or `create_bidirectional_mask` by its `is_decoder` argument, so
    one module is causal for some calls and not for others (refused before, C301). The port keeps `is_causal = False`
    and makes the causal builder always build its mask: parity for the bidirectional base model and for the LM head,
    which passes `is_decoder=True`, unpadded (where sdpa's builder would otherwise return None). With the builder
    allowed to skip again, the LM head's outputs differ: the check sees it."""
    from harness import modeling_path

    from sdpa_port import Status, port_source
    from sdpa_port.verify import parity
    from sdpa_port.verify.configs import tiny_config
    from sdpa_port.verify.loader import load_source_in_package

    result = port_source(modeling_path("blip").with_name("modeling_blip_text.py").read_text(encoding="utf-8"))
    assert result.status is Status.PORTED, result.reasons
    assert result.source.count("allow_is_causal_skip=False") == 1 and "_supports_attention_backend" not in result.source
    module = importlib.import_module("transformers.models.blip.modeling_blip_text")
    config = tiny_config(module.BlipTextConfig)
    broken = result.source.replace("allow_is_causal_skip=False", "allow_is_causal_skip=True")
    for tag, source in (("kept", result.source), ("skipping", broken)):
        ported = load_source_in_package(source, "transformers.models.blip", workdir, f"modeling_blip_text_{tag}")
        checks = [
            *parity.check_forward(module.BlipTextModel, ported.BlipTextModel, config, "right", kind="encoder"),
            *parity.check_forward(module.BlipTextLMHeadModel, ported.BlipTextLMHeadModel, config, "none", kind="decoder"),
        ]
        failed = [str(c) for c in checks if not c.passed]
        if tag == "kept":
            _assert(checks, "interface-523-blip-text", "blip_text")
        else:
            assert any("BlipTextLMHeadModel[none] sdpa == eager" in line for line in failed), "\n".join(map(str, checks))


def test_a_mask_extended_over_prompt_keys_is_given_in_each_implementation_s_format(workdir: Path) -> None:
    """MVP prepends its prompt keys and extends eager's float mask with zeros for them (refused before, M204). The
    port gives the block the boolean format under sdpa and always builds the decoder's causal mask (sdpa's shortcut
    cannot see the prompt keys): parity with prompts on, padded and not. Either half undone, the check sees it."""
    from sdpa_port import Status, port_source
    from sdpa_port.verify import parity
    from sdpa_port.verify.configs import tiny_config
    from sdpa_port.verify.loader import load_source_in_package

    from harness import modeling_path

    result = port_source(modeling_path("mvp").read_text(encoding="utf-8"), filename="modeling_mvp.py")
    assert result.status is Status.PORTED, result.reasons
    converted = "                    prompt_mask = prompt_mask == 0\n"
    assert result.source.count(converted) == 1 and result.source.count("allow_is_causal_skip=False") == 1
    module = original("mvp")
    config = tiny_config(module.MvpConfig, {"use_prompt": True, "prompt_length": 3, "prompt_mid_dim": 16})
    variants = {
        "port": result.source,
        "float_block": result.source.replace(converted, "                    pass\n"),
        "skipping": result.source.replace("allow_is_causal_skip=False", "allow_is_causal_skip=True"),
    }
    for tag, source in variants.items():
        ported = load_source_in_package(source, "transformers.models.mvp", workdir, f"modeling_mvp_{tag}")
        checks = [
            check
            for padding in ("right", "none")
            for check in parity.check_forward(module.MvpModel, ported.MvpModel, config, padding, kind="seq2seq")
        ]
        if tag == "port":
            _assert(checks, "interface-523-mvp-prompts", "mvp")
        else:
            assert any(c.name.endswith("sdpa == eager") and not c.passed for c in checks), "\n".join(map(str, checks))


def test_a_causal_buffer_handed_over_keeps_its_alignment_after_a_cache(workdir: Path, ported) -> None:  # type: ignore[no-untyped-def]
    """Bark builds its causal blocks with `is_causal=True` and gives them bidirectional masks; their own causal
    buffer goes to the implementations in `position_bias`, with `is_causal=False` (was refused C302). Continuing
    from a cache with several tokens is where sdpa's reading of the flag would be wrong (top-left alignment, keys
    cropped to the queries): the port matches eager there, and the same port left to the flag does not."""
    import torch
    from transformers import DynamicCache

    from sdpa_port.verify.checks import build, sharpen

    source, module = ported["bark"]
    assert source.count("            is_causal=False,\n") == 1
    left_to_flag = load("bark", source.replace("            is_causal=False,\n", ""), workdir, tag="flag")
    reference = build(original("bark").BarkSemanticModel, config_for("bark"), "eager")
    sharpen(reference, 2.0)
    ids = torch.randint(0, reference.config.input_vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))

    def continued(model_class, implementation: str) -> torch.Tensor:  # type: ignore[no-untyped-def]
        model = build(model_class, config_for("bark"), implementation)  # a config of its own
        model.load_state_dict(reference.state_dict())
        with torch.no_grad():
            cache = DynamicCache()
            model(ids[:, :5], past_key_values=cache, use_cache=True)
            return model(ids[:, 5:], past_key_values=cache, use_cache=True).logits

    expected = continued(original("bark").BarkSemanticModel, "eager")
    found = continued(module.BarkSemanticModel, "sdpa")
    record("interface-523", "bark: continued from a cache", float((found - expected).abs().max()))
    assert torch.allclose(found, expected, atol=1e-4), float((found - expected).abs().max())
    flagged = continued(left_to_flag.BarkSemanticModel, "sdpa")
    assert not torch.allclose(flagged, expected, atol=1e-2), "the flag's alignment went unnoticed"


@pytest.mark.parametrize("is_decoder", [False, True])
def test_the_side_kept_eager_takes_eager_s_mask(is_decoder: bool, workdir: Path, ported) -> None:  # type: ignore[no-untyped-def]
    """ImageGPT under `reorder_and_upcast_attn=True` runs its upcast helper as written beside the dispatch, under
    every implementation. Its mask comes from `create_bidirectional_mask` or, for a decoder, from a
    `create_causal_mask` the port always builds; under sdpa it is converted to eager's form first. The port's
    sdpa matches the original's eager on padded batches, and the same port without the conversion does not."""
    from sdpa_port.verify import parity

    source, module = ported["imagegpt"]
    start = source.index("        if self.reorder_and_upcast_attn:\n") + len("        if self.reorder_and_upcast_attn:\n")
    end = source.index("            attn_output, attn_weights = self._upcast_and_reordered_attn(")
    assert "attention_mask.dtype == torch.bool" in source[start:end]
    unconverted = load("imagegpt", source[:start] + source[end:], workdir, tag="unconverted")
    config = config_for("imagegpt", reorder_and_upcast_attn=True, is_decoder=is_decoder)
    base = original("imagegpt").ImageGPTModel
    for padding in ("left", "right"):
        checks = parity.check_forward(base, module.ImageGPTModel, config, padding, kind="encoder")
        parity_check = next(c for c in checks if c.name.endswith("sdpa == eager"))
        record("interface-523", f"imagegpt upcast side, is_decoder={is_decoder}, {padding}", parity_check.max_diff)
        assert parity_check.passed, str(parity_check)
    # left padding: every query is causal by ImageGPT's own buffer, so only padding before it changes what it sees
    broken = parity.check_forward(base, unconverted.ImageGPTModel, config, "left", kind="encoder")
    assert not next(c for c in broken if c.name.endswith("sdpa == eager")).passed, "the unconverted mask went unnoticed"


# their eager statements read sizes, a causal slice, a fill value and `output_attentions` from forward
STANDARD_SIGNATURE = ["bark", "imagegpt", "trocr", "led", "xglm"]


@pytest.mark.parametrize("model", STANDARD_SIGNATURE)
def test_the_eager_function_keeps_the_standard_signature_and_eager_s_weights(model: str, ported) -> None:  # type: ignore[no-untyped-def]
    """The eager function computes what it reads or takes it from `**kwargs` (`plan/eager_values.py`): no
    keyword-only parameter, and with weights asked for the port gives the original's weights and outputs."""
    import ast

    import torch

    from sdpa_port.verify.checks import build, make_batch, sharpen

    source, module = ported[model]
    functions = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and "eager_attention" in n.name]
    assert functions and not [a.arg for f in functions for a in f.args.kwonlyargs]
    case = CASES[model]
    config = config_for(model)
    expected_model = build(getattr(original(model), case.base), config, "eager")
    sharpen(expected_model)
    kind = "decoder" if case.lm else "encoder"
    batch = make_batch(config, kind, "left" if kind == "decoder" else "right")
    with torch.no_grad():
        expected = expected_model(**batch.inputs, output_attentions=True)
    for implementation in ("eager", "sdpa"):
        model_ = build(getattr(module, case.base), config, implementation)
        model_.load_state_dict(expected_model.state_dict())
        with torch.no_grad():
            found = model_(**batch.inputs, output_attentions=True)
        fields = [k for k in expected.keys() if k.endswith("attentions")]  # decoder_, cross_, encoder_ ones too
        assert fields and all(a is not None for k in fields for a in expected[k])
        for field in fields:
            assert len(found[field]) == len(expected[field])
            for got, want in zip(found[field], expected[field]):
                torch.testing.assert_close(got, want)
