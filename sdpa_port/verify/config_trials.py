"""The same drive under other configs: to reach SDPA where the defaults do not, or to switch optional terms on."""

from __future__ import annotations

import contextlib
import copy
import sys
from typing import Any

from sdpa_port.verify.batches import materialise
from sdpa_port.verify.candidates import Candidate
from sdpa_port.verify.checks import Check
from sdpa_port.verify.diagnose import PortCalls, attention_classes
from sdpa_port.verify.drive_original import Driven, drive_at
from sdpa_port.verify.driven_checks import check_driven
from sdpa_port.verify.model_builds import build_sdpa, forward
from sdpa_port.verify.sized_configs import attention_flags, sub_configs
from sdpa_port.verify.terms import eager_sides, expected_on_eager, setting_values, term_trials


def sdpa_reached(candidate: Candidate, driven: Driven) -> int:
    model, _ = build_sdpa(candidate.ported, driven.config, driven.propagate)
    model.load_state_dict(driven.state)
    batch = materialise(driven.plan, driven.config)
    with PortCalls(candidate.ported.__module__) as calls:
        forward(model, batch)
    return calls.from_port


def reach_sdpa(candidate: Candidate, driven: Driven) -> Driven:
    """The same drive, changed where SDPA is not reached at the config's defaults.

    The attention choice is set on the sub-configs too (transformers 5 does this itself), or a config flag switches
    attention modules on.
    """
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
    """The port's attention classes, those the original's classes became."""
    ported, original = sys.modules[candidate.ported.__module__], sys.modules[candidate.original.__module__]
    return [getattr(ported, name) for name in attention_classes(original, ported)]


def _changed(config: Any, changes: dict[str, Any]) -> Any:
    changed = copy.deepcopy(config)
    for name, value in changes.items():
        setattr(changed, name, value)
    return changed


def _reached_with(candidate: Candidate, driven: Driven, changes: dict[str, Any], note: str) -> Driven | None:
    """The drive again with the config changed, when SDPA is then reached, else None.

    `note` says what changed.
    """
    trial = _drive_with_config(candidate, _changed(driven.config, changes), driven)
    if trial is None:
        return None
    with contextlib.suppress(Exception):
        if sdpa_reached(candidate, trial):
            trial.notes.append(note)
            return trial
    return None


def with_term_flags(candidate: Candidate, driven: Driven, label: str) -> list[Check]:
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
    driven = drive_at(candidate, config, like.level, tried)
    return driven if isinstance(driven, Driven) else None
