"""Summarise a traced chain as an AttentionSite, the frozen facts planners and reviewers read."""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.site import AttentionSite, CausalSource, Dropout, Layout, Scaling, ScaleSite, Term, TermKind


def describe(
    facts: ModuleFacts,
    class_name: str,
    method: str,
    owner: str,
    candidate: t.Candidate,
    result: t.TraceResult,
) -> AttentionSite:
    """Summarise a traced chain as the frozen facts reviewers read."""
    start = candidate.start
    assert start is not None
    scaling: list[Scaling] = []
    terms: list[Term] = []
    seen_term = False
    guards = 0
    zero_rows = False
    softmax = ""
    upcast = start.upcast
    dropout: Dropout | None = None
    head_mask: str | None = None
    causal = CausalSource.NONE
    output_line = candidate.start_line
    values: list[str] = []  # of each product with V
    layout = Layout.HEADS if start.rank in (4, None) else Layout.FLAT
    query_scale = start.query_scale
    if query_scale is not None:
        scaling.append(Scaling(ScaleSite.QUERY, code(query_scale[0]), query_scale[1], False))
    # depths count from the product's own: a computation wholly inside one branch is unconditional within it
    start_depth = min((depth for _, depth, _ in candidate.ops), default=0)
    for op, depth, line in candidate.ops:
        conditional = depth > start_depth
        match op:
            case t.Scale():
                if op.per_query:
                    where = ScaleSite.QUERY
                elif not scaling and not seen_term and start.product.form is p.ProductForm.BADDBMM:
                    where = ScaleSite.PRODUCT
                else:
                    where = ScaleSite.AFTER_TERMS if seen_term else ScaleSite.SCORES
                scaling.append(Scaling(where, code(op.factor), op.divide, conditional))
            case t.AddTerm():
                seen_term = True
                terms.append(Term(_term_kind(op.term, result.params), code(op.term), conditional, line, op.always))
            case t.Fill():
                seen_term = True
                if op.causal:
                    causal = CausalSource.BUFFER
                kind = TermKind.CAUSAL_BUFFER if op.causal else TermKind.MASKED_FILL
                terms.append(Term(kind, code(op.condition), conditional, line))
            case t.Guard():
                guards += 1
            case t.ZeroRows():
                zero_rows = True
            case t.Softmax():
                call = op.call
                dim = code(call.dim) if call.dim is not None else "-1"
                softmax = f"{call.form.value}(dim={dim})"
                upcast = upcast or call.upcast
            case t.Cast():
                upcast = upcast or op.upcast
            case t.Dropout():
                # inside its own `if self.dropout is not None:`, the dropout is as conditional as that `if`
                own_depth = depth - 1 if op.guard is not None else depth
                dropout = Dropout(code(op.call.probability), own_depth > start_depth)
            case t.HeadMask():
                head_mask = op.root
            case t.View():
                if op.heads is not None:
                    layout = Layout.FLAT_TO_HEADS
            case t.Output():
                if not values:
                    output_line = line
                values.append(code(op.value))
            case t.Start() | t.Shift():
                pass
            case _:
                t.unreachable(op)
    if causal is CausalSource.NONE and any(term.kind is TermKind.MASK for term in terms):
        causal = CausalSource.MASK
    queries, keys = candidate.operands()
    return AttentionSite(
        class_name=class_name,
        method=method,
        owner=owner,
        line=candidate.start_line,
        output_line=output_line,
        query=code(queries),
        key=code(keys),
        value=values[0] if values else "",
        product=start.product.form,
        layout=layout,
        scaling=tuple(scaling),
        terms=tuple(terms),
        softmax=softmax + ("+upcast" if upcast else ""),
        upcast=upcast,
        dropout=dropout,
        head_mask=head_mask,
        guards=guards,
        zero_rows=zero_rows,
        causal=causal,
        returns_weights=bool(result.probs_names_after_output),
        more_values=tuple(values[1:]),
    )


def _term_kind(term: cst.BaseExpression, params: tuple[str, ...]) -> TermKind:
    names = p.walk_names(term)
    roots = [n for n in names if n in params]
    if isinstance(term, cst.Name) and term.value in params:
        return TermKind.MASK if "mask" in term.value else TermKind.PARAMETER
    if any("bias" in n for n in names):
        return TermKind.POSITION_BIAS
    if roots and all("mask" in n for n in roots):
        return TermKind.MASK
    return TermKind.OTHER
