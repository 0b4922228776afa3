"""Model outputs compared: their floating-point tensors, infinite entries and largest differences.

The tolerances that judge the differences live here too, shared by the driven, token and module checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch

EAGER_TOLERANCE = 1e-6
SDPA_TOLERANCE = 1e-4
RELATIVE_TOLERANCE = 1e-5  # of the largest output magnitude, for outputs far beyond unit scale


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


def infinite_entries(output: Any) -> dict[str, torch.Tensor] | None:
    """Where each float output is +inf or -inf, signed, or None when any entry is NaN."""
    found: dict[str, torch.Tensor] = {}
    for key, tensor in floats(output):
        if bool(torch.isnan(tensor).any()):
            return None
        found[key] = torch.where(torch.isinf(tensor), torch.sign(tensor), torch.zeros_like(tensor))
    return found


def same_entries(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None) -> bool:
    return a is not None and b is not None and a.keys() == b.keys() and all(bool(torch.equal(a[k], b[k])) for k in a)


@dataclass(frozen=True)
class Difference:
    absolute: float
    relative: float
    compared: int


def difference(a: Any, b: Any, keep: torch.Tensor) -> Difference:
    """The largest absolute and relative difference over the float outputs `a` and `b` share.

    Relative to the largest magnitude of `a`; positions outside `keep` are left out.
    """
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
