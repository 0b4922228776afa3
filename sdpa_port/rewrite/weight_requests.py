"""Calls that ask an attention module for its weights only to drop them unless the caller is asked for them.

Mask2Former's decoder layer calls its self-attention with `output_attentions=True` and reads the weights only under
`if output_attentions:`, its own parameter. The SDPA class falls back to eager whenever it is asked for weights, so
such a call would never run SDPA. Passing the caller's flag instead gives the same outputs: when the flag is off the
weights are never read, when it is on they are asked for as before.

The rewrite applies to a call `a, w = self.x(..., output_attentions=True)` in a method with a parameter
`output_attentions` it never rebinds, where `self.x` is built (in the class's own methods) from one of the classes
given, and `w` is read only inside `if output_attentions:` blocks of that method (or not at all).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import all_assigned_names, nodes_of_type
from sdpa_port.analyse.module_facts import ModuleFacts

FLAG = "output_attentions"


def relax_weight_requests(module: cst.Module, facts: ModuleFacts, classes: frozenset[str]) -> tuple[cst.Module, list[str]]:
    """The module with each such call passing the caller's flag, and a note per call changed."""
    changes: dict[cst.Arg, cst.Arg] = {}
    notes: list[str] = []
    for statement in module.body:
        if not isinstance(statement, cst.ClassDef):
            continue
        for method in nodes_of_type(statement.body, cst.FunctionDef):
            if not _takes_flag(method) or FLAG in all_assigned_names(method.body.body if isinstance(method.body, cst.IndentedBlock) else ()):
                continue
            for assign in nodes_of_type(method.body, cst.Assign):
                found = _weights_request(assign, facts, statement.name.value, classes)
                if found is None:
                    continue
                keyword, weights = found
                if _read_only_under_flag(method, weights, assign):
                    changes[keyword] = keyword.with_changes(value=cst.Name(FLAG))
                    notes.append(
                        f"{statement.name.value}.{method.name.value} asked its attention for the weights it reads only "
                        f"under `if {FLAG}:`; it passes `{FLAG}` on instead, so SDPA runs when they are not asked for"
                    )
    if not changes:
        return module, []
    return module.visit(_Replace(changes)), notes


def _takes_flag(method: cst.FunctionDef) -> bool:
    params = method.params
    return any(p.name.value == FLAG for p in (*params.posonly_params, *params.params, *params.kwonly_params))


def _weights_request(
    assign: cst.Assign, facts: ModuleFacts, owner: str, classes: frozenset[str]
) -> tuple[cst.Arg, str] | None:
    """`a, w = self.x(..., output_attentions=True)` with `self.x` built from one of `classes`: (the keyword, `w`)."""
    call = assign.value
    if len(assign.targets) != 1 or not isinstance(call, cst.Call):
        return None
    target = assign.targets[0].target
    if not isinstance(target, cst.Tuple) or len(target.elements) != 2:
        return None
    weights = target.elements[1].value
    if not isinstance(weights, cst.Name) or not m.matches(call.func, m.Attribute(value=m.Name("self"))):
        return None
    assert isinstance(call.func, cst.Attribute)
    built = facts.find_attribute_values(owner, call.func.attr.value)
    if not built or not all(
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in classes for value in built
    ):
        return None
    keywords = [a for a in call.args if a.keyword is not None and a.keyword.value == FLAG]
    if len(keywords) != 1 or not m.matches(keywords[0].value, m.Name("True")):
        return None
    if not all(_returns_pairs(facts, value.func.value) for value in built):  # type: ignore[attr-defined]
        return None  # with the flag off it may return fewer values than the call unpacks
    return keywords[0], weights.value


def _returns_pairs(facts: ModuleFacts, class_name: str) -> bool:
    """Every return of the class's forward is a literal pair: as many values whatever the flag."""
    found = facts.find_method(class_name, "forward")
    if found is None:
        return False
    returns = nodes_of_type(found[1].body, cst.Return)
    return bool(returns) and all(isinstance(r.value, cst.Tuple) and len(r.value.elements) == 2 for r in returns)


def _read_only_under_flag(method: cst.FunctionDef, name: str, assign: cst.Assign) -> bool:
    """Every read of `name` in the method sits inside an `if output_attentions:` block, and `assign` is its only
    assignment other than to None."""
    guarded: set[int] = set()
    for test in nodes_of_type(method.body, cst.If):
        if m.matches(test.test, m.Name(FLAG)):
            guarded |= {id(node) for node in nodes_of_type(test.body, cst.Name)}
    assigned = {
        id(node) for a in nodes_of_type(method.body, cst.Assign) for t in a.targets for node in nodes_of_type(t.target, cst.Name)
    }
    for node in nodes_of_type(method.body, cst.Name):
        if node.value != name or id(node) in assigned:
            continue
        if id(node) not in guarded:
            return False
    others = [a for a in nodes_of_type(method.body, cst.Assign) if a is not assign]
    return not any(
        n.value == name and not m.matches(a.value, m.Name("None"))  # `weights = None` before the call is fine
        for a in others
        for t in a.targets
        for n in nodes_of_type(t.target, cst.Name)
    )


class _Replace(cst.CSTTransformer):
    def __init__(self, changes: dict[cst.Arg, cst.Arg]) -> None:
        self.changes = changes

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        replacement = self.changes.get(original)
        return replacement if replacement is not None else updated
