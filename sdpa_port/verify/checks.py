"""Parity checks between attention implementations of a transformers model.

This module imports only the standard library, torch and transformers: sdpa-port's `--verify` and acceptance tests
import it, and every emitted parity test carries a copy of it, so a test committed into a transformers pull request
runs the very same checks.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


SDPA_OP = "aten::scaled_dot_product_attention"
SPECIAL_TOKENS = 3  # ids 0, 1 and 2 (pad, bos, eos in the tiny configs) are never drawn as inputs


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    max_diff: float | None = None
    detail: str = ""
    skipped: bool = False  # not run here (a missing optional package); `detail` says why

    def __str__(self) -> str:
        diff = f" max|diff|={self.max_diff:.3g}" if self.max_diff is not None else ""
        state = "skipped" if self.skipped else "ok" if self.passed else "FAILED"
        return f"{self.name}: {state}{diff}{' ' + self.detail if self.detail else ''}"


# ------------------------------------------------------------------ models


def sharpen(model: torch.nn.Module, gain: float = 2.0, seed: int = 0) -> None:
    """Re-draw weights so that attention logits spread over several units.

    Random initialisation makes attention near uniform.

    Matrices get std gain/sqrt(fan_in), embeddings std 1, biases std 0.5, norm scales U(0.5, 1.5). A wrong scale or a
    dropped additive term then moves the outputs far beyond the parity tolerance.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.dim() >= 2:
                    fan_in = max(parameter.shape[-1], 1)
                    std = 1.0 if isinstance(module, torch.nn.Embedding) else gain / math.sqrt(fan_in)
                    values = torch.randn(parameter.shape, generator=generator) * std
                elif "bias" in name:
                    values = torch.randn(parameter.shape, generator=generator) * 0.5
                else:
                    values = torch.rand(parameter.shape, generator=generator) + 0.5
                parameter.copy_(values.to(parameter.dtype))


def fresh(config: Any) -> Any:
    """A private copy: transformers 5 writes the attention choice into the config a model is built from."""
    return copy.deepcopy(config)


def without_dropout(config: Any) -> Any:
    """A copy of the config with every dropout and layer-drop probability set to 0, for comparing gradients.

    Layer drop skips random layers in training, differently in the two models compared.
    """
    config = fresh(config)
    for name, value in list(config.to_dict().items()):
        randomises = "dropout" in name or "pdrop" in name or name.endswith("_drop") or "layerdrop" in name
        if randomises and isinstance(value, float):
            setattr(config, name, 0.0)
    return config


def build(model_class: type, config: Any, attn_implementation: str, dtype: torch.dtype = torch.float32) -> Any:
    dtype_argument = "dtype" if transformers_major() >= 5 else "torch_dtype"
    arguments = {"attn_implementation": attn_implementation, dtype_argument: dtype}
    model = model_class._from_config(fresh(config), **arguments)
    model.eval()
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != attn_implementation:
        raise RuntimeError(f"{model_class.__name__} built with {implementation!r}, not {attn_implementation!r}")
    return model


def accepts(model_class: type, argument: str) -> bool:
    return argument in inspect.signature(model_class.forward).parameters


def model_kind(config: Any, model_class: type, causal: Callable[[], bool] | None = None) -> str:
    """Whether a model class is a seq2seq model, a decoder or an encoder.

    `seq2seq` when the forward takes decoder inputs (not every class of an encoder-decoder config does: a standalone
    decoder `...ForCausalLM`, an encoder `...EncoderModel`), `decoder` for causal models, else `encoder`.

    The one rule for both the parity checks and the benchmarks. `causal`, when given, settles the classes whose name
    and config say nothing (a base model such as `GPT2Model`) by running them (the benchmark's probe).
    """
    if getattr(config, "is_encoder_decoder", False) and accepts(model_class, "decoder_input_ids"):
        return "seq2seq"
    name = model_class.__name__
    if "CausalLM" in name or "LMHead" in name or getattr(config, "is_decoder", False):
        return "decoder"
    if getattr(config, "is_encoder_decoder", False) and accepts(model_class, "encoder_hidden_states"):
        return "decoder"
    if causal is not None and causal():
        return "decoder"
    return "encoder"


# ------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class Batch:
    inputs: dict[str, torch.Tensor]
    keep: torch.Tensor  # (batch, length): positions that are not padding
    decoder_keep: torch.Tensor | None = None


def make_batch(
    config: Any, kind: str, padding: str, batch: int = 2, length: int = 8, pad: int = 3, seed: int = 1
) -> Batch:
    """Random token ids; the last example padded on the left or the right, or no padding at all.

    Encoder-decoder inputs end each example with the end-of-sequence token (sequence classification heads pool the
    decoder states at it, one per example) and give the decoder as many tokens as the encoder.
    """
    generator = torch.Generator().manual_seed(seed)
    vocab = int(getattr(config, "vocab_size", 99))
    ids = torch.randint(SPECIAL_TOKENS, vocab, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padding == "left":
        mask[-1, :pad] = 0
    elif padding == "right":
        mask[-1, length - pad :] = 0
    pad_id = getattr(config, "pad_token_id", None)
    ids = ids.masked_fill(mask == 0, pad_id if isinstance(pad_id, int) else 0)
    inputs: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": mask}
    decoder_keep = None
    if kind == "seq2seq":
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, int):
            last = mask.sum(-1) - 1 + (mask.argmax(-1) if padding == "left" else 0)
            ids[torch.arange(batch), last] = eos
        inputs["decoder_input_ids"] = torch.randint(SPECIAL_TOKENS, vocab, (batch, length), generator=generator)
        decoder_keep = torch.ones(batch, length, dtype=torch.long)
    return Batch(inputs, mask, decoder_keep)


# ------------------------------------------------------------------ comparing


def tensors(output: Any) -> Iterator[tuple[str, torch.Tensor]]:
    items = (
        output.items() if hasattr(output, "items") else enumerate(output if isinstance(output, tuple) else [output])
    )
    for key, value in items:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            yield str(key), value


def compared(a: Any, b: Any, batch: Batch) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The float outputs two models share, as float32 pairs restricted to positions that are not padding."""
    others = dict(tensors(b))
    found = 0
    # left padding puts padding at the first position, which a pooler reads (BERT's first-token pooler): pooled
    # outputs are compared there only when nothing with positions is (a classifier's logits alone)
    first_padded = batch.keep.dim() == 2 and not bool(batch.keep[:, 0].bool().all())
    pooled: list[tuple[torch.Tensor, torch.Tensor]] = []
    for key, left in tensors(a):
        right = others.get(key)
        if right is None or right.shape != left.shape:
            continue
        keep = None
        if left.dim() >= 2 and tuple(left.shape[:2]) == tuple(batch.keep.shape):
            keep = batch.keep
        elif batch.decoder_keep is not None and left.dim() >= 2:
            if tuple(left.shape[:2]) == tuple(batch.decoder_keep.shape):
                keep = batch.decoder_keep
        if keep is None and first_padded and left.dim() == 2 and left.shape[0] == batch.keep.shape[0]:
            pooled.append((left.float(), right.float()))  # `(batch, features)`: it may read only padding
            continue
        left, right = left.float(), right.float()
        if keep is not None:
            left, right = left[keep.bool()], right[keep.bool()]
        if left.numel():
            found += 1
            yield left, right
    if found == 0:
        for left, right in pooled:
            found += 1
            yield left, right
    if found == 0:
        raise ValueError("the outputs have no tensors in common to compare")


def max_difference(a: Any, b: Any, batch: Batch, relative: bool = False) -> float:
    """The largest absolute difference at non-padded positions, or the largest relative to the largest magnitude."""
    worst = 0.0
    for left, right in compared(a, b, batch):
        difference = (left - right).abs()
        if not torch.isfinite(difference).all():
            return math.inf
        value = float(difference.max())
        if relative:
            value /= max(float(left.abs().max()), 1e-6)
        worst = max(worst, value)
    return worst


MIN_POSITIONS = 8  # a median over fewer positions is as much a matter of chance as the largest difference
BF16_LENGTH = 24  # tokens per example for the bf16 check: the median runs over about 45 positions, not 13


def typical_error(a: Any, b: Any, batch: Batch) -> float:
    """How far outputs differ at a typical position, relative to their size.

    The median over positions of each position's difference norm, relative to the output's RMS norm per position; the
    largest over the outputs. A rounding that breaks a near tie of a sharp softmax moves a few positions a lot; a wrong
    scale or term moves most of them, and so the median. Outputs of fewer than MIN_POSITIONS positions (the pooled
    logits of a classifier) count only when no output has more.
    """
    found: list[tuple[int, float]] = []
    for left, right in compared(a, b, batch):
        left, right = (left.flatten(1), right.flatten(1)) if left.dim() > 1 else (left[:, None], right[:, None])
        difference = (left - right).norm(dim=1)
        if not torch.isfinite(difference).all():
            return math.inf
        scale = max(float(left.norm(dim=1).pow(2).mean().sqrt()), 1e-12)
        found.append((left.shape[0], float(difference.median()) / scale))
    enough = [error for rows, error in found if rows >= MIN_POSITIONS]
    return max(enough or [error for _, error in found])


def with_last_hidden_states(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The model's float outputs with the last of each hidden-states tuple added.

    The last hidden state is asked for where the forward takes `output_hidden_states`: a classifier's pooled logits are
    a handful of numbers, its last hidden state has a position per token.
    """
    forward = getattr(model, "forward", model)
    try:
        takes = "output_hidden_states" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        takes = False
    output = model(**inputs, output_hidden_states=True) if takes else model(**inputs)
    out = dict(tensors(output))
    items = output.items() if hasattr(output, "items") else ()
    for key, value in items:
        if str(key).endswith("hidden_states") and isinstance(value, tuple) and value and torch.is_tensor(value[-1]):
            out[f"{key}[-1]"] = value[-1]
    return out


def attention_weights(output: Any) -> dict[str, tuple[torch.Tensor, ...]]:
    """Every attention-weight output of a model, seq2seq models' encoder, decoder and cross attentions included.

    `attentions`, or `encoder_`/`decoder_`/`cross_attentions`.
    """
    items = output.items() if hasattr(output, "items") else ()
    return {key: value for key, value in items if key.endswith("attentions") and value}


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to the null device: the profiler's native code logs a line at every start and stop."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def count_sdpa_calls(run: Callable[[], Any]) -> int:
    profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with _native_stderr_silenced():
        profile.__enter__()
    try:
        run()
    finally:
        # only the start and the stop are silenced: whatever the model itself prints stays visible
        with _native_stderr_silenced():
            profile.__exit__(None, None, None)
    return sum(event.count for event in profile.key_averages() if event.key == SDPA_OP)


def sdpa_backends(device: str = "cpu") -> list[str]:
    """The SDPA backends this device offers: math and flash on CPU; efficient and cuDNN too on CUDA."""
    names = ["MATH", "FLASH_ATTENTION"]
    if device == "cuda":
        names += ["EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]
    from torch.nn.attention import SDPBackend

    return [name for name in names if hasattr(SDPBackend, name)]


@contextlib.contextmanager
def only_backend(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, name)):
        yield


def compare(
    reference: Any,
    candidate: Any,
    batch: Batch,
    name: str,
    tolerance: float,
    relative: bool = False,
    expect_sdpa: bool = True,
    backend: str | None = None,
) -> list[Check]:
    """Outputs of two built models on one batch; optionally that the candidate really ran SDPA."""
    with torch.no_grad():
        expected = reference(**batch.inputs)
        results: list[Any] = []
        with only_backend(backend):
            calls = count_sdpa_calls(lambda: results.append(candidate(**batch.inputs)))
    difference = max_difference(expected, results[0], batch, relative)
    checks = [Check(name, difference <= tolerance, difference)]
    if expect_sdpa:
        checks.append(Check(f"{name} sdpa executed", calls > 0, None, f"{calls} SDPA call(s)"))
    return checks


def in_bf16(model: Any, implementation: str) -> Any:
    """`model`'s weights in a model of its class built in bf16, as loading with a bf16 dtype builds it.

    Buffers a module makes in float32 itself (a rotary table) stay so, as they do in use: `.to(torch.bfloat16)` would
    cast them, and hide a port that mixes dtypes.
    """
    built = build(type(model), model.config, implementation, torch.bfloat16)
    built.load_state_dict(model.state_dict())
    return built.to(next(model.parameters()).device)


def bf16_reference(model: Any) -> Any:
    """`model` computing in fp32 on its weights rounded to bf16, its buffers as they are."""
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.copy_(parameter.bfloat16().float())
    return reference


BF16_ULPS = 2.0**-7  # two units in the last place of bfloat16 (8 significant bits), relative to the output scale


def bf16_error(reference: Any, eager: Any, sdpa: Any, batch: Batch) -> tuple[float, float, float]:
    """How far SDPA and eager in bf16 are from an fp32 reference, and the bound SDPA must keep.

    Returns SDPA's bf16 error, eager's bf16 error and the bound, as typical relative errors.

    Both bf16 models round at every step; eager attention's own error measures what rounding costs this model on these
    inputs. SDPA in bf16 passes when it is no more than twice as far from the fp32 result as eager in bf16, plus two
    bf16 units: a wrong scale or a dropped term is many times that. The error is the median over positions
    (`typical_error`), not the largest difference: on sharpened weights rounding breaks near ties of a softmax one way
    or the other, so the largest difference of a correct port varies from input to input by more than a halved bias
    term moves it.
    """
    with torch.no_grad():
        expected = with_last_hidden_states(reference, batch.inputs)
        eager_error = typical_error(expected, with_last_hidden_states(eager, batch.inputs), batch)
        sdpa_error = typical_error(expected, with_last_hidden_states(sdpa, batch.inputs), batch)
    return sdpa_error, eager_error, 2 * eager_error + BF16_ULPS


def greedy(model: Any, batch: Batch, config: Any, kind: str, new_tokens: int = 6) -> torch.Tensor:
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
        return model.generate(**arguments)


def gradients(model: Any, batch: Batch, seed: int = 2) -> dict[str, torch.Tensor]:
    """Parameter gradients of a fixed random projection of the first output, in training mode."""
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):  # heads may hard-code their dropout probability
            module.p = 0.0
    model.zero_grad(set_to_none=True)
    output = next(value for _, value in tensors(model(**batch.inputs)))
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed)).to(output.dtype)
    keep = batch.keep if tuple(output.shape[:2]) == tuple(batch.keep.shape) else None
    product = output * weights
    if keep is not None:
        product = product[keep.bool()]
    product.sum().backward()
    model.eval()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def gradient_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest gradient difference relative to the largest gradient of the model.

    Relative to the whole model, not per parameter: some gradients are zero in exact arithmetic (a key bias shifts
    every score of a row alike, which the softmax ignores) and are only rounding noise in both implementations.
    """
    if set(a) != set(b):
        return math.inf
    scale = max((float(g.abs().max()) for g in a.values()), default=0.0)
    worst = max((float((a[name] - b[name]).abs().max()) for name in a), default=0.0)
    return worst / max(scale, 1e-12)
