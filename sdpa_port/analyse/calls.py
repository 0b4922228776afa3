"""Whether an attention class ever runs without being asked for its weights (read-only).

A port whose SDPA class falls back to eager for `output_attentions=True` does nothing if every call of the module
asks for the weights (Mask2Former's decoder layer calls its self-attention with `output_attentions=True`): the
port would be reported as done and never run SDPA. The calls are the ones `module_sites` finds.
"""

from __future__ import annotations

import ast
from typing import Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.known import false_flag
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.module_sites import ModuleCall, ModuleSites, module_sites, parameter_default


def always_asks_for_weights(facts: ModuleFacts, class_name: str, parameter: str, position: int | None) -> bool:
    """Every call of the modules built from `class_name` asks for the weights: it passes a literal True for
    `parameter` (by keyword, or at `position` among the positional arguments), leaves it to a default of True, or
    passes on a `forward` parameter of its own of which the same holds (ERNIE-M's layer defaults
    `output_attentions=True` and its encoder never passes it). False when no call is found."""
    sites = module_sites(facts)
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
    readable, value = _passed_value(call.args, call.keywords, parameter, position)
    if not readable:
        return False  # `**kwargs` or `*args` may carry it
    value = value if value is not None else default
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


def _passed_value(
    args: Sequence[ast.expr], keywords: Sequence[ast.keyword], parameter: str, position: int | None
) -> tuple[bool, ast.expr | None]:
    """Whether what a call (its `args` and `keywords`) passes for `parameter` (by keyword, else at `position` among
    the positional arguments) can be read, and the value passed (None: none, the default holds). Unreadable where
    `*args` or `**kwargs` may carry it; an argument before them cannot be carried twice."""
    named = [k.value for k in keywords if k.arg == parameter]
    if named:
        return True, named[0]
    starred = [i for i, a in enumerate(args) if isinstance(a, ast.Starred)]
    fixed = starred[0] if starred else len(args)  # the arguments whose position is known
    if position is not None and position < fixed:
        return True, args[position]
    if starred or any(k.arg is None for k in keywords):
        return False, None
    return True, None


def sdpa_side_never_built(
    facts: ModuleFacts, class_name: str, alternatives: Sequence[str]
) -> tuple[str, bool] | None:
    """A side of a test of the module's settings that the SDPA class takes (`alternatives` are known false there) that
    no construction of the class reaches: the test reads a flag `self.x` set from a constructor parameter with a
    literal default, and every call building the class in this file leaves that parameter at a value taking the
    other side (`if self.is_cross_attention:` SDPA, while the file builds the class for self-attention alone). The
    flag (`self.x`) and the value every construction gives it; None when some construction may reach the side, or
    none is found, or a value cannot be read."""
    for alternative in alternatives:
        flag = false_flag(alternative)
        if flag is None:
            continue
        attribute, wanted = flag
        given = _constructed_values(facts, class_name, attribute)
        if given and wanted not in given:
            return f"self.{attribute}", not wanted
    return None


def _constructed_values(facts: ModuleFacts, class_name: str, attribute: str) -> set[bool] | None:
    """The truth every construction of `class_name` in this file gives `self.<attribute>`, where `__init__` sets it
    from one of its parameters with a literal True/False default; None where any value cannot be read."""
    values = facts.find_attribute_values(class_name, attribute)
    found = facts.find_method(class_name, "__init__")
    sites = module_sites(facts)
    if len(values) != 1 or not isinstance(values[0], cst.Name) or found is None:
        return None
    if sites.subclasses(class_name) - {class_name}:  # a subclass built elsewhere in the file shares the flag
        return None
    name = values[0].value
    params = [*found[1].params.params, *found[1].params.kwonly_params]
    param = next((p for p in params if p.name.value == name), None)
    if param is None or param.default is None or not m.matches(param.default, m.Name("True") | m.Name("False")):
        return None
    default = m.matches(param.default, m.Name("True"))
    positional = [p.name.value for p in found[1].params.params][1:]
    position = positional.index(name) if name in positional else None
    out: set[bool] = set()
    for construction in (c for c in sites.constructions() if c.class_name == class_name):
        if construction.call is None:
            return None
        readable, value = _passed_value(construction.call.args, construction.call.keywords, name, position)
        if not readable:
            return None
        if value is None:
            out.add(default)
        elif isinstance(value, ast.Constant) and isinstance(value.value, bool):
            out.add(value.value)
        else:
            return None
    return out
