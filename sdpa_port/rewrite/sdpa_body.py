"""Rewrite a traced function body so its eager attention chain becomes one SDPA call.

Statements that only advanced the chain disappear; their effect is re-targeted onto side values: the scale
(`sdpa_scale`), the additive float mask (`sdpa_mask`) and a pending causal-buffer mask (`sdpa_causal`). These stay
compile-time expressions while they are unconditional and become variables only when a branch changes them.
The statement holding the product with V gets the SDPA call in place of that product.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import (
    assigned_names,
    assignment,
    binary,
    block_body,
    code,
    expr,
    if_chain,
    nodes_in,
    parenthesized,
    plus,
    primary,
    rebuild_if,
)
from sdpa_port.rewrite.edit import replace_names, replace_nodes
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.analyse.patterns import DropoutCall, cast_operand, inverse, least_rank, permuted, walk_names
from sdpa_port.refusals import Code, Refuse
from sdpa_port.render import render_module, render_statements
from sdpa_port.rewrite.walk import StatementWalker


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

    @classmethod
    def avoiding(cls, taken: set[str]) -> "SideNames":
        values = {}
        for name, default in cls().__dict__.items():
            candidate = default
            while candidate in taken:
                candidate = "_" + candidate
            values[name] = candidate
        return cls(**values)


@dataclass(frozen=True)
class Layout:
    """How the SDPA call sees the operands: unflatten `(b*h, l, d)` operands with `heads`, flatten the result back."""

    heads: tuple[cst.BaseExpression, cst.BaseExpression] | None
    unflatten_value: bool
    flatten_output: bool


class ZeroRowsState(enum.Enum):
    """Whether the path so far computed which query rows to zero (`sdpa_zero_rows`)."""

    ABSENT = "absent"
    SET = "set"
    MAYBE = "maybe"  # in some branches only: the variable may still be None


def whole_chain_branch(node: cst.If, plans: Mapping[cst.CSTNode, t.StmtPlan]) -> cst.If | cst.Else | None:
    """The one branch of an if-chain holding every chain statement, from the product to the product with V
    (when the chain starts before the `if`, the branches share it and are handled as a whole)."""
    holding = [branch for branch in if_chain(node) if nodes_in(branch.body, plans)]
    if len(holding) != 1 or (isinstance(holding[0], cst.If) and nodes_in(holding[0].test, plans)):
        return None
    found = [plans[n] for n in nodes_in(holding[0].body, plans)]
    starts = any(isinstance(op, t.Start) for plan in found if isinstance(plan, t.ChainStmt) for op in plan.ops)
    ends = any(isinstance(plan, t.OutputStmt) for plan in found)
    return holding[0] if starts and ends else None


@dataclass
class _State:
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

    def copy(self) -> "_State":
        return replace(self, scale_factors=list(self.scale_factors))

    def same_known(self, other: "_State") -> bool:
        """The same variables, and the same known (not yet variable) values."""
        if (self.scale_var, self.mask_var, self.causal_var) != (other.scale_var, other.mask_var, other.causal_var):
            return False
        if not self.scale_var and not _same_factors(self.scale_factors, other.scale_factors):
            return False
        if not self.mask_var and (
            not _same_node(self.mask, other.mask) or self.mask_nullable != other.mask_nullable
        ):
            return False
        return self.causal_var or _same_node(self.causal, other.causal)


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


@dataclass(frozen=True)
class EmitOptions:
    names: SideNames
    contract: MaskContract = MaskContract()


class SdpaEmitter(StatementWalker):
    def __init__(
        self,
        path: SdpaPath,
        options: EmitOptions,
    ) -> None:
        self.plans = path.plans
        self.dropped_ifs = path.dropped_ifs
        self.path = path
        self.options = options
        self.names = options.names
        self.state = _State()
        self.dropout: cst.BaseExpression | None = None
        self.query: cst.BaseExpression | None = None
        self.key: cst.BaseExpression | None = None
        self.start: t.Start | None = None
        self.probs_after_output = path.probs_after_output
        self.layout = self.decide_layout()
        # scores laid out otherwise than (batch, heads, query, key): what is added to them is permuted to SDPA's mask
        start = path.start
        self.scores_layout = start.layout if start is not None else None
        # the 5-D shape the scores are viewed as, and their rank before
        self.regrouped: tuple[tuple[cst.BaseExpression, ...], int | None] | None = None
        # query and key are float32 copies: run SDPA in float32 and cast the result back, as eager does
        self.upcast = any(isinstance(op, t.Start) and op.operands_upcast for op in path.chain_ops)
        # names read by the statements the rewrite removed: their definitions may now be dead
        self.removed_reads: set[str] = set()
        self.shifted = False  # the row's maximum was subtracted from the scores (`Shift`)
        # names the enclosing `if` tests have shown not to be None, innermost last
        self.not_none: list[set[str]] = []

    def emit(self, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """The SDPA code of a function body: the walk, with the query handed to SDPA named where an operation read
        the scores' dtype or device through it (`trace.HANDED_QUERY`)."""
        body = self.block(statements)
        if self.query is None or not self.path.built:
            return body
        return [replace_names(s, {t.HANDED_QUERY: self.query_root()}) for s in body]

    # -------------------------------------------------------------- layout

    def decide_layout(self) -> Layout:
        ops = _outside_regroupings(self.path.chain_ops)
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
            if names & self.path.names_assigned_after_start:
                raise Refuse(Code.LAYOUT, "the batch or head size is reassigned inside the attention computation")
            value_rank = output.rank if output.rank is not None else 4
            return Layout(heads, value_rank == 3, value_rank == 3)
        for op in ops:
            if isinstance(op, t.View) and op.rank_before != op.rank_after and op.rank_before is not None:
                raise Refuse(Code.LAYOUT, "the scores change layout between the products")
        return Layout(None, False, False)

    # -------------------------------------------------------------- walking

    def line(self, statement: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        kept: list[cst.BaseSmallStatement] = []

        def flush() -> None:
            if kept:
                out.append(statement.with_changes(body=list(kept)) if not out else cst.SimpleStatementLine(body=list(kept)))
                kept.clear()

        for small in statement.body:
            plan = self.plans.get(small)
            if isinstance(plan, t.ChainStmt):
                flush()
                self.removed_reads |= walk_names(small)
                out.extend(self.chain_statement(plan))
            elif isinstance(plan, t.OutputStmt):
                flush()
                out.extend(self.output_statement(small, plan, statement))
            else:
                new_small = self.keep(small, plan)
                pre = self.materialize_for(self.assigned_by(small))
                if pre:
                    flush()
                    out.extend(pre)
                kept.append(new_small)
        if kept:
            if not out:
                out.append(statement.with_changes(body=list(kept)))
            else:
                out.append(cst.SimpleStatementLine(body=list(kept)))
        return out

    def keep(self, node: cst.CSTNode, plan: t.StmtPlan | None):  # type: ignore[no-untyped-def]
        if not isinstance(plan, t.KeepStmt):
            return node
        mapping: dict[cst.CSTNode, cst.CSTNode] = {}
        for found in nodes_in(node, plan.sizes):
            index = plan.sizes[found]
            if self.key is None:
                raise Refuse(Code.SCORES_READ, "the scores' shape is read before the query-key product")
            operand, dim = (self.query_root(), index) if index is not None else (primary(self.key), -2)
            mapping[found] = cst.Call(
                func=cst.Attribute(value=operand, attr=cst.Name("size")),
                args=[cst.Arg(cst.Integer(str(dim)) if dim >= 0 else cst.UnaryOperation(cst.Minus(), cst.Integer(str(-dim))))],
            )
        for found in nodes_in(node, plan.replacements):
            action = plan.replacements[found]
            if action is t.KeepAction.STRIP_EXPAND:
                assert isinstance(found, cst.Call) and isinstance(found.func, cst.Attribute)
                mapping[found] = found.func.value
            elif action is t.KeepAction.RESHAPE_AS and self.scores_layout is not None:
                raise Refuse(Code.LAYOUT, f"`{code(found)}` reshapes to scores laid out otherwise than SDPA's")
            elif action is t.KeepAction.RESHAPE_AS:
                assert isinstance(found, cst.Call) and isinstance(found.func, cst.Attribute)
                mapping[found] = cst.Call(
                    func=cst.Attribute(value=found.func.value, attr=cst.Name("reshape")), args=[cst.Arg(self.scores_shape())]
                )
            else:
                mapping[found] = cst.Attribute(value=self.query_root(), attr=cst.Name(action.value))
        return replace_nodes(node, mapping)

    def if_statement(self, node: cst.If) -> list[cst.BaseStatement]:
        if node in self.dropped_ifs:
            self.removed_reads |= walk_names(node)
            return []
        whole = self.whole_chain_branch(node)
        if whole is not None:
            # the product, its masks and the product with V all in one branch (the others compute the output some
            # other way, e.g. with xformers in training): only that branch changes
            kept: list[tuple[cst.If | cst.Else, list[cst.BaseStatement]]] = []
            for current in if_chain(node):
                if current is whole:
                    self.not_none.append(not_none_names(current.test) if isinstance(current, cst.If) else set())
                    kept.append((current, self.block(block_body(current.body))))
                    self.not_none.pop()
                else:
                    kept.append((current, self.kept_branch(current, list(block_body(current.body)))))
            return [rebuild_if(kept, lambda branch: self.keep(branch.test, self.plans.get(branch.test)))]
        touched = self.chain_kinds(node)
        guarded = self.none_guarded_term(node, touched)
        if guarded is not None:
            # `if mask is not None: scores = scores + mask` on an empty mask is just `mask`, None or not
            body = self.block(block_body(node.body))
            self.state.mask, self.state.mask_nullable = cst.Name(guarded), True
            return [node.with_changes(body=node.body.with_changes(body=body))] if body else []
        pre = self.materialize(touched) if touched else []
        before = self.state.copy()
        ends: list[_State] = []
        branches: list[tuple[cst.If | cst.Else, list[cst.BaseStatement]]] = []
        for current in if_chain(node):
            self.state = before.copy()
            checked = not_none_names(current.test) if isinstance(current, cst.If) else set()
            self.not_none.append(checked)
            body = self.block(block_body(current.body))
            self.not_none.pop()
            ends.append(self.state)
            branches.append((current, body))
        if not isinstance(branches[-1][0], cst.Else):
            ends.append(before)
        self.state = self.merge(ends, node)
        if all(not body for _, body in branches):
            return pre
        rebuilt = rebuild_if(branches, lambda branch: self.keep(branch.test, self.plans.get(branch.test)))
        return [*pre, rebuilt]

    def whole_chain_branch(self, node: cst.If) -> cst.If | cst.Else | None:
        return whole_chain_branch(node, self.plans)

    def kept_branch(self, branch: cst.If | cst.Else, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """A branch beside the one holding the whole computation: it runs as written."""
        return body

    def merge(self, ends: list[_State], node: cst.If) -> _State:
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
                    line=self.line_in(node),
                )
        merged = first.copy()
        merged.mask_maybe_none = any(s.mask_maybe_none for s in ends)
        merged.mask_none = all(s.mask_none for s in ends)
        zero_rows = {s.zero_rows for s in ends}
        if len(zero_rows) > 1:
            if not merged.zero_rows_var:
                raise Refuse(
                    Code.CONDITIONAL, "the rows to zero are computed in some branches only", line=self.line_in(node)
                )
            merged.zero_rows = ZeroRowsState.MAYBE
        fills = [s.causal_fill for s in ends if s.causal_fill is not None]
        if fills:
            if not all(fill.deep_equals(fills[0]) for fill in fills):
                raise Refuse(
                    Code.CONDITIONAL, "the branches of an `if` mask causally with different values", line=self.line_in(node)
                )
            if len(fills) != len(ends) and not merged.causal_var:
                raise Refuse(
                    Code.CONDITIONAL, "the causal mask is applied in some branches only", line=self.line_in(node)
                )
            merged.causal_fill = fills[0]
        return merged

    def line_in(self, node: cst.CSTNode) -> int:
        lines = [plan.line for plan in self.plans_in(node) if isinstance(plan, (t.ChainStmt, t.OutputStmt))]
        return min(lines) if lines else 0

    def none_guarded_term(self, node: cst.If, touched: set[Side]) -> str | None:
        state = self.state
        if touched != {Side.MASK} or node.orelse is not None or state.mask is not None or state.mask_var:
            return None
        # a single `x is not None` (not joined with others by `and`)
        guarded = not_none_names(node.test) if isinstance(node.test, cst.Comparison) else set()
        if not guarded:
            return None
        (name,) = guarded
        ops = [op for plan in self.plans_in(node) if isinstance(plan, t.ChainStmt) for op in plan.ops]
        terms = [op for op in ops if not isinstance(op, (t.View, t.Cast))]
        if len(terms) != 1 or not isinstance(terms[0], t.AddTerm):
            return None
        term = terms[0].term
        if self.regrouped is not None or (self.layout.heads is not None and terms[0].rank == 3):
            return None  # the term joins the mask reshaped (`rel.unflatten(0, ...)`), not as the name itself
        return name if isinstance(term, cst.Name) and term.value == name else None

    def plans_in(self, node: cst.CSTNode) -> list[t.StmtPlan]:
        return [self.plans[found] for found in nodes_in(node, self.plans)]

    def chain_kinds(self, node: cst.CSTNode) -> set[Side]:
        """Which side values the chain statements inside a compound statement change."""
        kinds: set[Side] = set()
        mask_present = self.state.mask is not None or self.state.mask_var
        for found in nodes_in(node, self.plans):
            plan = self.plans[found]
            if isinstance(plan, t.ChainStmt):
                for op in plan.ops:
                    if isinstance(op, t.Start):
                        if self.path.branched:
                            continue  # each branch computes its own product: it names its operands (`start_chain`)
                        raise Refuse(Code.CONDITIONAL, "the query-key product is computed under a condition", line=plan.line)
                    if isinstance(op, t.Scale):
                        kinds.add(Side.SCALE)
                        if mask_present or any(isinstance(o, (t.AddTerm, t.Fill)) for o in plan.ops):
                            kinds.add(Side.MASK)
                    elif isinstance(op, t.AddTerm):
                        kinds.add(Side.MASK)
                    elif isinstance(op, t.Fill):
                        # only the first causal fill becomes the causal mask; later ones join the float mask
                        kinds.add(Side.CAUSAL if op.causal and self.state.causal_fill is None else Side.MASK)
                    elif isinstance(op, t.Guard):
                        kinds.add(Side.MASK)
                    elif isinstance(op, t.ZeroRows):
                        kinds.add(Side.ZERO_ROWS)
                    elif isinstance(op, t.Dropout):
                        if isinstance(node, cst.If) and node.test is op.guard:
                            continue  # `if self.dropout is not None: p = self.dropout(p)`: its rate reads as 0.0
                        raise Refuse(Code.DROPOUT, "dropout is applied to the probabilities only under a condition")
        return kinds

    # -------------------------------------------------------------- chain statements

    def chain_statement(self, plan: t.ChainStmt) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for op in plan.ops:
            out.extend(self.apply(op))
        return out

    def apply(self, op: t.Op) -> list[cst.BaseStatement]:
        """The side-value update one chain operation stands for; every operation is decided here, none dropped."""
        state = self.state
        match op:
            case t.Start():
                return self.start_chain(op)
            case t.Scale():
                return self.scale(op)
            case t.AddTerm():
                term, rank = op.term, op.rank
                pre: list[cst.BaseStatement] = []
                if op.scores_arg is not None:
                    pre.append(assignment(self.names.scores_shape, self.scores_shape()))
                    term = self.with_zero_scores(term, op.scores_arg)
                if self.regrouped is not None:
                    term, rank = self.regrouped_term(term, self.regrouped[0]), self.regrouped[1]
                if self.scores_layout is not None:
                    if op.may_be_number:
                        raise Refuse(
                            Code.LAYOUT, f"`{code(term)}` may be a number or a tensor laid out as the scores are"
                        )
                    term = self.laid_out(term, op.term_rank)
                elif op.term_rank is not None and op.term_rank < 2 and not op.may_be_number:
                    # SDPA takes a mask of two dimensions or more; a term along the keys only (`torch.arange(k)`)
                    # broadcasts over the queries just as well with a leading dimension of 1
                    term = cst.Call(func=cst.parse_expression("torch.atleast_2d"), args=[cst.Arg(term)])
                if self.layout.heads is not None and rank == 3:
                    # a `(batch * heads, ...)` term (ALiBi through baddbmm) joins the per-head mask; a number (a
                    # helper's `score = 0`) joins as it is
                    reshaped = unflatten(term, self.layout.heads)
                    term = _tensor_only(reshaped, term) if op.may_be_number else reshaped
                return [*pre, *self.add_to_mask(term)]
            case t.View() if op.shape is not None and op.rank_after == 5:
                return self.regroup(op.shape, op.rank_before)
            case t.View() if self.regrouped is not None and op.rank_before == 5:
                self.regrouped = None
                return []
            case t.Fill() | t.Guard() if self.regrouped is not None:
                raise Refuse(Code.LAYOUT, "the scores are masked while regrouped into another shape")
            case t.Fill():
                if self.scores_layout is not None:
                    op = replace(op, condition=self.laid_out(op.condition, op.rank))
                if self.shifted and not op.absorbing:
                    raise Refuse(Code.FILL_VALUE, f"scores shifted by the row's maximum are set to `{code(op.fill)}`, which does not absorb them")
                if op.causal and state.causal_fill is None:
                    state.causal_fill = op.fill
                    if state.causal_var:
                        return [assignment(self.names.causal, op.condition)]
                    state.causal = op.condition
                    return []
                return self.fill_mask(op)
            case t.Guard():
                if self.shifted:
                    raise Refuse(Code.MASKED_ROWS, "the scores are floored after the row's maximum was subtracted")
                return self.floor_mask(op)
            case t.Shift():
                # the softmax ignores a shift the same for every key; a later fill must absorb the scores for the
                # shift not to change the weight of what it masks
                self.shifted = True
                return []
            case t.ZeroRows():
                return self.zero_rows(op)
            case t.Dropout():
                if self.dropout is not None:
                    raise Refuse(Code.DROPOUT, "dropout is applied twice to the probabilities")
                self.dropout = _dropout_expression(op.call)
                return []
            case t.HeadMask():
                raise Refuse(Code.PROBABILITIES_CHANGED, "a head mask is applied on the SDPA path")
            case t.View() | t.Cast() | t.Softmax():
                # SDPA reads the operands' layout (decide_layout), runs the softmax itself, and casts are decided
                # once for the whole call (operands upcast to float32)
                return []
            case t.Output():
                raise AssertionError("the product with V is emitted by output_statement")
            case _:
                t.unreachable(op)

    def laid_out(self, node: cst.BaseExpression, rank: int | None) -> cst.BaseExpression:
        """A term or mask condition broadcast against scores laid out otherwise than SDPA's (`Start.layout`), as
        SDPA's mask: given the scores' rank (leading dimensions of 1 added, as broadcasting adds them) and permuted
        as the scores are; broadcasting then permuting is permuting then broadcasting, so the entries are the same."""
        layout = self.scores_layout
        assert layout is not None
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
            nones = [cst.SubscriptElement(cst.Index(cst.Name("None")), comma=_COMMA) for _ in range(size - rank)]
            node = cst.Subscript(value=primary(node), slice=[*nones, cst.SubscriptElement(cst.Index(cst.Ellipsis()))])
        return permuted(node, layout)

    def regrouped_term(self, term: cst.BaseExpression, shape: tuple[cst.BaseExpression, ...]) -> cst.BaseExpression:
        """A term added to the scores viewed as `shape` (`scores.view(shape) + term`, viewed back): the same term
        on the scores' own shape, `(zeros(scores).view(shape) + term).view(scores)`; views keep the entries' order,
        so the sum is unchanged. `scores_shape` is assigned where the regrouping starts."""
        if self.query is None:
            raise Refuse(Code.SCORES_READ, "the scores are regrouped before the query-key product")
        scores_shape = cst.Name(self.names.scores_shape)
        zeros = cst.Call(func=cst.Attribute(value=primary(self.query), attr=cst.Name("new_zeros")), args=[cst.Arg(scores_shape)])
        viewed = cst.Call(
            func=cst.Attribute(value=zeros, attr=cst.Name("view")),
            args=[cst.Arg(size, comma=_COMMA) for size in shape[:-1]]
            + [cst.Arg(shape[-1])],
        )
        summed = plus(viewed, term)
        return cst.Call(func=cst.Attribute(value=primary(summed), attr=cst.Name("view")), args=[cst.Arg(scores_shape)])

    def with_zero_scores(self, term: cst.BaseExpression, index: int) -> cst.BaseExpression:
        """A call of a helper that adds to the scores it is given, given zeros of the scores' shape instead."""
        assert isinstance(term, cst.Call)
        if self.key is None:
            raise Refuse(Code.SCORES_READ, "the scores are handed to a helper before the query-key product")
        # the key has the scores' dtype and device, and is a plain name more often than the (scaled) query
        zeros = cst.Call(
            func=cst.Attribute(value=primary(self.key), attr=cst.Name("new_zeros")),
            args=[cst.Arg(cst.Name(self.names.scores_shape))],
        )
        args = list(term.args)
        args[index] = args[index].with_changes(value=zeros)
        return term.with_changes(args=args)

    def regroup(self, shape: tuple[cst.BaseExpression, ...], rank: int | None) -> list[cst.BaseStatement]:
        """Where the scores are regrouped: their shape, read from the query and the key."""
        self.regrouped = (shape, rank)
        return [assignment(self.names.scores_shape, self.scores_shape())]

    def scores_shape(self) -> cst.BaseExpression:
        """The shape of the query-key product, `query.shape[:-1] + key.shape[-2:-1]`."""
        if self.query is None or self.key is None:
            raise Refuse(Code.SCORES_READ, "the scores' shape is read before the query-key product")
        return binary(_shape_slice(self.query, ":-1"), cst.Add(), _shape_slice(self.key, "-2:-1"))

    def start_chain(self, op: t.Start) -> list[cst.BaseStatement]:
        self.start = op
        self.query, self.key = op.query, op.key
        out: list[cst.BaseStatement] = []
        rebound = self.path.names_assigned_after_start
        # an operand laid out for SDPA (an einsum's) or built (a joined matrix's) is named once: shapes and dtypes are
        # read from it; where branches each compute their own product, each names its operands the same
        built = self.path.built
        if walk_names(op.query) & rebound or op.orders[0] is not None or built:
            out.append(assignment(self.names.query, op.query))
            self.query = cst.Name(self.names.query)
        if walk_names(op.key) & rebound or op.orders[1] is not None or built:
            out.append(assignment(self.names.key, op.key))
            self.key = cst.Name(self.names.key)
        return out

    def scale(self, op: t.Scale) -> list[cst.BaseStatement]:
        state = self.state
        out: list[cst.BaseStatement] = []
        if op.per_query:
            # (q @ k.T) * f == (q * f) @ k.T for a factor the same along the keys; terms added before would be scaled
            if state.scale_var or state.mask_var or state.mask is not None or state.causal_fill is not None:
                raise Refuse(
                    Code.SCALE_NOT_A_NUMBER,
                    f"the scores are scaled by the tensor `{code(op.factor)}` after other terms or under a condition",
                )
            out.append(assignment(self.names.query, _binary(self.query_root(), op.factor, op.divide)))
            self.query = cst.Name(self.names.query)
            return out
        if state.scale_var:
            out.append(assignment(self.names.scale, _binary(cst.Name(self.names.scale), op.factor, op.divide)))
        else:
            state.scale_factors.append((op.factor, op.divide))
        if state.mask_var and not state.mask_none:
            update = assignment(self.names.mask, _binary(cst.Name(self.names.mask), op.factor, op.divide))
            out.append(_if_not_none(self.names.mask, update) if state.mask_maybe_none else update)
        elif state.mask is not None:
            if state.mask_nullable:
                out.extend(self.materialize({Side.MASK}))
                update = assignment(self.names.mask, _binary(cst.Name(self.names.mask), op.factor, op.divide))
                out.append(_if_not_none(self.names.mask, update))
            else:
                state.mask = _binary(state.mask, op.factor, op.divide)
        return out

    def zero_rows(self, op: t.ZeroRows) -> list[cst.BaseStatement]:
        """The query rows whose every key the condition masks, computed where the probabilities were zeroed (its
        names may change later); the output is zeroed there after the SDPA call."""
        if self.regrouped is not None:
            raise Refuse(Code.LAYOUT, "the probabilities are zeroed while the scores are regrouped into another shape")
        keyword = _keyword("keepdim", cst.Name("True"))
        method = "any" if op.keep_where_true else "all"
        rows: cst.BaseExpression = cst.Call(
            func=cst.Attribute(value=primary(op.condition), attr=cst.Name(method)),
            args=[cst.Arg(cst.UnaryOperation(cst.Minus(), cst.Integer("1")), comma=_COMMA), keyword],
        )
        if op.keep_where_true:
            rows = cst.UnaryOperation(cst.BitInvert(), rows)
        self.state.zero_rows = ZeroRowsState.SET
        return [assignment(self.names.zero_rows, rows)]

    def floor_mask(self, op: t.Guard) -> list[cst.BaseStatement]:
        """`max(scores + mask, bound)` is `scores + max(mask, bound)` for an absorbing bound (scores + bound == bound).

        Without a mask the scores are finite and the floor changes nothing.
        """
        state = self.state
        if not state.mask_var and state.mask is None or state.mask_var and state.mask_none:
            return []
        if not op.absorbing:
            raise Refuse(
                Code.MASKED_ROWS,
                f"the scores are floored at `{code(op.bound)}`, which does not absorb the scores, so the floor cannot "
                "move onto the mask",
            )
        if state.mask_nullable:
            return [*self.materialize({Side.MASK}), *self.floor_mask(op)]
        if not state.mask_var:
            state.mask = _clamp(state.mask, op.bound)  # type: ignore[arg-type]
            return []
        update = assignment(self.names.mask, _clamp(cst.Name(self.names.mask), op.bound))
        return [_if_not_none(self.names.mask, update) if state.mask_maybe_none else update]

    def nullable_parameter(self, term: cst.BaseExpression) -> str | None:
        """The mask parameter an additive term reads (`mask`, `mask.to(dtype)`), when it may arrive as None."""
        name = cast_operand(term)
        return name if name is not None and name in self.options.contract.nullable else None

    def add_nullable(self, term: cst.BaseExpression, name: str) -> list[cst.BaseStatement]:
        """`mask + <term of a parameter that may be None>`: the term only joins when it is not None."""
        state = self.state
        if state.mask is None and not state.mask_var:
            state.mask, state.mask_nullable = term, True
            return []
        pre = self.materialize({Side.MASK}) if not state.mask_var else []
        mask = cst.Name(self.names.mask)
        added = plus(mask, term)
        value: cst.BaseExpression = (
            term
            if state.mask_none
            else cst.IfExp(test=_is_none(self.names.mask), body=term, orelse=added)
            if state.mask_maybe_none
            else added
        )
        state.mask_none = False
        return [*pre, _if_not_none(name, assignment(self.names.mask, value))]

    def add_to_mask(self, term: cst.BaseExpression) -> list[cst.BaseStatement]:
        state = self.state
        nullable = self.nullable_parameter(term)
        if nullable is not None and not any(nullable in names for names in self.not_none):
            return self.add_nullable(term, nullable)
        pre = self.materialize({Side.MASK}) if state.mask_nullable else []
        if pre:
            return [*pre, *self.add_to_mask(term)]
        if not state.mask_var:
            state.mask = term if state.mask is None else plus(state.mask, term)
            return []
        if state.mask_none:
            state.mask_none = state.mask_maybe_none = False
            return [assignment(self.names.mask, term)]
        mask = cst.Name(self.names.mask)
        named: list[cst.BaseStatement] = []
        if state.mask_maybe_none and isinstance(term, (cst.Call, cst.IfExp)):
            # `term if mask is None else mask + term` names a computed term once
            named.append(assignment(self.names.term, term))
            term = cst.Name(self.names.term)
        added = plus(mask, term)
        if state.mask_maybe_none:
            value: cst.BaseExpression = cst.IfExp(
                test=_is_none(self.names.mask), body=term, orelse=added
            )
        else:
            value = added
        state.mask_maybe_none = False
        return [*named, assignment(self.names.mask, value)]

    def fill_mask(self, op: t.Fill) -> list[cst.BaseStatement]:
        """`where(keep, scores, fill)` / `masked_fill(masked, fill)` folded into the additive mask."""
        state = self.state
        if state.mask_nullable:
            return [*self.materialize({Side.MASK}), *self.fill_mask(op)]
        dtype_target = self.query_root()

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
        mask = cst.Name(self.names.mask)
        if state.mask_none:
            value: cst.BaseExpression = where(None)
        elif state.mask_maybe_none:
            value = cst.IfExp(test=_is_none(self.names.mask), body=where(None), orelse=where(mask))
        else:
            value = where(mask)
        state.mask_none = state.mask_maybe_none = False
        return [assignment(self.names.mask, value)]

    # -------------------------------------------------------------- materialisation

    def materialize(self, kinds: set[Side]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        state = self.state
        if Side.SCALE in kinds and not state.scale_var:
            out.append(assignment(self.names.scale, self.scale_expression()))
            state.scale_var = True
            state.scale_factors = []
        if Side.MASK in kinds and not state.mask_var:
            out.append(assignment(self.names.mask, state.mask if state.mask is not None else cst.Name("None")))
            state.mask_maybe_none = state.mask is None or state.mask_nullable
            state.mask_none = state.mask is None
            state.mask = None
            state.mask_nullable = False
            state.mask_var = True
        if Side.CAUSAL in kinds and not state.causal_var:
            out.append(assignment(self.names.causal, state.causal if state.causal is not None else cst.Name("None")))
            state.causal = None
            state.causal_var = True
        if Side.ZERO_ROWS in kinds and not state.zero_rows_var:
            if state.zero_rows is ZeroRowsState.ABSENT:
                out.append(assignment(self.names.zero_rows, cst.Name("None")))
            state.zero_rows_var = True
        return out

    def materialize_for(self, assigned: set[str]) -> list[cst.BaseStatement]:
        """Known side values that read a name about to be reassigned become variables first."""
        if not assigned:
            return []
        state = self.state
        kinds: set[Side] = set()
        if any(walk_names(f) & assigned for f, _ in state.scale_factors):
            kinds.add(Side.SCALE)
        if state.mask is not None and walk_names(state.mask) & assigned:
            kinds.add(Side.MASK)
        if state.causal is not None and walk_names(state.causal) & assigned:
            kinds.add(Side.CAUSAL)
        return self.materialize(kinds)

    def assigned_by(self, small: cst.CSTNode) -> set[str]:
        if isinstance(small, cst.Assign):
            return {n for target in small.targets for n in assigned_names(target.target)}
        if isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            return set(assigned_names(small.target))
        return set()

    def scale_expression(self) -> cst.BaseExpression:
        state = self.state
        if state.scale_var:
            return cst.Name(self.names.scale)
        multiply = [f for f, divide in state.scale_factors if not divide]
        divide = [f for f, is_divide in state.scale_factors if is_divide]
        result: cst.BaseExpression | None = None
        for factor in multiply:
            result = factor if result is None else binary(result, cst.Multiply(), factor)
        for factor in divide:
            left = result if result is not None else cst.Float("1.0")
            result = binary(left, cst.Divide(), factor)
        return result if result is not None else cst.Float("1.0")

    # -------------------------------------------------------------- output

    def query_root(self) -> cst.BaseExpression:
        if self.query is None:
            raise Refuse(Code.SCORES_READ, "the scores' dtype is read before the query-key product")
        return primary(self.query)

    def output_statement(
        self, small: cst.BaseSmallStatement, plan: t.OutputStmt, line: cst.SimpleStatementLine
    ) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for op in plan.ops:
            out.extend(self.apply(op))
        if self.query is None or self.key is None:
            raise Refuse(Code.UNKNOWN_PRODUCT, "the product with V has no recognised scores")
        is_causal = self.finalize_causal(out)
        state = self.state
        if state.mask_var:
            mask_code = self.names.mask
        elif state.mask is not None:
            mask_code = code(state.mask)
        else:
            mask_code = ""
        value = plan.output.value
        query, key = self.query, self.key
        layout = self.layout
        if layout.heads is not None:
            query = unflatten(query, layout.heads)
            key = unflatten(key, layout.heads)
            if layout.unflatten_value:
                value = unflatten(value, layout.heads)
        value_for_call = value
        if self.upcast:
            dtype = cst.Attribute(value=self.query_root(), attr=cst.Name("dtype"))
            value_for_call = cst.Call(
                func=cst.Attribute(value=primary(value), attr=cst.Name("to")), args=[cst.Arg(dtype)]
            )
            if mask_code:
                out.extend(self.materialize({Side.MASK}) if not state.mask_var else [])
                cast = assignment(
                    self.names.mask,
                    cst.Call(func=cst.Attribute(value=cst.Name(self.names.mask), attr=cst.Name("to")), args=[cst.Arg(dtype)]),
                )
                out.append(_if_not_none(self.names.mask, cast) if state.mask_maybe_none else cast)
                mask_code = self.names.mask
        dropout = code(self.dropout) if self.dropout is not None else ""
        call_module = render_module(
            "class_style/sdpa_call.py.jinja",
            query=code(query),
            key=code(key),
            value=code(value_for_call),
            attn_mask=mask_code,
            dropout_p=dropout,
            scale=code(self.scale_expression()),
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
        # the einsum's own output order, read on the layout it was written for (flat when the operands were)
        call = permuted(call, plan.output.order)
        if self.upcast:
            call = cst.Call(
                func=cst.Attribute(value=call, attr=cst.Name("to")),
                args=[cst.Arg(cst.Attribute(value=primary(plan.output.value), attr=cst.Name("dtype")))],
            )
        new_small = replace_nodes(small, {plan.output.node: call})
        zeroing = self.zero_output(small, plan)
        own = self.assigned_by(small)
        weights = [assignment(name, cst.Name("None")) for name in sorted(self.probs_after_output - own)]
        self.removed_reads.update(self.probs_after_output - own)
        if isinstance(small, cst.Return):
            # `return sdpa(...), weights`: the weights are None on the SDPA path
            out.extend(weights)
            out.append(line.with_changes(body=[new_small]))
        else:
            out.append(line.with_changes(body=[new_small]))
            out.extend(zeroing)
            out.extend(weights)
        self.removed_reads |= walk_names(plan.output.node) - walk_names(plan.output.value)
        return out

    def zero_output(self, small: cst.BaseSmallStatement, plan: t.OutputStmt) -> list[cst.BaseStatement]:
        """`out = out.masked_fill(sdpa_zero_rows, 0.0)` after `out = <product with V>`: the rows eager zeroed."""
        state = self.state.zero_rows
        if state is ZeroRowsState.ABSENT:
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
        flat = self.layout.flatten_output and self.layout.heads is not None
        if flat:
            assert self.layout.heads is not None
            target = unflatten(target, self.layout.heads)
        zeroed: cst.BaseExpression = cst.Call(
            func=cst.Attribute(value=primary(target), attr=cst.Name("masked_fill")),
            args=[cst.Arg(cst.Name(self.names.zero_rows), comma=_COMMA), cst.Arg(cst.Float("0.0"))],
        )
        if flat:
            zeroed = cst.Call(
                func=cst.Attribute(value=zeroed, attr=cst.Name("flatten")),
                args=[cst.Arg(cst.Integer("0"), comma=_COMMA), cst.Arg(cst.Integer("1"))],
            )
        statement = assignment(name, permuted(zeroed, order))
        return [_if_not_none(self.names.zero_rows, statement) if state is ZeroRowsState.MAYBE else statement]

    def finalize_causal(self, out: list[cst.BaseStatement]) -> str:
        """Emit the causal-buffer decision; return the `is_causal=` argument code ('' when always False)."""
        state = self.state
        if state.causal_fill is None:
            return self.causal_contract(out)
        if not state.mask_var:
            out.extend(self.materialize({Side.MASK}))
        guard = state.causal_var
        causal = self.names.causal if guard else code(state.causal)  # type: ignore[arg-type]
        mask_set = not state.mask_maybe_none
        out.extend(
            render_statements(
                "class_style/causal_mask.py.jinja",
                guard=guard,
                causal=causal,
                mask=self.names.mask,
                mask_set=mask_set,
                is_causal=self.names.is_causal,
                query=code(self.query_root()),
                key=code(primary(self.key)) if self.key is not None else "",
                fill=code(state.causal_fill),
            )
        )
        state.mask_maybe_none, state.mask_none = True, False
        return "" if mask_set else self.names.is_causal

    def causal_contract(self, out: list[cst.BaseStatement]) -> str:
        """Layers fed by `_prepare_4d_causal_attention_mask_for_sdpa` get None for a plain causal mask.

        The plan sets the contract only where the mask parameter is the chain's only masking term, so here the mask
        is exactly that nullable parameter; anything else would silently turn a causal layer bidirectional.
        """
        contract = self.options.contract.causal_when_none
        state = self.state
        if contract is None:
            return ""
        if state.mask_var and state.mask_maybe_none:
            mask = self.names.mask
        elif not state.mask_var and state.mask is not None and state.mask_nullable:
            mask = code(state.mask)
        else:
            raise Refuse(
                Code.CAUSAL_BY_USE,
                "the mask may arrive as None for a causal layer, but it is not the chain's only masking term",
            )
        query = code(self.query_root())
        out.append(assignment(self.names.is_causal, expr(f"{mask} is None and {contract} and {query}.size(-2) > 1")))
        return self.names.is_causal


# ------------------------------------------------------------------ small builders

_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value, keyword=cst.Name(name), equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def _is_none(name: str) -> cst.Comparison:
    return cst.Comparison(left=cst.Name(name), comparisons=[cst.ComparisonTarget(cst.Is(), cst.Name("None"))])


def _if_not_none(name: str, statement: cst.SimpleStatementLine) -> cst.If:
    test = cst.Comparison(left=cst.Name(name), comparisons=[cst.ComparisonTarget(cst.IsNot(), cst.Name("None"))])
    return cst.If(test=test, body=cst.IndentedBlock(body=[statement]))


def not_none_names(test: cst.BaseExpression) -> set[str]:
    """Names an `if` test shows are not None in its body: `x is not None`, alone or joined by `and`."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return not_none_names(test.left) | not_none_names(test.right)
    if (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    ):
        return {test.left.value}
    return set()


def _clamp(mask: cst.BaseExpression, bound: cst.BaseExpression) -> cst.Call:
    return cst.Call(
        func=cst.Attribute(value=primary(mask), attr=cst.Name("clamp")),
        args=[_keyword("min", bound)],
    )


def _same_node(a: cst.CSTNode | None, b: cst.CSTNode | None) -> bool:
    if a is None or b is None:
        return a is b
    return a is b or a.deep_equals(b)


def _same_factors(a: list[tuple[cst.BaseExpression, bool]], b: list[tuple[cst.BaseExpression, bool]]) -> bool:
    return len(a) == len(b) and all(x[1] == y[1] and _same_node(x[0], y[0]) for x, y in zip(a, b))


def _binary(left: cst.BaseExpression, factor: cst.BaseExpression, divide: bool) -> cst.BinaryOperation:
    return binary(left, cst.Divide() if divide else cst.Multiply(), factor)


def _shape_slice(node: cst.BaseExpression, bounds: str) -> cst.BaseExpression:
    """`node.shape[<bounds>]` for bounds such as `:-1` or `-2:-1`."""
    lower, upper = bounds.split(":")
    shape = cst.Attribute(value=primary(node), attr=cst.Name("shape"))
    return cst.Subscript(
        value=shape, slice=[cst.SubscriptElement(cst.Slice(lower=_integer(lower), upper=_integer(upper)))]
    )


def _integer(text: str) -> cst.BaseExpression | None:
    if not text:
        return None
    if text.startswith("-"):
        return cst.UnaryOperation(cst.Minus(), cst.Integer(text[1:]))
    return cst.Integer(text)


def _outside_regroupings(ops: Sequence[t.Op]) -> list[t.Op]:
    """`ops` without their regroupings, checked: scores may be viewed in 5-D only to add terms (scaling and casts
    allowed), then viewed back to their rank with the same trailing sizes."""
    out: list[t.Op] = []
    opened: t.View | None = None
    for op in ops:
        if isinstance(op, t.View) and op.shape is not None and op.rank_after == 5 and opened is None:
            opened = op
            continue
        if opened is not None:
            assert opened.shape is not None
            if isinstance(op, t.View):
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


def _tensor_only(reshaped: cst.BaseExpression, term: cst.BaseExpression) -> cst.BaseExpression:
    """`reshaped if isinstance(term, torch.Tensor) else term`."""
    test = cst.Call(
        func=cst.Name("isinstance"),
        args=[cst.Arg(term, comma=_COMMA), cst.Arg(cst.Attribute(value=cst.Name("torch"), attr=cst.Name("Tensor")))],
    )
    return parenthesized(cst.IfExp(test=test, body=reshaped, orelse=term))


def unflatten(node: cst.BaseExpression, heads: tuple[cst.BaseExpression, cst.BaseExpression]) -> cst.BaseExpression:
    shape = cst.Tuple(elements=[cst.Element(heads[0]), cst.Element(heads[1])])
    return cst.Call(
        func=cst.Attribute(value=primary(node), attr=cst.Name("unflatten")),
        args=[cst.Arg(cst.Integer("0")), cst.Arg(shape)],
    )


def _dropout_expression(call: DropoutCall) -> cst.BaseExpression:
    training = call.training
    if isinstance(training, cst.Name) and training.value == "True":
        return call.probability
    if isinstance(training, cst.Name) and training.value == "False":
        return cst.Float("0.0")
    return cst.IfExp(test=training, body=call.probability, orelse=cst.Float("0.0"))
