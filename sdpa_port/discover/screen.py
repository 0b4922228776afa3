"""A fast first look with the standard `ast` module: is there anything for libcst to do in this file?

Parsing with libcst costs about ten times more than `ast`; most files of a release either already support SDPA or
have no softmax at all, and are answered from this screen alone.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class Screen:
    supports_sdpa: bool
    # top-level classes that call a softmax somewhere in their body, plus their in-file subclasses
    softmax_classes: frozenset[str]
    interface_machinery: bool  # imports masking_utils or ALL_ATTENTION_FUNCTIONS
    uses_attention_interface: bool  # dispatches through ALL_ATTENTION_FUNCTIONS already
    softmax_functions: frozenset[str]  # top-level functions that call a softmax (eager_attention_forward...)
    modeling: bool = True  # imports torch or defines a module class: a modeling file at all


def screen(tree: ast.Module) -> Screen:
    classes: dict[str, ast.ClassDef] = {}
    functions: set[str] = set()
    supports = False
    interface = False
    dispatches = False
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = node
        elif isinstance(node, ast.FunctionDef) and _has_softmax(node):
            functions.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            names = [alias.name for alias in node.names]
            if "masking_utils" in module.split(".") or "ALL_ATTENTION_FUNCTIONS" in names:
                interface = True
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(getattr(node, "value", None), ast.Dict):
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]  # type: ignore[union-attr]
            if "eager" in keys and "sdpa" in keys:
                supports = True
    for node in classes.values():
        if _is_pretrained_root(node) or _base_names(node) & {"PreTrainedModel"}:
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "_supports_sdpa" for t in statement.targets)
                    and isinstance(statement.value, ast.Constant)
                    and statement.value.value is True
                ):
                    supports = True
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "ALL_ATTENTION_FUNCTIONS":
            dispatches = True
            break
    direct = {name for name, node in classes.items() if _has_softmax(node)}
    # subclasses inherit forward and helpers
    changed = True
    found = set(direct)
    while changed:
        changed = False
        for name, node in classes.items():
            if name not in found and _base_names(node) & found:
                found.add(name)
                changed = True
    # classes whose forward calls a module-level softmax function (eager_attention_forward(self, ...))
    if functions:
        for name, node in classes.items():
            if name not in found and _calls_any(node, functions):
                found.add(name)
    modeling = any(_imports_torch(node) for node in tree.body) or any(
        any(base.endswith(("Module", "PreTrainedModel")) for base in _base_names(node)) for node in classes.values()
    )
    return Screen(supports, frozenset(found), interface, dispatches, frozenset(functions), modeling)


def _imports_torch(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "torch" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "torch"
    return False


def _base_names(node: ast.ClassDef) -> set[str]:
    out = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            out.add(base.id)
        elif isinstance(base, ast.Attribute):
            out.add(base.attr)
    return out


def _is_pretrained_root(node: ast.ClassDef) -> bool:
    return node.name.endswith("PreTrainedModel")


def _has_softmax(node: ast.AST) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            func = inner.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("softmax", "Softmax", "softmax_"):
                return True
            if isinstance(func, ast.Call):
                inner_func = func.func
                inner_name = inner_func.attr if isinstance(inner_func, ast.Attribute) else getattr(inner_func, "id", "")
                if inner_name == "Softmax":
                    return True
    return False


def _calls_any(node: ast.AST, names: set[str] | frozenset[str]) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in names:
            return True
    return False
