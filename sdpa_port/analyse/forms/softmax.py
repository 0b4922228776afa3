"""The softmax over the key dimension, which takes the chain from scores to probabilities.

`softmax(x, dim=-1)` as a function, a method, an `nn.Softmax(dim=-1)` module of the class, or over the last dimension
named by number (`dim=3` of 4-D scores). Over any other dimension it is refused S105. A softmax over something that is
not a recognised product starts a chain refused S107 (the scores' origin is unknown).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import (
    PROBS,
    SCORES,
    Candidate,
    Cast,
    ChainVal,
    NotChain,
    Op,
    Poison,
    Scale,
    Softmax,
    Start,
    Transpose,
    describe_layout,
    short,
)
from sdpa_port.analyse.cstutil import code, nodes_of_type, walk_names
from sdpa_port.analyse.forms.common import SEQUENCE_FIRST, Example, scored, sdpa
from sdpa_port.analyse.forms.products import query_scale
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
        if dim is not None and (dim == -2 or (rank is not None and rank >= 2 and dim == rank - 2)):
            return over_queries(tracer, base, ops, found, found.dim)
        if dim is None or not (dim == -1 or (rank is not None and dim == rank - 1)):
            raise Poison(
                Code.SOFTMAX_DIM, f"the softmax runs over dim={code(found.dim)}, not the key dimension", {base.cid}
            )
    return base, [*ops, Softmax(found)]


def over_queries(
    tracer: TracerView, base: ChainVal, ops: list[Op], found: p.SoftmaxCall, dim: cst.BaseExpression
) -> Recognised:
    """A softmax over the first of the two score dimensions, the product's left operand.

    Non-local blocks (SAGAN) normalise `softmax(torch.bmm(f^T, g), dim=1)` over the positions of `f`: that is the
    transpose of a softmax over the last dimension of `bmm(g^T, f)`, scores with the query and the key swapped. The
    chain's product is read so (`ChainBook.swap_roles`), and its probabilities are transposed (`Transpose`), for a
    value on their left (`torch.bmm(h, beta)`, `forms/transposed.py`). Only a scale by a number and casts may come
    between the product and the softmax: a term or a fill would have to be transposed too.
    """
    candidate = tracer.chains.candidates[base.cid]
    start = candidate.start
    since = [op for op, _, _ in candidate.ops] + ops
    shared = start is not None and start.heads is not None  # a key shared by every head would be the query
    if start is not None and start.single:
        raise Poison(
            Code.SOFTMAX_DIM,
            f"the softmax runs over dim={code(dim)}, not the keys, of single-query scores",
            {base.cid},
        )
    if start is None or candidate.branched() or start.joined or start.orders != (None, None) or shared or not all(
        _same_transposed(op) for op in since
    ):
        raise Poison(
            Code.SOFTMAX_DIM,
            f"the softmax runs over dim={code(dim)}, the queries, of scores that are not the product alone (scaled by "
            "a number)",
            {base.cid},
        )
    swapped = tracer.chains.swap_roles(base.cid, ops, query_scale(tracer, start.key))
    return base, [*swapped, Softmax(found), Transpose()]


def _same_transposed(op: Op) -> bool:
    """The product, a cast or a scale by a number: the same on the scores transposed (a factor per query is not)."""
    return isinstance(op, (Start, Cast)) or isinstance(op, Scale) and not op.per_query


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
        f"the attention scores come from `{short(softmax.operand)}`{origin(tracer, softmax.operand, line)}, not from a "
        "recognised query-key product",
        line,
    )
    candidate.stage = PROBS
    tracer.chains.candidates.append(candidate)
    return ChainVal(cid, PROBS, None), [Softmax(softmax)]


def origin(tracer: TracerView, operand: cst.BaseExpression, line: int) -> str:
    """` (`value`, line n, why)`: what the softmax of scores of unknown origin reads.

    A name is followed to its last assignment before `line` that does not read it (the scores' origin, before the
    steps that rebind it); a product there, or the operand itself, is said to be one of no query and key the tool
    can tell."""
    if not isinstance(operand, cst.Name):
        why = _product_why(tracer, operand)
        return f" ({why})" if why else ""
    found: tuple[int, cst.BaseExpression] | None = None
    for assign in nodes_of_type(tracer.function.body, cst.Assign):
        at = tracer.line_of(assign)
        if not any(isinstance(t.target, cst.Name) and t.target.value == operand.value for t in assign.targets):
            continue
        if 0 < at < line and operand.value not in walk_names(assign.value) and (found is None or at > found[0]):
            found = (at, assign.value)
    if found is None:
        return ""
    why = _product_why(tracer, found[1])
    return f" (`{short(found[1])}`, line {found[0]}{', ' + why if why else ''})"


def _product_why(tracer: TracerView, node: cst.BaseExpression) -> str:
    product = tracer.scope.product(node)
    if product is None:
        return ""
    if product.form is p.ProductForm.EINSUM:
        return "an einsum the tool does not read as a query-key product"
    swapped = _fixed_swap(product.right)
    if swapped is not None:  # `K.transpose(1, 0)`: the last two dims only of 2-D operands
        first, second = swapped
        return (
            f"a product whose right operand swaps dims {first} and {second}, its last two only where the operands "
            f"have {max(first, second) + 1} dims, a rank the file does not show"
        )
    # any right operand is a key swapped (`forms/products.py`, `untranspose`), in a product whose rank is read
    return (
        "a product whose right operand is not seen as a key with its last two dims swapped, of operands whose one "
        "rank (at least 3) cannot be read"
    )


_SWAP = m.Call(
    func=m.Attribute(attr=m.Name("transpose")), args=[m.Arg(m.Integer(), keyword=None), m.Arg(m.Integer(), keyword=None)]
)


def _fixed_swap(node: cst.BaseExpression) -> tuple[int, int] | None:
    """The dims `x.transpose(1, 0)` swaps, counted from the front; None for any other operand."""
    if not m.matches(node, _SWAP):
        return None
    assert isinstance(node, cst.Call)
    dims = [int(a.value.value) for a in node.args if isinstance(a.value, cst.Integer)]
    return dims[0], dims[1]


_HEADS = "b, s, _ = query.shape\nquery = query.view(b, s, 4, -1).transpose(1, 2)\n"
_LAID_OUT = (
    "scores = torch.einsum('ibnd,jbnd->ijbn', query, key)\nprobs = scores.softmax(dim={dim})\n"
    "return torch.einsum('ijbn,jbnd->ibnd', probs, value)"
)

# a non-local block's softmax over the queries, the positions of the product's left operand: every operand
# channels-first (batch, dim, length), the value on the left of the probabilities as they are
_OVER_QUERIES = (
    "scores = torch.bmm(query.permute(0, 2, 1), key)\nprobs = torch.softmax(scores, dim={dim})\n"
    "return torch.bmm(value, probs)"
)
# the product read with the query and the key swapped, SDPA's output transposed back
_OVER_QUERIES_PORT = (
    "return "
    + sdpa("scale=1.0", operands="key.transpose(-1, -2), query.permute(0, 2, 1), value.transpose(1, 2)")
    + ".transpose(1, 2)"
)

EXAMPLES = {
    "softmax": (
        Example(_OVER_QUERIES.format(dim=1), Transpose, becomes=_OVER_QUERIES_PORT),
        Example(_OVER_QUERIES.format(dim=-2), Transpose, becomes=_OVER_QUERIES_PORT),
        # in one expression, after a scale by a number
        Example(
            "probs = torch.softmax(torch.bmm(query.permute(0, 2, 1).contiguous(), key) / 8.0, dim=1)\n"
            "return torch.bmm(value, probs)",
            Transpose,
            becomes=_OVER_QUERIES_PORT.replace("scale=1.0", "scale=1.0 / 8.0"),
        ),
        # over the batch; over dim 1 of scores whose rank cannot be read (a matmul)
        Example(_OVER_QUERIES.format(dim=0), refused=Code.SOFTMAX_DIM),
        Example(
            "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = torch.softmax(scores, dim=1)\n"
            "return torch.matmul(value.transpose(-1, -2), probs)",
            refused=Code.SOFTMAX_DIM,
        ),
        # a mask added before: it would have to be transposed with the scores
        Example(
            _OVER_QUERIES.format(dim=1).replace("probs =", "scores = scores + attention_mask\nprobs ="),
            refused=Code.SOFTMAX_DIM,
        ),
        # the value on the right of probabilities normalised over the queries: no attention output
        Example(
            _OVER_QUERIES.format(dim=1).replace("torch.bmm(value, probs)", "torch.bmm(probs, value)"),
            refused=Code.LAYOUT,
        ),
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
