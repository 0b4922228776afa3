"""Rewrite a traced function body so its eager attention chain becomes one SDPA call.

Statements that only advanced the chain disappear; their effect is re-targeted onto side values: the scale
(`sdpa_scale`), the additive float mask (`sdpa_mask`) and a pending causal-buffer mask (`sdpa_causal`). These stay
compile-time expressions while they are unconditional and become variables only when a branch changes them.
The statement holding the product with V gets the SDPA call in place of that product.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import (
    assigned_names,
    expr,
    assignment,
    block_body,
    code,
    if_chain,
    nodes_in,
    parenthesized,
    primary,
    rebuild_if,
)
from sdpa_port.analyse.patterns import walk_names
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite import sdpa_mask, sdpa_output, sdpa_state, sdpa_terms, single_query, term_dtype
from sdpa_port.rewrite.edit import replace_names, replace_nodes
from sdpa_port.rewrite.sdpa_builders import computed_and_reread as reread, dropout_expression, not_none_names, query_root, unflatten
from sdpa_port.rewrite.sdpa_layout import Layout, decide_layout, laid_out, product_shape, scores_shape
from sdpa_port.rewrite.sdpa_state import EmitOptions, Side, SideState, merged
from sdpa_port.rewrite.walk import StatementWalker


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


def recast_operands(ops: Sequence[t.Op]) -> bool:
    """A cast of the probabilities after the softmax with no upcast of the scores or operands before it."""
    softmax = False
    for op in ops:
        match op:
            case t.Start() if op.upcast or op.operands_upcast:
                return False
            case t.Cast() if op.upcast:
                return False
            case t.Softmax() if op.call.upcast:
                return False
            case t.Softmax():
                softmax = True
            case t.Cast() if softmax:
                return True
            case _:
                pass
    return False


def recast_value(path: SdpaPath) -> cst.BaseExpression | None:
    """The value whose dtype the port hands query and key over in (`recast_operands`), where it is known at the
    product; None where they are handed over as they are."""
    ops = path.chain_ops
    if any(isinstance(op, t.Start) and op.operands_upcast for op in ops) or not recast_operands(ops):
        return None
    outputs = [op for op in ops if isinstance(op, t.Output)]
    if len(outputs) != 1 or walk_names(outputs[0].value) & path.names_assigned_after_start:
        return None
    return outputs[0].value


class SdpaEmitter(StatementWalker):
    """Walk a traced body, turning its chain statements into side-value updates and the product with V into SDPA."""

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
        self.state = SideState()
        self.dropout: cst.BaseExpression | None = None
        self.query: cst.BaseExpression | None = None
        self.key: cst.BaseExpression | None = None
        self.start: t.Start | None = None
        self.probs_after_output = path.probs_after_output
        self.layout = decide_layout(path, self.names.batch, self.names.heads)
        # the blocks being walked, innermost last, and those the batch and head sizes were bound in (`Layout.bound`)
        self.blocks: list[object] = []
        self.heads_bound_in: tuple[object, ...] | None = None
        # scores laid out otherwise than (batch, heads, query, key): what is added to them is permuted to SDPA's mask
        start = path.start
        self.scores_layout = start.layout if start is not None else None
        self.single = start is not None and start.single  # one query per head, no length axis (`single_query.py`)
        # the 5-D shape the scores are viewed as, and their rank before
        self.regrouped: sdpa_terms.Regrouped | None = None
        # query and key are float32 copies: run SDPA in float32 and cast the result back, as eager does
        self.upcast = any(isinstance(op, t.Start) and op.operands_upcast for op in path.chain_ops)
        # the probabilities are cast to another dtype after the softmax, never upcast before it: query and key may come
        # in a wider dtype than the value (GPT-NeoX's float32 rotary tables in a bf16 model), which SDPA does not take;
        # they are handed over in the value's dtype, a no-op where the dtypes agree
        self.recast = not self.upcast and recast_operands(path.chain_ops)
        # names read by the statements the rewrite removed: their definitions may now be dead
        self.removed_reads: set[str] = set()
        self.shifted = False  # the row's maximum was subtracted from the scores (`Shift`)
        # flat scores viewed in 4-D with their batch and heads (GPT-2's reordered product): their shape is read from
        # the operands split into their heads, as SDPA takes them; None where only some paths view them so
        self.widened: bool | None = False
        # names the enclosing `if` tests have shown not to be None, innermost last
        self.not_none: list[set[str]] = []
        # names bound by the chain statements the rewrite removed (the scores, the probabilities), and whether the
        # SDPA call has been written: `del` statements must not unbind what the call reads or what no longer exists
        self.chain_bound: set[str] = set()
        self.called = False
        # names whose dtype the plan does not prove, and those bound from them as the walk goes (`term_dtype.py`)
        self.unproven: set[str] = set(options.contract.unproven)

    def emit(self, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """The SDPA code of a function body: the walk, with the query handed to SDPA named where an operation read
        the scores' dtype or device through it (`trace.HANDED_QUERY`)."""
        body = self.block(statements)
        if self.query is None or not self.path.built:
            return body
        return [replace_names(s, {t.HANDED_QUERY: self.query_root()}) for s in body]

    # -------------------------------------------------------------- walking

    def block(self, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        self.blocks.append(object())
        try:
            return super().block(statements)
        finally:
            self.blocks.pop()

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
                self.chain_bound |= self.assigned_by(small)
                out.extend(self.chain_statement(plan, least=small in self.path.least_fills))
            elif isinstance(plan, t.OutputStmt):
                flush()
                out.extend(self.output_statement(small, plan, statement))
                self.called = True
            elif isinstance(small, cst.Del) and (kept_del := self.kept_del(small)) is not small:
                if kept_del is not None:
                    kept.append(kept_del)
            else:
                self.unproven |= term_dtype.bound_from(small, self.unproven)
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

    def kept_del(self, node: cst.Del) -> cst.Del | None:
        """A `del` with the names it may no longer unbind taken out (None when none is left): between the query-key
        product and the SDPA call every name (the call reads the operands, and the masks it builds, only there:
        `del q, k` after the scores), after it the names only removed statements bound (`del attn_weights`).
        Leaving a name bound changes no value, only when its memory is freed; other targets (`del cache[i]`) stay."""
        if self.key is None and not self.chain_bound:
            return node
        target = node.target
        elements = list(target.elements) if isinstance(target, (cst.Tuple, cst.List)) else [cst.Element(target)]
        left = [
            element
            for element in elements
            if not isinstance(element.value, cst.Name) or (self.called and element.value.value not in self.chain_bound)
        ]
        if len(left) == len(elements):
            return node
        if not left:
            return None
        if len(left) == 1:
            return node.with_changes(target=left[0].value)
        last = left[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return node.with_changes(target=cst.Tuple(elements=[*left[:-1], last], lpar=[], rpar=[]))

    def keep(self, node: cst.CSTNode, plan: t.StmtPlan | None):  # type: ignore[no-untyped-def]
        if not isinstance(plan, t.KeepStmt):
            return node
        if self.single:
            single_query.refuse_sizes(plan)
        mapping: dict[cst.CSTNode, cst.CSTNode] = {}
        for found in nodes_in(node, plan.sizes):
            index = plan.sizes[found]
            if self.key is None:
                raise Refuse(Code.SCORES_READ, "the scores' shape is read before the query-key product")
            query, key = self.shaped_operands()
            assert key is not None
            operand, dim = (query_root(query), index) if index is not None else (primary(key), -2)
            mapping[found] = cst.Call(
                func=cst.Attribute(value=operand, attr=cst.Name("size")),
                args=[cst.Arg(cst.Integer(str(dim)) if dim >= 0 else cst.UnaryOperation(cst.Minus(), cst.Integer(str(-dim))))],
            )
        for found in nodes_in(node, plan.shaped):
            size = cst.SubscriptElement(cst.Index(cst.Integer(str(plan.shaped[found]))))
            mapping[found] = cst.Subscript(value=parenthesized(product_shape(*self.shaped_operands())), slice=[size])
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
            widened = self.widened
            body = self.block(block_body(node.body))
            self.widened = widened if self.widened == widened else None
            self.state.mask, self.state.mask_nullable = cst.Name(guarded), True
            return [node.with_changes(body=node.body.with_changes(body=body))] if body else []
        pre = self.materialize(touched) if touched else []
        before = self.state.copy()
        widened = self.widened
        widths: set[bool | None] = set()
        ends: list[SideState] = []
        branches: list[tuple[cst.If | cst.Else, list[cst.BaseStatement]]] = []
        for current in if_chain(node):
            self.state = before.copy()
            self.widened = widened
            checked = not_none_names(current.test) if isinstance(current, cst.If) else set()
            self.not_none.append(checked)
            body = self.block(block_body(current.body))
            self.not_none.pop()
            ends.append(self.state)
            branches.append((current, body))
            widths.add(self.widened)
        if not isinstance(branches[-1][0], cst.Else):
            ends.append(before)
            widths.add(widened)
        self.state = merged(ends, self.line_in(node))
        self.widened = widths.pop() if len(widths) == 1 else None  # viewed in 4-D on some paths only: not known
        if all(not body for _, body in branches):
            return pre
        rebuilt = rebuild_if(branches, lambda branch: self.keep(branch.test, self.plans.get(branch.test)))
        return [*pre, rebuilt]

    def whole_chain_branch(self, node: cst.If) -> cst.If | cst.Else | None:
        return whole_chain_branch(node, self.plans)

    def kept_branch(self, branch: cst.If | cst.Else, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """A branch beside the one holding the whole computation: it runs as written."""
        return body

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
        if term_dtype.unproven(terms[0], self.unproven):
            return None  # the term joins the mask converted (`term.to(query.dtype)`), which None does not take
        term = terms[0].term
        if self.regrouped is not None or self.single or (self.layout.heads is not None and terms[0].rank == 3):
            return None  # the term joins the mask reshaped (`unflatten`, a single query's `unsqueeze`), not as it is
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

    def chain_statement(self, plan: t.ChainStmt, least: bool = False) -> list[cst.BaseStatement]:
        """The side-value updates of a chain statement; a fill holding the least number of the scores' dtype
        (`least`) fills with that number of the query's dtype (`least_fills.py`)."""
        out: list[cst.BaseStatement] = []
        for op in plan.ops:
            if least and isinstance(op, t.Fill):
                op = replace(op, fill=expr(f"torch.finfo({code(self.query_root())}.dtype).min"))
            out.extend(self.apply(op))
        return out

    def apply(self, op: t.Op) -> list[cst.BaseStatement]:
        """The side-value update one chain operation stands for; every operation is decided here, none dropped."""
        state = self.state
        op = single_query.checked(op) if self.single else op
        if isinstance(op, t.View) and op.shape is None and {op.rank_before, op.rank_after} == {3, 4}:
            self.widened = op.rank_after == 4
        match op:
            case t.Start():
                return self.start_chain(op)
            case t.Scale():
                return self.scale(op)
            case t.AddTerm():
                query, key = self.shaped_operands() if op.rank != 3 else (self.query, self.key)
                pre, term = sdpa_terms.added_term(
                    op,
                    self.names,
                    query=query,
                    key=key,
                    regrouped=self.regrouped,
                    scores_layout=self.scores_layout,
                    heads=(self.readable_layout() if op.rank == 3 else self.layout).heads,
                )
                if self.single:
                    term = single_query.term(op, term)
                term = term_dtype.in_query_dtype(op, term, self.unproven, self.query, state.mask_may_be_empty)
                return [*pre, *self.add_to_mask(term)]
            case t.View() if op.heads is not None and self.layout.bound is not None and self.heads_bound_in is None:
                return self.bind_heads(self.layout.bound)
            case t.View() if op.shape is not None and (op.rank_after or 0) >= 5:
                # where the scores are regrouped: their shape, read from the query and the key
                self.regrouped = sdpa_terms.Regrouped(op.shape, op.rank_before)
                return [assignment(self.names.scores_shape, self.scores_shape())]
            case t.View() if self.regrouped is not None and op.order is not None:
                self.regrouped = self.regrouped.permuted(op.order)
                return []
            case t.View() if self.regrouped is not None and (op.rank_before or 0) >= 5:
                self.regrouped = None
                return []
            case t.Fill() | t.Guard() if self.regrouped is not None:
                raise Refuse(Code.LAYOUT, "the scores are masked while regrouped into another shape")
            case t.Fill():
                if self.scores_layout is not None:
                    op = replace(op, condition=laid_out(op.condition, op.rank, self.scores_layout))
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
                self.dropout = dropout_expression(op.call)
                return []
            case t.HeadMask():
                raise Refuse(Code.PROBABILITIES_CHANGED, "a head mask is applied on the SDPA path")
            case t.View() | t.Cast() | t.Softmax() | t.Transpose():
                # SDPA reads the operands' layout (decide_layout), runs the softmax itself, and casts are decided
                # once for the whole call (operands upcast to float32); probabilities transposed for a value on
                # their left are the output's order (`Output.value_left`)
                return []
            case t.Output():
                raise AssertionError("the product with V is emitted by output_statement")
            case _:
                t.unreachable(op)

    def bind_heads(self, sizes: tuple[cst.BaseExpression, cst.BaseExpression]) -> list[cst.BaseStatement]:
        """`sdpa_batch, sdpa_heads = output_size[0], output_size[1]` where the scores are viewed (4-D) with them."""
        self.heads_bound_in = tuple(self.blocks)
        targets = cst.Tuple([cst.Element(cst.Name(self.names.batch)), cst.Element(cst.Name(self.names.heads))], lpar=[], rpar=[])
        values = cst.Tuple([cst.Element(sizes[0]), cst.Element(sizes[1])], lpar=[], rpar=[])
        return [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(targets)], values)])]

    def readable_layout(self) -> Layout:
        """The layout, refused where the SDPA call or a term would read sizes bound (`bind_heads`) where they may be
        unbound: in a block that does not enclose this point, or not yet."""
        bound = self.heads_bound_in
        if self.layout.bound is not None and (bound is None or tuple(self.blocks[: len(bound)]) != bound):
            raise Refuse(
                Code.LAYOUT,
                "the batch and head sizes the scores are viewed with are bound again before the SDPA call, and the "
                "view is not on every path to it, or comes after what reads them",
            )
        return self.layout

    def scores_shape(self) -> cst.BaseExpression:
        """The shape of the query-key product, `query.shape[:-1] + key.shape[-2:-1]`."""
        return scores_shape(*self.shaped_operands())

    def shaped_operands(self) -> tuple[cst.BaseExpression | None, cst.BaseExpression | None]:
        """The query and key whose shapes the scores' shape is read from: split into their heads once flat scores are
        viewed in 4-D (`widened`)."""
        heads = self.layout.heads
        if self.widened is None and heads is not None:
            raise Refuse(Code.LAYOUT, "the scores' shape is read where only some paths have viewed them in 4-D")
        if not self.widened or heads is None or self.query is None or self.key is None:
            return self.query, self.key
        heads = self.readable_layout().heads
        assert heads is not None
        return unflatten(self.query, heads), unflatten(self.key, heads)

    def start_chain(self, op: t.Start) -> list[cst.BaseStatement]:
        self.start = op
        self.query, self.key = op.query, op.key
        out: list[cst.BaseStatement] = []
        value = self.recast_value()
        if value is not None:
            dtype = cst.Attribute(value=primary(value), attr=cst.Name("dtype"))
            for name, operand in ((self.names.query, op.query), (self.names.key, op.key)):
                out.append(assignment(name, cst.Call(func=cst.Attribute(value=primary(operand), attr=cst.Name("to")), args=[cst.Arg(dtype)])))
            self.query, self.key = cst.Name(self.names.query), cst.Name(self.names.key)
            return out
        rebound = self.path.names_assigned_after_start
        # an operand laid out for SDPA (an einsum's, a shared key expanded) or built (a joined matrix's) is named
        # once: shapes and dtypes are read from it; where branches each compute their own product, each names its
        # operands the same
        built = self.path.built
        if walk_names(op.query) & rebound or op.orders[0] is not None or op.single or built or reread(op.query, self.path.ops):
            out.append(assignment(self.names.query, op.query))
            self.query = cst.Name(self.names.query)
        if walk_names(op.key) & rebound or op.orders[1] is not None or op.heads is not None or built:
            out.append(assignment(self.names.key, op.key))
            self.key = cst.Name(self.names.key)
        return out

    def recast_value(self) -> cst.BaseExpression | None:
        """The value whose dtype query and key are handed over in (`recast`), where it is known at the product."""
        return recast_value(self.path) if self.recast else None

    def scale(self, op: t.Scale) -> list[cst.BaseStatement]:
        """The scale factor joins the side values (`sdpa_terms.scale`); a factor per query rescales the query."""
        out = sdpa_terms.scale(self.state, self.names, op, self.query)
        if op.per_query:
            self.query = cst.Name(self.names.query)
        return out

    def zero_rows(self, op: t.ZeroRows) -> list[cst.BaseStatement]:
        return sdpa_mask.zero_rows(self.state, self.names, op, self.regrouped is not None)

    def floor_mask(self, op: t.Guard) -> list[cst.BaseStatement]:
        return sdpa_mask.floor_mask(self.state, self.names, op)

    def add_to_mask(self, term: cst.BaseExpression) -> list[cst.BaseStatement]:
        return sdpa_mask.add_to_mask(self.state, self.names, term, self.options.contract.nullable, self.not_none)

    def fill_mask(self, op: t.Fill) -> list[cst.BaseStatement]:
        return sdpa_mask.fill_mask(self.state, self.names, op, self.query)

    # -------------------------------------------------------------- materialisation

    def materialize(self, kinds: set[Side]) -> list[cst.BaseStatement]:
        return sdpa_state.materialize(self.state, self.names, kinds)

    def materialize_for(self, assigned: set[str]) -> list[cst.BaseStatement]:
        """Known side values that read a name about to be reassigned become variables first."""
        return sdpa_state.materialize_for(self.state, self.names, assigned)

    def assigned_by(self, small: cst.CSTNode) -> set[str]:
        if isinstance(small, cst.Assign):
            return {n for target in small.targets for n in assigned_names(target.target)}
        if isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            return set(assigned_names(small.target))
        return set()

    def scale_expression(self) -> cst.BaseExpression:
        return sdpa_state.scale_expression(self.state, self.names)

    # -------------------------------------------------------------- output

    def query_root(self) -> cst.BaseExpression:
        return query_root(self.query)

    def output_statement(
        self, small: cst.BaseSmallStatement, plan: t.OutputStmt, line: cst.SimpleStatementLine
    ) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for op in plan.ops:
            out.extend(self.apply(op))
        if self.query is None or self.key is None:
            raise Refuse(Code.UNKNOWN_PRODUCT, "the product with V has no recognised scores")
        contract = self.options.contract
        is_causal = sdpa_output.finalize_causal(self.state, self.names, contract, out, self.query, self.key)
        call = sdpa_output.sdpa_call(
            self.state,
            self.names,
            plan.output,
            out,
            query=self.query,
            key=self.key,
            layout=self.readable_layout(),
            upcast=self.upcast,
            dropout=self.dropout,
            is_causal=is_causal,
        )
        new_small = replace_nodes(small, {plan.output.node: call})
        zeroing = sdpa_output.zero_output(self.state.zero_rows, self.names, self.layout, small, plan)
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
