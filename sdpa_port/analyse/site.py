"""AttentionSite: the exact description of one eager attention computation (frozen, read-only)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sdpa_port.analyse.patterns import ProductForm


class ScaleSite(enum.Enum):
    """Where a factor multiplies the computation."""

    QUERY = "query"  # the query, before the product
    PRODUCT = "product"  # baddbmm's alpha
    SCORES = "scores"  # the scores, before any additive term
    AFTER_TERMS = "after_terms"  # the scores with terms already added (the terms are scaled too)


class TermKind(enum.Enum):
    """What an additive contribution to the scores is."""

    MASK = "mask"  # a mask parameter
    PARAMETER = "parameter"  # another parameter added as is
    MASKED_FILL = "masked_fill"  # a masking fill, folded into the mask
    CAUSAL_BUFFER = "causal_buffer"  # a bottom-right slice of a causal buffer
    POSITION_BIAS = "position_bias"  # a term computed from a bias (ALiBi, relative positions)
    OTHER = "other"


class Layout(enum.Enum):
    HEADS = "heads"  # (batch, heads, length, dim)
    FLAT = "flat"  # (batch * heads, length, dim)
    FLAT_TO_HEADS = "flat->heads"  # flat products, viewed per head for the mask


class CausalSource(enum.Enum):
    BUFFER = "buffer"  # a tril buffer slice
    MASK = "mask"  # only through the mask
    NONE = "none"


@dataclass(frozen=True)
class Dropout:
    """The dropout on the probabilities: its probability expression, and whether it applies only under a condition."""

    probability: str
    conditional: bool = False


@dataclass(frozen=True)
class Scaling:
    """One multiplicative factor on the scores."""

    where: ScaleSite
    expression: str
    divide: bool
    conditional: bool


@dataclass(frozen=True)
class Term:
    """One additive contribution to the scores before the softmax."""

    kind: TermKind
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
    product: ProductForm
    layout: Layout
    scaling: tuple[Scaling, ...]
    terms: tuple[Term, ...]
    softmax: str  # e.g. "functional(dim=-1)"; "+upcast" when computed in float32
    upcast: bool
    dropout: Dropout | None  # None without dropout
    head_mask: str | None  # the parameter that carries the head mask
    guards: int  # floors on the scores (clamps to finfo.min), moved onto the mask
    causal: CausalSource
    returns_weights: bool
    zero_rows: bool = False  # the probabilities are zeroed at masked keys: rows masked whole give 0
    # the values of further products with the same probabilities (LiLT's text values beside its layout values): one
    # SDPA call each, with the same query, key, mask and scale
    more_values: tuple[str, ...] = ()

    @property
    def scale_summary(self) -> str:
        if not self.scaling:
            return "none (scale=1.0)"
        parts = [f"{'/' if s.divide else '*'} {s.expression} [{s.where.value}{', conditional' if s.conditional else ''}]"
                 for s in self.scaling]
        return "; ".join(parts)

    def describe(self) -> str:
        lines = [
            f"{self.class_name}.{self.method} (line {self.line}-{self.output_line})",
            f"  q, k, v: {self.query}, {self.key}, {', '.join((self.value, *self.more_values))}  "
            f"[{self.product.value}, {self.layout.value}]",
            f"  scale: {self.scale_summary}",
        ]
        for term in self.terms:
            lines.append(f"  + {term.kind.value}: {term.expression}{' (conditional)' if term.conditional else ''}")
        dropout = self.dropout.probability if self.dropout else "none"
        lines.append(f"  softmax: {self.softmax}; dropout: {dropout}; head mask: {self.head_mask or 'none'}")
        if self.zero_rows:
            lines.append("  rows whose every key is masked: 0")
        return "\n".join(lines)
