"""Why the recogniser passed over eager attention the form-free detector found: the operation its reading of that
function stopped at, for the F601 refusal to name. Read-only."""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cstutil import code, nodes_of_type
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.module_facts import ModuleFacts


def where_reading_stops(facts: ModuleFacts, lines: Lines, where: str) -> str:
    """`where` is `Class.method` or a module-level `function`. The reason the chain nearest to completion was given
    up, with its line; or that no query-key product the recogniser reads starts a chain there."""
    owner, _, name = where.rpartition(".")
    if owner:
        found = facts.find_method(owner, name)
        function = found[1] if found is not None else None
    else:
        function = facts.functions.get(name)
    if function is None:
        return ""
    lines.prepare([owner or name])
    tracer = t.Tracer(facts, owner or None, function, lines)
    result = tracer.run()
    poisoned = [c for c in result.candidates if c.poison is not None]
    if not poisoned:
        if any(c.start is not None for c in result.candidates):
            return ""
        return "the recogniser reads no query-key product there"
    # the chain that got furthest (the probabilities over the scores), then the earliest
    stage_rank = {t.Stage.SCORES: 0, t.Stage.PROBABILITIES: 1, t.Stage.OUTPUT: 2}
    chosen = max(poisoned, key=lambda c: (stage_rank.get(c.stage, 0), -c.cid))
    assert chosen.poison is not None
    line = f" at line {chosen.poison_line}" if chosen.poison_line else ""
    return f"the recogniser stops{line}: {chosen.poison.detail} ({chosen.poison.code.code})" + _foreign_softmax(
        tracer, function, chosen.poison.detail
    )


def _foreign_softmax(tracer: t.Tracer, function: cst.FunctionDef, said: str) -> str:
    """`; its softmax is ...` naming each softmax module of another package the function calls, where the reason given
    stops before it: the file does not show what such a module computes (Megatron's `FusedScaleMaskSoftmax`), so no
    port could follow it."""
    named = []
    for call in nodes_of_type(function, cst.Call):
        module = tracer.module_of(call.func)
        callee = f"`{code(call.func)}`"
        if "another package" in module and "softmax" in module.lower() and callee not in said and callee + module not in named:
            named.append(callee + module)
    return "".join(f"; its softmax is {name}" for name in named)
