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


IMPLEMENTATION_KEYWORDS = (SELECTOR, "attn_implementation")
DICT_EDITS = ("update", "setdefault", "pop", "popitem", "clear")


def override_refusals(facts: ModuleFacts, attention_classes: set[str] | frozenset[str]) -> list[Refusal]:
    """Writes that can keep a model built with "sdpa" from building the SDPA class the port registers.

    transformers sets `config._attn_implementation` before the model is built; a file that writes it again (a
    layer setting `config._attn_implementation = "eager"` before looking its class up, `setattr`, an `update`, a
    keyword of a call), with anything but another `_attn_implementation` read (a sub-config handed the parent's
    value), or that edits a dict of attention classes after defining it (another class under "sdpa", an entry
    dropped), selects by a value or from a dict the port does not control.
    """
    if facts.tree is None:
        return []
    dicts = {name for name, entries in attention_dicts(facts).items() if entries["eager"] in attention_classes}
    out: list[Refusal] = []

    def refuse(node: ast.AST, detail: str) -> None:
        out.append(Refusal(Code.SELECTION_OVERRIDDEN, _enclosing(facts.tree, node), getattr(node, "lineno", 0), detail))

    for node in ast.walk(facts.tree):
        for target, value in _implementation_writes(node):
            if not _reads_implementation(value):
                refuse(
                    node,
                    f"`{target}` is set to `{ast.unparse(value) if value is not None else '...'}`, so a model built "
                    'with "sdpa" may build another attention class than the SDPA one the port registers',
                )
        edited = _dict_edit(node, dicts)
        if edited is not None:
            refuse(node, f"`{edited}` is changed after it is defined, so \"sdpa\" may select another class from it")
    return out


def _implementation_writes(node: ast.AST) -> list[tuple[str, ast.expr | None]]:
    """(what is written, the value) for each write of the implementation's name `node` makes."""
    out: list[tuple[str, ast.expr | None]] = []
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for inner in ast.walk(target):
                if isinstance(inner, ast.Attribute) and inner.attr == SELECTOR and isinstance(inner.ctx, ast.Store):
                    out.append((ast.unparse(inner), node.value))
    elif isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) == 3:
            name = node.args[1]
            if isinstance(name, ast.Constant) and name.value == SELECTOR:
                out.append((f"{ast.unparse(node.args[0])}.{SELECTOR}", node.args[2]))
        for keyword in node.keywords:
            if keyword.arg in IMPLEMENTATION_KEYWORDS and isinstance(keyword.value, ast.Constant):
                out.append((f"{keyword.arg}=", keyword.value))
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and key.value in IMPLEMENTATION_KEYWORDS:
                out.append((f"{key.value!r}:", value))
    return out


def _reads_implementation(value: ast.expr | None) -> bool:
    """The value written is the implementation already chosen: `config._attn_implementation` (a sub-config, a
    module attribute handed the parent's choice)."""
    return isinstance(value, ast.Attribute) and value.attr == SELECTOR


def _dict_edit(node: ast.AST, dicts: set[str]) -> str | None:
    """The dict of attention classes `node` changes (`D[k] = ...`, `del D[k]`, `D.update(...)`)."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
        value = node.value
        return value.id if isinstance(value, ast.Name) and value.id in dicts else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DICT_EDITS:
        value = node.func.value
        return value.id if isinstance(value, ast.Name) and value.id in dicts else None
    return None


def _enclosing(tree: ast.Module | None, node: ast.AST) -> str:
    """The top-level class or function holding `node` (the module when none does)."""
    line = getattr(node, "lineno", 0)
    for statement in tree.body if tree is not None else []:
        if isinstance(statement, (ast.ClassDef, ast.FunctionDef)) and statement.lineno <= line <= (statement.end_lineno or 0):
            return statement.name
    return "module"


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
