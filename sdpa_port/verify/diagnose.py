"""Why a port built for SDPA ran no SDPA call.

Which attention classes the port changed, whether the model built them, whether they were called, and with what.
Imports torch.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Callable


def changed_classes(original: ModuleType, ported: ModuleType) -> dict[str, type]:
    """The port's module classes that are new or whose forward changed.

    New in class style (`XxxSdpaAttention`); changed in interface style (the attention module dispatching through
    `ALL_ATTENTION_FUNCTIONS`).
    """
    import torch

    out: dict[str, type] = {}
    for name, value in vars(ported).items():
        if not (isinstance(value, type) and issubclass(value, torch.nn.Module) and value.__module__ == ported.__name__):
            continue
        before = getattr(original, name, None)
        if before is None:
            out[name] = value
            continue
        new_forward = getattr(value.forward, "__code__", None)
        old_forward = getattr(before.forward, "__code__", None)
        if new_forward is not None and old_forward is not None and new_forward.co_code != old_forward.co_code:
            out[name] = value
    return out


SDPA_NAMES = {"scaled_dot_product_attention", "ALL_ATTENTION_FUNCTIONS"}


def attention_classes(original: ModuleType, ported: ModuleType) -> list[str]:
    """The changed classes whose forward calls SDPA or dispatches through the attention interface."""
    out = []
    for name, value in changed_classes(original, ported).items():
        code = getattr(value.forward, "__code__", None)
        if code is not None and SDPA_NAMES & set(code.co_names):
            out.append(name)
    return sorted(out)


def why_no_sdpa(model: Any, run: Callable[[], Any], original: ModuleType, ported: ModuleType) -> str:
    """One sentence on why running `model`, built for SDPA, made no SDPA call."""
    classes = changed_classes(original, ported)
    if not classes:
        return "the port changes no module class"
    names = ", ".join(sorted(classes))
    instances = [m for m in model.modules() if type(m).__name__ in classes and type(m).__module__ == ported.__name__]
    if not instances:
        return f"the model builds none of the port's attention classes ({names}): its layers did not select them"
    calls: list[dict[str, Any]] = []

    def record(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            calls.append(dict(bound.arguments))
        except TypeError:
            calls.append(dict(kwargs))

    handles = [m.register_forward_pre_hook(record, with_kwargs=True) for m in instances]
    try:
        run()
    except Exception as error:
        return f"running the model raised {type(error).__name__}: {error}"
    finally:
        for handle in handles:
            handle.remove()
    kinds = sorted({type(m).__name__ for m in instances})
    if not calls:
        return f"the model builds {', '.join(kinds)} but never calls them"
    weights = sum(1 for c in calls if c.get("output_attentions"))
    heads = sum(1 for c in calls if c.get("head_mask") is not None or c.get("layer_head_mask") is not None)
    if weights == len(calls):
        return (
            f"{', '.join(kinds)} were called {len(calls)} time(s), always with output_attentions=True (their callers "
            "ask for attention weights), so they fell back to eager"
        )
    if heads == len(calls):
        return f"{', '.join(kinds)} were called {len(calls)} time(s), always with a head mask, so they fell back to eager"
    return f"{', '.join(kinds)} were called {len(calls)} time(s) without reaching SDPA"


class PortCalls:
    """Counts the SDPA calls made from the code of one module, the port, while active.

    Counts calls of `torch.nn.functional.scaled_dot_product_attention`: a model's SDPA calls may come from sub-models
    of other files that support SDPA already (ZoeDepth's BEiT backbone), which says nothing about the port.
    """

    DEPTH = 8  # frames walked up from the call: the port's forward, or the interface function it calls

    def __init__(self, module_name: str) -> None:
        self.module_name = module_name
        self.total = 0
        self.from_port = 0

    def __enter__(self) -> "PortCalls":
        import torch.nn.functional as functional

        self._functional = functional
        self._original = functional.scaled_dot_product_attention
        original, module_name = self._original, self.module_name

        def counted(*args: Any, **kwargs: Any) -> Any:
            import sys

            self.total += 1
            frame = sys._getframe(1)
            for _ in range(self.DEPTH):
                if frame is None:
                    break
                if frame.f_globals.get("__name__") == module_name:
                    self.from_port += 1
                    break
                frame = frame.f_back
            return original(*args, **kwargs)

        functional.scaled_dot_product_attention = counted
        return self

    def __exit__(self, *_: Any) -> None:
        self._functional.scaled_dot_product_attention = self._original
