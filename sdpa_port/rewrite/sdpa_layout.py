"""How the SDPA call sees the scores: the operands' layout, and terms broadcast against scores laid out otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import binary, code, primary
from sdpa_port.analyse.forms.views import REGROUPED
from sdpa_port.analyse.patterns import Order, least_rank, permuted, walk_names
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.sdpa_builders import COMMA, shape_slice


@dataclass(frozen=True)
class Layout:
    """How the SDPA call sees the operands: unflatten `(b*h, l, d)` operands with `heads`, flatten the result back.

    `bound`: the sizes as the view of the scores reads them, where the names they read are bound again before the
    SDPA call; the port binds them to `heads` (two names of its own) where the view was.
    """

    heads: tuple[cst.BaseExpression, cst.BaseExpression] | None
    unflatten_value: bool
    flatten_output: bool
    bound: tuple[cst.BaseExpression, cst.BaseExpression] | None = None


def decide_layout(path: SdpaPath, batch: str, heads_name: str) -> Layout:
    """The layout SDPA is called with, read from the chain; a chain changing layout between the products is refused.

    Before (Megatron's seq-first flattened heads, `q` bound again after the tuple is written):

        output_size = (q.size(1), q.size(2), q.size(0), k.size(0))
        q = q.view(output_size[2], output_size[0] * output_size[1], -1)
        scores = torch.bmm(q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2)).view(*output_size)

    After: `sdpa_batch, sdpa_heads = output_size[0], output_size[1]` where the view was, and SDPA gets
    `q.transpose(0, 1).unflatten(0, (sdpa_batch, sdpa_heads))`.
    """
    ops = outside_regroupings(path.chain_ops)
    start = ops[0]
    assert isinstance(start, t.Start)
    output = ops[-1]
    assert isinstance(output, t.Output)
    heads = next((op.heads for op in ops if isinstance(op, t.View) and op.heads is not None), None)
    if start.rank == 3:
        widened = any(isinstance(op, t.View) and op.rank_after == 4 for op in ops)
        if not widened and output.rank in (3, None):
            return Layout(None, False, False)
        if heads is None:
            raise Refuse(Code.LAYOUT, "the scores are reshaped to 4-D but the batch and head sizes cannot be read")
        names = walk_names(heads[0]) | walk_names(heads[1])
        value_rank = output.rank if output.rank is not None else 4
        if names & path.names_assigned_after_start:
            # read again at the SDPA call they would hold something else: bound where the view reads them
            return Layout((cst.Name(batch), cst.Name(heads_name)), value_rank == 3, value_rank == 3, bound=heads)
        return Layout(heads, value_rank == 3, value_rank == 3)
    for op in ops:
        if isinstance(op, t.View) and op.rank_before != op.rank_after and op.rank_before is not None:
            raise Refuse(Code.LAYOUT, "the scores change layout between the products")
    return Layout(None, False, False)


def outside_regroupings(ops: Sequence[t.Op]) -> list[t.Op]:
    """`ops` without their regroupings, checked: scores may be viewed in 5-D or 6-D only to add terms (scaling,
    casts and permutations allowed), then, permuted back, viewed back to their rank with the same trailing sizes."""
    out: list[t.Op] = []
    opened: t.View | None = None
    order: tuple[int, ...] | None = None  # the regrouped scores' permutation since they were regrouped
    for op in ops:
        if isinstance(op, t.View) and op.shape is not None and op.rank_after in REGROUPED and opened is None:
            opened, order = op, None
            continue
        if opened is not None:
            assert opened.shape is not None
            if isinstance(op, t.View) and op.order is not None:
                order = t.composed(order, op.order)
                continue
            if isinstance(op, t.View):
                if order is not None:
                    raise Refuse(Code.LAYOUT, "the regrouped scores are viewed back before they are permuted back")
                rank = opened.rank_before or 4
                back = op.shape
                kept = rank - 1  # the sizes after the batch
                if (
                    op.rank_after != rank
                    or back is None
                    or [code(n) for n in back[-kept:]] != [code(n) for n in opened.shape[-kept:]]
                ):
                    raise Refuse(Code.LAYOUT, "the regrouped scores are viewed back to another shape")
                opened = None
                continue
            if not isinstance(op, (t.AddTerm, t.Scale, t.Cast)):
                raise Refuse(Code.LAYOUT, "the scores are regrouped into another shape across more than added terms")
        out.append(op)
    if opened is not None:
        raise Refuse(Code.LAYOUT, "the regrouped scores are not viewed back before the softmax")
    return out


def laid_out(node: cst.BaseExpression, rank: int | None, layout: Order) -> cst.BaseExpression:
    """A term or mask condition broadcast against scores laid out otherwise than SDPA's (`Start.layout`), as
    SDPA's mask: given the scores' rank (leading dimensions of 1 added, as broadcasting adds them) and permuted
    as the scores are; broadcasting then permuting is permuting then broadcasting, so the entries are the same."""
    size = len(layout)
    if rank is None:
        rank = least_rank(node)  # an index showing as many dimensions as the scores have has no more
        rank = rank if rank == size else None
    if rank is not None and rank > size:
        raise Refuse(Code.LAYOUT, f"`{code(node)}` has more dimensions than the scores it is added to")
    if rank is None:
        # `x[(None,) * (4 - x.dim())]`: as many leading dimensions of 1 as broadcasting would add
        missing = cst.BinaryOperation(
            cst.Integer(str(size)),
            cst.Subtract(),
            cst.Call(func=cst.Attribute(value=primary(node), attr=cst.Name("dim"))),
            lpar=[cst.LeftParen()],
            rpar=[cst.RightParen()],
        )
        ones = cst.BinaryOperation(cst.Tuple([cst.Element(cst.Name("None"))]), cst.Multiply(), missing)
        node = cst.Subscript(value=primary(node), slice=[cst.SubscriptElement(cst.Index(ones))])
    elif rank < size:
        nones = [cst.SubscriptElement(cst.Index(cst.Name("None")), comma=COMMA) for _ in range(size - rank)]
        node = cst.Subscript(value=primary(node), slice=[*nones, cst.SubscriptElement(cst.Index(cst.Ellipsis()))])
    return permuted(node, layout)


def product_shape(query: cst.BaseExpression | None, key: cst.BaseExpression | None) -> cst.BaseExpression:
    """The shape of the query-key product at any rank, leading sizes broadcast:
    `torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]) + query.shape[-2:-1] + key.shape[-2:-1]`."""
    if query is None or key is None:
        raise Refuse(Code.SCORES_READ, "the scores' shape is read before the query-key product")
    broadcast = cst.Attribute(value=cst.Name("torch"), attr=cst.Name("broadcast_shapes"))
    leading = cst.Call(func=broadcast, args=[cst.Arg(shape_slice(query, ":-2")), cst.Arg(shape_slice(key, ":-2"))])
    return binary(binary(leading, cst.Add(), shape_slice(query, "-2:-1")), cst.Add(), shape_slice(key, "-2:-1"))


def scores_shape(query: cst.BaseExpression | None, key: cst.BaseExpression | None) -> cst.BaseExpression:
    """The shape of the query-key product, `query.shape[:-1] + key.shape[-2:-1]`."""
    if query is None or key is None:
        raise Refuse(Code.SCORES_READ, "the scores' shape is read before the query-key product")
    return binary(shape_slice(query, ":-1"), cst.Add(), shape_slice(key, "-2:-1"))
