"""Driving any model class of a modeling file, eager against SDPA, on inputs the original accepts.

`verify_driven` is the path of `verify_pair` for models whose forward takes more than token ids: images, videos, audio,
mel features, boxes, region features, time series, or several of them. For each class it tries, in order, configs from
tiny to default sizes (`configs.LEVELS`) and the input layouts of `inputs.plan_inputs`, and keeps the first the
ORIGINAL eager model runs on with finite outputs (`drive_original.py`). Only then are the port's eager and SDPA models
built and compared (`driven_checks.py`), so the port never chooses the inputs it is judged on.

A model that cannot be driven gets an `Unverified` check (never a pass) saying why: a missing optional package, an
input the harness cannot build, or the errors the original raised. Imports torch.
"""

from __future__ import annotations

import copy
import warnings
from types import ModuleType

import torch

from sdpa_port.verify.alone import verify_alone
from sdpa_port.verify.candidates import Candidate, candidates, model_classes
from sdpa_port.verify.checks import Check
from sdpa_port.verify.claim_scope import why_not_claimable
from sdpa_port.verify.claims import not_checked
from sdpa_port.verify.config_trials import reach_sdpa, with_term_flags
from sdpa_port.verify.configs import LEVELS
from sdpa_port.verify.diagnose import attention_classes
from sdpa_port.verify.drive_original import drive_original
from sdpa_port.verify.driven_checks import check_driven
from sdpa_port.verify.driven_claims import DrivenModel, driven_model, run_driven_isolated
from sdpa_port.verify.sized_configs import config_at
from sdpa_port.verify.unverified import Unverified, unverified


MAX_MODELS_DRIVEN = 6


def verify_driven(
    original: ModuleType,
    ported: ModuleType,
    classes: list[type] | None = None,
    covered: frozenset[str] = frozenset(),
    claims: bool = False,
) -> list[Check]:
    """Checks of the best class of the file that the harness can drive, then of further classes.

    Further classes are driven until every attention class of the port has been built in a checked model; `Unverified`
    lines say what no driven model covers.

    `covered`: attention classes already checked (by the token path); only classes building others are driven.
    `claims`: once every check passed, the models driven also run under flex and flash attention and compiled, on
    the drive their SDPA checks passed on (`driven_claims.py`); those checks decide the flags, not the verification.
    """
    drives: list[DrivenModel] = []
    checks, alone = _drive(original, ported, classes, covered, drives)
    if claims and (drives or alone) and all(c.passed for c in checks):
        why = why_not_claimable([d.label for d in drives], alone)
        if why is not None:
            checks += not_checked(", ".join(d.label for d in drives) or ", ".join(alone), why, skipped=True)
        else:
            checks += run_driven_isolated(original, ported, drives)
    return checks


def _drive(
    original: ModuleType,
    ported: ModuleType,
    classes: list[type] | None,
    covered: frozenset[str],
    drives: list[DrivenModel],
) -> tuple[list[Check], list[str]]:
    """`verify_driven`'s checks, and the attention classes checked on their own; each model driven added to `drives`."""
    wanted = set(attention_classes(original, ported))
    found, reasons = candidates(original, ported, classes if classes is not None else model_classes(original))
    if not found:
        why = "; ".join(reasons[:4]) or "no model class"
        names = sorted(wanted - covered)
        return _alone(original, ported, names, f"no model class whose inputs the harness can build: {why}"), names
    checks: list[Check] = []
    failures: list[Unverified] = []
    done = set(covered)
    attempts = 0
    for candidate in found:
        if checks or covered:
            # further models only for attention classes not yet built, and only a few (each is built three times)
            if not wanted - done or attempts >= MAX_MODELS_DRIVEN:
                break
            builds = classes_built(candidate)
            if builds is not None and not builds & (wanted - done):
                continue
        attempts += 1
        driven = drive_original(candidate)
        if isinstance(driven, Unverified):
            if driven.detail.startswith(f"{candidate.name}: needs ") and not checks and not covered:
                return _alone(original, ported, sorted(wanted), driven.detail), sorted(wanted)
            failures.append(driven)
            if not checks and not covered and len(failures) >= 3:
                break
            continue
        driven = reach_sdpa(candidate, driven)
        label = f"{candidate.name}[{'+'.join(candidate.kinds)}]"
        notes = [f"config: {driven.level.name}", f"inputs: {driven.plan.description}", f"gain {driven.gain:g}"]
        found_checks, built = check_driven(candidate, driven, label)
        drives.append(driven_model(candidate.name, label, driven.config, driven.plan, driven.state, driven.propagate))
        checks += [Check(f"{label} driven", True, None, "; ".join(notes + driven.notes))] + found_checks
        done |= built
        if len(checks) == len(found_checks) + 1:  # the first model driven: its optional attention terms too
            checks += with_term_flags(candidate, driven, label)
    if not checks and not covered:
        return _alone(original, ported, sorted(wanted), "; ".join(f.detail for f in failures)), sorted(wanted)
    missing = sorted(wanted - done)
    if missing:
        why = f" ({'; '.join(f.detail for f in failures)[:400]})" if failures else ""
        checks += _alone(original, ported, missing, f"{', '.join(missing)}: built by no model the harness could drive{why}")
    return checks, missing


def _alone(original: ModuleType, ported: ModuleType, names: list[str], why: str) -> list[Check]:
    """The attention classes no driven model covers, checked as modules by `alone.py`.

    `why` says why no model covers them.
    """
    if not names:
        return [unverified(why)]
    return verify_alone(original, ported, names, why)


def classes_built(candidate: Candidate) -> set[str] | None:
    """The port's classes a candidate builds for SDPA at the tiny level, built on the meta device without memory."""
    try:
        config = config_at(candidate.config_class, LEVELS[0])
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = candidate.ported._from_config(copy.deepcopy(config), attn_implementation="sdpa")
            except ValueError:
                model = candidate.ported._from_config(copy.deepcopy(config))
    except Exception:
        return None
    return {type(m).__name__ for m in model.modules() if type(m).__module__ == candidate.ported.__module__}
