"""The port's attention modules judged call by call: each eager call run again through the SDPA computation."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from sdpa_port.verify.checks import Batch
from sdpa_port.verify.diagnose import PortCalls, attention_classes
from sdpa_port.verify.model_builds import forward
from sdpa_port.verify.outputs import RELATIVE_TOLERANCE, SDPA_TOLERANCE


@dataclass(frozen=True)
class ModuleParity:
    passed: bool
    detail: str


def attention_parity(eager: Any, batch: Batch, original: ModuleType, ported: ModuleType) -> ModuleParity | None:
    """Each attention call of the port's eager model repeated through the SDPA computation, and how far they agree.

    The calls are run again on copies of the same inputs, masks as built for eager, which SDPA takes as they are:
    through the class-style SDPA class's forward on the eager module, or (interface style) the same module with the
    implementation set to sdpa. Their first outputs must agree within the SDPA tolerances; None when no call was seen
    or the calls cannot be repeated.
    """
    sdpa_classes = {}  # the eager class a call is made to -> the class whose forward computes it with SDPA
    for name in attention_classes(original, ported):
        klass = getattr(ported, name)
        sdpa_classes[eager_class_of(original, klass)] = klass
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = []
    pending: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pending[id(module)] = copy.deepcopy((args, kwargs))

    def after(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        saved = pending.pop(id(module), None)
        if saved is not None:
            calls.append((module, saved[0], saved[1], first_tensor(output)))

    modules = [m for m in eager.modules() if type(m) in sdpa_classes]
    handles = [m.register_forward_pre_hook(before, with_kwargs=True) for m in modules]
    handles += [m.register_forward_hook(after, with_kwargs=True) for m in modules]
    try:
        with torch.no_grad():
            forward(eager, batch)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    if not calls:
        return None
    worst = worst_relative = 0.0
    try:
        with torch.no_grad(), PortCalls(ported.__name__) as port_calls:
            for module, args, kwargs, _ in calls:
                # the states the model hands over rescaled to unit size: a sharpened model grows them by orders of
                # magnitude, where float32 rounding of the logits alone decides a near one-hot softmax
                args, kwargs = _unit_states(args, kwargs)
                expected = first_tensor(module(*copy.deepcopy(args), **copy.deepcopy(kwargs)))
                got = first_tensor(sdpa_call(module, sdpa_classes[type(module)], args, kwargs))
                if got is None or expected is None or got.shape != expected.shape:
                    return None
                gap = float((got.float() - expected.float()).abs().max())
                worst = max(worst, gap)
                worst_relative = max(worst_relative, gap / max(float(expected.float().abs().max()), 1e-6))
    except Exception:
        return None
    if port_calls.from_port == 0:
        return None  # the repeated calls did not reach SDPA: they prove nothing
    passed = worst <= SDPA_TOLERANCE or worst_relative <= RELATIVE_TOLERANCE
    detail = (
        f"the outputs do not follow the attention; each of the {len(calls)} call(s) of the port's attention modules, "
        f"eager and SDPA on the eager model's inputs (states at unit scale): max|diff|={worst:.3g} "
        f"(relative {worst_relative:.2g})"
    )
    return ModuleParity(passed, detail)


def eager_class_of(original: ModuleType, klass: type) -> type:
    """The port's class that eager calls are made to, for one of its attention classes.

    The class itself where the port rewrote it in place (interface style), else the eager base the SDPA class derives
    from (class style).
    """
    return klass if isinstance(getattr(original, klass.__name__, None), type) else klass.__mro__[1]


def _unit_states(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The states handed to an attention module rescaled to unit root mean square.

    The first positional argument and `*_states` keywords, float tensors of at least two dimensions, are divided by
    their root mean square; masks, positions and caches are left as they are.
    """

    def unit(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 2:
            return value / value.pow(2).mean().sqrt().clamp_min(1e-12)
        return value

    first = (unit(args[0]), *args[1:]) if args else args
    return first, {k: unit(v) if k.endswith("states") else v for k, v in kwargs.items()}


def first_tensor(output: Any) -> torch.Tensor | None:
    first = output[0] if isinstance(output, (tuple, list)) and output else output
    return first if isinstance(first, torch.Tensor) and first.is_floating_point() else None


def sdpa_call(module: Any, sdpa_class: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The SDPA computation of an eager attention module, called on the given arguments.

    The SDPA class's forward (class style), or the module's own forward with the implementation set to sdpa (interface
    style).
    """
    if sdpa_class is not type(module):
        eager_class = type(module)
        if not issubclass(sdpa_class, eager_class):
            return sdpa_class.forward(module, *args, **kwargs)
        # the module seen as the SDPA class for the call (it adds no state): its fallback's `super()` needs that
        module.__class__ = sdpa_class
        try:
            return sdpa_class.forward(module, *args, **kwargs)
        finally:
            module.__class__ = eager_class
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise ValueError("no config to set the implementation on")
    chosen = config._attn_implementation
    config._attn_implementation = "sdpa"
    try:
        return module(*args, **kwargs)
    finally:
        config._attn_implementation = chosen


def replaced_classes(original: ModuleType, ported: ModuleType) -> set[str]:
    """The original's classes whose computation the port's attention classes replace.

    An SDPA class's eager base, or the class itself where the port rewrote it in place.
    """
    out: set[str] = set()
    for name in attention_classes(original, ported):
        klass = getattr(ported, name, None)
        for base in getattr(klass, "__mro__", ()):
            if isinstance(getattr(original, base.__name__, None), type):
                out.add(base.__name__)
                break
    return out
