"""The differential judge: port a generated file, then run the original and the port, eager and SDPA.

Every case ends in one verdict:
- `refused`: the tool refused (exit 3); fine for any case.
- `exact`: ported, the port's eager path equals the original, its SDPA path equals eager within tolerance on every
  input the original accepts, and SDPA really ran.
- failures: `wrong` (SDPA or eager output differs), `inert` (ported, but SDPA never runs), `missed` (attention
  present, answered "unchanged"), `hazard` (ported a case only a refusal is right for), `crash` (the tool or the
  port raised).
- `invalid`: the generated original itself does not run: a generator bug, not the tool's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from unittest import mock

from render import render
from spec import Spec

PACKAGE = "transformers.models.gpt2"  # any package two levels below transformers resolves the `...` imports
FAILURES = ("wrong", "inert", "missed", "hazard", "crash")
SDPA_TOLERANCE = 1e-4  # absolute, on LayerNorm-ed outputs of sharpened models
EAGER_TOLERANCE = 1e-6


@dataclass
class Verdict:
    kind: str
    detail: str = ""
    checks: int = 0  # comparisons made
    sdpa_calls: int = 0
    reasons: tuple[str, ...] = ()
    skipped: int = 0  # inputs not compared: the original rejects them, or gives NaN on every compared position

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES


@dataclass(frozen=True)
class Inputs:
    name: str
    arguments: dict[str, Any]
    keep: Any  # (batch, length) bool tensor of positions to compare
    prefix: dict[str, Any] | None = None  # a first call whose cache the arguments continue
    encoder: bool = False


# ------------------------------------------------------------------ inputs


def inputs_for(spec: Spec) -> list[Inputs]:
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    batch, length = 2, 8
    ids = torch.randint(3, 64, (batch, length), generator=generator)
    ones = torch.ones(batch, length, dtype=torch.long)
    left = ones.clone()
    left[1, :3] = 0
    right = ones.clone()
    right[1, 5:] = 0
    out = [
        Inputs("left padding", {"input_ids": ids, "attention_mask": left}, left.bool()),
        Inputs("right padding", {"input_ids": ids, "attention_mask": right}, right.bool()),
        Inputs("no padding", {"input_ids": ids, "attention_mask": ones}, ones.bool()),
        Inputs("no mask", {"input_ids": ids}, ones.bool()),
    ]
    if spec.cache:
        prompt = ids[:, :6]
        prompt_mask = left[:, :6]
        step = ids[:, 6:]
        out.append(
            Inputs(
                "cache, 2 new tokens after a left-padded prompt",
                {"input_ids": step, "attention_mask": left, "use_cache": True},
                torch.ones(batch, 2, dtype=torch.bool),
                prefix={"input_ids": prompt, "attention_mask": prompt_mask, "use_cache": True},
            )
        )
        out.append(
            Inputs(
                "cache, 1 new token",
                {"input_ids": ids[:, 7:], "attention_mask": ones, "use_cache": True},
                torch.ones(batch, 1, dtype=torch.bool),
                prefix={"input_ids": ids[:, :7], "attention_mask": ones[:, :7], "use_cache": True},
            )
        )
        out.append(
            Inputs(
                "cache without masks",
                {"input_ids": ids[:, 5:], "use_cache": True},
                torch.ones(batch, 3, dtype=torch.bool),
                prefix={"input_ids": ids[:, :5], "use_cache": True},
            )
        )
    if spec.cross:
        states = torch.randn(batch, 5, 32, generator=generator)
        encoder_mask = torch.ones(batch, 5, dtype=torch.long)
        encoder_mask[1, 3:] = 0
        square = torch.randn(batch, length, 32, generator=generator)
        out += [
            Inputs("cross, padded encoder", {"input_ids": ids, "attention_mask": left, "encoder_hidden_states": states,
                                             "encoder_attention_mask": encoder_mask}, left.bool(), encoder=True),
            Inputs("cross, no encoder mask", {"input_ids": ids, "attention_mask": ones, "encoder_hidden_states": states},
                   ones.bool(), encoder=True),
            Inputs("cross, equal lengths, no masks", {"input_ids": ids, "encoder_hidden_states": square}, ones.bool(),
                   encoder=True),
        ]
    if spec.per_call or spec.call_causal != "none":  # the same model asked for bidirectional attention, with and without padding
        out += [
            Inputs("bidirectional call, right padding", {"input_ids": ids, "attention_mask": right, "is_decoder": False},
                   right.bool()),
            Inputs("bidirectional call, no padding", {"input_ids": ids, "attention_mask": ones, "is_decoder": False},
                   ones.bool()),
        ]
    if spec.head_mask:
        head_mask = torch.ones(2, 4)
        head_mask[0, 1] = 0.0
        head_mask[1, 2] = 0.5
        out.append(Inputs("head mask", {"input_ids": ids, "attention_mask": right, "head_mask": head_mask}, right.bool()))
    if spec.output_attentions:
        out.append(Inputs("output_attentions", {"input_ids": ids, "attention_mask": left, "output_attentions": True},
                          left.bool()))
        # the SDPA class falls back to eager, handed what the SDPA mask helpers build: None without padding
        out.append(Inputs("output_attentions, no padding",
                          {"input_ids": ids, "attention_mask": ones, "output_attentions": True}, ones.bool()))
    return out


# ------------------------------------------------------------------ running


class SdpaSpy:
    def __init__(self) -> None:
        import torch

        self.real = torch.nn.functional.scaled_dot_product_attention
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.real(*args, **kwargs)


@contextlib.contextmanager
def spying() -> Iterator[SdpaSpy]:
    import torch

    spy = SdpaSpy()
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", spy):
        yield spy


def run(model: Any, case: Inputs) -> Any:
    import torch

    with torch.no_grad():
        arguments = dict(case.arguments)
        if case.prefix is not None:
            first = model(**case.prefix)
            arguments["past_key_values"] = first.past_key_values
        return model(**arguments)


def difference(a: Any, b: Any, keep: Any) -> float:
    import torch

    left, right = a.last_hidden_state, b.last_hidden_state
    if left.shape != right.shape:
        return math.inf
    worst = float((left - right).abs()[keep].max()) if keep.any() else 0.0
    if not math.isfinite(worst) or not torch.isfinite(right[keep]).all():
        return math.inf
    if a.attentions is not None:
        if b.attentions is None or len(a.attentions) != len(b.attentions):
            return math.inf
        for x, y in zip(a.attentions, b.attentions):
            if x is None and y is None:
                continue
            if x is None or y is None or x.shape != y.shape:
                return math.inf
            if x.dim() == 3:  # flat (batch * heads, q, k) weights
                x, y = x.view(keep.shape[0], -1, *x.shape[1:]), y.view(keep.shape[0], -1, *y.shape[1:])
            rows = keep[:, None, :, None].expand_as(x)
            # equal entries count as equal, infinities included (weights may be scores before the softmax, filled
            # with -inf where masked)
            gaps = torch.where(x == y, torch.zeros_like(x), (x - y).abs())
            value = float(gaps[rows].max()) if rows.any() else 0.0
            worst = max(worst, value if math.isfinite(value) else math.inf)
    return worst


def flag_settings(spec: Spec) -> list[dict[str, bool]]:
    names = spec.flags()
    return [dict(zip(names, values)) for values in itertools.product((False, True), repeat=len(names))] or [{}]


def built_models(
    spec: Spec, original: Any, ported: Any, flags: dict[str, bool], training: bool = False, **settings: Any
) -> Verdict | tuple[Any, Any, Any]:
    """The original built eager with sharpened weights, and the port built eager and SDPA holding those weights, each
    from a config of its own (`flags` and `settings` set on it), all in training or in eval; a verdict where one
    does not build."""
    from sdpa_port.verify.checks import sharpen

    def config() -> Any:
        return original.FuzzConfig(add_cross_attention=spec.cross, **settings, **flags)

    try:
        reference = original.FuzzModel._from_config(config(), attn_implementation="eager")
    except Exception as error:  # noqa: BLE001 - a generator bug
        return Verdict("invalid", f"the original does not build: {type(error).__name__}: {error}")
    sharpen(reference)
    try:
        eager = ported.FuzzModel._from_config(config(), attn_implementation="eager")
        # an inline port selects nothing (and sets no flag): the model built eager is the one that runs SDPA
        sdpa = eager if spec.style == "inline" else ported.FuzzModel._from_config(config(), attn_implementation="sdpa")
        eager.load_state_dict(reference.state_dict())
        sdpa.load_state_dict(reference.state_dict())
    except Exception as error:  # noqa: BLE001
        return Verdict("crash", f"the port does not build: {type(error).__name__}: {error}")
    for model in {id(m): m for m in (reference, eager, sdpa)}.values():
        caller_terms(spec, model)
    return reference.train(training), eager.train(training), sdpa.train(training)


# the layer's keywords holding each additive term the attention adds to its scores
TERM_KEYWORDS = {"mask": ("attention_mask", "encoder_attention_mask"), "bias": ("position_bias",)}


def in_term_dtype(dtype: str, term: Any) -> Any:
    """A float term as a caller may hand it in another dtype: a bool of its kept (non-negative) entries, integers
    rounded (fills clamped to -1e4), or float16 (fills clamped to its range)."""
    import torch

    if dtype == "bool":
        return term >= 0
    if dtype == "int64":
        return term.clamp(min=-1e4).round().long()
    if dtype == "float16":
        return term.clamp(min=torch.finfo(torch.float16).min, max=torch.finfo(torch.float16).max).half()
    return term


def caller_terms(spec: Spec, model: Any) -> None:
    """Each layer handed its additive terms in `spec.term_dtype` (the original's and the port's alike): eager's
    `scores + term` promotes a bool, integer or float16 term to the float32 scores, which the port must match."""
    if spec.term_dtype == "float32":
        return
    names = {name for kind, _ in spec.terms for name in TERM_KEYWORDS.get(kind, ())}

    def convert(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, {
            key: in_term_dtype(spec.term_dtype, value)
            if key in names and getattr(value, "is_floating_point", lambda: False)()
            else value
            for key, value in kwargs.items()
        }

    for module in model.modules():
        if type(module).__name__ == "FuzzLayer":
            module.register_forward_pre_hook(convert, with_kwargs=True)


def reference_cases(
    spec: Spec, reference: Any, flags: dict[str, bool], verdict: Verdict
) -> Iterator[tuple[Inputs, Any, str]]:
    """Each input the original accepts, with its output, the positions to compare and a label; an input the original
    refuses, or whose every position it leaves non-finite (-inf fills on fully masked rows), counts as skipped."""
    import torch

    for case in inputs_for(spec):
        try:
            expected = run(reference, case)
        except Exception:  # noqa: BLE001 - the original does not accept this input (e.g. no mask)
            verdict.skipped += 1
            continue
        keep = case.keep & torch.isfinite(expected.last_hidden_state).all(-1)
        if not bool(keep.any()):
            verdict.skipped += 1
            continue
        yield dataclasses.replace(case, keep=keep), expected, f"{case.name} {flags}" if flags else case.name


def compare_modules(spec: Spec, original: Any, ported: Any, tolerance: float = SDPA_TOLERANCE) -> Verdict:
    """Run the original (eager) against the port (eager and SDPA) on every input and flag setting."""
    verdict = Verdict("exact")
    ran_any = False
    for flags in flag_settings(spec):
        built = built_models(spec, original, ported, flags)
        if isinstance(built, Verdict):
            return built
        reference, eager, sdpa = built
        if spec.style != "inline" and sdpa.config._attn_implementation != "sdpa":
            return Verdict("inert", f"built with {sdpa.config._attn_implementation!r}")
        for case, expected, label in reference_cases(spec, reference, flags, verdict):
            ran_any = True
            if spec.style != "inline":
                try:
                    eager_out = run(eager, case)
                except Exception as error:  # noqa: BLE001
                    return Verdict("crash", f"{label}: port, eager: {type(error).__name__}: {error}")
                gap = difference(expected, eager_out, case.keep)
                verdict.checks += 1
                if gap > EAGER_TOLERANCE:
                    return Verdict("wrong", f"{label}: the port's eager output changed by {gap:.3g}")
            try:
                with spying() as spy:
                    sdpa_out = run(sdpa, case)
            except Exception as error:  # noqa: BLE001
                if spec.term_dtype != "float32":  # an input the original takes, in a dtype its addition promotes
                    return Verdict("wrong", f"{label}: a {spec.term_dtype} term: the port raised {type(error).__name__}: {error}")
                return Verdict("crash", f"{label}: port, sdpa: {type(error).__name__}: {error}")
            verdict.sdpa_calls += spy.calls
            gap = difference(expected, sdpa_out, case.keep)
            verdict.checks += 1
            if gap > tolerance and not rounding_only(reference, sdpa, case, tolerance):
                return Verdict("wrong", f"{label}: SDPA differs from eager by {gap:.3g} ({spy.calls} SDPA calls)")
    if not ran_any:
        return Verdict("invalid", "the original accepts none of the inputs")
    if verdict.sdpa_calls == 0:
        return Verdict("inert", "ported, but no input ran SDPA")
    dropped = compare_dropout(spec, original, ported)
    return dropped if dropped is not None else verdict


def compare_dropout(spec: Spec, original: Any, ported: Any) -> Verdict | None:
    """In training with a dropout rate of 1.0 every probability the eager computation drops is 0, so SDPA must drop
    exactly where eager does (under a guard such as `if self.training:` too): both outputs then match, where a rate
    SDPA applies that eager does not (or the reverse) leaves one of them without attention. None when they match."""
    if spec.dropout == "none":
        return None
    for flags in flag_settings(spec):
        built = built_models(spec, original, ported, flags, training=True, attention_dropout=1.0)
        if isinstance(built, Verdict):
            return built
        reference, _, sdpa = built
        for case, expected, label in reference_cases(spec, reference, flags, Verdict("exact")):
            with spying() as spy:
                got = run(sdpa, case)
            gap = difference(expected, got, case.keep)
            if spy.calls and gap > SDPA_TOLERANCE:
                return Verdict("wrong", f"{label}: in training with dropout 1.0, SDPA differs from eager by {gap:.3g}")
    return None


def rounding_only(reference: Any, sdpa: Any, case: Inputs, tolerance: float) -> bool:
    """A gap over the tolerance that float64 shrinks to almost nothing is float32 rounding (unscaled scores of a
    sharpened model make the softmax steep), not a wrong port: a wrong scale or a missing term stays as large."""
    import copy

    import torch

    def wide(arguments: dict[str, Any] | None) -> dict[str, Any] | None:
        if arguments is None:
            return None
        return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in arguments.items()}

    wide_case = dataclasses.replace(case, arguments=wide(case.arguments) or {}, prefix=wide(case.prefix))
    try:
        wide_reference, wide_sdpa = copy.deepcopy(reference).double(), copy.deepcopy(sdpa).double()
        with torch.no_grad():
            gap = difference(run(wide_reference, wide_case), run(wide_sdpa, wide_case), case.keep)
    except Exception:  # noqa: BLE001 - a model that does not run in float64 keeps its verdict
        return False
    return gap <= tolerance / 1000


# ------------------------------------------------------------------ one case


def load_pair(original_source: str, ported_source: str, directory: Path, tag: str) -> tuple[Any, Any]:
    from sdpa_port.verify.loader import load_source_in_package

    original = load_source_in_package(original_source, PACKAGE, directory, f"fuzz_{tag}_original")
    ported = load_source_in_package(ported_source, PACKAGE, directory, f"fuzz_{tag}_ported")
    return original, ported


def forget(*modules: Any) -> None:
    for module in modules:
        sys.modules.pop(getattr(module, "__name__", ""), None)


def judge_sources(spec: Spec, source: str, ported_source: str, tolerance: float = SDPA_TOLERANCE) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="sdpa-port-fuzz-") as directory:
        try:
            original, ported = load_pair(source, ported_source, Path(directory), str(spec.seed))
        except Exception as error:  # noqa: BLE001
            return Verdict("crash", f"loading: {type(error).__name__}: {error}")
        try:
            return compare_modules(spec, original, ported, tolerance)
        finally:
            forget(original, ported)


def judge(spec: Spec, transform: Callable[[str], str] | None = None) -> Verdict:
    """Port the rendered spec and judge the result. `transform` may alter the port first (to test the judge)."""
    from sdpa_port import Status, port_source

    source = render(spec)
    try:
        result = port_source(source, filename="modeling_fuzz.py", style=spec.style)
    except Exception as error:  # noqa: BLE001 - the pure API must never raise
        return Verdict("crash", f"port_source raised {type(error).__name__}: {error}\n{traceback.format_exc()}")
    if result.status is Status.REFUSED:
        return Verdict("refused", "; ".join(result.reasons), reasons=result.reasons)
    if result.status is Status.ERROR:
        return Verdict("crash", "; ".join(result.reasons) or result.detail)
    if result.status is Status.UNCHANGED:
        return Verdict("missed", result.detail)
    if spec.must_refuse:
        return Verdict("hazard", f"ported a `{spec.hazard}` case")
    ported = transform(result.source) if transform else result.source
    return judge_sources(spec, source, ported)


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[tuple[Spec, Verdict]] = field(default_factory=list)
    by: tuple[str, ...] = ()  # the spec fields to split the counts by
    split: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (field, value, verdict) -> count
    checks: int = 0  # comparisons made, over every judged port
    skipped: int = 0  # inputs left uncompared (Verdict.skipped), over every judged port

    def add(self, spec: Spec, verdict: Verdict) -> None:
        self.counts[verdict.kind] = self.counts.get(verdict.kind, 0) + 1
        self.checks += verdict.checks
        self.skipped += verdict.skipped
        for name in self.by:
            key = (name, repr(getattr(spec, name)), verdict.kind)
            self.split[key] = self.split.get(key, 0) + 1
        if verdict.failed or verdict.kind == "invalid":
            self.failures.append((spec, verdict))
