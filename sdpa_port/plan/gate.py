"""File-level reasons to refuse before any edit is planned, shared by both styles: the authors' own flag, and
implementation choices the port could never reach."""

from __future__ import annotations

import ast

import libcst as cst

from sdpa_port.analyse.calls import sdpa_side_never_built
from sdpa_port.analyse.known import holds_where
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.recognise import ClassAnalysis
from sdpa_port.analyse.selection import attention_dicts
from sdpa_port.refusals import Code, Refusal

SELECTOR = "_attn_implementation"


def authors_refusal(facts: ModuleFacts) -> Refusal | None:
    """A PreTrainedModel class that sets `_supports_sdpa = False`: the file's authors ruled SDPA out."""
    for root in facts.pretrained_roots:
        value = facts.classes[root].class_vars.get("_supports_sdpa")
        if isinstance(value, cst.Name) and value.value == "False":
            return Refusal(
                Code.AUTHORS_OFF, root, 0, "sets `_supports_sdpa = False` explicitly; the file's own authors ruled SDPA out"
            )
    return None


def selection_refusals(facts: ModuleFacts, attention_classes: set[str] | frozenset[str]) -> list[Refusal]:
    """`XXX_ATTENTION_CLASSES[...]` lookups keyed by anything but `config._attn_implementation`.

    transformers records the requested implementation in `config._attn_implementation`; a lookup keyed by another
    value (a config field of the model's own, a constant) keeps building the eager class, so an `"sdpa"` entry
    would never be chosen.
    """
    if facts.tree is None:
        return []
    dicts = {name for name, entries in attention_dicts(facts).items() if entries["eager"] in attention_classes}
    out: list[Refusal] = []
    for node in ast.walk(facts.tree):
        key: ast.expr | None = None
        name: str | None = None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in dicts:
            name, key = node.value.id, node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in dicts
            and node.args
        ):
            name, key = node.func.value.id, node.args[0]
        if name is None or key is None:
            continue
        if isinstance(node, ast.Subscript) and isinstance(getattr(node, "ctx", None), ast.Store):
            continue
        if not (isinstance(key, ast.Attribute) and key.attr == SELECTOR):
            out.append(
                Refusal(
                    Code.SELECTION_KEY,
                    name,
                    getattr(node, "lineno", 0),
                    f"`{name}` is indexed by `{ast.unparse(key)}`, not `config.{SELECTOR}`, so an \"sdpa\" entry would "
                    "never be selected",
                )
            )
    return out


def unreached_side_refusal(facts: ModuleFacts, analysis: ClassAnalysis) -> Refusal | None:
    """A port that computes with SDPA only on one side of a test of the module's settings
    (`ClassAnalysis.alternatives`) that no construction of the class in this file reaches (`if
    self.is_cross_attention:` where every construction builds self-attention): its SDPA path would never run, so the
    port would be inert."""
    unreached = sdpa_side_never_built(facts, analysis.class_name, analysis.alternatives)
    if unreached is None:
        return None
    flag, value = unreached
    where = holds_where(analysis.alternatives)
    why = f" ({analysis.eager_side})" if analysis.eager_side is not None else ""
    return Refusal(
        Code.SDPA_SIDE_UNBUILT,
        analysis.class_name,
        analysis.sites[0].line if analysis.sites else 0,
        f"SDPA can run only where {where}, but every construction of {analysis.class_name} in this file sets `{flag}` "
        f"to {value}: the other side stays eager{why}, so SDPA would never run",
    )
