"""The claim checks of driven models: flex, flash (a CPU stand-in kernel) and fullgraph compile, on the drive their
SDPA check passed on.

`verify_driven` hands over each model it drove, with the config level, sharpened weights and input plan the original
eager model ran finitely on (`drive_original.py`); the checks (`claims.flex_claim`, `claims.compile_claim`) run in the
claims' own process (`claims_child.py`) on the batch padded as the SDPA check's was, against the original's eager
outputs, judged as the driven SDPA check is; flash's on transformers' flash path (`flash_claim.py`). Imports torch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from sdpa_port.plan.flash_proof import FLASH_FLAG
from sdpa_port.rewrite.flags import COMPILE_FLAG, FLEX_FLAG
from sdpa_port.verify.batches import materialise
from sdpa_port.verify.claim_scope import claim_padding
from sdpa_port.verify.claims import (
    BUILT_WITH,
    ClaimCheck,
    compile_claim,
    compiled_fullgraph,
    failed_run,
    flash_claim,
    flex_claim,
    in_child,
    not_checked,
)
from sdpa_port.verify.inputs import Plan
from sdpa_port.verify.model_builds import build, build_sdpa, forward
from sdpa_port.verify.outputs import RELATIVE_TOLERANCE, SDPA_TOLERANCE, difference


@dataclass
class DrivenModel:
    """A model whose driven SDPA checks passed, as the claims' process needs it."""

    name: str  # the model class, in both files
    label: str  # the driven checks' name for it, e.g. `GitModel[text+image]`
    config: Any
    plan: Plan
    state: dict[str, torch.Tensor]
    propagate: bool
    padding: str


def driven_model(
    name: str, label: str, config: Any, plan: Plan, state: dict[str, torch.Tensor], propagate: bool
) -> DrivenModel:
    """A driven model, to be checked on the batch padded as its SDPA check's was (`claim_scope.claim_padding`)."""
    return DrivenModel(name, label, config, plan, state, propagate, claim_padding(plan.mask, plan.padding_side))


def run_driven_isolated(original: ModuleType, ported: ModuleType, models: list[DrivenModel]) -> list[ClaimCheck]:
    """The claim checks of `models`, in a process of their own, which reads them from a file written here."""
    label = ", ".join(model.label for model in models)
    with tempfile.TemporaryDirectory(prefix="sdpa-port-driven-claims-") as directory:
        path = Path(directory) / "models.pt"
        try:
            torch.save(models, path)
        except Exception as error:
            why = f"the driven models cannot be handed to the checks' process: {type(error).__name__}: {error}"
            return not_checked(label, why[:300])
        return in_child(original, ported, {"driven": str(path)}, label)


def load_models(path: str) -> list[DrivenModel]:
    """The models `run_driven_isolated` wrote (a file of this run: its pickled configs and plans are trusted)."""
    return list(torch.load(path, weights_only=False))


def driven_claim_checks(original: ModuleType, ported: ModuleType, model: DrivenModel) -> list[ClaimCheck]:
    """The flex, flash and compile checks of one driven model of the port."""
    original_class, ported_class = getattr(original, model.name), getattr(ported, model.name)
    name = f"{model.label}[{model.padding if model.padding != 'none' else 'unpadded'}]"
    flex, compiled = f"{name} flex_attention", f"{name} torch.compile(fullgraph=True)"
    flash = f"{name} flash_attention_2 (CPU stand-in kernel)"
    return flex_claim(
        ported, flex, lambda: _against_eager(original_class, ported_class, model, flex, FLEX_FLAG, lambda m: m)
    ) + flash_claim(
        ported, flash, lambda: _against_eager(original_class, ported_class, model, flash, FLASH_FLAG, lambda m: m)
    ) + compile_claim(
        ported, lambda: _against_eager(original_class, ported_class, model, compiled, COMPILE_FLAG, compiled_fullgraph)
    )


def _against_eager(
    original_class: type, ported_class: type, model: DrivenModel, label: str, flag: str, wrap: Callable[[Any], Any]
) -> list[ClaimCheck]:
    """The port's model (built with its flag's implementation, else SDPA), wrapped, against the original's eager."""
    try:
        original = build(original_class, model.config, "eager", model.propagate)
        original.load_state_dict(model.state)
        if flag in BUILT_WITH:
            port = build(ported_class, model.config, BUILT_WITH[flag], model.propagate)
        else:
            port, _ = build_sdpa(ported_class, model.config, model.propagate)
        port.load_state_dict(model.state)
        batch = materialise(model.plan, model.config, model.padding)
        expected = forward(original, batch)
        found = forward(wrap(port), batch)
    except Exception as error:  # the finding: this path does not run the port
        return [failed_run(label, flag, error)]
    compared = difference(expected, found, batch.keep)
    if compared.compared == 0:
        return [ClaimCheck(f"{label} == eager", False, None, "the outputs have no tensors in common", flag=flag)]
    passed = compared.absolute <= SDPA_TOLERANCE or compared.relative <= RELATIVE_TOLERANCE
    detail = "" if compared.absolute <= SDPA_TOLERANCE else f"(relative {compared.relative:.2g})"
    return [ClaimCheck(f"{label} == eager", passed, compared.absolute, detail, flag=flag)]
