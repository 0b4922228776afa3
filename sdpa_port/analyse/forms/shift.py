"""A row's maximum subtracted from the scores before the softmax: a shift the softmax ignores.

`scores - scores.amax(-1, keepdim=True)`. After the softmax it is refused S106; over another dimension it is no shift
(S103).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import SCORES, Poison, Shift
from sdpa_port.analyse.forms.common import Example, scored, sdpa
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def shifted(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, cst.Subtract):
        return None
    if not tracer.chain_or_start(node.left) or not row_maximum_of(tracer, node.right, node.left):
        return None
    base, ops = tracer.decompose(node.left, line)
    if tracer.chains.advance(base, ops).stage != SCORES:
        raise Poison(Code.PROBABILITIES_CHANGED, "the probabilities are shifted after the softmax", {base.cid})
    return base, [*ops, Shift()]


def row_maximum_of(tracer: TracerView, node: cst.BaseExpression, scores: cst.BaseExpression) -> bool:
    """Whether `node` is the maximum over the last dimension of `scores`, kept as a dimension.

    `scores.amax(-1, keepdim=True)`, `scores.amax(dim=-1).unsqueeze(-1)`, `scores.max(-1, keepdim=True)[0]` or
    `.values`, `torch.amax(scores, -1, keepdim=True)`; also through one local holding it, and detached from the graph
    (`.detach()` on the maximum or on the scores it is taken of: the same values).
    """
    if isinstance(node, cst.Name):
        values = tracer.scope.local_values(node.value)
        return len(values) == 1 and row_maximum_of(tracer, values[0], scores)
    node = _undetached(node)
    kept = False
    if isinstance(node, cst.Call) and p.method_call(node, {"unsqueeze"}) is not None and len(node.args) == 1:
        if p.number(node.args[0].value) == -1:
            node, kept = p.method_call(node, {"unsqueeze"})[0], True  # type: ignore[index]
    if (
        isinstance(node, cst.Subscript)
        and len(node.slice) == 1
        and m.matches(node.slice[0].slice, m.Index(m.Integer("0")))
    ):
        node = node.value
    elif isinstance(node, cst.Attribute) and node.attr.value == "values":
        node = node.value
    if not isinstance(node, cst.Call):
        return False
    found = p.method_call(node, {"amax", "max"})
    operand: cst.BaseExpression | None
    if found is not None:
        operand, dim, keepdim = found[0], p.arg(node, 0, "dim"), p.arg(node, 1, "keepdim")
    elif tracer.scope.qualify(node.func) in ("torch.amax", "torch.max"):
        operand, dim, keepdim = p.arg(node, 0, "input"), p.arg(node, 1, "dim"), p.arg(node, 2, "keepdim")
    else:
        return False
    if operand is None or dim is None or p.number(dim) not in (-1,):
        return False
    if not kept and (keepdim is None or not m.matches(keepdim, m.Name("True"))):
        return False
    return _undetached(operand).deep_equals(scores)


def _undetached(node: cst.BaseExpression) -> cst.BaseExpression:
    """`x` for `x.detach()`: the same values, cut from the graph (lucidrains' `sim.amax(-1, keepdim=True).detach()`)."""
    found = p.method_call(node, {"detach"})
    if found is not None and isinstance(node, cst.Call) and not node.args:
        return found[0]
    return node


EXAMPLES = {
    "shifted": (
        Example(
            scored("scores = scores - scores.amax(-1, keepdim=True)\nprobs = scores.softmax(-1)"),
            Shift,
            becomes=sdpa("scale=1.0"),
        ),
        Example(
            scored("scores = scores - scores.max(dim=-1, keepdim=True).values\nprobs = scores.softmax(-1)"),
            Shift,
            becomes=sdpa("scale=1.0"),
        ),
        Example(
            scored("scores = scores - scores.amax(dim=-1, keepdim=True).detach()\nprobs = scores.softmax(-1)"),
            Shift,
            becomes=sdpa("scale=1.0"),
        ),
        Example(
            scored("scores = scores - scores.amax(1, keepdim=True)\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_COMBINED,
        ),
        Example(
            scored("scores = scores - scores.amax(-1, keepdim=True).detach() * 2\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_COMBINED,
        ),
    ),
}
