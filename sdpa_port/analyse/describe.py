"""Summarise a traced chain as an AttentionSite, the frozen facts planners and reviewers read."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    read = _Reading(start, result.params, output_line=candidate.start_line, upcast=start.upcast)
    read.layout = Layout.HEADS if start.rank in (4, None) else Layout.FLAT
    query_scale = start.query_scale
    if query_scale is not None:
        read.scaling.append(Scaling(ScaleSite.QUERY, code(query_scale[0]), query_scale[1], False))
    # depths count from the product's own: a computation wholly inside one branch is unconditional within it
    start_depth = min((depth for _, depth, _ in candidate.ops), default=0)
    for op, depth, line in candidate.ops:
        read.take(op, depth, line, start_depth)
    causal = read.causal
    if causal is CausalSource.NONE and any(term.kind is TermKind.MASK for term in read.terms):
        causal = CausalSource.MASK
    queries, keys = candidate.operands()
    return AttentionSite(
        class_name=class_name,
        method=method,
        owner=owner,
        line=candidate.start_line,
        output_line=read.output_line,
        query=code(queries),
        key=code(keys),
        value=read.values[0] if read.values else "",
        product=start.product.form,
        layout=read.layout,
        scaling=tuple(read.scaling),
        terms=tuple(read.terms),
        softmax=read.softmax + ("+upcast" if read.upcast else ""),
        upcast=read.upcast,
        dropout=read.dropout,
        head_mask=read.head_mask,
        guards=read.guards,
        zero_rows=read.zero_rows,
        causal=causal,
        returns_weights=bool(result.probs_names_after_output),
        more_values=tuple(read.values[1:]),
    )


@dataclass
class _Reading:
    """What `describe` has read so far of a chain's operations, in order."""

    start: t.Start
    params: tuple[str, ...]  # the traced function's parameters
    output_line: int
    upcast: bool
    scaling: list[Scaling] = field(default_factory=list)
    terms: list[Term] = field(default_factory=list)
    seen_term: bool = False
    guards: int = 0
    zero_rows: bool = False
    softmax: str = ""
    dropout: Dropout | None = None
    head_mask: str | None = None
    causal: CausalSource = CausalSource.NONE
    values: list[str] = field(default_factory=list)  # of each product with V
    layout: Layout = Layout.HEADS

    def take(self, op: t.Op, depth: int, line: int, start_depth: int) -> None:
        """Read one operation at `depth` on `line`; `start_depth` is the product's own."""
        conditional = depth > start_depth
        match op:
            case t.Scale():
                if op.per_query:
                    where = ScaleSite.QUERY
                elif not self.scaling and not self.seen_term and self.start.product.form is p.ProductForm.BADDBMM:
                    where = ScaleSite.PRODUCT
                else:
                    where = ScaleSite.AFTER_TERMS if self.seen_term else ScaleSite.SCORES
                self.scaling.append(Scaling(where, code(op.factor), op.divide, conditional))
            case t.AddTerm():
                self.seen_term = True
                self.terms.append(Term(_term_kind(op.term, self.params), code(op.term), conditional, line, op.always))
            case t.Fill():
                self.seen_term = True
                if op.causal:
                    self.causal = CausalSource.BUFFER
                kind = TermKind.CAUSAL_BUFFER if op.causal else TermKind.MASKED_FILL
                self.terms.append(Term(kind, code(op.condition), conditional, line))
            case t.Guard():
                self.guards += 1
            case t.ZeroRows():
                self.zero_rows = True
            case t.Softmax():
                call = op.call
                dim = code(call.dim) if call.dim is not None else "-1"
                self.softmax = f"{call.form.value}(dim={dim})"
                self.upcast = self.upcast or call.upcast
            case t.Cast():
                self.upcast = self.upcast or op.upcast
            case t.Dropout():
                # inside its own `if self.dropout is not None:`, the dropout is as conditional as that `if`
                own_depth = depth - 1 if op.guard is not None else depth
                self.dropout = Dropout(code(op.call.probability), own_depth > start_depth)
            case t.HeadMask():
                self.head_mask = op.root
            case t.View():
                if op.heads is not None:
                    self.layout = Layout.FLAT_TO_HEADS
            case t.Output():
                if not self.values:
                    self.output_line = line
                self.values.append(code(op.value))
            case t.Start() | t.Shift() | t.Transpose():
                pass
            case _:
                t.unreachable(op)


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
