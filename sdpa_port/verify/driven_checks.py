"""The checks of one driven model: eager unchanged, SDPA equal to eager, SDPA executed, for each padding."""

from __future__ import annotations

import math
import sys
from types import ModuleType
from typing import Any

from sdpa_port.verify.attention_calls import attention_parity, replaced_classes
from sdpa_port.verify.batches import materialise
from sdpa_port.verify.candidates import Candidate
from sdpa_port.verify.checks import Batch, Check, count_sdpa_calls
from sdpa_port.verify.diagnose import PortCalls, attention_classes, why_no_sdpa
from sdpa_port.verify.drive_original import Driven
from sdpa_port.verify.errors import out_of_memory, short_error
from sdpa_port.verify.model_builds import build, build_sdpa, forward
from sdpa_port.verify.outputs import EAGER_TOLERANCE, RELATIVE_TOLERANCE, SDPA_TOLERANCE, Difference, difference
from sdpa_port.verify.rounding import in_double, within_rounding
from sdpa_port.verify.sized_configs import sub_configs


def _judge(name: str, found: Difference, absolute: float, relative: float) -> Check:
    if found.compared == 0:
        return Check(name, False, None, "the outputs have no tensors in common to compare")
    if found.absolute <= absolute:
        return Check(name, True, found.absolute)
    if found.relative <= relative:
        return Check(name, True, found.absolute, f"(relative {found.relative:.2g})")
    return Check(name, False, found.absolute, f"(relative {found.relative:.2g})")


def check_driven(candidate: Candidate, driven: Driven, label: str) -> tuple[list[Check], set[str]]:
    """Each padding's checks of a driven model, and the port's classes its SDPA model builds.

    Port eager against original eager, port SDPA against original eager, SDPA executed.
    """
    original = build(candidate.original, driven.config, "eager", driven.propagate)
    original.load_state_dict(driven.state)
    try:
        eager = build(candidate.ported, driven.config, "eager", driven.propagate)
        eager.load_state_dict(driven.state)
        sdpa, note = build_sdpa(candidate.ported, driven.config, driven.propagate)
        sdpa.load_state_dict(driven.state)
    except Exception as error:
        if out_of_memory(error):
            raise
        return [Check(f"{label} port builds", False, None, short_error(error))], set()
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
            if out_of_memory(error):
                raise
            checks.append(Check(f"{name} eager unchanged", False, None, f"raised {short_error(error)}"))
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
            if out_of_memory(error):
                raise
            checks.append(Check(f"{name} sdpa == eager", False, None, f"raised {short_error(error)}"))
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
    """What the port's eager model gives with eager also set on every sub-config.

    PreTrainedModels built inside a model choose their own implementation in transformers 4, SDPA where their class
    supports it.
    """
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
    return sys.modules[candidate.original.__module__], sys.modules[candidate.ported.__module__]


def _outside_port(candidate: Candidate, driven: Driven, batch: Batch, got: Any) -> tuple[str, Difference | None]:
    """The port's SDPA outputs against the original built with transformers' default implementation.

    Sub-models from other files then run SDPA where they support it, as they do in the port's SDPA build, so only the
    ported attention differs. A note and that difference; None where nothing outside the port runs SDPA.
    """
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
