"""Why the recogniser passed over eager attention the form-free detector found: the operation its reading of that
function stopped at, for the F601 refusal to name. Read-only."""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cstutil import code, nodes_of_type
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.known import holds_where
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.optional_facts import tried_facts


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
    chosen = max(poisoned, key=_furthest)
    where_known = ""
    if owner and name == "forward":
        # a stop on a path the port would leave to eager (a TPU branch, a switch only eager takes) is not the one
        # that counts: the furthest reading under the facts the SDPA path may hold, where it gets further
        for known in tried_facts(facts, owner, function):
            traced = t.Tracer(facts, owner, function, lines, known=known)
            further = [c for c in traced.run().candidates if c.poison is not None]
            best = max(further, key=_furthest) if further else None
            if best is not None and _progress(best) > _progress(chosen):
                chosen, tracer = best, traced
                tests = sorted(known.falsy) + [f"{none} is not None" for none in sorted(known.none)]
                where_known = f", where {holds_where(tests)}"
    assert chosen.poison is not None
    line = f" at line {chosen.poison_line}" if chosen.poison_line else ""
    said = f"the recogniser stops{line}{where_known}: {chosen.poison.detail} ({chosen.poison.code.code})"
    return said + _foreign_softmax(tracer, function, chosen.poison.detail)


_STAGE_RANK = {t.Stage.SCORES: 0, t.Stage.PROBABILITIES: 1, t.Stage.OUTPUT: 2}


def _furthest(candidate: t.Candidate) -> tuple[int, int]:
    """The chain that got furthest (the probabilities over the scores), then the earliest."""
    return (_STAGE_RANK.get(candidate.stage, 0), -candidate.cid)


def _progress(candidate: t.Candidate) -> tuple[int, int]:
    """How far a chain got, to compare readings under other facts: its stage, then its stop's line."""
    return (_STAGE_RANK.get(candidate.stage, 0), candidate.poison_line or 0)


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
