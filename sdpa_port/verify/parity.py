"""Parity of a port against the original module: eager unchanged, SDPA equal to eager, SDPA really executed.

The building blocks live in `checks.py` (the code the emitted tests carry); this module composes them for
`--verify` and the acceptance tests, where the reference is the original file's eager model.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from sdpa_port.verify.checks import (  # noqa: F401  (re-exported for callers)
    BF16_LENGTH,
    SDPA_OP,
    Batch,
    Check,
    bf16_error,
    bf16_reference,
    build,
    compare,
    count_sdpa_calls,
    greedy,
    in_bf16,
    make_batch,
    max_difference,
    model_kind,
    sharpen,
)
from sdpa_port.verify.attention_calls import attention_parity, replaced_classes
from sdpa_port.verify.model_builds import forward
from sdpa_port.verify.outputs import RELATIVE_TOLERANCE, difference
from sdpa_port.verify.rounding import Rounding, in_double, within_rounding


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
    """The ported module's eager and SDPA outputs against the original's eager outputs, same weights."""
    kind = kind or model_kind(config, original_class)
    original = build(original_class, config, "eager")
    sharpen(original, gain)
    state = original.state_dict()
    ported_eager = build(ported_class, config, "eager")
    ported_eager.load_state_dict(state)
    ported_sdpa = build(ported_class, config, "sdpa")
    ported_sdpa.load_state_dict(state)
    batch = make_batch(config, kind, padding)
    label = f"{original_class.__name__}[{padding}]"
    checks = compare(original, ported_eager, batch, f"{label} eager unchanged", eager_tolerance, expect_sdpa=False)
    sdpa = compare(original, ported_sdpa, batch, f"{label} sdpa == eager", sdpa_tolerance)
    sdpa[1] = Check(f"{label} sdpa executed", sdpa[1].passed, None, sdpa[1].detail)
    if not sdpa[0].passed:
        # models without normalisation grow activations to 1e6 and more: then judge relative to the magnitude
        relative = compare(original, ported_sdpa, batch, f"{label} sdpa == eager", RELATIVE_TOLERANCE, relative=True)[0]
        if relative.passed:
            sdpa[0] = Check(sdpa[0].name, True, sdpa[0].max_diff, f"(relative {relative.max_diff:.2g})")
    if not sdpa[0].passed:
        rounding = _within_rounding(original, ported_sdpa, original_class, ported_class, batch)
        sdpa[0] = Check(sdpa[0].name, rounding.excused, sdpa[0].max_diff, f"{sdpa[0].detail} {rounding.note}".strip())
        if rounding.jumps:
            modules = sys.modules[original_class.__module__], sys.modules[ported_class.__module__]
            found = attention_parity(ported_eager, batch, *modules)
            if found is not None:
                sdpa[0] = Check(sdpa[0].name, found.passed, sdpa[0].max_diff, f"{sdpa[0].detail}; {found.detail}")
    if not sdpa[0].passed and sdpa[0].max_diff is not None and math.isfinite(sdpa[0].max_diff):
        # the same comparison in float64 beside it, as for driven models; float32 alone decides
        note = in_double(original, ported_sdpa, batch)
        sdpa[0] = Check(sdpa[0].name, False, sdpa[0].max_diff, f"{sdpa[0].detail} {note}".strip())
    return checks + sdpa


def check_bf16(
    original_class: type, ported_class: type, config: Any, padding: str, *, kind: str | None = None, gain: float = 2.0
) -> list[Check]:
    """The port's SDPA in bf16 against the original's eager in bf16, both judged against fp32 maths on bf16 weights.

    The rule the emitted tests carry (`checks.bf16_error`): SDPA's error at most twice eager's own, plus two bf16
    units. Both bf16 models are built in bf16, as loading with `dtype=torch.bfloat16` builds them: buffers a module
    makes in float32 itself (CodeGen's rotary tables) stay so, and the attention sees what it sees in use. A model
    whose original does not run in bf16 here is skipped, saying so.
    """
    import torch

    kind = kind or model_kind(config, original_class)
    label = f"{original_class.__name__}[{padding}] bf16 sdpa as accurate as bf16 eager"
    original = build(original_class, config, "eager")
    sharpen(original, gain)
    batch = make_batch(config, kind, padding, length=BF16_LENGTH)
    try:
        eager = in_bf16(original, "eager")
        with torch.no_grad():
            eager(**batch.inputs)
    except Exception as error:  # e.g. a CPU kernel without bf16
        return [Check(label, True, None, f"the original does not run in bf16 here: {type(error).__name__}", skipped=True)]
    try:
        sdpa = build(ported_class, config, "sdpa", torch.bfloat16)
        sdpa.load_state_dict(original.state_dict())
        sdpa_error, eager_error, bound = bf16_error(bf16_reference(original), eager, sdpa, batch)
    except Exception as error:
        return [Check(label, False, None, f"the port raised {type(error).__name__}: {str(error)[:200]}")]
    detail = f"(bound {bound:.3g}; bf16 eager's error {eager_error:.3g})"
    return [Check(label, sdpa_error <= bound, sdpa_error, detail)]


def _within_rounding(original: Any, sdpa: Any, original_class: type, ported_class: type, batch: Batch) -> Rounding:
    """`rounding.within_rounding` for a token model: the difference is what the model makes of rounding."""
    modules = sys.modules[original_class.__module__], sys.modules[ported_class.__module__]
    expected = forward(original, batch)
    found = difference(expected, forward(sdpa, batch), batch.keep)
    return within_rounding(original, batch, replaced_classes(*modules), expected, found)


def check_generate(
    original_class: type, ported_class: type, config: Any, *, new_tokens: int = 6, gain: float = 2.0
) -> list[Check]:
    """Greedy decoding with cache: the ported module gives the original's tokens with eager and with SDPA."""
    kind = model_kind(config, original_class)
    padding = "left" if kind == "decoder" else "right"
    original = build(original_class, config, "eager")
    sharpen(original, gain)
    state = original.state_dict()
    ported_eager = build(ported_class, config, "eager")
    ported_eager.load_state_dict(state)
    ported_sdpa = build(ported_class, config, "sdpa")
    ported_sdpa.load_state_dict(state)
    batch = make_batch(config, kind, padding)
    reference = greedy(original, batch, config, kind, new_tokens)
    eager = greedy(ported_eager, batch, config, kind, new_tokens)
    sdpa = greedy(ported_sdpa, batch, config, kind, new_tokens)
    label = f"{original_class.__name__}[generate]"
    same_eager = reference.shape == eager.shape and bool((reference == eager).all())
    same_sdpa = reference.shape == sdpa.shape and bool((reference == sdpa).all())
    return [
        Check(f"{label} eager tokens unchanged", same_eager, None, f"{reference.shape[-1]} tokens"),
        Check(
            f"{label} sdpa tokens == eager", same_sdpa, None, "" if same_sdpa else f"{reference.tolist()} vs {sdpa.tolist()}"
        ),
    ]
