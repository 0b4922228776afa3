"""The SDPA call that replaces the product with V: its arguments, the causal decision, and the rows zeroed after it."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import assignment, code, expr, primary
from sdpa_port.analyse.patterns import inverse, permuted
from sdpa_port.analyse.patterns.numbers import FINFO_MIN
from sdpa_port.refusals import Code, Refuse
from sdpa_port.render import render_module, render_statements
from sdpa_port.rewrite.sdpa_builders import COMMA, if_not_none, query_root, unflatten
from sdpa_port.rewrite.sdpa_layout import Layout
from sdpa_port.rewrite.single_query import squeezed
from sdpa_port.rewrite.sdpa_state import (
    MaskContract,
    Side,
    SideNames,
    SideState,
    ZeroRowsState,
    materialize,
    scale_expression,
)


def sdpa_call(
    state: SideState,
    names: SideNames,
    output: t.Output,
    out: list[cst.BaseStatement],
    *,
    query: cst.BaseExpression,
    key: cst.BaseExpression,
    layout: Layout,
    upcast: bool,
    dropout: cst.BaseExpression | None,
    is_causal: str,
) -> cst.BaseExpression:
    """The SDPA call standing for the product with V, in the product's own layout; statements it needs go to `out`."""
    if state.mask_var:
        mask_code = names.mask
    elif state.mask is not None:
        mask_code = code(state.mask)
    else:
        mask_code = ""
    value = output.value
    operand = query
    if layout.heads is not None:
        query = unflatten(query, layout.heads)
        key = unflatten(key, layout.heads)
        if layout.unflatten_value:
            value = unflatten(value, layout.heads)
    value_for_call = value
    if upcast:
        dtype = cst.Attribute(value=query_root(operand), attr=cst.Name("dtype"))
        value_for_call = cst.Call(
            func=cst.Attribute(value=primary(value), attr=cst.Name("to")), args=[cst.Arg(dtype)]
        )
        if mask_code:
            out.extend(materialize(state, names, {Side.MASK}) if not state.mask_var else [])
            cast = assignment(
                names.mask,
                cst.Call(func=cst.Attribute(value=cst.Name(names.mask), attr=cst.Name("to")), args=[cst.Arg(dtype)]),
            )
            out.append(if_not_none(names.mask, cast) if state.mask_maybe_none else cast)
            mask_code = names.mask
    dropout_code = code(dropout) if dropout is not None else ""
    call_module = render_module(
        "class_style/sdpa_call.py.jinja",
        query=code(query),
        key=code(key),
        value=code(value_for_call),
        attn_mask=mask_code,
        dropout_p=dropout_code,
        scale=code(scale_expression(state, names)),
        is_causal=is_causal,
    )
    call_statement = call_module.body[0]
    assert isinstance(call_statement, cst.SimpleStatementLine) and isinstance(call_statement.body[0], cst.Expr)
    call: cst.BaseExpression = call_statement.body[0].value
    if layout.flatten_output:
        call = cst.Call(
            func=cst.Attribute(value=call, attr=cst.Name("flatten")),
            args=[cst.Arg(cst.Integer("0")), cst.Arg(cst.Integer("1"))],
        )
    if output.single:
        call = squeezed(call)  # SDPA's query axis of 1, which the single-query output has not
    # the einsum's own output order, read on the layout it was written for (flat when the operands were)
    call = permuted(call, output.order)
    if output.value_left:
        # eager's `value @ probs^T` is contiguous, SDPA's output transposed back is not: made so, a later `view` of
        # it merging dimensions runs as on eager's
        call = cst.Call(func=cst.Attribute(value=call, attr=cst.Name("contiguous")))
    if upcast:
        call = cst.Call(
            func=cst.Attribute(value=call, attr=cst.Name("to")),
            args=[cst.Arg(cst.Attribute(value=primary(output.value), attr=cst.Name("dtype")))],
        )
    return call


def zero_output(
    rows: ZeroRowsState, names: SideNames, layout: Layout, small: cst.BaseSmallStatement, plan: t.OutputStmt
) -> list[cst.BaseStatement]:
    """`out = out.masked_fill(sdpa_zero_rows, 0.0)` after `out = <product with V>`: the rows eager zeroed."""
    if rows is ZeroRowsState.ABSENT:
        return []
    single = (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and small.value is plan.output.node
    )
    if not single:
        raise Refuse(
            Code.LAYOUT,
            "the probabilities are zeroed where every key is masked, and the product with V is not assigned to a "
            "name on its own, where the zeroing could follow it",
        )
    assert isinstance(small, cst.Assign) and isinstance(small.targets[0].target, cst.Name)
    name = small.targets[0].target.value
    # the rows are SDPA's, `(batch, heads or 1, q, 1)`: the output is brought to that layout (out of an einsum's
    # order, split into heads when flat), zeroed, and put back
    order = plan.output.order
    target: cst.BaseExpression = permuted(cst.Name(name), inverse(order) if order else None)
    flat = layout.flatten_output and layout.heads is not None
    if flat:
        assert layout.heads is not None
        target = unflatten(target, layout.heads)
    zeroed: cst.BaseExpression = cst.Call(
        func=cst.Attribute(value=primary(target), attr=cst.Name("masked_fill")),
        args=[cst.Arg(cst.Name(names.zero_rows), comma=COMMA), cst.Arg(cst.Float("0.0"))],
    )
    if flat:
        zeroed = cst.Call(
            func=cst.Attribute(value=zeroed, attr=cst.Name("flatten")),
            args=[cst.Arg(cst.Integer("0"), comma=COMMA), cst.Arg(cst.Integer("1"))],
        )
    statement = assignment(name, permuted(zeroed, order))
    return [if_not_none(names.zero_rows, statement) if rows is ZeroRowsState.MAYBE else statement]


def finalize_causal(
    state: SideState,
    names: SideNames,
    contract: MaskContract,
    out: list[cst.BaseStatement],
    query: cst.BaseExpression | None,
    key: cst.BaseExpression | None,
) -> str:
    """Emit the causal-buffer decision; return the `is_causal=` argument code ('' when always False)."""
    if state.causal_fill is None:
        return causal_contract(state, names, contract, out, query)
    if not state.mask_var:
        out.extend(materialize(state, names, {Side.MASK}))
    guard = state.causal_var
    causal = names.causal if guard else code(state.causal)  # type: ignore[arg-type]
    mask_set = not state.mask_maybe_none
    out.extend(
        render_statements(
            "class_style/causal_mask.py.jinja",
            guard=guard,
            causal=causal,
            mask=names.mask,
            mask_set=mask_set,
            is_causal=names.is_causal,
            query=code(query_root(query)),
            key=code(primary(key)) if key is not None else "",
            fill=code(state.causal_fill),
            # zeros of the query's dtype where the fill is a number: two Python numbers make a float32 mask, which
            # cannot hold `finfo(float64).min`; beside a 0-d tensor fill `0.0` takes the tensor's dtype
            zero=f"{code(query_root(query))}.new_zeros(())" if m.matches(state.causal_fill, FINFO_MIN) else "0.0",
        )
    )
    state.mask_maybe_none, state.mask_none = True, False
    return "" if mask_set else names.is_causal

def causal_contract(
    state: SideState,
    names: SideNames,
    contract: MaskContract,
    out: list[cst.BaseStatement],
    query: cst.BaseExpression | None,
) -> str:
    """Layers fed by `_prepare_4d_causal_attention_mask_for_sdpa` get None for a plain causal mask.

    The plan sets the contract only where the mask parameter is the chain's only masking term, so here the mask
    is exactly that nullable parameter; anything else would silently turn a causal layer bidirectional.
    """
    when_none = contract.causal_when_none
    if when_none is None:
        return ""
    if state.mask_var and state.mask_maybe_none:
        mask = names.mask
    elif not state.mask_var and state.mask is not None and state.mask_nullable:
        mask = code(state.mask)
    else:
        raise Refuse(
            Code.CAUSAL_BY_USE,
            "the mask may arrive as None for a causal layer, but it is not the chain's only masking term",
        )
    root = code(query_root(query))
    out.append(assignment(names.is_causal, expr(f"{mask} is None and {when_none} and {root}.size(-2) > 1")))
    return names.is_causal

