"""The softmax over the key dimension, which takes the chain from scores to probabilities.

`softmax(x, dim=-1)` as a function, a method, an `nn.Softmax(dim=-1)` module of the class, or over the last dimension
named by number (`dim=3` of 4-D scores). Over any other dimension it is refused S105. A softmax over something that is
not a recognised product starts a chain refused S107 (the scores' origin is unknown).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import (
    PROBS,
    SCORES,
    Candidate,
    ChainVal,
    NotChain,
    Op,
    Poison,
    Softmax,
    describe_layout,
    short,
)
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.forms.common import SEQUENCE_FIRST, Example, scored, sdpa
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def softmax(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    found = p.softmax_call(node, tracer.scope)
    if found is None:
        return None
    try:
        base, ops = tracer.decompose(found.operand, line)
    except NotChain:
        return unknown_origin(tracer, node, found, line)
    tracer.require(base, ops, SCORES, "softmax", line, Code.SOFTMAX_DIM)
    layout = tracer.chains.layout_of(base.cid)
    if layout is not None:
        # scores laid out otherwise (`ijbn`): the key dimension is where the layout puts it, named either way
        dim = p.number(found.dim) if found.dim is not None else None
        if dim is None or dim not in (layout[-1], layout[-1] - len(layout)):
            raise Poison(
                Code.SOFTMAX_DIM,
                f"the softmax runs over dim={code(found.dim) if found.dim is not None else '(implicit)'}, not the key "
                f"dimension ({layout[-1]}) of scores laid out {describe_layout(layout)}",
                {base.cid},
            )
    elif found.dim is not None:
        dim = p.number(found.dim)
        rank = tracer.chains.advance(base, ops).rank
        if dim is None or not (dim == -1 or (rank is not None and dim == rank - 1)):
            raise Poison(
                Code.SOFTMAX_DIM, f"the softmax runs over dim={code(found.dim)}, not the key dimension", {base.cid}
            )
    return base, [*ops, Softmax(found)]


def unknown_origin(
    tracer: TracerView, node: cst.BaseExpression, softmax: p.SoftmaxCall, line: int
) -> tuple[ChainVal, list[Op]]:
    """A softmax whose operand is no chain: a candidate of unknown origin, refused F602 if it reaches V."""
    if tracer.selected_start is not None:
        raise NotChain()
    cid = len(tracer.chains.candidates)
    candidate = Candidate(cid, None, line, start_node=node)
    candidate.poisoned(
        Code.UNKNOWN_PRODUCT,
        f"the attention scores come from `{short(softmax.operand)}`, not from a recognised query-key product",
        line,
    )
    candidate.stage = PROBS
    tracer.chains.candidates.append(candidate)
    return ChainVal(cid, PROBS, None), [Softmax(softmax)]


_HEADS = "b, s, _ = query.shape\nquery = query.view(b, s, 4, -1).transpose(1, 2)\n"
_LAID_OUT = (
    "scores = torch.einsum('ibnd,jbnd->ijbn', query, key)\nprobs = scores.softmax(dim={dim})\n"
    "return torch.einsum('ijbn,jbnd->ibnd', probs, value)"
)

EXAMPLES = {
    "softmax": (
        Example(scored("probs = nn.functional.softmax(scores, dim=-1)"), Softmax, becomes=sdpa("scale=1.0")),
        Example(scored("probs = self.softmax(scores)"), Softmax, becomes=sdpa("scale=1.0")),
        # the last dimension of 4-D scores
        Example(scored("probs = scores.softmax(dim=3)", _HEADS), Softmax, becomes=sdpa("scale=1.0")),
        Example(scored("probs = scores.softmax(dim=1)"), refused=Code.SOFTMAX_DIM),
        # scores laid out (query, key, batch, heads): the key dimension is 1
        Example(_LAID_OUT.format(dim=1), Softmax, becomes=SEQUENCE_FIRST),
        Example(_LAID_OUT.format(dim=-3), Softmax, becomes=SEQUENCE_FIRST),
        Example(_LAID_OUT.format(dim=-1), refused=Code.SOFTMAX_DIM),
        Example(_LAID_OUT.format(dim=0), refused=Code.SOFTMAX_DIM),
        Example(
            "scores = self.score(query, key)\nprobs = scores.softmax(-1)\nreturn probs @ value",
            refused=Code.UNKNOWN_PRODUCT,
        ),
    ),
}
