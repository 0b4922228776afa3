"""Find the side of a test of the module's settings that holds the one attention SDPA can take.

`if self.num_landmarks == self.seq_len:` exact attention, else an approximation: `one_branch` traces forward with
each side of such a test known false in turn; the SDPA class falls back to eager on the other side.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cstutil import code, nodes_of_type, reads_only_self_attributes
from sdpa_port.analyse.known import Known, negated_comparison
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.optional_facts import tried_facts
from sdpa_port.analyse.tracing import LineOf
from sdpa_port.refusals import Code, Refusal


@dataclass(frozen=True)
class OneBranch:
    """What `one_branch` found.

    The facts on the SDPA path (the side known false, with any optional fact), the trace and its one attention, the
    side, and why the other side stays eager.
    """

    known: Known
    result: t.TraceResult
    candidate: t.Candidate
    side: str
    eager_side: Refusal | None


def one_branch(facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, line_of: LineOf) -> OneBranch | None:
    """The trace taking the side of a settings test that holds the one attention SDPA can take.

    Several attentions sit one per side of a test of the module's own settings (`if self.num_landmarks ==
    self.seq_len:` exact attention, else an approximation); the side is known through the comparison that sends the
    SDPA class back to eager otherwise. Where that side's one attention has a step only an optional argument or a
    switch of the call takes (`if return_scores: return scores`), that fact is known too, as `without_optional` tries
    them.
    """
    optional: list[Known] | None = None
    for test in nodes_of_type(forward.body, cst.If):
        if not settings_only(test.test):
            continue
        if negated_comparison(test.test) is None and (test.orelse is None or _reads_training(test.test)):
            # a flag choosing between two computations, not a step only one setting takes (a hook, a talking-heads
            # projection: `without_optional` tries those, off by default), nor the module's training mode
            continue
        sides = sides_of(test.test)
        for index, other_side in enumerate(sides):
            side = code(other_side)
            known = Known(falsy=frozenset({side}))
            result = t.Tracer(facts, class_name, forward, line_of, known=known).run()
            inline = result.attention()
            if len(inline) != 1:
                continue
            if inline[0].poison is not None:
                # one attention on this side, with a step an optional fact may rule out
                optional = tried_facts(facts, class_name, forward) if optional is None else optional
                for extra in optional:
                    known = Known(falsy=extra.falsy | {side}, none=extra.none)
                    result = t.Tracer(facts, class_name, forward, line_of, known=known).run()
                    inline = result.attention()
                    if len(inline) == 1 and inline[0].poison is None:
                        break
            if len(inline) == 1 and inline[0].poison is None:
                opposite = Known(falsy=(known.falsy - {side}) | {code(sides[1 - index])}, none=known.none)
                why = _why_eager(facts, class_name, forward, line_of, opposite)
                return OneBranch(known, result, inline[0], side, why)
    return None


def _why_eager(
    facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, line_of: LineOf, known: Known
) -> Refusal | None:
    """Why the side of a settings test that `known` leaves is not ported.

    Its one attention's refusal, or that it computes several; None where it computes no attention, or one SDPA could
    take.
    """
    inline = t.Tracer(facts, class_name, forward, line_of, known=known).run().attention()
    if len(inline) == 1 and inline[0].poison is not None:
        return Refusal.of(inline[0].poison, class_name, inline[0].poison_line or inline[0].start_line)
    if len(inline) > 1:
        return Refusal(Code.REPEATED, class_name, inline[1].start_line, "that side computes several attentions")
    return None


def _reads_training(test: cst.BaseExpression) -> bool:
    return any(m.matches(a, m.Attribute(value=m.Name("self"), attr=m.Name("training"))) for a in nodes_of_type(test, cst.Attribute))


def sides_of(test: cst.BaseExpression) -> tuple[cst.BaseExpression, ...]:
    """The expressions that, known false, decide `test` either way, in the order tried.

    A comparison's negation (its `if` branch) then the comparison; for a flag (`self.x`, `self.config.x`), the flag
    itself first, so that the side where it is off (usually the default) is the one tried first (`if not self.fast:`
    its `if` branch, `if self.upcast:` its `else`), then `not` the flag.
    """
    negated = negated_comparison(test)
    if negated is not None:
        return (negated, test)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return (test.expression, test)
    return (test, cst.UnaryOperation(operator=cst.Not(), expression=test))


def settings_only(test: cst.BaseExpression) -> bool:
    """A test that reads nothing but `self.` attributes and literals.

    No argument, no tensor it computes.
    """
    selfs = [a for a in nodes_of_type(test, cst.Attribute) if m.matches(a.value, m.Name("self"))]
    return bool(selfs) and reads_only_self_attributes(test)
