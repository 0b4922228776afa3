"""Which driven models decide a port's claim flags, and why none do where they cannot. Torch-free.

The flags are set on the port's model classes, so each attention class of the port must have run, under flex
attention and compiled, in a whole model checked against the original's eager one: a class only checked on its own
(`alone.py`, where no driven model builds it) decides nothing, and then neither flag is checked.
"""

from __future__ import annotations

from collections.abc import Sequence


def claim_padding(mask: str | None, padding_side: str) -> str:
    """The batch the claim checks run on: padded as the driven SDPA check's was, where the forward takes a mask."""
    return padding_side if mask else "none"


def why_not_claimable(driven: Sequence[str], alone: Sequence[str]) -> str | None:
    """Why the claim checks cannot decide the flags for models `driven`, `alone` the attention classes no model built.

    None where they can.
    """
    if not driven:
        return (
            "no model of the file could be driven (its attention classes were checked on their own), and only whole "
            "models are run compiled and under flex attention"
        )
    if alone:
        return (
            f"{', '.join(alone)} built by no driven model (checked on their own): no model runs "
            f"{'it' if len(alone) == 1 else 'them'} compiled or under flex attention"
        )
    return None
