"""Parity checks between an original eager model and its SDPA port, on sharpened random-init weights.

One implementation serves the project's acceptance tests, `--verify` and (rendered into a template) the emitted
tests: build the original with eager attention, sharpen its weights so attention is far from uniform, copy the
weights into the ported model built with eager and with SDPA, compare on a padded batch, count SDPA calls and
compare greedy generation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from sdpa_port.verify.configs import fresh

SDPA_OP = "aten::scaled_dot_product_attention"
SPECIAL_TOKENS = 3  # ids 0 (pad), 1 (bos), 2 (eos) are never drawn for inputs


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    max_diff: float | None = None
    detail: str = ""

    def __str__(self) -> str:
        diff = f" max|diff|={self.max_diff:.3g}" if self.max_diff is not None else ""
        state = "ok" if self.passed else "FAILED"
        return f"{self.name}: {state}{diff}{' ' + self.detail if self.detail else ''}"


# ------------------------------------------------------------------ models


def sharpen(model: torch.nn.Module, gain: float = 2.0, seed: int = 0) -> None:
    """Re-draw weights so attention logits have a spread of several units (random init makes it near uniform).

    Matrices get std gain/sqrt(fan_in), embeddings std 1, biases std 0.5, norm scales U(0.5, 1.5). A wrong scale or a
    dropped additive term then moves the outputs far beyond the parity tolerance.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.dim() >= 2:
                    if isinstance(module, torch.nn.Embedding):
                        std = 1.0
                    else:
                        std = gain / math.sqrt(max(parameter.shape[-1], 1))
                    values = torch.randn(parameter.shape, generator=generator) * std
                elif name == "bias" or "bias" in name:
                    values = torch.randn(parameter.shape, generator=generator) * 0.5
                else:
                    values = torch.rand(parameter.shape, generator=generator) + 0.5
                parameter.copy_(values.to(parameter.dtype))


def build(model_class: type, config: Any, attn_implementation: str, dtype: torch.dtype = torch.float32) -> Any:
    """A model with its own copy of the config (transformers 5 writes the attention choice into it)."""
    import transformers

    dtype_argument = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    arguments = {"attn_implementation": attn_implementation, dtype_argument: dtype}
    model = model_class._from_config(fresh(config), **arguments)
    model.eval()
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != attn_implementation:
        raise RuntimeError(f"{model_class.__name__} built with {implementation!r}, not {attn_implementation!r}")
    return model


# ------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class Batch:
    inputs: dict[str, torch.Tensor]
    keep: torch.Tensor  # (batch, length) positions that are not padding
    decoder_keep: torch.Tensor | None = None


def model_kind(config: Any, model_class: type) -> str:
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    name = model_class.__name__
    if "CausalLM" in name or "LMHead" in name or getattr(config, "is_decoder", False):
        return "decoder"
    return "encoder"


def make_batch(
    config: Any, kind: str, padding: str, batch: int = 2, length: int = 8, pad: int = 3, seed: int = 1
) -> Batch:
    """Random token ids with the last example padded on the left or the right (or not at all)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = int(getattr(config, "vocab_size", 99))
    ids = torch.randint(SPECIAL_TOKENS, vocab, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padding == "left":
        mask[-1, :pad] = 0
    elif padding == "right":
        mask[-1, length - pad :] = 0
    pad_id = getattr(config, "pad_token_id", None)
    ids = ids.masked_fill(mask == 0, pad_id if pad_id is not None else 0)
    inputs: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": mask}
    decoder_keep = None
    if kind == "seq2seq":
        decoder_length = max(length - 2, 2)
        inputs["decoder_input_ids"] = torch.randint(SPECIAL_TOKENS, vocab, (batch, decoder_length), generator=generator)
        decoder_keep = torch.ones(batch, decoder_length, dtype=torch.long)
    return Batch(inputs, mask, decoder_keep)


# ------------------------------------------------------------------ comparing


def tensors(output: Any) -> Iterator[tuple[str, torch.Tensor]]:
    items = output.items() if hasattr(output, "items") else enumerate(output if isinstance(output, tuple) else [output])
    for key, value in items:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            yield str(key), value


def max_difference(a: Any, b: Any, batch: Batch) -> float:
    """Largest absolute difference over the tensors of two outputs, at non-padded positions."""
    worst = 0.0
    b_tensors = dict(tensors(b))
    compared = 0
    for key, left in tensors(a):
        right = b_tensors.get(key)
        if right is None or right.shape != left.shape:
            continue
        keep = None
        if left.dim() >= 2 and tuple(left.shape[:2]) == tuple(batch.keep.shape):
            keep = batch.keep
        elif batch.decoder_keep is not None and left.dim() >= 2 and tuple(left.shape[:2]) == tuple(batch.decoder_keep.shape):
            keep = batch.decoder_keep
        difference = (left.float() - right.float()).abs()
        if keep is not None:
            difference = difference[keep.bool()]
        if difference.numel():
            if not torch.isfinite(difference).all():
                return math.inf
            worst = max(worst, float(difference.max()))
            compared += 1
    if compared == 0:
        raise ValueError("the outputs have no tensors in common to compare")
    return worst


def count_sdpa_calls(run: Callable[[], Any]) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return sum(event.count for event in profile.key_averages() if event.key == SDPA_OP)


# ------------------------------------------------------------------ the checks


def check_forward(
    original_class: type,
    ported_class: type,
    config: Any,
    padding: str,
    *,
    kind: str | None = None,
    eager_tolerance: float = 1e-6,
    sdpa_tolerance: float = 1e-4,
    gain: float = 2.0,
) -> list[Check]:
    kind = kind or model_kind(config, original_class)
    torch.manual_seed(0)
    original = build(original_class, config, "eager")
    sharpen(original, gain)
    state = original.state_dict()
    ported_eager = build(ported_class, config, "eager")
    ported_eager.load_state_dict(state)
    ported_sdpa = build(ported_class, config, "sdpa")
    ported_sdpa.load_state_dict(state)
    batch = make_batch(config, kind, padding)
    label = f"{original_class.__name__}[{padding}]"
    with torch.no_grad():
        reference = original(**batch.inputs)
        eager = ported_eager(**batch.inputs)
        sdpa_output: list[Any] = []
        calls = count_sdpa_calls(lambda: sdpa_output.append(ported_sdpa(**batch.inputs)))
    eager_diff = max_difference(reference, eager, batch)
    sdpa_diff = max_difference(reference, sdpa_output[0], batch)
    return [
        Check(f"{label} eager unchanged", eager_diff <= eager_tolerance, eager_diff),
        Check(f"{label} sdpa == eager", sdpa_diff <= sdpa_tolerance, sdpa_diff),
        Check(f"{label} sdpa executed", calls > 0, None, f"{calls} SDPA call(s)"),
    ]


def check_generate(
    original_class: type, ported_class: type, config: Any, *, new_tokens: int = 6, gain: float = 2.0
) -> list[Check]:
    kind = model_kind(config, original_class)
    padding = "left" if kind == "decoder" else "right"
    torch.manual_seed(0)
    original = build(original_class, config, "eager")
    sharpen(original, gain)
    state = original.state_dict()
    ported_eager = build(ported_class, config, "eager")
    ported_eager.load_state_dict(state)
    ported_sdpa = build(ported_class, config, "sdpa")
    ported_sdpa.load_state_dict(state)
    batch = make_batch(config, kind, padding)
    arguments = {
        "input_ids": batch.inputs["input_ids"],
        "attention_mask": batch.inputs["attention_mask"],
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "num_beams": 1,
        "use_cache": True,
        "pad_token_id": getattr(config, "pad_token_id", None) or 0,
    }
    if kind == "seq2seq":
        arguments["decoder_start_token_id"] = getattr(config, "decoder_start_token_id", None) or 2
    with torch.no_grad():
        reference = original.generate(**arguments)
        eager = ported_eager.generate(**arguments)
        sdpa = ported_sdpa.generate(**arguments)
    label = f"{original_class.__name__}[generate]"
    same_eager = reference.shape == eager.shape and bool((reference == eager).all())
    same_sdpa = reference.shape == sdpa.shape and bool((reference == sdpa).all())
    return [
        Check(f"{label} eager tokens unchanged", same_eager, None, f"{reference.shape[-1]} tokens"),
        Check(f"{label} sdpa tokens == eager", same_sdpa, None, "" if same_sdpa else f"{reference.tolist()} vs {sdpa.tolist()}"),
    ]
