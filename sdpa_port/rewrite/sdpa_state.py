"""The side values an SDPA emitter tracks through a body (scale, masks, rows to zero), and their variables."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

import libcst as cst

from sdpa_port.analyse.cstutil import assignment, binary
from sdpa_port.analyse.patterns import walk_names
from sdpa_port.refusals import Code, Refuse


class Side(enum.Enum):
    """The side values the chain's operations update in place of the scores."""

    SCALE = "scale"  # SDPA's scale=
    MASK = "mask"  # the additive float mask
    CAUSAL = "causal"  # a pending causal-buffer condition
    ZERO_ROWS = "zero_rows"  # query rows whose every key is masked, whose output is then 0


@dataclass(frozen=True)
class SideNames:
    mask: str = "sdpa_mask"
    scale: str = "sdpa_scale"
    causal: str = "sdpa_causal"
    is_causal: str = "sdpa_is_causal"
    query: str = "sdpa_query"
    key: str = "sdpa_key"
    scores_shape: str = "scores_shape"
    term: str = "sdpa_term"
    zero_rows: str = "sdpa_zero_rows"
    batch: str = "sdpa_batch"
    heads: str = "sdpa_heads"

    @classmethod
    def avoiding(cls, taken: set[str]) -> "SideNames":
        values = {}
        for name, default in cls().__dict__.items():
            candidate = default
            while candidate in taken:
                candidate = "_" + candidate
            values[name] = candidate
        return cls(**values)


class ZeroRowsState(enum.Enum):
    """Whether the path so far computed which query rows to zero (`sdpa_zero_rows`)."""

    ABSENT = "absent"
    SET = "set"
    MAYBE = "maybe"  # in some branches only: the variable may still be None


@dataclass
class SideState:
    """The side values at one point of the walk; Known expressions until a branch forces variables."""

    scale_factors: list[tuple[cst.BaseExpression, bool]] = field(default_factory=list)
    scale_var: bool = False
    mask: cst.BaseExpression | None = None
    mask_nullable: bool = False  # a known mask that may be None at run time (`attention_mask`)
    mask_var: bool = False
    mask_maybe_none: bool = True
    mask_none: bool = False  # the variable holds the None it was made with: nothing has been added to it yet
    causal: cst.BaseExpression | None = None  # condition of a causal-buffer fill, while known
    causal_var: bool = False
    causal_fill: cst.BaseExpression | None = None
    zero_rows: ZeroRowsState = ZeroRowsState.ABSENT
    zero_rows_var: bool = False  # `sdpa_zero_rows = None` is emitted before a branch that may set it

    def copy(self) -> "SideState":
        return replace(self, scale_factors=list(self.scale_factors))

    @property
    def mask_may_be_empty(self) -> bool:
        """On some path nothing has joined the mask yet: a term added now may be the whole mask."""
        if self.mask_var:
            return self.mask_none or self.mask_maybe_none
        return self.mask is None or self.mask_nullable

    def same_known(self, other: "SideState") -> bool:
        """The same variables, and the same known (not yet variable) values."""
        if (self.scale_var, self.mask_var, self.causal_var) != (other.scale_var, other.mask_var, other.causal_var):
            return False
        if not self.scale_var and not same_factors(self.scale_factors, other.scale_factors):
            return False
        if not self.mask_var and (
            not same_node(self.mask, other.mask) or self.mask_nullable != other.mask_nullable
        ):
            return False
        return self.causal_var or same_node(self.causal, other.causal)


@dataclass(frozen=True)
class MaskContract:
    """What the SDPA forward may receive as its mask once the model builds masks with the `_for_sdpa` helpers.

    Those helpers give None for a batch without padding; the SDPA path then treats None as "no mask" (and the
    additive mask becomes nullable), and for a causal module as "causal" (`is_causal=True`), when the mask is the
    chain's only masking term and the call is self-attention.
    """

    nullable: frozenset[str] = frozenset()  # mask parameters that may arrive as None
    # code true when a None mask means causal, e.g. "self.is_causal and encoder_hidden_states is None"
    causal_when_none: str | None = None
    # names holding a caller's tensors whose dtype the plan does not prove (the forward's parameters, where its callers
    # are not followed): a term read from them is handed to SDPA in the query's dtype (`term_dtype.py`)
    unproven: frozenset[str] = frozenset()


@dataclass(frozen=True)
class EmitOptions:
    names: SideNames
    contract: MaskContract = MaskContract()


def same_node(a: cst.CSTNode | None, b: cst.CSTNode | None) -> bool:
    if a is None or b is None:
        return a is b
    return a is b or a.deep_equals(b)


def same_factors(a: list[tuple[cst.BaseExpression, bool]], b: list[tuple[cst.BaseExpression, bool]]) -> bool:
    return len(a) == len(b) and all(x[1] == y[1] and same_node(x[0], y[0]) for x, y in zip(a, b))


def materialize(state: SideState, names: SideNames, kinds: set[Side]) -> list[cst.BaseStatement]:
    """Make the side values of `kinds` variables: assign each its known value, once."""
    out: list[cst.BaseStatement] = []
    if Side.SCALE in kinds and not state.scale_var:
        out.append(assignment(names.scale, scale_expression(state, names)))
        state.scale_var = True
        state.scale_factors = []
    if Side.MASK in kinds and not state.mask_var:
        out.append(assignment(names.mask, state.mask if state.mask is not None else cst.Name("None")))
        state.mask_maybe_none = state.mask is None or state.mask_nullable
        state.mask_none = state.mask is None
        state.mask = None
        state.mask_nullable = False
        state.mask_var = True
    if Side.CAUSAL in kinds and not state.causal_var:
        out.append(assignment(names.causal, state.causal if state.causal is not None else cst.Name("None")))
        state.causal = None
        state.causal_var = True
    if Side.ZERO_ROWS in kinds and not state.zero_rows_var:
        if state.zero_rows is ZeroRowsState.ABSENT:
            out.append(assignment(names.zero_rows, cst.Name("None")))
        state.zero_rows_var = True
    return out


def materialize_for(state: SideState, names: SideNames, assigned: set[str]) -> list[cst.BaseStatement]:
    """Known side values that read a name about to be reassigned become variables first."""
    if not assigned:
        return []
    kinds: set[Side] = set()
    if any(walk_names(f) & assigned for f, _ in state.scale_factors):
        kinds.add(Side.SCALE)
    if state.mask is not None and walk_names(state.mask) & assigned:
        kinds.add(Side.MASK)
    if state.causal is not None and walk_names(state.causal) & assigned:
        kinds.add(Side.CAUSAL)
    return materialize(state, names, kinds)


def scale_expression(state: SideState, names: SideNames) -> cst.BaseExpression:
    """The `scale=` SDPA takes: the variable, or the known factors multiplied and divided out."""
    if state.scale_var:
        return cst.Name(names.scale)
    multiply = [f for f, divide in state.scale_factors if not divide]
    divide = [f for f, is_divide in state.scale_factors if is_divide]
    result: cst.BaseExpression | None = None
    for factor in multiply:
        result = factor if result is None else binary(result, cst.Multiply(), factor)
    for factor in divide:
        left = result if result is not None else cst.Float("1.0")
        result = binary(left, cst.Divide(), factor)
    return result if result is not None else cst.Float("1.0")


def merged(ends: list[SideState], line: int) -> SideState:
    """One state after the branches; branches that leave a known side value differently are refused.

    Side values a branch changes were made variables before the `if` (`chain_kinds`), so every branch updates
    the same variable; what may still differ is which branches set the causal fill, recorded once for all.
    """
    first = ends[0]
    for other in ends[1:]:
        if not first.same_known(other):
            raise Refuse(
                Code.CONDITIONAL,
                "the branches of an `if` leave the scale, the mask or the causal mask in different states",
                line=line,
            )
    merged = first.copy()
    merged.mask_maybe_none = any(s.mask_maybe_none for s in ends)
    merged.mask_none = all(s.mask_none for s in ends)
    zero_rows = {s.zero_rows for s in ends}
    if len(zero_rows) > 1:
        if not merged.zero_rows_var:
            raise Refuse(
                Code.CONDITIONAL, "the rows to zero are computed in some branches only", line=line
            )
        merged.zero_rows = ZeroRowsState.MAYBE
    fills = [s.causal_fill for s in ends if s.causal_fill is not None]
    if fills:
        if not all(fill.deep_equals(fills[0]) for fill in fills):
            raise Refuse(
                Code.CONDITIONAL, "the branches of an `if` mask causally with different values", line=line
            )
        if len(fills) != len(ends) and not merged.causal_var:
            raise Refuse(
                Code.CONDITIONAL, "the causal mask is applied in some branches only", line=line
            )
        merged.causal_fill = fills[0]
    return merged
