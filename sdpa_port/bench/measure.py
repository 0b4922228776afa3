"""The torch side of a benchmark: load the model, build inputs, run one phase, time it.

Imports torch.
"""

from __future__ import annotations

import copy
import gc
import importlib
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from sdpa_port.bench.spec import MAX_ROUNDS, Kind, ModelRef, Phase, Settings, Timing

SPECIAL_TOKENS = 3  # ids below this are never drawn (pad, bos, eos in most configs)


# ------------------------------------------------------------------ loading


def load_module(ref: ModelRef) -> Any:
    if ref.module is not None:
        return importlib.import_module(ref.module)
    from pathlib import Path

    from sdpa_port.verify.loader import load_in_package

    assert ref.path is not None
    return load_in_package(Path(ref.path), ref.package)


def pretrained_base() -> type:
    from transformers import PreTrainedModel

    return PreTrainedModel


def pick_model_class(module: Any, wanted: str | None = None) -> type:
    """The base model of a modeling module, such as `BertModel` for `BertConfig`, or the class named `wanted`."""
    base = pretrained_base()
    classes = {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, base) and value.__module__ == module.__name__
    }
    if wanted:
        if wanted not in classes:
            raise LookupError(f"no model class {wanted} in {module.__name__}")
        return classes[wanted]
    bases = sorted(n for n in classes if n.endswith("Model") and not n.endswith("PreTrainedModel"))
    for name in bases:
        config_class = getattr(classes[name], "config_class", None)
        if config_class is not None and name == config_class.__name__.replace("Config", "Model"):
            return classes[name]
    plain = [n for n in bases if not any(w in n for w in ("For", "LMHead", "Head"))]
    if not plain:
        raise LookupError(f"no base model class in {module.__name__}; give --model-class")
    return classes[min(plain, key=len)]


def build_config(model_class: type, kwargs: dict[str, Any]) -> Any:
    config = model_class.config_class(**kwargs)
    for name, value in kwargs.items():
        setattr(config, name, value)
    return config


def build_model(
    model_class: type, config: Any, implementation: str, device: str, seed: int, dtype: str = "float32"
) -> Any:
    from sdpa_port.verify.parity import build

    torch.manual_seed(seed)
    return build(model_class, config, implementation, getattr(torch, dtype)).to(device)


def accepts(model: Any, argument: str) -> bool:
    return argument in inspect.signature(model.forward).parameters


def detect_kind(model_class: type, config: Any) -> Kind:
    """The kind of a model class by verify's rule, probed for causality where that rule cannot tell.

    Verify's `model_kind`, one rule for both, with a causal probe for the classes it cannot tell from their name and
    config: a decoder when position 0 ignores later tokens.
    """
    from sdpa_port.verify.checks import model_kind

    return Kind(model_kind(config, model_class, causal=lambda: _causal_probe(model_class, config)))


def _causal_probe(model_class: type, config: Any) -> bool:
    probe = copy.deepcopy(config)
    model = build_model(model_class, probe, "eager", "cpu", 0)
    vocab = int(getattr(config, "vocab_size", 100))
    generator = torch.Generator().manual_seed(0)
    first = torch.randint(SPECIAL_TOKENS, vocab, (1, 8), generator=generator)
    second = first.clone()
    second[0, -1] = SPECIAL_TOKENS + (int(first[0, -1]) + 1 - SPECIAL_TOKENS) % (vocab - SPECIAL_TOKENS)
    with torch.inference_mode():
        a = first_tensor(model(input_ids=first))
        b = first_tensor(model(input_ids=second))
    return bool(torch.equal(a[:, 0], b[:, 0]))


def first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "last_hidden_state") and output.last_hidden_state is not None:
        return output.last_hidden_state
    return output[0]


# ------------------------------------------------------------------ inputs


@dataclass
class Inputs:
    forward: dict[str, torch.Tensor]
    mask: torch.Tensor  # (batch, length) of the (encoder) input


def make_inputs(config: Any, kind: Kind, settings: Settings, length: int, device: str) -> Inputs:
    """Random ids; with padding, the last example is padded by `pad_fraction` of its length on the chosen side."""
    generator = torch.Generator().manual_seed(settings.seed + length)
    vocab = int(getattr(config, "vocab_size"))
    ids = torch.randint(SPECIAL_TOKENS, vocab, (settings.batch, length), generator=generator)
    mask = torch.ones(settings.batch, length, dtype=torch.long)
    side = settings.padding_side(kind)
    pad = int(length * settings.pad_fraction)
    if side == "left" and pad:
        mask[-1, :pad] = 0
    elif side == "right" and pad:
        mask[-1, length - pad :] = 0
    pad_id = getattr(config, "pad_token_id", None)
    ids = ids.masked_fill(mask == 0, pad_id if pad_id is not None else 0)
    forward = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if kind is Kind.SEQ2SEQ:
        decoder = torch.randint(SPECIAL_TOKENS, vocab, (settings.batch, length), generator=generator)
        forward["decoder_input_ids"] = decoder.to(device)
    return Inputs(forward, mask.to(device))


# ------------------------------------------------------------------ phases


def forward_call(model: Any, inputs: Inputs) -> Callable[[], Any]:
    arguments = dict(inputs.forward)
    if accepts(model, "use_cache"):
        arguments["use_cache"] = False
    return lambda: model(**arguments)


def prefill_call(model: Any, inputs: Inputs) -> Callable[[], Any]:
    return lambda: model(**inputs.forward, use_cache=True)


@dataclass
class DecodeState:
    cache: Any
    encoder_outputs: Any
    token: torch.Tensor
    working: Any = None  # the copy of `cache` the next timed call extends


def decode_state(model: Any, inputs: Inputs, kind: Kind) -> DecodeState:
    with torch.inference_mode():
        output = model(**inputs.forward, use_cache=True)
    token = inputs.forward.get("decoder_input_ids", inputs.forward["input_ids"])[:, -1:]
    encoder = (output.encoder_last_hidden_state,) if kind is Kind.SEQ2SEQ else None
    return DecodeState(output.past_key_values, encoder, token)


def decode_call(model: Any, inputs: Inputs, kind: Kind, state: DecodeState, tokens: int) -> Callable[[], Any]:
    """`tokens` greedy-free steps of one token each against a private copy of the prefilled cache."""
    batch = inputs.mask.shape[0]
    ones = torch.ones(batch, tokens, dtype=inputs.mask.dtype, device=inputs.mask.device)

    def run() -> Any:
        cache = state.working
        output = None
        for step in range(tokens):
            if kind is Kind.SEQ2SEQ:
                output = model(
                    encoder_outputs=state.encoder_outputs,
                    attention_mask=inputs.mask,
                    decoder_input_ids=state.token,
                    past_key_values=cache,
                    use_cache=True,
                )
            else:
                mask = torch.cat([inputs.mask, ones[:, : step + 1]], dim=1)
                output = model(input_ids=state.token, attention_mask=mask, past_key_values=cache, use_cache=True)
            cache = output.past_key_values
        return output

    return run


# ------------------------------------------------------------------ timing


@dataclass(frozen=True)
class Timed:
    """One phase of one model, ready to time.

    `run` is timed, `before` runs untimed ahead of it.
    """

    run: Callable[[], Any]
    before: Callable[[], None] | None = None
    per: int = 1  # calls of the model inside `run` (decode: tokens), to report per call


def synchronise(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prepare_phase(model: Any, inputs: Inputs, kind: Kind, phase: Phase, settings: Settings) -> Timed:
    if phase is Phase.FORWARD:
        return Timed(forward_call(model, inputs))
    if phase is Phase.PREFILL:
        return Timed(prefill_call(model, inputs))
    state = decode_state(model, inputs, kind)

    def fresh_cache() -> None:
        state.working = copy.deepcopy(state.cache)

    return Timed(decode_call(model, inputs, kind, state, settings.decode_tokens), fresh_cache, settings.decode_tokens)


def time_interleaved(
    timed: dict[str, Timed], runs: int, warmup: int, device: str, min_time: float = 0.0
) -> dict[str, Timing]:
    """Minimum time per call of each entry over the timed rounds after `warmup` rounds, the entries taking turns.

    At least `runs` rounds are timed, and more (up to MAX_ROUNDS) until `min_time` seconds were spent in timed
    calls: short calls get many samples. Taking turns exposes every entry to the same background load; the minimum
    discards runs slowed by it. The CPU time of the process is kept next to wall time: with one thread it is the
    latency without the time other processes took.
    """
    walls: dict[str, list[float]] = {name: [] for name in timed}
    cpus: dict[str, list[float]] = {name: [] for name in timed}
    spent = 0.0
    index = 0
    with torch.inference_mode():
        while index < warmup + runs or (spent < min_time and index < warmup + MAX_ROUNDS):
            for name, entry in timed.items():
                if entry.before is not None:
                    entry.before()
                gc.collect()
                synchronise(device)
                wall, cpu = time.perf_counter(), time.process_time()
                entry.run()
                synchronise(device)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if index >= warmup:
                    walls[name].append(wall / entry.per)
                    cpus[name].append(cpu / entry.per)
                    spent += wall
            index += 1
    return {name: Timing(tuple(walls[name]), tuple(cpus[name])) for name in timed}


def output_difference(eager: Any, sdpa: Any, inputs: Inputs, kind: Kind) -> float:
    """Largest |eager - sdpa| of the final hidden states over positions that are not padding."""
    with torch.inference_mode():
        a = first_tensor(forward_call(eager, inputs)()).float()
        b = first_tensor(forward_call(sdpa, inputs)()).float()
    difference = (a - b).abs()
    if kind is not Kind.SEQ2SEQ and difference.shape[:2] == inputs.mask.shape:
        difference = difference[inputs.mask.bool()]
    return float(difference.max())
