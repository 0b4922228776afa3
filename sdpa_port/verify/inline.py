"""Parity of an inline-style port: each class rewritten in place against the original's class, and the models.

Imports torch.

An inline port has no eager implementation to select: the class computes with SDPA whatever the setting, and keeps
its eager forward only for calls asking for what SDPA cannot give. So the reference is always the original file.
Each class of the port is built from its own constructor beside the original's, with the same sharpened weights, and
run on the synthetic inputs of `alone.py` (no mask, padded keys, optional terms): the port's outputs must agree with
the original's within the SDPA tolerances, SDPA must run from the port, and a call asking for the attention weights
must give exactly the original's outputs. Where the file has models taking token ids, the base model is compared as
a whole too, padded and not.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from types import ModuleType
from typing import Any

import torch

from sdpa_port.discover.values import WEIGHT_REQUESTS  # which the kept eager forward answers
from sdpa_port.verify import alone_inputs, parity
from sdpa_port.verify.alone import GAIN, _arguments, _cases, _config, _heads, _width, construct
from sdpa_port.verify.attention_calls import first_tensor
from sdpa_port.verify.checks import Check
from sdpa_port.verify.diagnose import PortCalls
from sdpa_port.verify.model_builds import sharpen
from sdpa_port.verify.outputs import EAGER_TOLERANCE, RELATIVE_TOLERANCE, SDPA_TOLERANCE
from sdpa_port.verify.loader import source_of
from sdpa_port.verify.stubs import explained
from sdpa_port.verify.unverified import unverified



def verify_inline(
    original: ModuleType, ported: ModuleType, names: tuple[str, ...] | list[str], alone: str | None = None
) -> list[Check]:
    """The checks of the module docstring, one per class in `names` (the classes ported in place), models first.

    `alone`: why the classes are checked on their own only (the file loaded with stand-ins), no model."""
    checks: list[Check] = [] if alone is not None else _models(original, ported)
    if alone is not None:
        checks.append(Check("attention modules checked on their own", True, None, alone))
    else:
        checks.append(Check("in-place classes checked on their own", True, None, "against the original's classes"))
    checks.extend(check_class(original, ported, name) for name in names)
    return checks


def _models(original: ModuleType, ported: ModuleType) -> list[Check]:
    """The base model taking token ids, where the file has one, against the original's, padded and not."""
    from sdpa_port.verify.auto import pick_targets, token_config

    targets = pick_targets(original)
    if targets is None:
        return []
    checks: list[Check] = []
    try:
        config = token_config(targets, None)
        padded = "left" if targets.kind == "decoder" else "right"
        for padding in (padded, "none"):
            checks.extend(_model(targets.base, getattr(ported, targets.base.__name__), config, padding, targets.kind))
    except Exception as error:  # a model the tiny config does not fit: the classes alone still decide
        checks.append(
            Check(f"{targets.base.__name__} token checks", True, None, f"not run: {type(error).__name__}: {str(error)[:160]}")
        )
    return checks


def _model(original_class: type, ported_class: type, config: Any, padding: str, kind: str) -> list[Check]:
    reference = parity.build(original_class, copy.deepcopy(config), "eager")
    parity.sharpen(reference, GAIN)
    candidate = parity.build(ported_class, copy.deepcopy(config), "eager")
    candidate.load_state_dict(reference.state_dict())
    batch = parity.make_batch(config, kind, padding)
    label = f"{original_class.__name__}[{padding}] in-place sdpa == original"
    checks = parity.compare(reference, candidate, batch, label, SDPA_TOLERANCE)
    if not checks[0].passed:
        relative = parity.compare(reference, candidate, batch, label, RELATIVE_TOLERANCE, relative=True, expect_sdpa=False)
        if relative[0].passed:
            checks[0] = Check(label, True, checks[0].max_diff, f"(relative {relative[0].max_diff:.2g})")
    return checks


def _explained(failure: object, original: ModuleType) -> str:
    """A constructor's failure, naming the missing package of a name the file imports inside a try block."""
    try:
        return explained(failure, source_of(original))
    except (OSError, SyntaxError, ValueError):
        return str(failure)


def check_class(original: ModuleType, ported: ModuleType, name: str) -> Check:
    """One class of the port against the original's, under its default settings and each boolean setting flipped.

    The rewritten computation must run somewhere: a port whose SDPA calls on every input are the ones the original
    already made (a branch that already called SDPA) proves nothing about the branch it rewrote."""
    label = f"{name} in place"
    try:
        variants = _variants(original, name)
    except Exception as reason:  # noqa: BLE001 - a constructor the harness cannot satisfy: not verified, said why
        return unverified(f"{name} of the port, checked on its own: {_explained(reason, original)}")
    ran: list[str] = []
    details: list[str] = []
    worst = 0.0
    window: dict[str, Any] = {}
    for setting, extra in variants:
        if not extra:  # the defaults: the window values in order, the first the original builds and runs with taken
            found, window, failure = _first_window(original, ported, name)
            if failure is not None:
                return unverified(f"{name} of the port, checked on its own: {_explained(failure, original)}")
        else:
            try:
                reference, port = _pair(original, ported, name, {**window, **extra})
            except Exception:  # noqa: BLE001 - this setting cannot be built: the others decide
                continue
            found = _run(reference, port, original.__name__, ported.__name__, next(iter(window.values()), None))
        if isinstance(found, Check):
            return Check(label, False, found.max_diff, f"[{setting}] {found.detail}")
        if found is None:
            continue
        gap, detail, new_calls = found
        worst = max(worst, gap)
        details.append(f"[{setting}] {detail}")
        if new_calls:
            ran.append(setting)
    if not details:
        return unverified(f"{name} of the port, checked on its own: the original runs on none of the synthetic inputs")
    detail = "; ".join(details)
    if not ran:
        return unverified(
            f"{name} of the port, checked on its own: the rewritten computation never ran (every SDPA call came from "
            f"code the original already had): {detail}"
        )
    return Check(label, True, worst, f"({detail}; the rewritten computation ran under: {', '.join(ran)})")


def _variants(original: ModuleType, name: str) -> list[tuple[str, dict[str, Any]]]:
    """The default settings, then each boolean constructor parameter flipped alone."""
    klass = getattr(original, name)
    out: list[tuple[str, dict[str, Any]]] = [("defaults", {})]
    for parameter in list(inspect.signature(klass.__init__).parameters.values())[1:]:
        if isinstance(parameter.default, bool):
            out.append((f"{parameter.name}={not parameter.default}", {parameter.name: not parameter.default}))
    return out[: 1 + MAX_FLIPS]


MAX_FLIPS = 8


def _first_window(
    original: ModuleType, ported: ModuleType, name: str
) -> tuple[tuple[float, str, bool] | Check | None, dict[str, Any], Exception | None]:
    """The defaults run with each window value of `alone_inputs.window_options` in turn: the first outcome where the
    original runs, the window it took, and the constructor's failure where no window builds."""
    found: tuple[float, str, bool] | Check | None = None
    failure: Exception | None = None
    built = False
    for option in alone_inputs.window_options(getattr(original, name)):
        try:
            reference, port = _pair(original, ported, name, option)
        except Exception as reason:  # noqa: BLE001 - the next window may build
            failure = failure or reason
            continue
        built = True
        found = _run(reference, port, original.__name__, ported.__name__, next(iter(option.values()), None))
        if found is not None:
            return found, option, None
    return found, {}, None if built else failure


def _pair(original: ModuleType, ported: ModuleType, name: str, extra: dict[str, Any]) -> tuple[Any, Any]:
    original_class, port_class = getattr(original, name), getattr(ported, name)
    config = _config(original)
    arguments = {**_arguments(original_class, config), **extra}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference, port = construct(original_class, port_class, arguments, config)
    sharpen(reference, GAIN)
    port.load_state_dict(reference.state_dict())
    return reference.eval(), port.eval()


def _run(
    reference: Any, port: Any, original_name: str, ported_name: str, window: Any = None
) -> tuple[float, str, bool] | Check | None:
    """The port against the original on the synthetic cases: (worst gap, detail, whether the port made SDPA calls
    the original did not), a failed check, or None where the original runs on none of them."""
    width, heads = _width(reference), _heads(reference)
    cases = _cases(reference, width, heads, window)
    if not cases:
        return None
    worst = worst_relative = fallback_gap = 0.0
    calls = already = 0
    flag = next((f for f in WEIGHT_REQUESTS if f in inspect.signature(reference.forward).parameters), None)
    with torch.no_grad():
        for case, kwargs in cases:
            try:
                with PortCalls(original_name) as before:
                    expected = first_tensor(reference(**copy.deepcopy(kwargs)))
                with PortCalls(ported_name) as port_calls:
                    got = first_tensor(port(**copy.deepcopy(kwargs)))
                if flag is not None:
                    asked = {**copy.deepcopy(kwargs), flag: True}
                    weights_expected = first_tensor(reference(**copy.deepcopy(asked)))
                    weights_got = first_tensor(port(**asked))
                    if weights_expected is not None and weights_got is not None:
                        fallback_gap = max(fallback_gap, float((weights_got.float() - weights_expected.float()).abs().max()))
            except Exception as error:  # the port fails where the original ran: a failed check
                return Check("", False, None, f"[{case}] the port raised {type(error).__name__}: {str(error)[:160]}")
            calls += port_calls.from_port
            already += before.from_port
            if expected is None or got is None or got.shape != expected.shape:
                return Check("", False, None, f"[{case}] outputs of different shapes or not tensors")
            gap = float((got.float() - expected.float()).abs().max())
            worst = max(worst, gap)
            worst_relative = max(worst_relative, gap / max(float(expected.float().abs().max()), 1e-6))
    shown = f", window {window}" if window is not None else ""
    detail = f"hidden {width}, {heads} heads{shown}, gain {GAIN:g}, {', '.join(case for case, _ in cases)}: max|diff|={worst:.3g}"
    detail += f" (relative {worst_relative:.2g}), SDPA calls {calls} (the original's own {already})"
    if flag is not None:
        detail += f", with {flag}=True max|diff|={fallback_gap:.3g}"
        if fallback_gap > EAGER_TOLERANCE:
            return Check("", False, worst, f"{detail}: the eager forward kept for {flag} changed")
    if not (worst <= SDPA_TOLERANCE or worst_relative <= RELATIVE_TOLERANCE):
        return Check("", False, worst, f"{detail}: SDPA differs from eager")
    return worst, detail, calls > already


__all__ = ["verify_inline", "check_class"]
