"""Driving any model class of a modeling file: tiny config, synthesised inputs, eager against SDPA (imports torch).

`verify_driven` is the path of `verify_pair` for models whose forward takes more than token ids: images, videos,
audio, mel features, boxes, region features, time series, or several of them. For each class it tries, in order,
configs from tiny to default sizes (`configs.LEVELS`) and the input layouts of `inputs.plan_inputs`, and keeps the
first the ORIGINAL eager model runs on with finite outputs. Only then are the port's eager and SDPA models built
and compared, so the port never chooses the inputs it is judged on.

A model that cannot be driven gets an `Unverified` check (never a pass) saying why: a missing optional package,
an input the harness cannot build, or the errors the original raised.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import sys
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterator

import torch

from sdpa_port.verify.checks import Batch, Check, count_sdpa_calls, model_kind
from sdpa_port.verify.configs import LEVELS, Level, level_kwargs, timm_backbone
from sdpa_port.verify.diagnose import PortCalls, attention_classes, why_no_sdpa
from sdpa_port.verify.inputs import ConfigView, Plan, TensorSpec, Unsupported, describe, plan_inputs
from sdpa_port.verify.terms import eager_sides, expected_on_eager, setting_values, term_trials

EAGER_TOLERANCE = 1e-6
SDPA_TOLERANCE = 1e-4
RELATIVE_TOLERANCE = 1e-5  # of the largest output magnitude, for outputs far beyond unit scale
MAX_PARAMETERS = 300_000_000  # three fp32 copies of the model are held at once
GAINS = (2.0, 1.0, 0.5)  # sharpening; milder where the original overflows (deep stacks without normalisation)
PAD = {"input_ids": 3}  # padded positions of the last example; other sequences lose a quarter
NOT_VERIFIED = "not verified"


@dataclass(frozen=True)
class Unverified(Check):
    """A port the harness could not check: never a pass. Printed as `not verified: <reason>`."""

    def __str__(self) -> str:
        return f"{NOT_VERIFIED}: {self.detail}"


def unverified(reason: str) -> Unverified:
    return Unverified(NOT_VERIFIED, False, None, reason)


_REQUIRES = re.compile(r"requires the (\S+?) library", re.IGNORECASE)


def missing_package(error: BaseException) -> str | None:
    """The optional package an ImportError is about (transformers' `requires_backends` message, or the module)."""
    if not isinstance(error, ImportError):
        return None
    match = _REQUIRES.search(str(error))
    if match:
        return match.group(1)
    name = getattr(error, "name", None)
    if name:
        return name.split(".")[0]
    return None


# ------------------------------------------------------------------ candidates


@dataclass
class Candidate:
    original: type
    ported: type
    config_class: type
    kinds: tuple[str, ...]
    index: int

    @property
    def name(self) -> str:
        return self.original.__name__

    def rank(self) -> tuple[int, int, int]:
        name = self.name
        base = name.endswith("Model") and "For" not in name and "LMHead" not in name
        return (len(self.kinds), int(base), -self.index)


def candidates(original: ModuleType, ported: ModuleType, classes: list[type]) -> tuple[list[Candidate], list[str]]:
    """Classes whose forward the harness can feed, best first, and why the others cannot be fed."""
    from sdpa_port.verify.configs import config_class_of

    found: list[Candidate] = []
    reasons: list[str] = []
    for index, klass in enumerate(classes):
        config_class = config_class_of(klass)
        port_class = getattr(ported, klass.__name__, None)
        if config_class is None or port_class is None:
            continue
        try:
            view = ConfigView.of(config_class().to_dict())
        except Exception as error:  # a config that needs arguments
            reasons.append(f"{klass.__name__}: config {config_class.__name__}() failed: {_short(error)}")
            continue
        plans = plan_inputs(describe(klass.forward), view)
        if isinstance(plans, Unsupported):
            reasons.append(f"{klass.__name__}: {plans.reason}")
            continue
        found.append(Candidate(klass, port_class, config_class, plans[0].kinds, index))
    found.sort(key=Candidate.rank, reverse=True)
    return found, reasons


# ------------------------------------------------------------------ configs


def timm_available() -> bool:
    try:
        from transformers.utils import is_timm_available
    except ImportError:
        return False
    return bool(is_timm_available())


def config_at(config_class: type, level: Level) -> Any:
    """The config class rebuilt at `level`; twice, since a constructor may create sub-configs (a default
    backbone) that only then can be shrunk."""
    config = config_class()
    kwargs: dict[str, Any] = {}
    for _ in range(2):
        changes = level_kwargs(config.to_dict(), level, timm_available())
        if not changes:
            break
        kwargs = {**kwargs, **changes}
        try:
            config = config_class(**kwargs)
        except Exception:
            config = config_class()
            for name, value in kwargs.items():
                if not isinstance(value, dict):
                    setattr(config, name, value)
        for name, value in kwargs.items():  # fields the constructor ignored
            if value is None and hasattr(getattr(config, name, None), "to_dict"):
                continue  # a sub-config the constructor built in place of None (a default backbone)
            if not isinstance(value, dict) and getattr(config, name, None) != value:
                with contextlib.suppress(Exception):
                    setattr(config, name, value)
    return config


def sub_configs(config: Any) -> Iterator[tuple[str, Any]]:
    """(path, config) of every nested config."""
    base = _config_base()
    seen = {id(config)}
    stack = [("", config)]
    while stack:
        prefix, current = stack.pop()
        for name, value in list(vars(current).items()):
            if isinstance(value, base) and id(value) not in seen:
                seen.add(id(value))
                path = f"{prefix}{name}"
                yield path, value
                stack.append((f"{path}.", value))


def _config_base() -> type:
    import transformers

    return getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig


def attention_flags(config: Any) -> list[str]:
    """Boolean config fields that switch attention on and are off (e.g. `self_attn`), top level first."""
    names = []
    for name, value in sorted(config.to_dict().items()):
        if value is False and re.search(r"(^|_)(self_)?att(n|ention)($|_)", name) and "output" not in name:
            names.append(name)
    return names


# ------------------------------------------------------------------ building and running


def sharpen(model: torch.nn.Module, gain: float = 2.0, seed: int = 0) -> None:
    """`checks.sharpen` with the fan-in of convolution kernels counted over channels and kernel positions.

    Matrices get std gain/sqrt(fan_in), embeddings std 1, biases std 0.5, norm scales U(0.5, 1.5): attention logits
    spread over several units, so a wrong scale or a dropped term shows far beyond the tolerance. (`checks.sharpen`
    takes the last dimension as the fan-in, which for a convolution is its kernel width: convolutional stacks
    then grow by orders of magnitude per layer.)
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.dim() >= 2:
                    fan_in = parameter.shape[-1] if parameter.dim() == 2 else parameter[0].numel()
                    std = 1.0 if isinstance(module, torch.nn.Embedding) else gain / math.sqrt(max(fan_in, 1))
                    values = torch.randn(parameter.shape, generator=generator) * std
                elif "bias" in name:
                    values = torch.randn(parameter.shape, generator=generator) * 0.5
                else:
                    values = torch.rand(parameter.shape, generator=generator) + 0.5
                parameter.copy_(values.to(parameter.dtype))


def build_sdpa(model_class: type, config: Any, propagate: bool = False) -> tuple[Any, str]:
    """The model built for SDPA, and a note when that needed transformers' default choice.

    transformers 5 hands an explicit `attn_implementation="sdpa"` down to every sub-model and refuses the build when
    one of them (from a file not ported, e.g. BLIP's text model) lacks SDPA; its default (None) picks SDPA wherever
    supported and eager elsewhere, as a user loading the ported model gets it.
    """
    try:
        return build(model_class, config, "sdpa", propagate), ""
    except ValueError as error:
        if "scaled_dot_product_attention" not in str(error):
            raise
        model = build(model_class, config, None, propagate, expect="sdpa")
        refused = str(error).split(" does not support", 1)[0]
        return model, f"built with the default implementation (SDPA where supported): {refused} has no SDPA"


def build(model_class: type, config: Any, implementation: str | None, propagate: bool = False, expect: str | None = None) -> Any:
    """A model built with `implementation`; `propagate` sets it on every sub-config too."""
    import transformers

    config = copy.deepcopy(config)
    if propagate:
        for _, sub in sub_configs(config):
            with contextlib.suppress(Exception):
                sub._attn_implementation = implementation
    dtype_argument = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    # the same random initialisation in every build: weights a model keeps outside its state dict (Mask2Former
    # 4.40 holds its input projections in a plain list) are then alike in the original and the port
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class._from_config(config, attn_implementation=implementation, **{dtype_argument: torch.float32})
    model.eval()
    built = getattr(model.config, "_attn_implementation", None)
    if built != (expect or implementation):
        raise RuntimeError(f"{model_class.__name__} built with {built!r}, not {expect or implementation!r}")
    return model


def materialise(plan: Plan, config: Any, padding: str = "none", seed: int = 1) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    inputs = {spec.name: _tensor(spec, generator) for spec in plan.tensors}
    keep = torch.ones(plan.tensors[0].shape[0], 0, dtype=torch.long)
    if plan.mask and plan.sequence:
        mask = inputs[plan.mask]
        length = mask.shape[1]
        pad = PAD.get(plan.sequence, max(length // 4, 1))
        if padding == "left":
            mask[-1, :pad] = 0
        elif padding == "right":
            mask[-1, length - pad :] = 0
        if plan.sequence == "input_ids":
            pad_id = _pad_id(config)
            inputs["input_ids"] = inputs["input_ids"].masked_fill(mask == 0, pad_id)
            keep = mask
        elif padding != "none":
            sequence = inputs[plan.sequence]
            shape = [mask.shape[0], length] + [1] * (sequence.dim() - 2)
            inputs[plan.sequence] = sequence * mask.view(shape).to(sequence.dtype)
    return Batch(inputs, keep)


def _pad_id(config: Any) -> int:
    for holder in (config, getattr(config, "text_config", None)):
        value = getattr(holder, "pad_token_id", None) if holder is not None else None
        if isinstance(value, int):
            return value
    return 0


def _tensor(spec: TensorSpec, generator: torch.Generator) -> torch.Tensor:
    shape = spec.shape
    if spec.fill == "ids":
        low = min(spec.low, max(spec.high - 1, 0))
        ids = torch.randint(low, max(spec.high, low + 1), shape, generator=generator)
        if spec.placeholders:
            ids[:, 1 : 1 + spec.placeholders] = spec.placeholder
        return ids
    if spec.fill == "normal":
        return torch.randn(shape, generator=generator)
    if spec.fill == "uniform":
        return torch.rand(shape, generator=generator)
    if spec.fill == "ones":
        dtype = {"long": torch.long, "bool": torch.bool}.get(spec.dtype, torch.float32)
        return torch.ones(shape, dtype=dtype)
    if spec.fill == "boxes":
        corner = torch.rand(shape[:-1] + (2,), generator=generator) * 0.5
        size = torch.rand(shape[:-1] + (2,), generator=generator) * 0.5
        boxes = torch.cat([corner, corner + size], dim=-1) * spec.high
        return boxes.round().long() if spec.dtype == "long" else boxes
    if spec.fill == "patches":
        batch, count, width = shape
        side = max(int(math.ceil(math.sqrt(count))), 1)
        rows = (torch.arange(count) // side + 1).float()
        columns = (torch.arange(count) % side + 1).float()
        values = torch.randn((batch, count, width - 2), generator=generator)
        index = torch.stack([rows, columns], dim=-1).expand(batch, count, 2)
        return torch.cat([index, values], dim=-1)
    if spec.fill == "categorical":
        columns = [torch.randint(0, max(c, 1), (shape[0], 1), generator=generator) for c in spec.cardinality]
        return torch.cat(columns, dim=1) if columns else torch.zeros(shape, dtype=torch.long)
    raise ValueError(f"unknown fill {spec.fill!r}")


def forward(model: Any, batch: Batch, seed: int = 0) -> Any:
    """One forward pass with the global generator reset, so random masking (MAE) draws alike in every model."""
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(**batch.inputs)


def floats(output: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every floating-point tensor in a model output, nested tuples and outputs included, by path."""
    if isinstance(output, torch.Tensor):
        if output.is_floating_point():
            yield prefix or "0", output
        return
    if hasattr(output, "items"):
        items = list(output.items())
    elif isinstance(output, (tuple, list)):
        items = list(enumerate(output))
    else:
        return
    for key, value in items:
        yield from floats(value, f"{prefix}{key}.")


def finite(output: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for _, t in floats(output))


def _infinite_entries(output: Any) -> dict[str, torch.Tensor] | None:
    """Where each float output is +inf or -inf (signed), or None when any entry is NaN."""
    found: dict[str, torch.Tensor] = {}
    for key, tensor in floats(output):
        if bool(torch.isnan(tensor).any()):
            return None
        found[key] = torch.where(torch.isinf(tensor), torch.sign(tensor), torch.zeros_like(tensor))
    return found


def _same_entries(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None) -> bool:
    return a is not None and b is not None and a.keys() == b.keys() and all(bool(torch.equal(a[k], b[k])) for k in a)


@dataclass(frozen=True)
class Difference:
    absolute: float
    relative: float
    compared: int


def difference(a: Any, b: Any, keep: torch.Tensor) -> Difference:
    """Largest absolute and relative (to the largest magnitude of `a`) difference over shared float outputs."""
    others = dict(floats(b))
    worst_abs = worst_rel = 0.0
    compared = 0
    for key, left in floats(a):
        right = others.get(key)
        if right is None or right.shape != left.shape:
            continue
        # infinities by design (masked logits) count as equal where both sides hold the same one
        same = left.float() == right.float()
        delta = torch.where(same, torch.zeros_like(left.float()), (left.float() - right.float()).abs())
        scale = torch.where(torch.isinf(left.float()), torch.zeros_like(left.float()), left.float().abs())
        if keep.numel() and left.dim() >= 2 and tuple(left.shape[:2]) == tuple(keep.shape):
            delta, scale = delta[keep.bool()], scale[keep.bool()]
        if not delta.numel():
            continue
        compared += 1
        if not torch.isfinite(delta).all():
            return Difference(math.inf, math.inf, compared)
        value = float(delta.max())
        worst_abs = max(worst_abs, value)
        worst_rel = max(worst_rel, value / max(float(scale.max()), 1e-6))
    return Difference(worst_abs, worst_rel, compared)


# ------------------------------------------------------------------ driving one class


@dataclass
class Driven:
    """What the original accepted: the config, its sharpened weights, the input plan."""

    config: Any
    level: Level
    gain: float
    plan: Plan
    state: dict[str, torch.Tensor]
    propagate: bool = False
    notes: list[str] = field(default_factory=list)


def drive_original(candidate: Candidate) -> Driven | Unverified:
    """The first (config level, input layout, sharpening) on which the original eager model runs finitely."""
    tried: list[str] = []
    for level in LEVELS:
        try:
            config = config_at(candidate.config_class, level)
        except Exception as error:
            tried.append(f"[{level.name}] config: {_short(error)}")
            continue
        driven = _drive_at(candidate, config, level, tried)
        if isinstance(driven, (Driven, Unverified)):
            return driven
    return unverified(f"{candidate.name}: the original model could not be driven: {summarise(tried)}")


def summarise(tried: list[str], limit: int = 700) -> str:
    """The first failure at each config level, each cut short; the first and last levels kept when too long."""
    firsts: dict[str, str] = {}
    for line in tried:
        firsts.setdefault(line.split("]", 1)[0], line)
    lines = [line if len(line) <= 200 else line[:197] + "..." for line in (list(firsts.values()) or tried)]
    while len(lines) > 2 and len("; ".join(lines)) > limit:
        del lines[-2]
    return "; ".join(lines)


def parameter_count(model_class: type, config: Any) -> int | None:
    """Parameters of the model built on the meta device (no memory), or None where that cannot be done."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_class._from_config(copy.deepcopy(config), attn_implementation="eager")
    except Exception:
        return None
    return sum(p.numel() for p in model.parameters())


def _drive_at(candidate: Candidate, config: Any, level: Level, tried: list[str]) -> Driven | Unverified | None:
    size = parameter_count(candidate.original, config)
    if size is not None and size > MAX_PARAMETERS:
        tried.append(f"[{level.name}] {size / 1e6:.0f}M parameters: too large to run three copies here")
        return None
    kind = model_kind(config, candidate.original)
    params, view = describe(candidate.original.forward), ConfigView.of(config.to_dict())
    plans = plan_inputs(params, view, decoder=kind == "decoder")
    if isinstance(plans, Unsupported):
        tried.append(f"[{level.name}] {plans.reason}")
        return None
    # a batch of one last: a few models only run one example at a time (TVP 4.40's grid position embeddings)
    singles = plan_inputs(params, view, decoder=kind == "decoder", batch=1)
    plans = plans + (singles if isinstance(singles, list) else [])
    try:
        model = build(candidate.original, config, "eager")
    except AttributeError as error:
        repaired = _with_missing_field(config, error)
        if repaired is None:
            tried.append(f"[{level.name}] build: {_short(error)}")
            return None
        return _drive_at(candidate, repaired, level, tried)
    except Exception as error:
        package = missing_package(error)
        if package:
            return unverified(f"{candidate.name}: needs {package} ({_short(error)})")
        tried.append(f"[{level.name}] build: {_short(error)}")
        return None
    for plan in plans:
        try:
            output = forward(model, materialise(plan, config))
        except Exception as error:
            package = missing_package(error)
            if package:
                return unverified(f"{candidate.name}: needs {package} ({_short(error)})")
            tried.append(f"[{level.name}] {plan.description}: {_short(error)}")
            continue
        if not list(floats(output)):
            tried.append(f"[{level.name}] {plan.description}: no floating-point output")
            continue
        infinities: list[Any] = []
        for gain in GAINS:
            sharpen(model, gain)
            try:
                output = forward(model, materialise(plan, config))
            except Exception as error:
                tried.append(f"[{level.name}] gain {gain}: {_short(error)}")
                break
            if finite(output):
                state = {k: v.clone() for k, v in model.state_dict().items()}
                return Driven(config, level, gain, plan, state, notes=_config_notes(candidate, config))
            infinities.append(_infinite_entries(output))
            if len(infinities) >= 2 and infinities[-1] is not None and _same_entries(infinities[-2], infinities[-1]):
                # the same entries infinite at two gains, and no NaN: masked logits (`masked_fill(~mask, -inf)`,
                # Grounding DINO's text mask), not an overflow; compared as equal where both sides have them
                state = {k: v.clone() for k, v in model.state_dict().items()}
                notes = [*_config_notes(candidate, config), "some outputs are infinite by design (the same entries at two gains)"]
                return Driven(config, level, gain, plan, state, notes=notes)
            tried.append(f"[{level.name}] {plan.description}: non-finite outputs at gain {gain}")
        return None  # this layout runs but never finitely: a smaller config will not help either
    return None


def _config_notes(candidate: Candidate, config: Any) -> list[str]:
    """What the check changed in the config beyond sizes, for the report."""
    default = candidate.config_class()
    switched = timm_backbone(default.to_dict()) and not timm_backbone(config.to_dict())
    if switched or getattr(default, "use_timm_backbone", False) and getattr(config, "use_timm_backbone", True) is False:
        return ["timm is not installed: the config's transformers backbone (use_timm_backbone=False)"]
    return []


# Fields some models read that their config classes do not define (checkpoints carry them in config.json): the
# value a config of that family would have. Used only when building the original fails for want of the field.
MISSING_FIELDS = {
    "type_vocab_size": 2,  # TVP's text embeddings (4.40.2), BERT's default
}


def _with_missing_field(config: Any, error: AttributeError) -> Any | None:
    match = re.search(r"object has no attribute '(\w+)'", str(error))
    if not match or match.group(1) not in MISSING_FIELDS or hasattr(config, match.group(1)):
        return None
    repaired = copy.deepcopy(config)
    setattr(repaired, match.group(1), MISSING_FIELDS[match.group(1)])
    return repaired


# ------------------------------------------------------------------ checks


def check_driven(candidate: Candidate, driven: Driven, label: str) -> tuple[list[Check], set[str]]:
    """Port eager against original eager, port SDPA against original eager, SDPA executed; per padding. Also the
    port's classes the SDPA model builds."""
    original = build(candidate.original, driven.config, "eager", driven.propagate)
    original.load_state_dict(driven.state)
    try:
        eager = build(candidate.ported, driven.config, "eager", driven.propagate)
        eager.load_state_dict(driven.state)
        sdpa, note = build_sdpa(candidate.ported, driven.config, driven.propagate)
        sdpa.load_state_dict(driven.state)
    except Exception as error:
        if _out_of_memory(error):
            raise
        return [Check(f"{label} port builds", False, None, _short(error))], set()
    if note:
        driven.notes.append(note)
    # the port's classes this model exercises: those its SDPA forward calls
    called: set[str] = set()
    handles = [
        m.register_forward_pre_hook(lambda module, args: called.add(type(module).__name__))
        for m in sdpa.modules()
        if type(m).__module__ == candidate.ported.__module__
    ]
    try:
        return _compare_paddings(candidate, driven, label, original, eager, sdpa), called
    finally:
        for handle in handles:
            handle.remove()


def _compare_paddings(candidate: Candidate, driven: Driven, label: str, original: Any, eager: Any, sdpa: Any) -> list[Check]:
    paddings = ["none"] + ([driven.plan.padding_side] if driven.plan.mask else [])
    checks: list[Check] = []
    for padding in paddings:
        batch = materialise(driven.plan, driven.config, padding)
        name = f"{label}[{padding if padding != 'none' else 'unpadded'}]"
        reference: list[Any] = []
        original_calls = count_sdpa_calls(lambda: reference.append(forward(original, batch)))
        expected = reference[0]
        got: list[Any] = []
        try:
            eager_calls = count_sdpa_calls(lambda: got.append(forward(eager, batch)))
        except Exception as error:
            if _out_of_memory(error):
                raise
            checks.append(Check(f"{name} eager unchanged", False, None, f"raised {_short(error)}"))
        else:
            check = _judge(f"{name} eager unchanged", difference(expected, got[0], batch.keep), EAGER_TOLERANCE, EAGER_TOLERANCE)
            if eager_calls > original_calls:  # e.g. sub-models that choose their own implementation when built
                why = f"the port built for eager ran {eager_calls} SDPA call(s), the original {original_calls}"
                why += _eager_everywhere(candidate, driven, batch, expected)
                check = Check(check.name, False, check.max_diff, f"{check.detail} {why}".strip())
            checks.append(check)
        results: list[Any] = []
        try:
            with PortCalls(candidate.ported.__module__) as port_calls:
                calls = count_sdpa_calls(lambda: results.append(forward(sdpa, batch)))
        except Exception as error:
            if _out_of_memory(error):
                raise
            checks.append(Check(f"{name} sdpa == eager", False, None, f"raised {_short(error)}"))
            continue
        found = difference(expected, results[0], batch.keep)
        check = _judge(f"{name} sdpa == eager", found, SDPA_TOLERANCE, RELATIVE_TOLERANCE)
        if not check.passed:
            rounding = within_rounding(original, batch, replaced_classes(*_modules(candidate)), expected, found)
            check = Check(check.name, rounding.excused, check.max_diff, f"{check.detail} {rounding.note}".strip())
            if rounding.jumps:
                # the outputs do not follow the attention (a threshold, a rounding to whole steps): judge the port
                # where it acts, each call of its attention modules against the eager computation on the same inputs
                modules = attention_parity(eager, batch, *_modules(candidate))
                if modules is not None:
                    check = Check(check.name, modules.passed, check.max_diff, f"{check.detail}; {modules.detail}")
        if not check.passed and check.max_diff is not None and math.isfinite(check.max_diff):
            outside, isolated = _outside_port(candidate, driven, batch, results[0])
            # the port alone decides when sub-models of other files run SDPA too: against the original built so
            passed = isolated is not None and _judge(check.name, isolated, SDPA_TOLERANCE, RELATIVE_TOLERANCE).passed
            notes = [check.detail, "" if passed else in_double(original, sdpa, batch), outside]
            check = Check(check.name, passed, check.max_diff, " ".join(n for n in notes if n))
        checks.append(check)
        detail = f"{calls} SDPA call(s)"
        if port_calls.from_port != calls:
            detail += f", {port_calls.from_port} from the port's attention"
        # a model that builds neither the port's attention classes nor their eager bases does not test the port
        # (verify_driven checks those classes alone); one that builds them and makes no SDPA call fails
        absent = not port_calls.from_port and not _builds_attention(candidate, sdpa)
        if absent:
            detail += ": the model builds none of the port's attention classes nor the classes they replace"
        elif not port_calls.from_port:
            detail += ": " + why_no_sdpa(sdpa, lambda: forward(sdpa, batch), *_modules(candidate))
        checks.append(Check(f"{name} sdpa executed", port_calls.from_port > 0 or absent, None, detail))
    return checks


def _builds_attention(candidate: Candidate, model: Any) -> bool:
    """Whether `model` holds a module of the port's attention classes or of the eager classes they replace."""
    original, ported = _modules(candidate)
    names = set(attention_classes(original, ported)) | replaced_classes(original, ported)
    return any(type(m).__name__ in names and type(m).__module__ == ported.__name__ for m in model.modules())


def _eager_everywhere(candidate: Candidate, driven: Driven, batch: Batch, expected: Any) -> str:
    """What the port's eager model gives with eager also set on every sub-config (PreTrainedModels built inside a
    model choose their own implementation in transformers 4, SDPA where their class supports it)."""
    if not any(True for _ in sub_configs(driven.config)):
        return ""
    try:
        model = build(candidate.ported, driven.config, "eager", propagate=True)
        model.load_state_dict(driven.state)
        results: list[Any] = []
        calls = count_sdpa_calls(lambda: results.append(forward(model, batch)))
    except Exception:
        return ""
    found = difference(expected, results[0], batch.keep)
    return f" (with eager set on every sub-config too: {calls} SDPA call(s), max|diff|={found.absolute:.3g})"


def _modules(candidate: Candidate) -> tuple[ModuleType, ModuleType]:
    import sys

    return sys.modules[candidate.original.__module__], sys.modules[candidate.ported.__module__]


def _outside_port(candidate: Candidate, driven: Driven, batch: Batch, got: Any) -> tuple[str, Difference | None]:
    """The port's SDPA outputs against the original built with transformers' default implementation: sub-models from
    other files then run SDPA where they support it, as they do in the port's SDPA build, so only the ported
    attention differs. A note and that difference; None where nothing outside the port runs SDPA."""
    try:
        reference = build(candidate.original, driven.config, None, driven.propagate, expect="eager")
        reference.load_state_dict(driven.state)
        results: list[Any] = []
        calls = count_sdpa_calls(lambda: results.append(forward(reference, batch)))
    except Exception:
        return "", None
    if not calls:
        return "", None  # nothing outside the port runs SDPA: the comparison above already isolates the port
    found = difference(results[0], got, batch.keep)
    return (
        f"(against the original whose sub-models run SDPA where they support it ({calls} call(s)): "
        f"max|diff|={found.absolute:.3g}, relative {found.relative:.2g})"
    ), found


def in_double(original: Any, sdpa: Any, batch: Batch) -> str:
    """The same comparison in float64, to tell rounding amplified by the model (the difference shrinks by orders
    of magnitude) from a wrong computation (it stays). Reported beside the float32 result, which alone decides: an
    output that does not follow the attention (every match under a threshold) agrees in float64 whatever the port
    computes, so agreement there proves nothing by itself."""
    try:
        reference, candidate = copy.deepcopy(original).double(), copy.deepcopy(sdpa).double()
        inputs = {k: v.double() if v.is_floating_point() else v for k, v in batch.inputs.items()}
        double = Batch(inputs, batch.keep)
        found = difference(forward(reference, double), forward(candidate, double), batch.keep)
    except Exception as error:
        return f"(float64 comparison not possible: {type(error).__name__})"
    return f"(in float64: max|diff|={found.absolute:.3g}, relative {found.relative:.2g})"


ROUNDING = 2.0**-20  # a relative change of every attention output: eight float32 units in the last place
PROBE = 1e-3  # a relative change a wrong computation (a 5 % scale, a dropped term) far exceeds
LINEAR = 0.1  # the least share of PROBE / ROUNDING by which the model's response to the two must grow


@dataclass(frozen=True)
class Rounding:
    """Whether a float32 difference is what the model makes of rounding in its attention, and the figures why."""

    excused: bool
    note: str
    rounding: float = math.nan  # how far the outputs move for a ROUNDING change of the attention outputs
    probe: float = math.nan  # and for a PROBE change
    jumps: bool = False  # the outputs answer such changes out of proportion: they jump rather than follow


def within_rounding(original: Any, batch: Batch, classes: set[str], expected: Any, found: Difference) -> Rounding:
    """Whether a float32 difference is what the model makes of rounding in its attention.

    Models that amplify (FastSpeech2's variance predictors, CvT's stacked normalisations) turn the few units in
    the last place by which two attention kernels differ into differences beyond any fixed tolerance. The original
    eager model is run again with the outputs of its `classes` (the attention modules the port replaces) changed by
    `ROUNDING` relative, random signs: the port's difference counts as rounding when it is no larger than that
    response. Only where the response is smooth: a `PROBE` change must move the outputs at least `LINEAR` times
    `PROBE / ROUNDING` as far, so a model whose outputs jump (a threshold on matching scores) is never excused, and
    a wrong computation, which changes the attention outputs by far more than `PROBE`, stays a failure."""
    if not classes or not math.isfinite(found.absolute):
        return Rounding(False, "")
    small = _perturbed(original, batch, classes, expected, ROUNDING)
    probe = _perturbed(original, batch, classes, expected, PROBE)
    if small is None or probe is None:
        return Rounding(False, "")
    figures = (
        f"changing the attention outputs by {ROUNDING:.2g} relative moves the original's outputs by "
        f"{small.absolute:.3g}, by {PROBE:g} relative {probe.absolute:.3g}"
    )
    moved = small.absolute, probe.absolute
    if small.absolute <= 0.0 or probe.absolute < LINEAR * (PROBE / ROUNDING) * small.absolute:
        return Rounding(False, f"(not judged against rounding: {figures}, not in proportion)", *moved, jumps=True)
    if found.absolute > small.absolute:
        return Rounding(False, f"(beyond rounding: {figures})", *moved)
    return Rounding(True, f"(within rounding: {figures})", *moved)


def _perturbed(original: Any, batch: Batch, classes: set[str], expected: Any, size: float) -> Difference | None:
    generator = torch.Generator().manual_seed(7)

    def change(module: Any, args: Any, output: Any) -> Any:
        first = output[0] if isinstance(output, (tuple, list)) and output else output
        if not isinstance(first, torch.Tensor) or not first.is_floating_point():
            return output
        signs = torch.randint(0, 2, first.shape, generator=generator).to(first.dtype) * 2 - 1
        changed = first + first * signs * size
        if isinstance(output, tuple):
            return (changed, *output[1:])
        if isinstance(output, list):
            return [changed, *output[1:]]
        return changed

    handles = [m.register_forward_hook(change) for m in original.modules() if type(m).__name__ in classes]
    if not handles:
        return None
    try:
        return difference(expected, forward(original, batch), batch.keep)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class ModuleParity:
    passed: bool
    detail: str


def attention_parity(eager: Any, batch: Batch, original: ModuleType, ported: ModuleType) -> ModuleParity | None:
    """Each call the port's eager model makes to its attention modules, run again through the SDPA computation on
    copies of the same inputs (masks as built for eager, which SDPA takes as they are): the class-style SDPA class's
    forward on the eager module, or (interface style) the same module with the implementation set to sdpa. Their first
    outputs must agree within the SDPA tolerances; None when no call was seen or the calls cannot be repeated."""
    sdpa_classes = {}  # the eager class a call is made to -> the class whose forward computes it with SDPA
    for name in attention_classes(original, ported):
        klass = getattr(ported, name)
        sdpa_classes[eager_class_of(original, klass)] = klass
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = []
    pending: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pending[id(module)] = copy.deepcopy((args, kwargs))

    def after(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        saved = pending.pop(id(module), None)
        if saved is not None:
            calls.append((module, saved[0], saved[1], first_tensor(output)))

    modules = [m for m in eager.modules() if type(m) in sdpa_classes]
    handles = [m.register_forward_pre_hook(before, with_kwargs=True) for m in modules]
    handles += [m.register_forward_hook(after, with_kwargs=True) for m in modules]
    try:
        with torch.no_grad():
            forward(eager, batch)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    if not calls:
        return None
    worst = worst_relative = 0.0
    try:
        with torch.no_grad(), PortCalls(ported.__name__) as port_calls:
            for module, args, kwargs, _ in calls:
                # the states the model hands over rescaled to unit size: a sharpened model grows them by orders of
                # magnitude, where float32 rounding of the logits alone decides a near one-hot softmax
                args, kwargs = _unit_states(args, kwargs)
                expected = first_tensor(module(*copy.deepcopy(args), **copy.deepcopy(kwargs)))
                got = first_tensor(sdpa_call(module, sdpa_classes[type(module)], args, kwargs))
                if got is None or expected is None or got.shape != expected.shape:
                    return None
                gap = float((got.float() - expected.float()).abs().max())
                worst = max(worst, gap)
                worst_relative = max(worst_relative, gap / max(float(expected.float().abs().max()), 1e-6))
    except Exception:
        return None
    if port_calls.from_port == 0:
        return None  # the repeated calls did not reach SDPA: they prove nothing
    passed = worst <= SDPA_TOLERANCE or worst_relative <= RELATIVE_TOLERANCE
    detail = (
        f"the outputs do not follow the attention; each of the {len(calls)} call(s) of the port's attention modules, "
        f"eager and SDPA on the eager model's inputs (states at unit scale): max|diff|={worst:.3g} "
        f"(relative {worst_relative:.2g})"
    )
    return ModuleParity(passed, detail)


def eager_class_of(original: ModuleType, klass: type) -> type:
    """The port's class eager calls are made to, for one of its attention classes: the class itself where the port
    rewrote it in place (interface style), else the eager base the SDPA class derives from (class style)."""
    return klass if isinstance(getattr(original, klass.__name__, None), type) else klass.__mro__[1]


def _unit_states(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The first positional argument and `*_states` keywords, float tensors of at least two dimensions, divided by
    their root mean square; masks, positions and caches are left as they are."""

    def unit(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 2:
            return value / value.pow(2).mean().sqrt().clamp_min(1e-12)
        return value

    first = (unit(args[0]), *args[1:]) if args else args
    return first, {k: unit(v) if k.endswith("states") else v for k, v in kwargs.items()}


def first_tensor(output: Any) -> torch.Tensor | None:
    first = output[0] if isinstance(output, (tuple, list)) and output else output
    return first if isinstance(first, torch.Tensor) and first.is_floating_point() else None


def sdpa_call(module: Any, sdpa_class: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The SDPA computation of an eager attention module: the SDPA class's forward (class style), or the module's
    own forward with the implementation set to sdpa (interface style)."""
    if sdpa_class is not type(module):
        return sdpa_class.forward(module, *args, **kwargs)
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise ValueError("no config to set the implementation on")
    chosen = config._attn_implementation
    config._attn_implementation = "sdpa"
    try:
        return module(*args, **kwargs)
    finally:
        config._attn_implementation = chosen


def replaced_classes(original: ModuleType, ported: ModuleType) -> set[str]:
    """The original's classes whose computation the port's attention classes replace (an SDPA class's eager base,
    or the class itself where the port rewrote it in place)."""
    out: set[str] = set()
    for name in attention_classes(original, ported):
        klass = getattr(ported, name, None)
        for base in getattr(klass, "__mro__", ()):
            if isinstance(getattr(original, base.__name__, None), type):
                out.add(base.__name__)
                break
    return out


def _judge(name: str, found: Difference, absolute: float, relative: float) -> Check:
    if found.compared == 0:
        return Check(name, False, None, "the outputs have no tensors in common to compare")
    if found.absolute <= absolute:
        return Check(name, True, found.absolute)
    if found.relative <= relative:
        return Check(name, True, found.absolute, f"(relative {found.relative:.2g})")
    return Check(name, False, found.absolute, f"(relative {found.relative:.2g})")


def sdpa_reached(candidate: Candidate, driven: Driven) -> int:
    model, _ = build_sdpa(candidate.ported, driven.config, driven.propagate)
    model.load_state_dict(driven.state)
    batch = materialise(driven.plan, driven.config)
    with PortCalls(candidate.ported.__module__) as calls:
        forward(model, batch)
    return calls.from_port


def reach_sdpa(candidate: Candidate, driven: Driven) -> Driven:
    """The same drive, changed where SDPA is not reached at the defaults: the attention choice set on the
    sub-configs too (transformers 5 does this itself), or a config flag that switches attention modules on."""
    try:
        if sdpa_reached(candidate, driven):
            return driven
    except Exception:
        return driven  # the checks report the port's failure
    with contextlib.suppress(Exception):
        if any(True for _ in sub_configs(driven.config)):
            propagated = Driven(driven.config, driven.level, driven.gain, driven.plan, driven.state, True, list(driven.notes))
            if sdpa_reached(candidate, propagated):
                names = ", ".join(path for path, _ in sub_configs(driven.config))
                propagated.notes.append(f"attn_implementation also set on the sub-configs ({names})")
                return propagated
    for flag in attention_flags(driven.config):
        trial = _reached_with(candidate, driven, {flag: True}, f"config {flag}=True (attention is off at the defaults)")
        if trial is not None:
            return trial
    for field_name, values in setting_values(_port_classes(candidate), driven.config).items():
        default = getattr(driven.config, field_name)
        for value in values:
            note = f"config {field_name}={value!r} (the SDPA classes fall back to eager at {default!r})"
            trial = _reached_with(candidate, driven, {field_name: value}, note)
            if trial is not None:
                return trial
    return driven


def _port_classes(candidate: Candidate) -> list[type]:
    """The port's attention classes (those the original's classes became)."""
    ported, original = sys.modules[candidate.ported.__module__], sys.modules[candidate.original.__module__]
    return [getattr(ported, name) for name in attention_classes(original, ported)]


def _changed(config: Any, changes: dict[str, Any]) -> Any:
    changed = copy.deepcopy(config)
    for name, value in changes.items():
        setattr(changed, name, value)
    return changed


def _reached_with(candidate: Candidate, driven: Driven, changes: dict[str, Any], note: str) -> Driven | None:
    """The drive again with the config changed, when SDPA is reached so (`note` says what changed), else None."""
    trial = _drive_with_config(candidate, _changed(driven.config, changes), driven)
    if trial is None:
        return None
    with contextlib.suppress(Exception):
        if sdpa_reached(candidate, trial):
            trial.notes.append(note)
            return trial
    return None


def _with_term_flags(candidate: Candidate, driven: Driven, label: str) -> list[Check]:
    checks: list[Check] = []
    for settings, changes in term_trials(_port_classes(candidate), driven.config):
        trial = _drive_with_config(candidate, _changed(driven.config, changes), driven)
        if trial is None:
            checks.append(Check(f"{label}[{settings}] not checked", True, None, "the original cannot be driven so"))
            continue
        found, _ = check_driven(candidate, trial, f"{label}[{settings}]")
        checks += expected_on_eager(found, eager_sides(_port_classes(candidate), changes))
    return checks


def _drive_with_config(candidate: Candidate, config: Any, like: Driven) -> Driven | None:
    tried: list[str] = []
    driven = _drive_at(candidate, config, like.level, tried)
    return driven if isinstance(driven, Driven) else None


# ------------------------------------------------------------------ the whole file


MAX_MODELS_DRIVEN = 6


def verify_driven(
    original: ModuleType, ported: ModuleType, classes: list[type] | None = None, covered: frozenset[str] = frozenset()
) -> list[Check]:
    """Checks for the best class of the file the harness can drive, then for further classes until every attention
    class of the port has been built in a checked model; `Unverified` lines for what no driven model covers.

    `covered`: attention classes already checked (by the token path); only classes building others are driven.
    """
    from sdpa_port.verify.auto import model_classes

    wanted = set(attention_classes(original, ported))
    found, reasons = candidates(original, ported, classes if classes is not None else model_classes(original))
    if not found:
        why = "; ".join(reasons[:4]) or "no model class"
        return _alone(original, ported, sorted(wanted - covered), f"no model class whose inputs the harness can build: {why}")
    checks: list[Check] = []
    failures: list[Unverified] = []
    done = set(covered)
    attempts = 0
    for candidate in found:
        if checks or covered:
            # further models only for attention classes not yet built, and only a few (each is built three times)
            if not wanted - done or attempts >= MAX_MODELS_DRIVEN:
                break
            builds = classes_built(candidate)
            if builds is not None and not builds & (wanted - done):
                continue
        attempts += 1
        driven = drive_original(candidate)
        if isinstance(driven, Unverified):
            if driven.detail.startswith(f"{candidate.name}: needs ") and not checks and not covered:
                return _alone(original, ported, sorted(wanted), driven.detail)
            failures.append(driven)
            if not checks and not covered and len(failures) >= 3:
                break
            continue
        driven = reach_sdpa(candidate, driven)
        label = f"{candidate.name}[{'+'.join(candidate.kinds)}]"
        notes = [f"config: {driven.level.name}", f"inputs: {driven.plan.description}", f"gain {driven.gain:g}"]
        found_checks, built = check_driven(candidate, driven, label)
        checks += [Check(f"{label} driven", True, None, "; ".join(notes + driven.notes))] + found_checks
        done |= built
        if len(checks) == len(found_checks) + 1:  # the first model driven: its optional attention terms too
            checks += _with_term_flags(candidate, driven, label)
    if not checks and not covered:
        return _alone(original, ported, sorted(wanted), "; ".join(f.detail for f in failures))
    missing = sorted(wanted - done)
    if missing:
        why = f" ({'; '.join(f.detail for f in failures)[:400]})" if failures else ""
        checks += _alone(original, ported, missing, f"{', '.join(missing)}: built by no model the harness could drive{why}")
    return checks


def _alone(original: ModuleType, ported: ModuleType, names: list[str], why: str) -> list[Check]:
    """The attention classes no driven model covers, checked as modules (`alone.py`); `why` no model covers them."""
    from sdpa_port.verify.alone import verify_alone

    if not names:
        return [unverified(why)]
    return verify_alone(original, ported, names, why)


def classes_built(candidate: Candidate) -> set[str] | None:
    """The port's classes a candidate builds for SDPA at the tiny level, built on the meta device (no memory)."""
    try:
        config = config_at(candidate.config_class, LEVELS[0])
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = candidate.ported._from_config(copy.deepcopy(config), attn_implementation="sdpa")
            except ValueError:
                model = candidate.ported._from_config(copy.deepcopy(config))
    except Exception:
        return None
    return {type(m).__name__ for m in model.modules() if type(m).__module__ == candidate.ported.__module__}


def _out_of_memory(error: BaseException) -> bool:
    """A failure of the machine, not of the port: the checks could not run (the edge reports an error)."""
    return isinstance(error, MemoryError) or "can't allocate memory" in str(error) or "DefaultCPUAllocator" in str(error)


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:200]}"
