"""Fold the chain's masking into the additive mask: added terms, fills, floors, and the query rows to zero."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import assignment, code, expr, plus, primary
from sdpa_port.analyse.patterns import cast_operand
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.sdpa_builders import COMMA, clamp, if_not_none, is_none, keyword_arg, query_root
from sdpa_port.rewrite.sdpa_state import Side, SideNames, SideState, ZeroRowsState, materialize


def zero_rows(state: SideState, names: SideNames, op: t.ZeroRows, regrouped: bool) -> list[cst.BaseStatement]:
    """The query rows whose every key the condition masks, computed where the probabilities were zeroed (its
    names may change later); the output is zeroed there after the SDPA call."""
    if regrouped:
        raise Refuse(Code.LAYOUT, "the probabilities are zeroed while the scores are regrouped into another shape")
    keyword = keyword_arg("keepdim", cst.Name("True"))
    method = "any" if op.keep_where_true else "all"
    rows: cst.BaseExpression = cst.Call(
        func=cst.Attribute(value=primary(op.condition), attr=cst.Name(method)),
        args=[cst.Arg(cst.UnaryOperation(cst.Minus(), cst.Integer("1")), comma=COMMA), keyword],
    )
    if op.keep_where_true:
        rows = cst.UnaryOperation(cst.BitInvert(), rows)
    state.zero_rows = ZeroRowsState.SET
    return [assignment(names.zero_rows, rows)]


def floor_mask(state: SideState, names: SideNames, op: t.Guard) -> list[cst.BaseStatement]:
    """`max(scores + mask, bound)` is `scores + max(mask, bound)` for an absorbing bound (scores + bound == bound).

    Without a mask the scores are finite and the floor changes nothing.
    """
    if not state.mask_var and state.mask is None or state.mask_var and state.mask_none:
        return []
    if not op.absorbing:
        raise Refuse(
            Code.MASKED_ROWS,
            f"the scores are floored at `{code(op.bound)}`, which does not absorb the scores, so the floor cannot "
            "move onto the mask",
        )
    if state.mask_nullable:
        return [*materialize(state, names, {Side.MASK}), *floor_mask(state, names, op)]
    if not state.mask_var:
        state.mask = clamp(state.mask, op.bound)  # type: ignore[arg-type]
        return []
    update = assignment(names.mask, clamp(cst.Name(names.mask), op.bound))
    return [if_not_none(names.mask, update) if state.mask_maybe_none else update]


def nullable_parameter(term: cst.BaseExpression, nullable: frozenset[str]) -> str | None:
    """The mask parameter an additive term reads (`mask`, `mask.to(dtype)`), when it may arrive as None."""
    name = cast_operand(term)
    return name if name is not None and name in nullable else None


def add_nullable(
    state: SideState, names: SideNames, term: cst.BaseExpression, name: str
) -> list[cst.BaseStatement]:
    """`mask + <term of a parameter that may be None>`: the term only joins when it is not None."""
    if state.mask is None and not state.mask_var:
        state.mask, state.mask_nullable = term, True
        return []
    pre = materialize(state, names, {Side.MASK}) if not state.mask_var else []
    mask = cst.Name(names.mask)
    added = plus(mask, term)
    value: cst.BaseExpression = (
        term
        if state.mask_none
        else cst.IfExp(test=is_none(names.mask), body=term, orelse=added)
        if state.mask_maybe_none
        else added
    )
    state.mask_none = False
    return [*pre, if_not_none(name, assignment(names.mask, value))]


def add_to_mask(
    state: SideState,
    names: SideNames,
    term: cst.BaseExpression,
    nullable: frozenset[str],
    not_none: Sequence[set[str]],
) -> list[cst.BaseStatement]:
    """`mask + term`, the term joining the known mask or its variable; `nullable` are the mask parameters that may be
    None, `not_none` the names the enclosing `if` tests show are not."""
    parameter = nullable_parameter(term, nullable)
    if parameter is not None and not any(parameter in shown for shown in not_none):
        return add_nullable(state, names, term, parameter)
    pre = materialize(state, names, {Side.MASK}) if state.mask_nullable else []
    if pre:
        return [*pre, *add_to_mask(state, names, term, nullable, not_none)]
    if not state.mask_var:
        state.mask = term if state.mask is None else plus(state.mask, term)
        return []
    if state.mask_none:
        state.mask_none = state.mask_maybe_none = False
        return [assignment(names.mask, term)]
    mask = cst.Name(names.mask)
    named: list[cst.BaseStatement] = []
    if state.mask_maybe_none and isinstance(term, (cst.Call, cst.IfExp)):
        # `term if mask is None else mask + term` names a computed term once
        named.append(assignment(names.term, term))
        term = cst.Name(names.term)
    added = plus(mask, term)
    if state.mask_maybe_none:
        value: cst.BaseExpression = cst.IfExp(
            test=is_none(names.mask), body=term, orelse=added
        )
    else:
        value = added
    state.mask_maybe_none = False
    return [*named, assignment(names.mask, value)]


def fill_mask(
    state: SideState, names: SideNames, op: t.Fill, query: cst.BaseExpression | None
) -> list[cst.BaseStatement]:
    """`where(keep, scores, fill)` / `masked_fill(masked, fill)` folded into the additive mask."""
    if state.mask_nullable:
        return [*materialize(state, names, {Side.MASK}), *fill_mask(state, names, op, query)]
    dtype_target = query_root(query)

    def where(current: cst.BaseExpression | None) -> cst.BaseExpression:
        # zeros of the query's dtype, not `0.0`: a Python number makes the result float32, which cannot hold
        # `finfo(float64).min`
        zero = cst.Call(func=cst.Attribute(value=dtype_target, attr=cst.Name("new_zeros")), args=[cst.Arg(cst.Tuple([]))])
        base: cst.BaseExpression = current if current is not None else zero
        if op.keep_where_true:
            args = [op.condition, base, op.fill]
        else:
            args = [op.condition, op.fill, base]
        call: cst.BaseExpression = cst.Call(func=expr("torch.where"), args=[cst.Arg(a) for a in args])
        if current is None:
            call = cst.Call(
                func=cst.Attribute(value=call, attr=cst.Name("to")),
                args=[cst.Arg(cst.Attribute(value=dtype_target, attr=cst.Name("dtype")))],
            )
        return call

    if not state.mask_var:
        state.mask = where(state.mask)
        return []
    mask = cst.Name(names.mask)
    if state.mask_none:
        value: cst.BaseExpression = where(None)
    elif state.mask_maybe_none:
        value = cst.IfExp(test=is_none(names.mask), body=where(None), orelse=where(mask))
    else:
        value = where(mask)
    state.mask_none = state.mask_maybe_none = False
    return [assignment(names.mask, value)]
