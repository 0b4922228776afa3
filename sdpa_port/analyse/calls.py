"""Whether an attention class ever runs without being asked for its weights (read-only).

A port whose SDPA class falls back to eager for `output_attentions=True` does nothing if every call of the module
asks for the weights (Mask2Former's decoder layer calls its self-attention with `output_attentions=True`): the
port would be reported as done and never run SDPA. The calls are the ones `module_sites` finds.
"""

from __future__ import annotations

import ast

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.module_sites import ModuleCall, ModuleSites


def always_asks_for_weights(facts: ModuleFacts, class_name: str, parameter: str, position: int | None) -> bool:
    """Every call of the modules built from `class_name` passes a literal True for `parameter` (by keyword, or at
    `position` among the positional arguments); False when no call is found."""
    calls = [use for use in ModuleSites(facts).uses if class_name in use.classes]
    return bool(calls) and all(_passes_true(call, parameter, position) for call in calls)


def _passes_true(call: ModuleCall, parameter: str, position: int | None) -> bool:
    for keyword in call.keywords:
        if keyword.arg == parameter:
            return _is_true(keyword.value)
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    if position is not None and position < len(positional):
        return _is_true(positional[position])
    return False


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
