"""Whether an interface-style port runs under flex attention, flash attention and `torch.compile(fullgraph=True)`.

Transformers 5 builds a model with `attn_implementation="flex_attention"` only when its class sets
`_supports_flex_attn`, and compiles generation's forward when it sets `_can_compile_fullgraph`. A port sets either
flag only after its check here ran and matched the original's eager outputs on the padded batch, with the same
sharpened weights:

- flex: the port's model classes are given the flag for the check, the model is built with flex attention, and the
  flex calls through the port's dispatch are counted, so a model that never reached flex attention does not pass;
- flash: likewise, on transformers' flash path run on a CPU with a stand-in for the kernel (`flash_claim.py`), the
  stand-in's calls counted; the flag also needs the port's static proof (`plan/flash_proof.py`);
- compile: the SDPA model compiled with `fullgraph=True` (no graph break anywhere in its forward), unless the
  file claims it already.

`run_isolated` runs them in a child process (`claims_child.py`). A failed or impossible check is not a failed
verification: the port is then written without that flag, and the report says why. Imports torch.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from sdpa_port.plan.flash_proof import FLASH_FLAG
from sdpa_port.plan.mask_readers import FUNCTION as MASK_FUNCTION
from sdpa_port.rewrite.flags import COMPILE_FLAG, FLEX_FLAG
from sdpa_port.verify.checks import Check, build, make_batch, max_difference, sharpen
from sdpa_port.verify.flash_claim import FLASH, STAND_IN, flash_path, why_no_flash
from sdpa_port.verify.outputs import RELATIVE_TOLERANCE

FLEX = "flex_attention"
# the implementation each flag's model is built with; the compile check builds sdpa's
BUILT_WITH = {FLEX_FLAG: FLEX, FLASH_FLAG: FLASH}
TOLERANCE = 1e-4  # as for SDPA: both compute in float32 on CPU


@dataclass(frozen=True)
class ClaimCheck(Check):
    """A check of one flag's claim: it decides the flag, never whether the port is written."""

    flag: str = ""


TIMEOUT_S = 1800  # two compiles of a tiny model; a first flex compile takes a minute or so on a CPU


def run_isolated(
    original: ModuleType, ported: ModuleType, base: str, overrides: dict[str, Any] | None
) -> list[ClaimCheck]:
    """The claim checks of `ported`'s token model `base`, run by `claims_child.py` in a process of their own.

    A compiler crash there cannot take `--verify` down: a child that died (CanineModel's compile ends in a native
    double free) gives failed checks of both flags, so the port is written without them and says why.
    """
    return in_child(original, ported, {"base": base, "overrides": overrides or {}}, base)


def in_child(original: ModuleType, ported: ModuleType, request: dict[str, Any], label: str) -> list[ClaimCheck]:
    """The checks `claims_child.py` runs on `request`, with both files' sources; both flags failed if it died.

    `label` names the model(s) checked, in the failed checks.
    """
    from sdpa_port.verify.loader import source_of

    request = {
        "modules": [[module.__name__.rsplit(".", 1)[1], source_of(module)] for module in (original, ported)],
        "package": ported.__package__,
        **request,
    }
    command = [sys.executable, "-m", "sdpa_port.verify.claims_child"]
    try:
        done = subprocess.run(command, input=json.dumps(request), capture_output=True, text=True, timeout=TIMEOUT_S)
        lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
        if done.returncode == 0 and lines:
            return [ClaimCheck(**fields) for fields in json.loads(lines[-1])]
        tail = (done.stderr.strip().splitlines() or [""])[-1][:200]
        why = f"the checks' process died (exit {done.returncode}): {tail}"
    except subprocess.TimeoutExpired:
        why = f"the checks' process ran past {TIMEOUT_S} s"
    return not_checked(label, why)


def not_checked(label: str, why: str, skipped: bool = False) -> list[ClaimCheck]:
    """Failed checks of every flag, saying why none could be checked; `skipped` where none was tried."""
    flags = (FLEX_FLAG, FLASH_FLAG, COMPILE_FLAG)
    return [ClaimCheck(f"{label} {flag} not checked", False, None, why, skipped, flag=flag) for flag in flags]


def claiming_classes(ported: ModuleType, flag: str) -> tuple[str, ...]:
    """The port's model classes that would carry `flag`: those setting `_supports_sdpa` in their own body."""
    from transformers import PreTrainedModel

    found = []
    for name, value in vars(ported).items():
        if isinstance(value, type) and issubclass(value, PreTrainedModel) and value.__module__ == ported.__name__:
            if vars(value).get("_supports_sdpa") is True and not vars(value).get(flag):
                found.append(name)
    return tuple(found)


def why_no_flex(ported: ModuleType) -> str | None:
    """Why flex attention cannot be checked for this port, or None when it can."""
    if not hasattr(ported, "ALL_ATTENTION_FUNCTIONS"):
        return "the port does not dispatch through ALL_ATTENTION_FUNCTIONS"
    if FLEX not in ported.ALL_ATTENTION_FUNCTIONS:
        return "this transformers offers no flex_attention"
    if _eager_form_masks(ported):
        return (
            "a module of the port reads the mask itself, so the model builds every mask in eager's form "
            f"(`{MASK_FUNCTION}`), and flex attention's mask is a BlockMask, which has none"
        )
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return "this torch has no flex attention"
    return None


def _eager_form_masks(ported: ModuleType) -> bool:
    """Whether the port converts the masks transformers builds to eager's form (`plan/mask_readers.py`)."""
    return any(
        name.startswith(MASK_FUNCTION) and callable(value) and getattr(value, "__module__", None) == ported.__name__
        for name, value in vars(ported).items()
    )


def claim_checks(original_class: type, ported: ModuleType, config: Any, padding: str, kind: str) -> list[ClaimCheck]:
    """The flex, flash and compile checks of the port's model `original_class` names."""
    return (
        check_flex(original_class, ported, config, padding, kind)
        + check_flash(original_class, ported, config, padding, kind)
        + check_compile(original_class, ported, config, padding, kind)
    )


def check_flex(original_class: type, ported: ModuleType, config: Any, padding: str, kind: str) -> list[ClaimCheck]:
    """Flex attention's outputs of the port against the original's eager outputs, on one batch."""
    label = f"{original_class.__name__}[{padding}] flex_attention"
    return flex_claim(
        ported,
        label,
        lambda: _against_eager(original_class, ported, config, padding, kind, label, FLEX_FLAG, lambda m: m),
    )


def flex_claim(ported: ModuleType, label: str, run: Callable[[], list[ClaimCheck]]) -> list[ClaimCheck]:
    """`run`'s comparison of the port's flex-built model with the original's eager one, the flex calls counted.

    The port's model classes carry the flag for the time of `run` (5.23.0 builds a model with flex attention only
    then), and a model that never called flex attention through the port's dispatch does not pass.
    """
    classes = claiming_classes(ported, FLEX_FLAG)
    why = why_no_flex(ported) or (None if classes else "no model class of the port sets _supports_sdpa")
    if why is not None:
        return [ClaimCheck(f"{label} not checked", False, None, why, skipped=True, flag=FLEX_FLAG)]
    with claimed_for_the_check(ported, classes, FLEX_FLAG), _counted(ported) as calls:
        checks = run()
    executed = ClaimCheck(f"{label} executed", calls[0] > 0, None, f"{calls[0]} flex call(s)", flag=FLEX_FLAG)
    return checks + [executed]


def check_flash(original_class: type, ported: ModuleType, config: Any, padding: str, kind: str) -> list[ClaimCheck]:
    """Transformers' flash path, its kernel a CPU stand-in, for the port against the original's eager, on one batch."""
    label = f"{original_class.__name__}[{padding}] flash_attention_2 (CPU stand-in kernel)"
    stepped = f"{original_class.__name__}[left, cached step] flash_attention_2 (CPU stand-in kernel)"

    def run() -> list[ClaimCheck]:
        checks = _against_eager(original_class, ported, config, padding, kind, label, FLASH_FLAG, lambda m: m)
        if kind == "decoder":  # queries fewer than keys: where flash's causal alignment shows
            checks += _cached_step(original_class, ported, config, stepped)
        return checks

    return flash_claim(ported, label, run)


def flash_claim(ported: ModuleType, label: str, run: Callable[[], list[ClaimCheck]]) -> list[ClaimCheck]:
    """`run`'s comparison of the port's flash-built model with the original's eager one, on transformers' flash path
    with the stand-in kernel (`flash_claim.py`); the port's model classes carry the flag meanwhile (5.23.0 builds a
    model with flash only then), and a model that never reached the stand-in does not pass."""
    classes = claiming_classes(ported, FLASH_FLAG)
    if not classes:
        return []  # the file claims it already (or sets no _supports_sdpa, which the flex check reports)
    why = why_no_flash(ported)
    if why is not None:
        return [ClaimCheck(f"{label} not checked", False, None, why, skipped=True, flag=FLASH_FLAG)]
    with claimed_for_the_check(ported, classes, FLASH_FLAG), flash_path() as stand_in:
        checks = run()
    detail = f"{stand_in.calls} call(s) of {STAND_IN}"
    return checks + [ClaimCheck(f"{label} executed", stand_in.calls > 0, None, detail, flag=FLASH_FLAG)]


def _cached_step(original_class: type, ported: ModuleType, config: Any, label: str) -> list[ClaimCheck]:
    """A left-padded prompt, then its last two tokens with the prompt's cache: the flash-built port against eager."""
    try:
        original, model = _sharpened_pair(original_class, ported, config, FLASH)
        batch = make_batch(config, "decoder", "left")
        ids, mask = batch.inputs["input_ids"], batch.inputs["attention_mask"]
        outputs = []
        with torch.no_grad():
            for run in (original, model):
                first = run(input_ids=ids[:, :-2], attention_mask=mask[:, :-2], use_cache=True)
                second = run(input_ids=ids[:, -2:], attention_mask=mask, past_key_values=first.past_key_values)
                outputs.append(second[0])
    except Exception as error:  # the finding: this path does not run the port
        return [failed_run(label, FLASH_FLAG, error)]
    difference = float((outputs[0] - outputs[1]).abs().max())
    return [ClaimCheck(f"{label} == eager", difference <= TOLERANCE, difference, flag=FLASH_FLAG)]


def check_compile(original_class: type, ported: ModuleType, config: Any, padding: str, kind: str) -> list[ClaimCheck]:
    """The SDPA model compiled with `fullgraph=True` against the original's eager outputs, on one batch."""
    label = f"{original_class.__name__}[{padding}] torch.compile(fullgraph=True)"
    return compile_claim(
        ported,
        lambda: _against_eager(original_class, ported, config, padding, kind, label, COMPILE_FLAG, compiled_fullgraph),
    )


def compile_claim(ported: ModuleType, run: Callable[[], list[ClaimCheck]]) -> list[ClaimCheck]:
    """`run`'s comparison of the port's compiled SDPA model with the original's eager one, on a fresh dynamo cache."""
    if not claiming_classes(ported, COMPILE_FLAG):
        return []  # the file claims it already (or sets no _supports_sdpa, which the flex check reports)
    torch._dynamo.reset()  # a fresh cache: no graph compiled for another model is reused
    try:
        return run()
    finally:
        torch._dynamo.reset()


def compiled_fullgraph(model: Any) -> Any:
    """`model` compiled with `fullgraph=True`: any graph break raises."""
    return torch.compile(model, fullgraph=True)


def failed_run(label: str, flag: str, error: Exception) -> ClaimCheck:
    """The check of a path that raised: the finding is that this path does not run the port."""
    detail = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
    return ClaimCheck(f"{label} == eager", False, None, detail, flag=flag)


def _against_eager(
    original_class: type,
    ported: ModuleType,
    config: Any,
    padding: str,
    kind: str,
    label: str,
    flag: str,
    wrap: Callable[[Any], Any],
) -> list[ClaimCheck]:
    """The port's model (built with its flag's implementation, else SDPA), wrapped, against the original's eager."""
    try:
        original, model = _sharpened_pair(original_class, ported, config, BUILT_WITH.get(flag, "sdpa"))
        batch = make_batch(config, kind, padding)
        with torch.no_grad():
            expected = original(**batch.inputs)
            found = wrap(model)(**batch.inputs)
    except Exception as error:  # the finding: this path does not run the port
        return [failed_run(label, flag, error)]
    difference = max_difference(expected, found, batch)
    passed = difference <= TOLERANCE
    detail = ""
    if not passed and difference != float("inf"):
        relative = max_difference(expected, found, batch, relative=True)
        passed, detail = relative <= RELATIVE_TOLERANCE, f"(relative {relative:.2g})"
    return [ClaimCheck(f"{label} == eager", passed, difference, detail, flag=flag)]


def _sharpened_pair(original_class: type, ported: ModuleType, config: Any, implementation: str) -> tuple[Any, Any]:
    """The original's eager model, sharpened, and the port's model built with `implementation`, on its weights."""
    original = build(original_class, config, "eager")
    sharpen(original)
    model = build(getattr(ported, original_class.__name__), config, implementation)
    model.load_state_dict(original.state_dict())
    return original, model


def verdicts(checks: list[Check]) -> dict[str, str]:
    """For each flag checked among `checks`, why it may not be claimed: "" where it may."""
    out: dict[str, str] = {}
    for check in checks:
        if isinstance(check, ClaimCheck):
            failed = check.skipped or not check.passed
            reason = out.get(check.flag, "")
            out[check.flag] = "; ".join(filter(None, (reason, str(check) if failed else "")))
    return out


@contextlib.contextmanager
def claimed_for_the_check(ported: ModuleType, names: tuple[str, ...], flag: str) -> Iterator[None]:
    """`flag` set on the port's model classes for the time of the check."""
    classes = [getattr(ported, name) for name in names]
    for cls in classes:
        setattr(cls, flag, True)
    try:
        yield
    finally:
        for cls in classes:
            delattr(cls, flag)


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
