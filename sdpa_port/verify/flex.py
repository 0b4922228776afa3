"""Whether an interface-style port runs under torch's flex attention and matches eager, so it may claim it.

Transformers 5 builds a model with `attn_implementation="flex_attention"` only when its class sets
`_supports_flex_attn`. A port claims that flag only after this check ran: the port's model classes are given the flag
for the check, the model is built with flex attention, and its outputs on a padded batch are compared with the
original eager model's, with the same sharpened weights. The flex calls are counted, so a model that never reached
flex attention does not pass.

A failed or impossible check is not a failed verification: the port is then written without the flag, and the
report says why. Imports torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from sdpa_port.rewrite.flags import FLEX_FLAG as FLAG
from sdpa_port.verify.checks import Check, build, make_batch, max_difference, sharpen
from sdpa_port.verify.outputs import RELATIVE_TOLERANCE

FLEX = "flex_attention"
TOLERANCE = 1e-4  # as for SDPA: flex attention computes in float32 on CPU


@dataclass(frozen=True)
class FlexCheck(Check):
    """A check of the flex attention claim: it decides the flag, never whether the port is written."""


def claiming_classes(ported: ModuleType) -> tuple[str, ...]:
    """The port's model classes that would carry the flag: those setting `_supports_sdpa` in their own body."""
    from transformers import PreTrainedModel

    found = []
    for name, value in vars(ported).items():
        if isinstance(value, type) and issubclass(value, PreTrainedModel) and value.__module__ == ported.__name__:
            if vars(value).get("_supports_sdpa") is True and not vars(value).get(FLAG):
                found.append(name)
    return tuple(found)


def why_not_checked(ported: ModuleType) -> str | None:
    """Why flex attention cannot be checked for this port, or None when it can."""
    if not hasattr(ported, "ALL_ATTENTION_FUNCTIONS"):
        return "the port does not dispatch through ALL_ATTENTION_FUNCTIONS"
    if FLEX not in ported.ALL_ATTENTION_FUNCTIONS:
        return "this transformers offers no flex_attention"
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return "this torch has no flex attention"
    if not claiming_classes(ported):
        return "no model class of the port sets _supports_sdpa"
    return None


def check_flex(
    original_class: type, ported: ModuleType, config: Any, padding: str, kind: str, gain: float = 2.0
) -> list[FlexCheck]:
    """Flex attention's outputs of the port against the original's eager outputs, on one batch."""
    label = f"{original_class.__name__}[{padding}] flex_attention"
    why = why_not_checked(ported)
    if why is not None:
        return [FlexCheck(f"{label} not checked", False, None, why, skipped=True)]
    try:
        with _claimed(ported, claiming_classes(ported)), _counted(ported) as calls:
            original = build(original_class, config, "eager")
            sharpen(original, gain)
            flex = build(getattr(ported, original_class.__name__), config, FLEX)
            flex.load_state_dict(original.state_dict())
            batch = make_batch(config, kind, padding)
            with torch.no_grad():
                expected = original(**batch.inputs)
                found = flex(**batch.inputs)
    except Exception as error:  # the finding: flex attention does not run this port
        detail = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
        return [FlexCheck(f"{label} == eager", False, None, detail)]
    difference = max_difference(expected, found, batch)
    passed = difference <= TOLERANCE
    detail = ""
    if not passed and difference != float("inf"):
        relative = max_difference(expected, found, batch, relative=True)
        passed, detail = relative <= RELATIVE_TOLERANCE, f"(relative {relative:.2g})"
    return [
        FlexCheck(f"{label} == eager", passed, difference, detail),
        FlexCheck(f"{label} executed", calls[0] > 0, None, f"{calls[0]} flex call(s)"),
    ]


def flex_verdict(checks: list[Check]) -> tuple[bool, str]:
    """Whether the flex checks among `checks` allow the claim, and why not when they do not."""
    flex = [c for c in checks if isinstance(c, FlexCheck)]
    if not flex:
        return False, "flex attention was not checked: only models taking token ids are run under it"
    failed = [c for c in flex if c.skipped or not c.passed]
    if failed:
        return False, "; ".join(str(c) for c in failed[:2])
    return True, ""


@contextlib.contextmanager
def _claimed(ported: ModuleType, names: tuple[str, ...]) -> Iterator[None]:
    """The flag set on the port's model classes for the time of the check."""
    classes = [getattr(ported, name) for name in names]
    for cls in classes:
        setattr(cls, FLAG, True)
    try:
        yield
    finally:
        for cls in classes:
            delattr(cls, FLAG)


@contextlib.contextmanager
def _counted(ported: ModuleType) -> Iterator[list[int]]:
    """Calls of flex attention through the port's dispatch, counted for the time of the check."""
    functions = ported.ALL_ATTENTION_FUNCTIONS
    inner = functions[FLEX]
    local = getattr(functions, "_local_mapping", {})
    had_local, before = FLEX in local, local.get(FLEX)
    calls = [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return inner(*args, **kwargs)

    functions[FLEX] = counting
    try:
        yield calls
    finally:
        if had_local:
            functions[FLEX] = before
        else:
            del functions[FLEX]  # the override lives in the instance's own mapping; the release's stays
