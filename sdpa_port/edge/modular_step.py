"""Modular models at the edge: which file a modular source generates, and writing a port into both.

Transformers 5 checks in `modeling_<m>.py` generated from `modular_<m>.py`. Porting either one ports the generated
file (where the attention code is whole) and carries the change into the modular file, so that regenerating gives
the port back. Nothing here runs the converter; `checkout_step` does where the checkout has it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sdpa_port.checkout.modular import carry
from sdpa_port.discover.modular import generated_from
from sdpa_port.result import PortResult, Status

GENERATED_WARNING = "this file is generated from"


def generated_from_modular(path: Path) -> Path | None:
    """`modular_<m>.py` -> the `modeling_<m>.py` beside it whose banner names it."""
    if not path.name.startswith("modular_") or path.suffix != ".py":
        return None
    generated = path.with_name(path.name.replace("modular_", "modeling_", 1))
    try:
        banner = generated_from(generated.read_text(encoding="utf-8"))
    except OSError:
        return None
    return generated if banner is not None and Path(banner).name == path.name else None


def modular_source_of(path: Path, source: str) -> Path | None:
    """The modular file a generated modeling file names in its banner, when it is beside it."""
    banner = generated_from(source)
    if banner is None:
        return None
    modular = path.with_name(Path(banner).name)
    return modular if modular.is_file() else None


def carry_into_modular(
    modular: Path, generated: str, result: PortResult, asked_for_modular: bool
) -> tuple[PortResult, tuple[Path, str, str] | None, tuple[str, ...]]:
    """The result with the port carried into `modular`, or why it could not be.

    The carried write is the modular file's path, old text and new text.

    Asked to port the modular file, a port that cannot be carried is refused (writing the generated file alone would be
    undone by the next regeneration); asked for the generated file, it is written with a warning.
    """
    text = modular.read_text(encoding="utf-8")
    carried = carry(text, generated, result.source)
    if carried.source is None:
        reasons = tuple(f"cannot carry the port into {modular.name}: {reason}" for reason in carried.reasons)
        if asked_for_modular:
            return PortResult(Status.REFUSED, generated, result.style, "refused", reasons=reasons), None, ()
        return replace(result, warnings=result.warnings + reasons), None, ()
    warnings = tuple(w for w in result.warnings if not w.startswith(GENERATED_WARNING))
    context = (f"carried into {modular.name} (regenerating gives this port): " + "; ".join(carried.notes),)
    return replace(result, warnings=warnings), (modular, text, carried.source), context
