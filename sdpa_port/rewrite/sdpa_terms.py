"""Scale factors and added terms: how the chain's scaling and additions to the scores join SDPA's scale and mask."""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import assignment, code, plus, primary
from sdpa_port.analyse.patterns import Order
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.sdpa_builders import COMMA, if_not_none, query_root, scaled, tensor_only, unflatten
from sdpa_port.rewrite.sdpa_layout import laid_out, scores_shape
from sdpa_port.rewrite.sdpa_state import Side, SideNames, SideState, materialize


def scale(
    state: SideState, names: SideNames, op: t.Scale, query: cst.BaseExpression | None
) -> list[cst.BaseStatement]:
    """The scale factor joins `scale=` and whatever is already added; a factor per query scales the query instead
    (the caller then names the query `names.query`)."""
    out: list[cst.BaseStatement] = []
    if op.per_query:
        # (q @ k.T) * f == (q * f) @ k.T for a factor the same along the keys; terms added before would be scaled
        if state.scale_var or state.mask_var or state.mask is not None or state.causal_fill is not None:
            raise Refuse(
                Code.SCALE_NOT_A_NUMBER,
                f"the scores are scaled by the tensor `{code(op.factor)}` after other terms or under a condition",
            )
        out.append(assignment(names.query, scaled(query_root(query), op.factor, op.divide)))
        return out
    if state.scale_var:
        out.append(assignment(names.scale, scaled(cst.Name(names.scale), op.factor, op.divide)))
    else:
        state.scale_factors.append((op.factor, op.divide))
    if state.mask_var and not state.mask_none:
        update = assignment(names.mask, scaled(cst.Name(names.mask), op.factor, op.divide))
        out.append(if_not_none(names.mask, update) if state.mask_maybe_none else update)
    elif state.mask is not None:
        if state.mask_nullable:
            out.extend(materialize(state, names, {Side.MASK}))
            update = assignment(names.mask, scaled(cst.Name(names.mask), op.factor, op.divide))
            out.append(if_not_none(names.mask, update))
        else:
            state.mask = scaled(state.mask, op.factor, op.divide)
    return out


@dataclass(frozen=True)
class Regrouped:
    """Scores regrouped to add terms (`view(b // w, w, h, q, k)`): the shape, their rank before, and the order their
    dimensions are permuted into since (`.permute(0, 2, 1, 3, 4)`; None where they are in their own)."""

    shape: tuple[cst.BaseExpression, ...]
    rank: int | None
    order: tuple[int, ...] | None = None

    def permuted(self, order: tuple[int, ...]) -> Regrouped:
        return replace(self, order=t.composed(self.order, order))


def added_term(
    op: t.AddTerm,
    names: SideNames,
    *,
    query: cst.BaseExpression | None,
    key: cst.BaseExpression | None,
    regrouped: Regrouped | None,
    scores_layout: Order | None,
    heads: tuple[cst.BaseExpression, cst.BaseExpression] | None,
) -> tuple[list[cst.BaseStatement], cst.BaseExpression]:
    """A term added to the scores as SDPA's mask takes it, with the statements it needs first (the scores' shape)."""
    term, rank = op.term, op.rank
    pre: list[cst.BaseStatement] = []
    if op.scores_arg is not None:
        pre.append(assignment(names.scores_shape, scores_shape(query, key)))
        term = with_zero_scores(term, op.scores_arg, key, names)
    if regrouped is not None:
        term, rank = regrouped_term(term, regrouped.shape, query, names, regrouped.order), regrouped.rank
    if scores_layout is not None:
        if op.may_be_number:
            raise Refuse(Code.LAYOUT, f"`{code(term)}` may be a number or a tensor laid out as the scores are")
        term = laid_out(term, op.term_rank, scores_layout)
    elif op.term_rank is not None and op.term_rank < 2 and not op.may_be_number:
        # SDPA takes a mask of two dimensions or more; a term along the keys only (`torch.arange(k)`) broadcasts
        # over the queries just as well with a leading dimension of 1
        term = cst.Call(func=cst.parse_expression("torch.atleast_2d"), args=[cst.Arg(term)])
    if heads is not None and rank == 3:
        # a `(batch * heads, ...)` term (ALiBi through baddbmm) joins the per-head mask; a number (a helper's
        # `score = 0`) joins as it is
        reshaped = unflatten(term, heads)
        term = tensor_only(reshaped, term) if op.may_be_number else reshaped
    return pre, term


def regrouped_term(
    term: cst.BaseExpression,
    shape: tuple[cst.BaseExpression, ...],
    query: cst.BaseExpression | None,
    names: SideNames,
    order: tuple[int, ...] | None = None,
) -> cst.BaseExpression:
    """A term added to the scores viewed as `shape` (`scores.view(shape) + term`, viewed back): the same term
    on the scores' own shape, `(zeros(scores).view(shape) + term).view(scores)`; views keep the entries' order,
    so the sum is unchanged. `scores_shape` is assigned where the regrouping starts.

    Where the regrouped scores are permuted when the term is added (`order`, not None), the zeros are
    permuted the same way, and the sum permuted back before its view: `(zeros(scores).view(shape).permute(order) +
    term).permute(back).reshape(scores)`."""
    if query is None:
        raise Refuse(Code.SCORES_READ, "the scores are regrouped before the query-key product")
    shape_var = cst.Name(names.scores_shape)
    zeros = cst.Call(func=cst.Attribute(value=primary(query), attr=cst.Name("new_zeros")), args=[cst.Arg(shape_var)])
    viewed: cst.BaseExpression = cst.Call(
        func=cst.Attribute(value=zeros, attr=cst.Name("view")),
        args=[cst.Arg(size, comma=COMMA) for size in shape[:-1]]
        + [cst.Arg(shape[-1])],
    )
    if order is not None:
        viewed = _permute(viewed, order)
    summed = plus(viewed, term)
    if order is None:
        return cst.Call(func=cst.Attribute(value=primary(summed), attr=cst.Name("view")), args=[cst.Arg(shape_var)])
    back = tuple(order.index(dim) for dim in range(len(order)))
    permuted_back = _permute(primary(summed), back)
    return cst.Call(func=cst.Attribute(value=permuted_back, attr=cst.Name("reshape")), args=[cst.Arg(shape_var)])


def _permute(node: cst.BaseExpression, order: tuple[int, ...]) -> cst.Call:
    args = [cst.Arg(cst.Integer(str(dim)), comma=COMMA) for dim in order[:-1]] + [cst.Arg(cst.Integer(str(order[-1])))]
    return cst.Call(func=cst.Attribute(value=node, attr=cst.Name("permute")), args=args)


def with_zero_scores(
    term: cst.BaseExpression, index: int, key: cst.BaseExpression | None, names: SideNames
) -> cst.BaseExpression:
    """A call of a helper that adds to the scores it is given, given zeros of the scores' shape instead."""
    assert isinstance(term, cst.Call)
    if key is None:
        raise Refuse(Code.SCORES_READ, "the scores are handed to a helper before the query-key product")
    # the key has the scores' dtype and device, and is a plain name more often than the (scaled) query
    zeros = cst.Call(
        func=cst.Attribute(value=primary(key), attr=cst.Name("new_zeros")),
        args=[cst.Arg(cst.Name(names.scores_shape))],
    )
    args = list(term.args)
    args[index] = args[index].with_changes(value=zeros)
    return term.with_changes(args=args)
