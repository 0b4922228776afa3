"""Parity checks for any ported modeling file: pick its model classes, synthesise a tiny config, run the checks.

Used by `--verify`, by the census (scripts/census.py) and by the tests. Token models are checked on padded ids and
by greedy generation; every other model on inputs synthesised from its forward signature and config (`drive.py`).
A model the harness cannot drive gets a `not verified` line saying why, never a pass.
"""

from __future__ import annotations

import copy
import inspect
import sys
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import torch

from sdpa_port.verify import drive, parity
from sdpa_port.verify.candidates import candidates, model_classes
from sdpa_port.verify.claims import ClaimCheck
from sdpa_port.verify.configs import config_class_of, flag_fields, tiny_config
from sdpa_port.verify.diagnose import attention_classes, why_no_sdpa
from sdpa_port.verify.parity import Check
from sdpa_port.verify.terms import eager_sides, expected_on_eager, term_trials

LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "MTModel")


@dataclass(frozen=True)
class Targets:
    config_class: type
    base: type
    lm: type | None
    kind: str


def pick_targets(original: ModuleType) -> Targets | None:
    classes = model_classes(original)
    if not classes:
        return None
    takes_ids = [c for c in classes if "input_ids" in inspect.signature(c.forward).parameters]
    if not takes_ids:
        return None
    prefixes = {c.__name__[: -len("Model")] for c in takes_ids if c.__name__.endswith("Model")}
    base = next((c for c in takes_ids if c.__name__.endswith("Model") and c.__name__[:-5] in prefixes and not c.__name__.endswith(LM_SUFFIXES)), None)
    lm = next((c for c in takes_ids if c.__name__.endswith(LM_SUFFIXES) and _can_generate(c)), None)
    if base is None:
        base = lm or takes_ids[0]
    config_class = config_class_of(base)
    if config_class is None:
        return None
    config = config_class()
    kind = parity.model_kind(config, lm or base)
    return Targets(config_class, base, lm, kind)


def _can_generate(model_class: type) -> bool:
    check = getattr(model_class, "can_generate", None)
    try:
        return bool(check()) if callable(check) else False
    except Exception:  # some classes need an instance or a config to answer
        return False


def verify_pair(
    original: ModuleType,
    ported: ModuleType,
    overrides: dict[str, Any] | None = None,
    generate: bool = True,
    claims: bool = False,
) -> list[Check]:
    """Parity checks of `ported` against `original`, on token ids or on inputs the forward signature asks for.

    Token models on padded ids and by greedy generation; any other model on inputs synthesised from its forward
    signature and config (`drive.py`). `claims`: the models of an interface-style port also run under flex attention
    and compiled (`claims.py`, `driven_claims.py`), once their SDPA checks passed; those checks decide the flags, not
    the verification.
    """
    found, _ = candidates(original, ported, model_classes(original))
    targets = pick_targets(original)
    if found and set(found[0].kinds) <= {"text"} and targets is not None:
        try:
            checks = verify_tokens(targets, ported, overrides, generate)
            if claims and all(c.passed for c in checks):
                checks += _claims(targets, ported, overrides)
        except Exception as error:  # e.g. a model the single tiny config does not fit: the driver tries more
            note = f"raised {type(error).__name__}: {str(error)[:160]}; driven instead"
            driven = drive.verify_driven(original, ported, claims=claims)
            return [Check(f"{targets.base.__name__} token checks", True, None, note)] + driven
        covered = _built(targets, ported, overrides)
        if set(attention_classes(original, ported)) - covered:
            # attention classes the token models do not build (a vision tower): driven through other classes, whose
            # claim checks decide the flags with the token model's
            passed = all(c.passed for c in checks if not isinstance(c, ClaimCheck))
            checks += drive.verify_driven(original, ported, covered=frozenset(covered), claims=claims and passed)
        return checks
    return drive.verify_driven(original, ported, claims=claims)


def _built(targets: Targets, ported: ModuleType, overrides: dict[str, Any] | None) -> set[str]:
    """The port's classes the token models build for SDPA, built on the meta device."""
    config = tiny_config(targets.config_class, overrides)
    names: set[str] = set()
    for model_class in filter(None, (targets.base, targets.lm)):
        try:
            with torch.device("meta"):
                model = getattr(ported, model_class.__name__)._from_config(copy.deepcopy(config), attn_implementation="sdpa")
        except Exception:
            continue
        names |= {type(m).__name__ for m in model.modules() if type(m).__module__ == ported.__name__}
    return names | _called(targets, ported, config)


def _called(targets: Targets, ported: ModuleType, config: Any) -> set[str]:
    """The port's classes the SDPA base model runs on a short batch, those built during the forward included.

    Some are built only when the forward sees its inputs: BigBird switches to full attention on short sequences.
    """
    names: set[str] = set()
    try:
        model = parity.build(getattr(ported, targets.base.__name__), config, "sdpa")
        for module in model.modules():
            if type(module).__module__ == ported.__name__:
                module.register_forward_pre_hook(lambda m, args: names.add(type(m).__name__))
        batch = parity.make_batch(config, targets.kind, "none")
        model(**batch.inputs)
    except Exception:
        return set()
    # a module built during the forward had no hook: read the modules again
    return names | {type(m).__name__ for m in model.modules() if type(m).__module__ == ported.__name__}


def token_config(targets: Targets, overrides: dict[str, Any] | None) -> Any:
    """The tiny config the token checks run on: the class's flag defaults, then `overrides`."""
    defaults = flag_fields(targets.config_class().to_dict())  # e.g. a default language, no attention weights
    return tiny_config(targets.config_class, {**defaults, **(overrides or {})})


def verify_tokens(targets: Targets, ported: ModuleType, overrides: dict[str, Any] | None, generate: bool) -> list[Check]:
    config = token_config(targets, overrides)
    checks: list[Check] = []
    padded = "left" if targets.kind == "decoder" else "right"
    for padding in (padded, "none"):
        checks.extend(
            parity.check_forward(
                targets.base, getattr(ported, targets.base.__name__), config, padding, kind=targets.kind
            )
        )
    if targets.lm is not None and targets.lm is not targets.base and targets.kind == "decoder":
        # the LM's own forward, every position compared: it may take another path than the base model (BLIP's text
        # decoder passes `is_decoder=True` down), and generation compares only what the last prompt position gives;
        # unpadded, where sdpa's mask builders may leave the causality to `is_causal`
        checks.extend(
            parity.check_forward(targets.lm, getattr(ported, targets.lm.__name__), config, "none", kind=targets.kind)
        )
    if any(c.name.endswith("sdpa executed") and not c.passed for c in checks):
        checks = _explain_no_sdpa(checks, targets, ported, config)
    checks.extend(parity.check_bf16(targets.base, getattr(ported, targets.base.__name__), config, padded, kind=targets.kind))
    checks.extend(_with_term_settings(targets, ported, config, padded))
    if generate and targets.lm is not None and targets.kind in ("decoder", "seq2seq"):
        checks.extend(_generate(targets, ported, config))
    if generate and targets.lm is not None and targets.kind == "decoder":
        from sdpa_port.verify.serving import serving_checks_for  # continuous batching, kernels, export, ExecuTorch

        checks.extend(serving_checks_for(ported, targets.lm, config))
    return checks


def _claims(targets: Targets, ported: ModuleType, overrides: dict[str, Any] | None) -> list[Check]:
    """The port's base model under flex and flash attention and compiled, padded as its SDPA checks were, against
    eager.

    They run in a child process (`claims_child.py`): each compiles, and a compiler crash must not end `--verify`.
    """
    from sdpa_port.verify.claims import run_isolated

    return list(run_isolated(sys.modules[targets.base.__module__], ported, targets.base.__name__, overrides))


def _with_term_settings(targets: Targets, ported: ModuleType, config: Any, padding: str) -> list[Check]:
    """The padded forward checked again under each config change that switches optional score terms on.

    Such as a relative position flag off by default; the checks are named after the change.
    """
    checks: list[Check] = []
    original = sys.modules[targets.base.__module__]
    classes = [getattr(ported, name) for name in attention_classes(original, ported)]
    for settings, changes in term_trials(classes, config):
        changed = copy.deepcopy(config)
        for name, value in changes.items():
            setattr(changed, name, value)
        try:
            parity.build(targets.base, copy.deepcopy(changed), "eager")
        except Exception as error:
            checks.append(Check(f"{targets.base.__name__}[{settings}] not checked", True, None, f"the original cannot be built so: {type(error).__name__}"))
            continue
        found = parity.check_forward(targets.base, getattr(ported, targets.base.__name__), changed, padding, kind=targets.kind)
        for check in expected_on_eager(found, eager_sides(classes, changes)):
            checks.append(replace(check, name=check.name.replace(targets.base.__name__, f"{targets.base.__name__}[{settings}]", 1)))
    return checks


def _generate(targets: Targets, ported: ModuleType, config: Any) -> list[Check]:
    """Greedy decoding with cache, or a note where the original cannot generate from token ids alone.

    A model whose original cannot generate from token ids alone (it needs other inputs, e.g. Pop2Piano's features) gets
    a note instead, its forward checks standing alone.
    """
    assert targets.lm is not None
    try:
        return parity.check_generate(targets.lm, getattr(ported, targets.lm.__name__), config)
    except Exception as error:
        try:
            model = parity.build(targets.lm, config, "eager")
            parity.greedy(model, parity.make_batch(config, targets.kind, "none"), config, targets.kind)
        except Exception as original_error:
            why = f"{type(original_error).__name__}: {str(original_error)[:160]}"
            return [Check(f"{targets.lm.__name__}[generate] not checked", True, None, f"the original cannot generate here: {why}")]
        return [Check(f"{targets.lm.__name__}[generate]", False, None, f"the port raised {type(error).__name__}: {str(error)[:200]}")]


def _explain_no_sdpa(checks: list[Check], targets: Targets, ported: ModuleType, config: Any) -> list[Check]:
    try:
        model = parity.build(getattr(ported, targets.base.__name__), config, "sdpa")
        batch = parity.make_batch(config, targets.kind, "none")
        why = why_no_sdpa(model, lambda: model(**batch.inputs), sys.modules[targets.base.__module__], ported)
    except Exception as error:
        why = f"(no diagnosis: {type(error).__name__})"
    return [
        Check(c.name, c.passed, c.max_diff, f"{c.detail}: {why}") if c.name.endswith("sdpa executed") and not c.passed else c
        for c in checks
    ]
