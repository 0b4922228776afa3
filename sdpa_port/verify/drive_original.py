"""The first config level, input layout and sharpening on which the original eager model runs finitely."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from sdpa_port.verify.batches import materialise
from sdpa_port.verify.candidates import Candidate
from sdpa_port.verify.checks import model_kind
from sdpa_port.verify.configs import LEVELS, Level, timm_backbone
from sdpa_port.verify.errors import missing_package, short_error
from sdpa_port.verify.inputs import ConfigView, Plan, Unsupported, describe, plan_inputs
from sdpa_port.verify.model_builds import build, forward, parameter_count, sharpen
from sdpa_port.verify.outputs import finite, floats, infinite_entries, same_entries
from sdpa_port.verify.sized_configs import config_at
from sdpa_port.verify.unverified import Unverified, unverified

MAX_PARAMETERS = 300_000_000  # three fp32 copies of the model are held at once
GAINS = (2.0, 1.0, 0.5)  # sharpening; milder where the original overflows (deep stacks without normalisation)


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
    """The first config level, input layout and sharpening on which the original eager model runs finitely."""
    tried: list[str] = []
    for level in LEVELS:
        try:
            config = config_at(candidate.config_class, level)
        except Exception as error:
            tried.append(f"[{level.name}] config: {short_error(error)}")
            continue
        driven = drive_at(candidate, config, level, tried)
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


def drive_at(candidate: Candidate, config: Any, level: Level, tried: list[str]) -> Driven | Unverified | None:
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
            tried.append(f"[{level.name}] build: {short_error(error)}")
            return None
        return drive_at(candidate, repaired, level, tried)
    except Exception as error:
        package = missing_package(error)
        if package:
            return unverified(f"{candidate.name}: needs {package} ({short_error(error)})")
        tried.append(f"[{level.name}] build: {short_error(error)}")
        return None
    for plan in plans:
        try:
            output = forward(model, materialise(plan, config))
        except Exception as error:
            package = missing_package(error)
            if package:
                return unverified(f"{candidate.name}: needs {package} ({short_error(error)})")
            tried.append(f"[{level.name}] {plan.description}: {short_error(error)}")
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
                tried.append(f"[{level.name}] gain {gain}: {short_error(error)}")
                break
            if finite(output):
                state = {k: v.clone() for k, v in model.state_dict().items()}
                return Driven(config, level, gain, plan, state, notes=_config_notes(candidate, config))
            infinities.append(infinite_entries(output))
            if len(infinities) >= 2 and infinities[-1] is not None and same_entries(infinities[-2], infinities[-1]):
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
