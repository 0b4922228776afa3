"""A floor under the scores, a NaN guard; any other clamp is refused S101.

`scores.clamp(min=very negative)`, `torch.max(scores, finfo.min)`, `torch.maximum`/`torch.clamp` with such a bound;
whether it absorbs what it floors is noted. A floor that reads the scores is refused S101 too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import Guard
from sdpa_port.analyse.forms.common import Example, method_on_chain, scored, sdpa
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def clamp_method(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    found = method_on_chain(tracer, node, {"clamp", "clamp_min"})
    if found is None:
        return None
    call, receiver, _ = found
    bound, upper = p.arg(call, 0, "min"), p.arg(call, 1, "max")
    if bound is None or upper is not None or not p.is_very_negative(bound, tracer.scope):
        return None
    base, ops = tracer.decompose(receiver, line)
    return base, [*ops, Guard(tracer.reads.detach(bound, base.cid), p.is_absorbing(bound, tracer.scope))]


def maximum(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    if not isinstance(node, cst.Call):
        return None
    qualified = tracer.scope.qualify(node.func)
    if qualified not in p.MAXIMUM_FUNCTIONS:
        return None
    operand = p.arg(node, 0, "input")
    bound = p.arg(node, 1, "min" if "clamp" in (qualified or "") else "other")
    if operand is None or bound is None or not tracer.chain_or_start(operand) or tracer.reads.chain_value_refs(bound):
        return None
    if not p.is_very_negative(bound, tracer.scope) or p.arg(node, 2, "max") is not None:
        return None
    base, ops = tracer.decompose(operand, line)
    return base, [*ops, Guard(tracer.reads.detach(bound, base.cid), p.is_absorbing(bound, tracer.scope))]


EXAMPLES = {
    "clamp_method": (
        Example(
            scored("probs = scores.clamp(min=torch.finfo(scores.dtype).min).softmax(-1)"),
            Guard,
            becomes=sdpa("scale=1.0"),
        ),
        Example(scored("probs = scores.clamp(min=-5.0).softmax(-1)"), refused=Code.SCORES_TRANSFORMED),  # a real floor
    ),
    "maximum": (
        Example(
            scored(
                "scores = torch.max(scores, torch.tensor(torch.finfo(scores.dtype).min))\nprobs = scores.softmax(-1)"
            ),
            Guard,
            becomes=sdpa("scale=1.0"),
        ),
        Example(
            scored("probs = torch.maximum(scores, torch.zeros_like(scores)).softmax(-1)"),
            refused=Code.SCORES_TRANSFORMED,
        ),
    ),
}
