"""Whether an attention class ever runs without being asked for its weights (read-only).

A port whose SDPA class falls back to eager for `output_attentions=True` does nothing if every call of the module
asks for the weights (Mask2Former's decoder layer calls its self-attention with `output_attentions=True`): the
port would be reported as done and never run SDPA. The calls are the ones `module_sites` finds.
"""

from __future__ import annotations

import ast

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.module_sites import ModuleCall, ModuleSites, parameter_default


def always_asks_for_weights(facts: ModuleFacts, class_name: str, parameter: str, position: int | None) -> bool:
    """Every call of the modules built from `class_name` asks for the weights: it passes a literal True for
    `parameter` (by keyword, or at `position` among the positional arguments), leaves it to a default of True, or
    passes on a `forward` parameter of its own of which the same holds (ERNIE-M's layer defaults
    `output_attentions=True` and its encoder never passes it). False when no call is found."""
    sites = facts.module_sites
    return _always_true(sites, class_name, parameter, position, frozenset())


def _always_true(
    sites: ModuleSites, class_name: str, parameter: str, position: int | None, seen: frozenset[str]
) -> bool:
    found = sites.method(class_name, "forward")
    default = parameter_default(found[1], parameter) if found is not None else None
    calls = [use for use in sites.uses if class_name in use.classes]
    return bool(calls) and all(
        _passes_true(sites, call, parameter, position, default, seen | {class_name}) for call in calls
    )


def _passes_true(
    sites: ModuleSites,
    call: ModuleCall,
    parameter: str,
    position: int | None,
    default: ast.expr | None,
    seen: frozenset[str],
) -> bool:
    value: ast.expr | None = default
    keywords = [k for k in call.keywords if k.arg == parameter]
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    if keywords:
        value = keywords[0].value
    elif position is not None and position < len(positional):
        value = positional[position]
    elif any(k.arg is None for k in call.keywords) or len(positional) < len(call.args):
        return False  # `**kwargs` or `*args` may carry it
    if value is None:
        return False
    if _is_true(value):
        return True
    return isinstance(value, ast.Name) and _forwarded_true(sites, call.context, value.id, seen)


def _forwarded_true(sites: ModuleSites, context: tuple[str, str], name: str, seen: frozenset[str]) -> bool:
    """`name` is a parameter of the calling `forward`, never rebound there, that every call of it sets to True."""
    owner, method = context
    if method != "forward" or owner in seen:
        return False
    found = sites.method(owner, "forward")
    if found is None or found[0] != owner:
        return False
    function = found[1]
    positional = [p.arg for p in (*function.args.posonlyargs, *function.args.args)]
    if name not in positional[1:] and name not in {p.arg for p in function.args.kwonlyargs}:
        return False
    if _rebinds(function, name):
        return False
    position = positional.index(name) - 1 if name in positional[1:] else None
    built = [c for c in sorted(sites.subclasses(owner)) if (sites.method(c, "forward") or ("",))[0] == owner]
    return bool(built) and all(_always_true(sites, c, name, position, seen) for c in built)


def _rebinds(function: ast.FunctionDef, name: str) -> bool:
    for node in ast.walk(function):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)):
            targets = [node.target]
        elif isinstance(node, (ast.With,)):
            targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
        if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
            return True
    return False


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
