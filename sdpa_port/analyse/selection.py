"""How a modeling file selects its attention classes: `XXX_ATTENTION_CLASSES` dicts and the `_supports_sdpa` flag."""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse.module_facts import ModuleFacts


def attention_dicts(facts: ModuleFacts) -> dict[str, dict[str, str]]:
    """`XXX_ATTENTION_CLASSES`-like dicts: name -> {key: class name}."""
    out: dict[str, dict[str, str]] = {}
    for name, literal in facts.dicts.items():
        entries: dict[str, str] = {}
        for element in literal.elements:
            key = getattr(element, "key", None)
            value = getattr(element, "value", None)
            if key is None or value is None:
                continue
            key_text = getattr(key, "evaluated_value", None)
            value_text = getattr(value, "value", None)
            if isinstance(key_text, str) and isinstance(value_text, str):
                entries[key_text] = value_text
        if "eager" in entries and entries["eager"] in facts.classes:
            out[name] = entries
    return out


def supports_sdpa(facts: ModuleFacts) -> bool:
    for name in facts.pretrained_roots:
        value = facts.classes[name].class_vars.get("_supports_sdpa")
        if value is not None and getattr(value, "value", None) == "True":
            return True
    return any("sdpa" in entries for entries in attention_dicts(facts).values())


def configured_classes(facts: ModuleFacts) -> frozenset[str]:
    """Classes whose methods can read the model's config as `self.config`: PreTrainedModels, and modules whose
    `__init__` stores its `config` parameter there."""
    out: set[str] = set()
    for name in facts.classes:
        if facts.is_subclass(name, "PreTrainedModel"):
            out.add(name)
            continue
        values = facts.find_attribute_values(name, "config")
        if values and all(isinstance(v, cst.Name) and v.value == "config" for v in values):
            out.add(name)
    return frozenset(out)
