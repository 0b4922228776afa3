"""AttentionSite: the exact description of one eager attention computation (frozen, read-only)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scaling:
    """One multiplicative factor on the scores."""

    where: str  # "query" (before the product), "product" (baddbmm alpha), "scores", "after_terms"
    expression: str
    divide: bool
    conditional: bool


@dataclass(frozen=True)
class Term:
    """One additive contribution to the scores before the softmax."""

    kind: str  # "mask", "masked_fill", "causal_buffer", "position_bias", "other"
    expression: str
    conditional: bool
    line: int
    always: bool = True  # applied whenever its operands are not None (only `x is not None` tests enclose it)


@dataclass(frozen=True)
class AttentionSite:
    class_name: str
    method: str  # the method holding the computation: forward or a helper it calls
    owner: str  # the class that defines `method` (a base class when inherited)
    line: int  # line of the query-key product
    output_line: int  # line of the product with V
    query: str
    key: str
    value: str
    product: str  # matmul, bmm, operator, einsum, baddbmm
    layout: str  # "heads" (b, h, l, d), "flat" ((b*h), l, d), "flat->heads" (viewed per head for the mask)
    scaling: tuple[Scaling, ...]
    terms: tuple[Term, ...]
    softmax: str  # e.g. "functional(dim=-1)"; "+upcast" when computed in float32
    upcast: bool
    dropout: str | None  # the dropout probability expression, None without dropout
    head_mask: str | None  # the parameter that carries the head mask
    guards: int  # NaN guards (clamps to finfo.min) dropped
    causal: str  # "buffer" (a tril buffer slice), "mask" (only through the mask), "none"
    returns_weights: bool

    @property
    def scale_summary(self) -> str:
        if not self.scaling:
            return "none (scale=1.0)"
        parts = [f"{'/' if s.divide else '*'} {s.expression} [{s.where}{', conditional' if s.conditional else ''}]"
                 for s in self.scaling]
        return "; ".join(parts)

    def describe(self) -> str:
        lines = [
            f"{self.class_name}.{self.method} (line {self.line}-{self.output_line})",
            f"  q, k, v: {self.query}, {self.key}, {self.value}  [{self.product}, {self.layout}]",
            f"  scale: {self.scale_summary}",
        ]
        for term in self.terms:
            lines.append(f"  + {term.kind}: {term.expression}{' (conditional)' if term.conditional else ''}")
        lines.append(f"  softmax: {self.softmax}; dropout: {self.dropout or 'none'}; head mask: {self.head_mask or 'none'}")
        return "\n".join(lines)
