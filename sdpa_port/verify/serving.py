"""Serving and export checks for ported decoders: what models already on the attention interface support.

- continuous batching (`generate_batch`, paged cache) gives each prompt's greedy `generate` tokens;
- a kernel registered through `AttentionInterface` is called in every layer, with `position_ids`, and gives the same
  tokens;
- `torch.export` with a static cache (`transformers.integrations.executorch`) gives the original's tokens;
- where `executorch` is importable, the exported program lowered to XNNPACK and run from its `.pte` buffer gives
  the eager logits (skipped with the reason otherwise).

Like `checks.py`, this module imports only the standard library, torch and transformers (and executorch when it is
there), so an emitted test can carry its text after that of `checks.py`; the one import from `checks` below is
then dropped.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterator

import torch

from sdpa_port.verify.checks import Check, build, sharpen

PROMPTS = ((5, 6, 7, 8, 9), (10, 11, 12), (13, 14, 15, 16, 17, 18, 19))
NEW_TOKENS = 5
PROBE = "sdpa_port_probe"  # the name the kernel check registers
LOGITS_TOLERANCE = 1e-4  # ExecuTorch (XNNPACK, fp32) against the same program run eagerly


@dataclass
class Models:
    """The original's eager model, sharpened, and its weights, for building ported models alike."""

    original: Any
    state: dict[str, torch.Tensor]
    config: Any


def reference(original_class: type, config: Any, gain: float = 2.0) -> Models:
    original = build(original_class, config, "eager")
    sharpen(original, gain)
    return Models(original, original.state_dict(), config)


def ported_model(ported_class: type, models: Models, implementation: str) -> Any:
    model = build(ported_class, models.config, implementation)
    model.load_state_dict(models.state)
    return model


def greedy_tokens(model: Any, prompts: tuple[tuple[int, ...], ...] = PROMPTS, new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Each prompt alone, greedy, exactly `new_tokens` new tokens."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=0,
            )
            out.append(generated[0, len(prompt) :].tolist())
    return out


def _same(name: str, expected: list[list[int]], got: list[list[int]], detail: str = "") -> Check:
    same = expected == got
    text = detail if same else f"{detail} expected {expected}, got {got}".strip()
    return Check(name, same, None, text)


# ------------------------------------------------------------------ continuous batching


def continuous_batching_tokens(model: Any, prompts: tuple[tuple[int, ...], ...], new_tokens: int) -> list[list[int]]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    generation = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    # a small paged cache: every prompt is prefilled in one packed batch, then decoded together
    paged = ContinuousBatchingConfig(
        page_size=16, num_blocks=16, max_batch_tokens=64, max_requests_per_batch=4, use_async_batching=False
    )
    with torch.no_grad(), _quiet_batching() as errors:
        outputs = model.generate_batch(
            inputs=[list(p) for p in prompts], generation_config=generation, continuous_batching_config=paged, warmup=False
        )
    by_prompt = {tuple(o.prompt_ids): list(o.generated_tokens) for o in outputs.values()}
    if errors:
        # the manager logs a failing forward and returns the requests as far as they got: that error is the finding
        raise BatchingFailed(errors[0])
    return [by_prompt.get(tuple(p), []) for p in prompts]


class BatchingFailed(RuntimeError):
    """The generation loop of continuous batching failed; the message is its error."""


@contextlib.contextmanager
def _quiet_batching() -> Iterator[list[str]]:
    """Continuous batching's logger kept off stderr, its errors collected.

    Its psutil notices and eos warnings are not the port's.

    A filter on the logger itself, since the generation loop swaps its handlers for tqdm's while it runs.
    """
    from transformers.generation.continuous_batching.utils import logger

    errors: list[str] = []

    def collect(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            errors.append(f"{type(error).__name__}: {error}")
        return False

    logger.addFilter(collect)
    try:
        yield errors
    finally:
        logger.removeFilter(collect)


def check_continuous_batching(
    original_class: type, ported_class: type, config: Any, implementation: str = "sdpa", models: Models | None = None
) -> list[Check]:
    """The port's batched generation with a paged cache against each prompt's greedy generation by the original.

    `generate_batch` packs the prompts. `implementation` "eager" runs transformers' `paged|eager`.
    """
    models = models or reference(original_class, config)
    expected = greedy_tokens(models.original)
    model = ported_model(ported_class, models, implementation)
    name = f"{ported_class.__name__}[continuous batching, {implementation}] tokens == generate"
    try:
        got = continuous_batching_tokens(model, PROMPTS, NEW_TOKENS)
    except BatchingFailed as error:  # the port's own code failing under a paged cache is the finding
        return [Check(name, False, None, str(error))]
    except Exception as error:
        return [Check(name, False, None, f"{type(error).__name__}: {error}")]
    return [_same(name, expected, got, f"{len(PROMPTS)} prompts")]


# ------------------------------------------------------------------ a registered kernel


@dataclass
class KernelCalls:
    modules: list[int]
    with_positions: int = 0
    without_positions: int = 0
    position_bias: int = 0


def probe_kernel(record: KernelCalls) -> Callable[..., Any]:
    """SDPA behind a kernel registered by name, recording what each call receives."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def probe(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        record.modules.append(id(module))
        if kwargs.get("position_ids") is not None:
            record.with_positions += 1
        else:
            record.without_positions += 1
        if kwargs.get("position_bias") is not None:
            record.position_bias += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    return probe


def register_probe(record: KernelCalls, name: str = PROBE) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(name, probe_kernel(record))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # it takes SDPA's masks


def attention_layers(config: Any) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "num_hidden_layers"))


def check_registered_kernel(
    original_class: type, ported_class: type, config: Any, models: Models | None = None
) -> list[Check]:
    """A kernel registered through `AttentionInterface` and selected by name, as serving stacks plug theirs in.

    The kernel is called once per layer and step, always with `position_ids`, and the tokens are the original's.
    """
    models = models or reference(original_class, config)
    expected = greedy_tokens(models.original)
    record = KernelCalls([])
    register_probe(record)
    model = ported_model(ported_class, models, PROBE)
    label = f"{ported_class.__name__}[registered kernel]"
    with torch.no_grad():
        model(input_ids=torch.tensor([PROMPTS[0]]))
    layers = attention_layers(config)
    called = len(set(record.modules))
    checks = [Check(f"{label} called in every layer", called == layers, None, f"{called} of {layers} layers")]
    got = greedy_tokens(model)
    calls = record.with_positions + record.without_positions
    checks.append(
        Check(
            f"{label} receives position_ids",
            record.without_positions == 0 and calls > 0,
            None,
            f"{record.with_positions} of {calls} calls",
        )
    )
    bias = f", position_bias in {record.position_bias}" if record.position_bias else ""
    checks.append(_same(f"{label} tokens == generate", expected, got, f"{calls} calls{bias}"))
    return checks


# ------------------------------------------------------------------ torch.export with a static cache


def exportable(model: Any, max_cache_len: int) -> Any:
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    if getattr(model, "generation_config", None) is None:  # a base model: the wrapper returns its hidden states
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig()
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    model.generation_config.cache_config = {"batch_size": 1, "max_cache_len": max_cache_len}
    return TorchExportableModuleWithStaticCache(model)


class DecodeStep(torch.nn.Module):
    """The static-cache wrapper called with positional inputs, as ExecuTorch's runtime passes them.

    The inputs are `(input_ids, cache_position)`.
    """

    def __init__(self, wrapper: torch.nn.Module) -> None:
        super().__init__()
        self.wrapper = wrapper

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> Any:
        return self.wrapper(input_ids=input_ids, cache_position=cache_position)


def export_static(model: Any, max_cache_len: int, strict: bool = True, length: int = 1) -> Any:
    """A step of `length` tokens exported with a static cache, as ExecuTorch takes it.

    One token is the decode step.
    """
    step = DecodeStep(exportable(model, max_cache_len))
    example = (torch.ones(1, length, dtype=torch.long), torch.arange(length))
    with torch.no_grad():
        return torch.export.export(step, args=example, strict=strict)


def static_decode(step: Callable[[torch.Tensor, torch.Tensor], Any], prompt: tuple[int, ...], new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Feed the prompt one token at a time, then decode greedily: the new tokens and the logits of every step.

    (`TorchExportableModuleWithStaticCache.generate` builds a new module from the program at every step, and its
    tokens drift from `generate` on tiny models; one module keeps its cache buffers.)
    """
    tokens = list(prompt)
    logits = []
    with torch.no_grad():
        for position in range(len(prompt) + new_tokens - 1):
            out = step(torch.tensor([[tokens[position]]]), torch.tensor([position]))
            logits.append(out)
            if position + 1 >= len(tokens):
                tokens.append(int(out[0, -1].argmax()))
    return tokens[len(prompt) :], logits


def exported_tokens(program: Any, prompts: tuple[tuple[int, ...], ...], new_tokens: int) -> list[list[int]]:
    module = program.module()
    return [
        static_decode(lambda ids, position: module(ids, position), prompt, new_tokens)[0]
        for prompt in prompts
    ]


def max_cache_length(prompts: tuple[tuple[int, ...], ...] = PROMPTS, new_tokens: int = NEW_TOKENS) -> int:
    return max(len(p) for p in prompts) + new_tokens + 1


def check_static_export(
    original_class: type, ported_class: type, config: Any, implementation: str = "sdpa", models: Models | None = None
) -> list[Check]:
    """A strict `torch.export` of the port with a static cache, whose program decodes the original's tokens."""
    models = models or reference(original_class, config)
    expected = greedy_tokens(models.original)
    model = ported_model(ported_class, models, implementation)
    name = f"{ported_class.__name__}[torch.export, static cache, {implementation}] tokens == generate"
    try:
        program = export_static(model, max_cache_length())
    except Exception as error:  # an export failure of the port's code is the finding
        return [Check(name, False, None, f"export failed: {type(error).__name__}: {str(error).splitlines()[0]}")]
    return [_same(name, expected, exported_tokens(program, PROMPTS, NEW_TOKENS))]


# ------------------------------------------------------------------ ExecuTorch


def executorch_missing() -> str | None:
    """Why the ExecuTorch check cannot run here, or None."""
    try:
        import executorch.runtime  # noqa: F401
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: F401
        from executorch.exir import to_edge_transform_and_lower  # noqa: F401
    except ImportError as error:
        return f"executorch is not importable ({error})"
    return None


def lower_to_xnnpack(program: Any) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    return bytes(to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)


@dataclass
class Pte:
    """A loaded `.pte`: the method keeps pointing into the program and its buffer, so all three stay together."""

    buffer: bytes
    program: Any
    method: Any

    def __call__(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> Any:
        return self.method.execute([input_ids, cache_position])[0]


def load_pte(buffer: bytes) -> Pte:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(buffer)
    return Pte(buffer, program, program.load_method("forward"))


def check_executorch(
    original_class: type, ported_class: type, config: Any, implementation: str = "sdpa", models: Models | None = None
) -> list[Check]:
    """The static-cache program lowered to XNNPACK and run by ExecuTorch, against the same module run eagerly.

    The program runs from its `.pte` buffer: its logits at every step of a prompt and its greedy continuation equal
    those of the same module run eagerly.
    """
    name = f"{ported_class.__name__}[ExecuTorch XNNPACK .pte] logits == eager"
    missing = executorch_missing()
    if missing is not None:
        return [Check(name, True, None, missing, skipped=True)]
    models = models or reference(original_class, config)
    model = ported_model(ported_class, models, implementation)
    length = max_cache_length()
    try:
        pte = load_pte(lower_to_xnnpack(export_static(model, length)))
    except Exception as error:
        return [Check(name, False, None, f"lowering failed: {type(error).__name__}: {str(error).splitlines()[0]}")]
    eager = exportable(ported_model(ported_class, models, implementation), length)
    _, expected = static_decode(lambda ids, position: eager(input_ids=ids, cache_position=position), PROMPTS[0], NEW_TOKENS)
    _, got = static_decode(pte, PROMPTS[0], NEW_TOKENS)
    worst = max(float((a - b).abs().max()) for a, b in zip(expected, got))
    return [Check(name, worst <= LOGITS_TOLERANCE, worst, f"{len(got)} decode steps")]


CUSTOM_SDPA = "custom_sdpa"


def custom_sdpa_forward(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
    scaling: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """ExecuTorch's `llama::custom_sdpa` behind the attention interface, as optimum-executorch registers it.

    Static cache only, causal, the start position read from `position_ids`; the mask and `position_bias` are not read.
    """
    max_seq_len = key.shape[2]
    dtype = query.dtype
    query, key, value = (t.transpose(1, 2).to(torch.float32) for t in (query, key, value))
    kwargs.pop("is_causal", None)
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError("custom_sdpa needs position_ids to find the start position in the static cache")
    start = position_ids[0][0].item()
    torch._check_is_size(start)
    torch._check(start < max_seq_len)
    output = torch.ops.llama.custom_sdpa(query, key, value, start, None, 0.0, bool(module.is_causal), scaling)
    return output.to(dtype), None


def register_custom_sdpa() -> None:
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (registers torch.ops.llama)
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(CUSTOM_SDPA, custom_sdpa_forward)
    AttentionMaskInterface.register(CUSTOM_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def check_custom_sdpa(
    original_class: type, ported_class: type, config: Any, models: Models | None = None
) -> list[Check]:
    """ExecuTorch's custom SDPA registered as optimum-executorch does, on a static cache: the original's tokens.

    The kernel reads neither the mask nor `position_bias`: a port handing ALiBi or relative positions over that way
    is not claimed (skipped with the reason)."""
    name = f"{ported_class.__name__}[ExecuTorch custom_sdpa, static cache] tokens == generate"
    missing = executorch_missing()
    if missing is not None:
        return [Check(name, True, None, missing, skipped=True)]
    models = models or reference(original_class, config)
    record = KernelCalls([])
    register_probe(record)
    with torch.no_grad():
        ported_model(ported_class, models, PROBE)(input_ids=torch.tensor([PROMPTS[0]]))
    if record.position_bias:
        return [Check(name, True, None, "custom_sdpa ignores position_bias (ALiBi, relative positions): not supported", skipped=True)]
    register_custom_sdpa()
    expected = greedy_tokens(models.original)
    wrapper = exportable(ported_model(ported_class, models, CUSTOM_SDPA), max_cache_length())
    try:
        got = [
            static_decode(lambda ids, position: wrapper(input_ids=ids, cache_position=position), prompt, NEW_TOKENS)[0]
            for prompt in PROMPTS
        ]
    except Exception as error:  # the kernel failing on the port's arguments is the finding
        return [Check(name, False, None, f"{type(error).__name__}: {str(error).splitlines()[0]}")]
    return [_same(name, expected, got)]


def serving_checks(original_class: type, ported_class: type, config: Any) -> list[Check]:
    """Every serving and export check of a ported decoder, sharing one reference model.

    Continuous batching runs with sdpa and with transformers' `paged|eager`; the latter ignores `position_bias`, so
    for a port handing its ALiBi or relative positions over that way it is reported as skipped, with the reason.
    """
    models = reference(original_class, config)
    checks = check_continuous_batching(original_class, ported_class, config, "sdpa", models=models)
    kernel = check_registered_kernel(original_class, ported_class, config, models=models)
    name = f"{ported_class.__name__}[continuous batching, eager] tokens == generate"
    if any("position_bias" in c.detail for c in kernel):
        checks.append(Check(name, True, None, "transformers' paged|eager ignores position_bias", skipped=True))
    else:
        checks.extend(check_continuous_batching(original_class, ported_class, config, "eager", models=models))
    checks.extend(kernel)
    checks.extend(check_static_export(original_class, ported_class, config, models=models))
    checks.extend(check_executorch(original_class, ported_class, config, models=models))
    checks.extend(check_custom_sdpa(original_class, ported_class, config, models=models))
    if not getattr(ported_class, "_supports_attention_backend", False):
        # the port does not claim the attention backends and said why in its warnings (kwargs not threaded,
        # positions the model does not build, a position_bias kernels may ignore): what fails is reported, not failed
        checks = [c if c.passed else _not_claimed(c) for c in checks]
    return checks


def _not_claimed(check: Check) -> Check:
    detail = f"not claimed (the port sets no _supports_attention_backend): {check.detail}"
    return Check(check.name, True, check.max_diff, detail, skipped=True)


def serving_checks_for(ported: ModuleType, lm_class: type, config: Any) -> list[Check]:
    """The serving checks of an interface-style port of a decoder, none for other ports.

    Interface style is transformers 5's.
    """
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5 or not hasattr(ported, "ALL_ATTENTION_FUNCTIONS"):
        return []
    return serving_checks(lm_class, getattr(ported, lm_class.__name__), config)
