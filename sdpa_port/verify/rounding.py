"""Whether a float32 difference is what the model makes of rounding in its attention, or a wrong computation."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from sdpa_port.verify.checks import Batch
from sdpa_port.verify.model_builds import forward
from sdpa_port.verify.outputs import Difference, difference


def in_double(original: Any, sdpa: Any, batch: Batch) -> str:
    """The same comparison in float64, reported beside the float32 one.

    It tells rounding amplified by the model (the difference shrinks by orders of magnitude) from a wrong computation
    (it stays). The float32 result alone decides: an output that does not follow the attention (every match under a
    threshold) agrees in float64 whatever the port computes, so agreement there proves nothing by itself.
    """
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
