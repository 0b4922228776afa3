"""What a single-query chain (`Start.single`, `analyse/forms/single_query.py`) changes in the SDPA code.

Eager's scores have no query axis: `att` is (batch, heads, key) where SDPA's are (batch, heads, 1, key). What joins
the mask is given that axis before the keys, and the output has it removed:

    att = att + attention_mask.squeeze(1)        ->  sdpa_mask = attention_mask.squeeze(1).unsqueeze(-2)
    att = att.masked_fill(pad, -inf)             ->  torch.where(pad.unsqueeze(-2), ...)
    out = einsum("bhld,bhl->bhd", value, probs)  ->  scaled_dot_product_attention(...).squeeze(-2)

A term broadcast against the scores is broadcast the same with an axis of 1 inserted before its last on both sides:
broadcasting aligns the trailing axes, so entry (b, h, k) of the sum is entry (b, h, 0, k) of SDPA's. A term known to
have fewer than two axes is first made 2-D (`torch.atleast_2d`, `sdpa_terms.added_term`), a number joins as it is.
What reads or reshapes the scores' axes themselves (a view, their sizes, a causal slice, rows zeroed after the
softmax) would read SDPA's four axes as eager's three, and is refused.
"""

from __future__ import annotations

from dataclasses import replace

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.forms.single_query import unsqueezed
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.sdpa_builders import tensor_only


def term(op: t.AddTerm, joined: cst.BaseExpression) -> cst.BaseExpression:
    """The term as it joins SDPA's mask (`joined`, as `sdpa_terms.added_term` made it), given the query axis of 1."""
    if op.term_rank is not None and op.rank is not None and op.term_rank > op.rank:
        raise Refuse(Code.LAYOUT, f"`{code(op.term)}` has more dimensions than the single-query scores it is added to")
    if op.scores_arg is not None:
        raise Refuse(Code.LAYOUT, "a helper is handed the single-query scores, whose shape SDPA's do not have")
    given = unsqueezed(joined)
    return tensor_only(given, joined) if op.may_be_number else given


def checked(op: t.Op) -> t.Op:
    """An operation on single-query scores as SDPA's mask takes it: a fill's condition given the query axis of 1.
    Operations that read the scores' axes are refused (a view, a causal slice, rows zeroed after the softmax)."""
    if isinstance(op, t.View):
        raise Refuse(Code.LAYOUT, "the single-query scores are viewed in another shape")
    if isinstance(op, t.ZeroRows):
        raise Refuse(Code.LAYOUT, "rows of single-query probabilities are zeroed after the softmax")
    if isinstance(op, t.Fill) and (op.causal or op.top_left):
        raise Refuse(Code.LAYOUT, "a causal slice masks single-query scores, which have no query axis to slice")
    return replace(op, condition=unsqueezed(op.condition)) if isinstance(op, t.Fill) else op


def refuse_sizes(plan: t.KeepStmt) -> None:
    """A statement reading the single-query scores' sizes or shape: SDPA's would answer with one axis more."""
    if plan.sizes or plan.shaped or t.KeepAction.RESHAPE_AS in plan.replacements.values():
        raise Refuse(Code.LAYOUT, "the shape of the single-query scores is read, which SDPA's do not have")


def squeezed(call: cst.BaseExpression) -> cst.Call:
    """`call.squeeze(-2)`: SDPA's output without the query axis of 1."""
    minus_two = cst.UnaryOperation(cst.Minus(), cst.Integer("2"))
    return cst.Call(func=cst.Attribute(value=call, attr=cst.Name("squeeze")), args=[cst.Arg(minus_two)])
