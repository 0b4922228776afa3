"""Where a module extends the mask it receives before adding it to the scores (read-only).

transformers builds the mask for each implementation (a float mask for eager, a boolean one or None for sdpa, a
padding mask for flash); code that concatenates it with a tensor of its own (MVP's zeros for prompt keys) is written
for the eager format only. A block of zeros only keeps its keys, which a boolean mask says with True
(`rewrite/extended_masks.py`).
"""

from __future__ import annotations

import ast

CONCATENATIONS = ("cat", "concat", "concatenate")


def forward_of(tree: ast.Module, classes: list[str]) -> ast.FunctionDef | None:
    """The `forward` of the first of `classes` (a class and its in-file bases, in order) that defines one."""
    nodes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    for name in classes:
        for item in nodes[name].body if name in nodes else []:
            if isinstance(item, ast.FunctionDef) and item.name == "forward":
                return item
    return None


def extended_mask(function: ast.FunctionDef, mask_param: str) -> int | None:
    """The line where `mask_param` is reassigned to a concatenation holding it, or None."""
    for node in ast.walk(function):
        if not (isinstance(node, ast.Assign) and any(_names(t, mask_param) for t in node.targets)):
            continue
        value = node.value
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, (ast.Attribute, ast.Name))
            and (value.func.attr if isinstance(value.func, ast.Attribute) else value.func.id) in CONCATENATIONS
            and value.args
            and isinstance(value.args[0], (ast.List, ast.Tuple))
            and any(_names(element, mask_param) for element in value.args[0].elts)
            and len(value.args[0].elts) > 1
        ):
            return node.lineno
    return None


def zeros_block(function: ast.FunctionDef, mask_param: str) -> str | None:
    """The name of the block an extension of `mask_param` adds, where it only keeps keys: `mask = torch.cat([block,
    mask], dim=-1)` (either order, the last dimension) with `block` bound in the function to `torch.zeros(...)`
    (`.to(...)` after it allowed). An additive zero keeps its keys, as True does in a boolean mask; None otherwise."""
    block: str | None = None
    for node in ast.walk(function):
        if not (isinstance(node, ast.Assign) and any(_names(t, mask_param) for t in node.targets)):
            continue
        value = node.value
        if not (isinstance(value, ast.Call) and value.args and isinstance(value.args[0], (ast.List, ast.Tuple))):
            continue
        elements = value.args[0].elts
        others = [e for e in elements if not _names(e, mask_param)]
        if len(elements) != 2 or len(others) != 1 or not isinstance(others[0], ast.Name):
            return None
        dims = [k.value for k in value.keywords if k.arg == "dim"] + value.args[1:2]
        if len(dims) != 1 or ast.unparse(dims[0]).strip("()") not in ("-1", "3"):
            return None
        block = others[0].id
    if block is None:
        return None
    bound = [
        node.value
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and any(_names(t, block) for t in node.targets)
    ]
    if len(bound) != 1:
        return None
    value = bound[0]
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "to"
        and isinstance(value.func.value, ast.Call)
    ):
        value = value.func.value
    zeros = (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "zeros"
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == "torch"
    )
    return block if zeros else None


def _names(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


__all__ = ["extended_mask", "forward_of", "zeros_block"]
