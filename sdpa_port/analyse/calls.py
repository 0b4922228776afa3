"""Where an attention class runs: the calls of the modules other classes build from it (read-only).

A port whose SDPA class falls back to eager for `output_attentions=True` does nothing if every call of the module
asks for the weights (Mask2Former's decoder layer calls its self-attention with `output_attentions=True`): the
port would be reported as done and never run SDPA.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import nodes_of_type
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.selection import attention_dicts


def instance_calls(facts: ModuleFacts, class_name: str) -> list[cst.Call]:
    """Calls `self.x(...)` (or `self.x.forward(...)`) in classes whose `self.x` is built from `class_name`, directly
    or through a dict of attention classes holding it."""
    dicts = {name for name, entries in attention_dicts(facts).items() if class_name in entries.values()}
    out: list[cst.Call] = []
    for info in facts.classes.values():
        built = {
            attribute
            for attribute, values in info.attributes.items()
            if any(_builds(value, class_name, dicts) for value in values)
        }
        if not built:
            continue
        for method in info.methods.values():
            for call in nodes_of_type(method.body, cst.Call):
                func = call.func
                if m.matches(func, m.Attribute(value=m.Attribute(value=m.Name("self")), attr=m.Name("forward"))):
                    func = func.value  # type: ignore[attr-defined]
                if m.matches(func, m.Attribute(value=m.Name("self"))) and func.attr.value in built:  # type: ignore[attr-defined]
                    out.append(call)
    return out


def _builds(value: cst.BaseExpression, class_name: str, dicts: set[str]) -> bool:
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if m.matches(func, m.Name(class_name)):
        return True
    return isinstance(func, cst.Subscript) and isinstance(func.value, cst.Name) and func.value.value in dicts


def always_asks_for_weights(facts: ModuleFacts, class_name: str, parameter: str, position: int | None) -> bool:
    """Every call of the modules built from `class_name` passes a literal True for `parameter` (by keyword, or at
    `position` among the positional arguments); False when no call is found."""
    calls = instance_calls(facts, class_name)
    return bool(calls) and all(_passes_true(call, parameter, position) for call in calls)


def _passes_true(call: cst.Call, parameter: str, position: int | None) -> bool:
    for argument in call.args:
        if argument.keyword is not None and argument.keyword.value == parameter:
            return m.matches(argument.value, m.Name("True"))
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if position is not None and position < len(positional):
        return m.matches(positional[position].value, m.Name("True"))
    return False
