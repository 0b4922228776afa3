"""Follow the attention score chain through one function body (read-only).

The tracer walks the statements of a function in order, keeping an environment of what each local name holds.
A product of a query with a transposed key starts a *chain*; what each later expression that feeds the chain does
to it is decided by the recognisers of `forms/` (one per form: products, softmax, dropout, views, fills, guards,
terms, scales, shifts, softmax wrappers), each an operation of the closed set in `chain.py`. Anything else that
touches the chain poisons it, with a reason. The tracer itself keeps the environment, the branches, the in-place
statements and the bookkeeping of the chains.

The result says, statement by statement, what the chain does; `recognise.py` turns it into an AttentionSite
and the rewriting passes turn it into SDPA code.
"""

from __future__ import annotations

from typing import Callable, Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.known import Known, holding
from sdpa_port.analyse.cstutil import assigned_names, block_body, code, primary
from sdpa_port.rewrite.edit import replace_names
from sdpa_port.analyse.chain import (  # the chain's values and operations, used across the package as `trace.X`
    OUT,
    PROBS,
    SCORES,
    AddTerm,
    AnyExpr,
    Candidate,
    Cast,
    ChainStmt,
    ChainVal,
    Dropout,
    ExprVal,
    Fill,
    HANDED_QUERY,
    Guard,
    HeadMask,
    KeepAction,
    KeepStmt,
    NotChain,
    Op,
    Output,
    OutputStmt,
    Poison,
    ScalarVal,
    Scale,
    Shift,
    describe_layout,
    short,
    Softmax,
    Stage,
    Start,
    StmtPlan,
    TraceResult,
    unreachable,
    Value,
    View,
    ZeroRows,
)
from sdpa_port.analyse.forms import FORMS, fills, products, scales, terms
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.branches import if_statement
from sdpa_port.analyse.chain_book import ChainBook
from sdpa_port.analyse.kept import keep_expression
from sdpa_port.analyse.outputs import find_output, output_statement, reads_only_weights, weights_passed_along
from sdpa_port.analyse.chain_reads import ChainReads, ProductFinder, contains_softmax
from sdpa_port.analyse.ranks import Ranks
from sdpa_port.analyse.remakes import Branch
from sdpa_port.analyse.scope import FunctionScope
from sdpa_port.refusals import Code

# the chain's values and operations are read across the package as `trace.X`
__all__ = [
    "OUT",
    "PROBS",
    "SCORES",
    "AddTerm",
    "AnyExpr",
    "Candidate",
    "Cast",
    "ChainStmt",
    "ChainVal",
    "Dropout",
    "ExprVal",
    "Fill",
    "FunctionScope",
    "Guard",
    "HANDED_QUERY",
    "HeadMask",
    "KeepAction",
    "KeepStmt",
    "Op",
    "Output",
    "OutputStmt",
    "ScalarVal",
    "Scale",
    "Shift",
    "Softmax",
    "Stage",
    "Start",
    "StmtPlan",
    "TraceResult",
    "Tracer",
    "Value",
    "View",
    "ZeroRows",
    "describe_layout",
    "unreachable",
]


# ------------------------------------------------------------------ the tracer


LineOf = Callable[[cst.CSTNode], int]


class Tracer:
    def __init__(
        self,
        facts: ModuleFacts,
        class_name: str | None,
        function: cst.FunctionDef,
        line_of: LineOf | None = None,
        selected_start: cst.CSTNode | None = None,
        known: Known = Known(),
        selected_members: frozenset[cst.CSTNode] = frozenset(),
        key_params: frozenset[str] = frozenset(),
        param_ranks: tuple[tuple[str, int], ...] = (),
    ) -> None:
        self.facts = facts
        # parameters every caller passes a key laid out (..., dim, length) (`self._attn(q, self.split_heads(k,
        # k=True), v)`): `q @ k` on them is a product with the key transposed
        self.key_params = key_params
        # what holds on the SDPA path: branches it decides are not followed (the eager fallback runs them)
        self.known = holding(known, block_body(function.body)) if known != Known() else known
        self.class_name = class_name
        self.function = function
        self.line_of = line_of or (lambda node: 0)
        # on a re-trace for one chain: its query-key product, and the products joined into it (`Candidate.members`)
        self.selected_start = selected_start
        self.selected_members = selected_members
        self.env: dict[str, Value] = {}
        self.scope = FunctionScope(facts, class_name, self.env)
        self.plans: dict[cst.CSTNode, StmtPlan] = {}
        self.dropped_ifs: set[cst.If] = set()
        self.returns: list[cst.Return] = []
        self.current_line = 0
        self.tests: list[cst.BaseExpression] = []
        # (id of the `if`, branch index) of the enclosing if/elif/else branches; `tests` holds the if/elif tests
        self.path: list[tuple[int, int]] = []
        self.branches: list[Branch] = []  # the same branches, by their tests (for `remakes`)
        self.chains = ChainBook(self.env, self.plans, self.path, self.tests)
        self.reads = ChainReads(self.env, self.chains)
        self.assignments: dict[str, int] = {}  # how often each name has been assigned so far
        self.ranks = Ranks(self.scope, function, param_ranks, self.assignments)
        self.output_seen = False
        self.probs_after_output: set[str] = set()
        # conditions under which a module the chain passes through is not the identity: eager runs then
        self.fallbacks: list[str] = []
        self.params = tuple(param.name.value for param in _all_params(function.params))
        for param in _all_params(function.params):
            if param.annotation is not None and _numeric_annotation(param.annotation.annotation):
                self.env[param.name.value] = ScalarVal()

    # -------------------------------------------------------------- entry

    def run(self) -> TraceResult:
        self.block(block_body(self.function.body), 0)
        self.chains.settle_joined()
        return TraceResult(
            candidates=self.chains.candidates,
            plans=self.plans,
            dropped_ifs=self.dropped_ifs,
            returns=self.returns,
            probs_names_after_output=self.probs_after_output,
            params=self.params,
            fallbacks=tuple(dict.fromkeys(self.fallbacks)),
            other_streams=self.chains.other_streams(),
        )

    # -------------------------------------------------------------- statements

    def block(self, statements: Sequence[cst.BaseStatement], depth: int) -> None:
        for statement in statements:
            self.statement(statement, depth)

    def statement(self, statement: cst.BaseStatement, depth: int) -> None:
        self.current_line = self.line_of(statement)
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                self.small(small, depth, self.line_of(statement))
        elif isinstance(statement, cst.If):
            if_statement(self, statement, depth)
        elif isinstance(statement, cst.With):
            for item in statement.items:
                self.poison_reads(item.item, self.line_of(statement), Code.SCORES_READ, "a `with` item reads the scores")
            self.block(block_body(statement.body), depth)
        elif isinstance(statement, (cst.For, cst.While)):
            self.loop(statement, depth)
        elif isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            self.env.pop(statement.name.value, None)
        elif isinstance(statement, cst.Try):
            before = set(self.reads.live_cids())
            self.block(block_body(statement.body), depth + 1)
            for handler in statement.handlers:
                self.block(block_body(handler.body), depth + 1)
            self.poison_new(before, Code.REPEATED, "computed inside a try block", self.line_of(statement))
        else:
            self.poison_reads(statement, self.line_of(statement), Code.SCORES_READ, "read by an unsupported statement")

    def loop(self, statement: cst.For | cst.While, depth: int) -> None:
        line = self.line_of(statement)
        chain_names = {name for name, value in self.env.items() if isinstance(value, ChainVal)}
        before = set(self.reads.live_cids())
        self.block(block_body(statement.body), depth + 1)
        touched = self.reads.live_cids() - before
        for name in chain_names:
            value = self.env.get(name)
            if isinstance(value, ChainVal):
                touched.add(value.cid)
        for cid in touched:
            body_names = _names_in(statement.body)
            if cid in before and not (body_names & chain_names):
                continue
            self.chains.candidates[cid].poisoned(Code.REPEATED, "the attention is computed inside a loop (chunked or iterative attention)", line)
        if isinstance(statement, cst.For):
            for name in assigned_names(statement.target):
                self.env.pop(name, None)

    # -------------------------------------------------------------- small statements

    def small(self, small: cst.BaseSmallStatement, depth: int, line: int) -> None:
        if isinstance(small, cst.Assign):
            self.assign([t.target for t in small.targets], small.value, small, depth, line)
        elif isinstance(small, cst.AnnAssign):
            if small.value is not None:
                self.assign([small.target], small.value, small, depth, line)
        elif isinstance(small, cst.AugAssign):
            self.aug_assign(small, depth, line)
        elif isinstance(small, cst.Expr):
            self.expression_statement(small, depth, line)
        elif isinstance(small, cst.Assert) and self.reads.chain_refs(small) and not self.reads.chain_value_refs(small):
            self.plans[small] = ChainStmt([], [], depth, line)  # a shape check on the scores goes with them
        elif isinstance(small, cst.Return):
            self.returns.append(small)
            output = find_output(self, small.value) if small.value is not None else None
            if output is not None:
                assert small.value is not None
                output_statement(self, small, small.value, output, [], depth, line)
            elif small.value is not None:
                if not weights_passed_along(self, small.value):
                    for cid in self.reads.chain_value_refs(small.value):
                        self.chains.candidates[cid].poisoned(
                            Code.VALUE_SIDE,
                            f"the probabilities are used after the product with V, in `{short(small.value)}`",
                            line,
                        )
                keep_expression(self, small.value, line, small, allow_probs=True)
        else:
            keep_expression(self, small, line, small)
        # a value changed in place is another value to `remakes`, as if assigned (`m.mul_(2)`, `m[0] = 1`)
        for name in _changed_in_place(small):
            self.assignments[name] = self.assignments.get(name, 0) + 1

    def assign(
        self, targets: list[cst.BaseExpression], value: cst.BaseExpression, small: cst.CSTNode, depth: int, line: int
    ) -> None:
        names = [n for t in targets for n in assigned_names(t)]
        simple = len(targets) == 1 and isinstance(targets[0], cst.Name)
        output = find_output(self, value)
        if output is not None:
            output_statement(self, small, value, output, names, depth, line)
            return
        weights_only = reads_only_weights(self, value)
        again = self.remade(value, line) if weights_only else None  # decomposed once, used below
        if weights_only and again is None:
            if not weights_passed_along(self, value):
                for cid in self.reads.chain_value_refs(value):
                    self.chains.candidates[cid].poisoned(
                        Code.VALUE_SIDE, f"the probabilities are used after the product with V, in `{short(value)}`", line
                    )
            keep_expression(self, value, line, small, allow_probs=True)
            self.bind_plain(targets, value)
            return
        try:
            base, ops = again if again is not None else self.decompose(value, line)
        except NotChain:
            keep_expression(self, value, line, small, allow_probs=self.output_seen)
            self.bind_plain(targets, value)
            return
        except Poison as poison:
            self.poison_statement(poison, value, names, line)
            return
        if not simple:
            self.chains.candidates[base.cid].poisoned(Code.LAYOUT, "the scores are unpacked into several names", line)
            for name in names:
                self.env[name] = base
            return
        # how the value is made: an earlier statement that made it the same way makes this one a remake (FLAVA
        # computes its softmax twice, LiLT its masked scores once per stream), the operations recorded once
        made = self.chains.remakes.key(base, value, self.env, self.assignments, self.branches) if ops else None
        remade = self.chains.remakes.first(made) if made is not None else None
        if remade is None:
            self.chains.record(base, ops, depth, line)
        self.plans[small] = ChainStmt(ops if remade is None else [], names, depth, line)
        after = self.chains.advance(base, ops)
        if ops:
            self.chains.remakes.note(base, after.step, ops, made, remade)
            self.chains.made_by[after.step] = (small, base.step, base.cid)
        self.env[names[0]] = after
        self.note_assignment(names)

    def remade(self, value: cst.BaseExpression, line: int) -> tuple[ChainVal, list[Op]] | None:
        """The expression's chain value and operations where it makes again a value of a chain an earlier statement
        made (after LiLT's product with its layout values, the dropout of the probabilities for the text values)."""
        try:
            base, ops = self.decompose(value, line)
        except (NotChain, Poison):
            return None
        made = self.chains.remakes.key(base, value, self.env, self.assignments, self.branches)
        return (base, ops) if ops and self.chains.remakes.first(made) is not None else None

    def aug_assign(self, small: cst.AugAssign, depth: int, line: int) -> None:
        target = small.target
        if not isinstance(target, cst.Name):
            keep_expression(self, small, line, small)
            return
        current = self.env.get(target.value)
        if not isinstance(current, ChainVal):
            passed = (
                isinstance(small.operator, cst.AddAssign)
                and reads_only_weights(self, small.value)
                and weights_passed_along(self, small.value)
            )
            if passed:  # `outputs += (attention_probs,)`: the weights are returned, as `return out, probs` does
                keep_expression(self, small.value, line, small, allow_probs=True)
                self.env.pop(target.value, None)
                self.note_assignment([target.value])
                return
            if self.reads.chain_value_refs(small.value):
                self.poison_reads(small.value, line, Code.SCORES_READ, f"the scores are folded into `{target.value}`")
            keep_expression(self, small.value, line, small)
            scalar = (
                current is not None
                and self.value_is_scalar(current)
                and p.scalar(small.value, self.scope) is not None
                and isinstance(small.operator, (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign, cst.DivideAssign))
            )
            if scalar:
                self.env[target.value] = ScalarVal()
            else:
                self.env.pop(target.value, None)
            self.note_assignment([target.value])
            return
        operator = small.operator
        try:
            younger = self.chain_or_start(small.value)
            if isinstance(operator, cst.AddAssign) and younger and all(cid > current.cid for cid in younger):
                # `scores += relative_scores` (another product, e.g. the query times position embeddings): as for
                # `scores + relative_scores`, the younger chain is an additive term
                for cid in younger:
                    self.chains.candidates[cid].absorbed = True
                ops: list[Op] = [AddTerm(small.value, current.rank)]
            elif isinstance(operator, (cst.AddAssign, cst.SubtractAssign)):
                negate = isinstance(operator, cst.SubtractAssign)
                ops = [terms.add_term(self, current, small.value, line, negate=negate)]
            elif isinstance(operator, (cst.MultiplyAssign, cst.DivideAssign)):
                ops = [scales.scale_or_head_mask(self, current, small.value, isinstance(operator, cst.DivideAssign), line)]
            else:
                raise Poison(Code.SCORES_COMBINED, f"the scores are updated with `{code(operator).strip()}`", {current.cid})
        except Poison as poison:
            self.poison_statement(poison, small.value, [target.value], line)
            return
        self.chains.record(current, ops, depth, line)
        self.plans[small] = ChainStmt(ops, [target.value], depth, line)
        self.env[target.value] = self.chains.advance(current, ops)

    def expression_statement(self, small: cst.Expr, depth: int, line: int) -> None:
        value = small.value
        output = find_output(self, value)
        if output is not None:  # `outputs.append(probs @ value)`
            output_statement(self, small, value, output, [], depth, line)
            return
        found = p.method_call(value)
        if found is not None and isinstance(found[0], cst.Name):
            receiver = self.env.get(found[0].value)
            if isinstance(receiver, ChainVal):
                name = found[1]
                assert isinstance(value, cst.Call)
                try:
                    if name == "masked_fill_":
                        ops: list[Op] = [
                            fills.masking_fill(self, p.arg(value, 0, "mask"), p.arg(value, 1, "value"), False, line, receiver.cid)
                        ]
                    elif name == "add_":
                        ops = [terms.add_term(self, receiver, value.args[0].value, line)]
                    elif name in ("div_", "mul_"):
                        ops = [scales.scale_or_head_mask(self, receiver, value.args[0].value, name == "div_", line)]
                    else:
                        what = f"`.{name}()` is applied to the {receiver.stage.value} in place"
                        raise Poison(Code.SCORES_TRANSFORMED, what, {receiver.cid})
                except Poison as poison:
                    self.poison_statement(poison, value, [], line)
                    return
                self.chains.record(receiver, ops, depth, line)
                self.plans[small] = ChainStmt(ops, [found[0].value], depth, line)
                after = self.chains.advance(receiver, ops)
                self.chains.made_by[after.step] = (small, receiver.step, receiver.cid)
                self.env[found[0].value] = after
                return
        keep_expression(self, value, line, small)

    def may_start(self, node: cst.CSTNode) -> bool:
        """A query-key product (or a concatenation of them) may start a chain: on a re-trace for one chain, only its
        own."""
        return self.selected_start is None or node is self.selected_start or node in self.selected_members

    # -------------------------------------------------------------- chain expressions

    def decompose(self, node: cst.BaseExpression, line: int) -> tuple[ChainVal, list[Op]]:
        """Split an expression into the chain value it starts from and the operations applied to it: the first of
        the recognisers in `forms.FORMS` that claims it decides; what none claims is refused when it touches a chain."""
        if isinstance(node, cst.Name):
            value = self.env.get(node.value)
            if isinstance(value, ChainVal):
                if value.cid in self.chains.joined:
                    raise Poison(
                        Code.SCORES_READ,
                        f"`{node.value}` is used again after its scores joined others at line {self.chains.joined[value.cid][1]}",
                        {self.chains.joined_into(value.cid)},
                    )
                return value, []
            raise NotChain()
        for form in FORMS:
            found = form.recognise(self, node, line)
            if found is not None:
                return found
        method = p.method_call(node)
        if method is not None and self.chain_or_start(method[0]):
            base, ops = self.decompose(method[0], line)
            stage = self.chains.advance(base, ops).stage.value
            raise Poison(Code.SCORES_TRANSFORMED, f"`.{method[1]}()` is applied to the {stage}", {base.cid})
        if isinstance(node, cst.BinaryOperation):
            refs = self.chain_or_start(node.left) | self.chain_or_start(node.right)
            if not refs:
                raise NotChain()
            raise Poison(Code.SCORES_COMBINED, f"the scores are combined with `{code(node.operator).strip()}`", refs)
        refs = self.reads.chain_value_refs(node)
        if refs and isinstance(node, cst.Call):
            raise Poison(Code.SCORES_TRANSFORMED, f"the scores are passed to `{short(node.func)}`", refs)
        if refs:
            raise Poison(Code.SCORES_READ, f"the scores are used in `{short(node)}`", refs)
        raise NotChain()

    # -------------------------------------------------------------- single operations

    def require(self, base: ChainVal, ops: list[Op], stage: Stage, what: str, line: int, code: Code) -> None:
        current = self.chains.advance(base, ops)
        if current.stage != stage:
            raise Poison(code, f"{what} is applied to the {current.stage.value}, expected the {stage.value}", {base.cid})

    # -------------------------------------------------------------- bookkeeping

    def module_guard(self, module: str | None) -> cst.BaseExpression | None:
        """The test of the innermost branch when it is the `if` of `if self.<module> is not None`."""
        if module is None or not self.tests or not self.path or self.path[-1][1] != 0:
            return None
        return self.tests[-1] if p.optional_module_test(self.tests[-1]) == module else None

    def setting_guard(self) -> cst.BaseExpression | None:
        """The test of the innermost branch when it is the `if` (not an `elif` or `else`) of a test of the module's
        settings alone: `self.training`, `self.config.use_dropout`, combined by `not`, `and`, `or`."""
        if not self.tests or not self.path or self.path[-1][1] != 0:
            return None
        test = self.tests[-1]
        return test if self.reads_settings(test) else None

    def reads_settings(self, test: cst.BaseExpression) -> bool:
        """A test of the module's settings alone (`self.training`, `self.config.x`, with `not`/`and`/`or`), no chain
        value among its reads: the same on every call of the module's forward."""
        return p.reads_settings_only(test) and not self.reads.chain_refs(test)

    def note_assignment(self, names: Sequence[str]) -> None:
        for name in names:
            self.assignments[name] = self.assignments.get(name, 0) + 1
        for candidate in self.chains.candidates:
            if candidate.stage != OUT:
                candidate.names_assigned_after_start.update(names)

    def bind_plain(self, targets: list[cst.BaseExpression], value: cst.BaseExpression) -> None:
        names = [n for t in targets for n in assigned_names(t)]
        if len(targets) == 1 and isinstance(targets[0], cst.Name):
            name = targets[0].value
            previous = self.env.get(name)
            node = value
            if name in _names_in(value) and isinstance(previous, ExprVal):
                # `x = x * 2`: the stored expression reads the previous value of x
                node = replace_names(value, {name: previous.node})
            self.env[name] = ExprVal(node)
        elif (
            len(targets) == 1
            and isinstance(targets[0], cst.Tuple)
            and isinstance(value, cst.Tuple)
            and len(targets[0].elements) == len(value.elements)
        ):
            for target_element, value_element in zip(targets[0].elements, value.elements):
                if isinstance(target_element.value, cst.Name) and not isinstance(value_element, cst.StarredElement):
                    self.env[target_element.value.value] = ExprVal(value_element.value)
                else:
                    for name in assigned_names(target_element.value):
                        self.env.pop(name, None)
        elif len(targets) == 1 and isinstance(targets[0], cst.Tuple) and _unbound(value) is not None:
            # `q, k, v = qkv.unbind(0)`: each name holds `qkv[i]`
            source = _unbound(value)
            assert source is not None
            for index, element in enumerate(targets[0].elements):
                if isinstance(element.value, cst.Name) and not isinstance(element, cst.StarredElement):
                    item = cst.Subscript(value=primary(source), slice=[cst.SubscriptElement(cst.Index(cst.Integer(str(index))))])
                    self.env[element.value.value] = ExprVal(item)
                else:
                    for name in assigned_names(element.value):
                        self.env.pop(name, None)
        elif len(targets) == 1 and isinstance(targets[0], cst.Tuple) and _is_shape(value):
            # `batch, heads, length, dim = query.shape`: every name holds a number
            for name in names:
                self.env[name] = ScalarVal()
        else:
            for name in names:
                self.env.pop(name, None)
        self.note_assignment(names)

    def poison_statement(self, poison: Poison, value: cst.BaseExpression, names: list[str], line: int) -> None:
        for cid in poison.cids:
            self.chains.candidates[cid].poisoned(poison.reason.code, poison.reason.detail, line)
        stages = [v.stage for v in (self.env.get(n) for n in _names_in(value)) if isinstance(v, ChainVal)]
        stage = PROBS if PROBS in stages or OUT in stages else SCORES
        if contains_softmax(value, self.scope):
            stage = PROBS
        first: int | None = min(poison.cids) if poison.cids else None
        for name in names:
            if first is not None:
                self.env[name] = ChainVal(first, stage, None)
                if stage == PROBS:
                    self.chains.candidates[first].stage = PROBS
            else:
                self.env.pop(name, None)

    def poison_reads(self, node: cst.CSTNode, line: int, code: Code, reason: str) -> None:
        for cid in self.reads.chain_refs(node):
            self.chains.candidates[cid].poisoned(code, reason, line)

    def poison_new(self, before: set[int], code: Code, reason: str, line: int) -> None:
        for cid in self.reads.live_cids() - before:
            self.chains.candidates[cid].poisoned(code, reason, line)

    def value_is_scalar(self, value: Value) -> bool:
        if isinstance(value, ScalarVal):
            return True
        return isinstance(value, ExprVal) and p.scalar(value.node, self.scope) is not None

    def chain_or_start(self, node: cst.CSTNode) -> set[int]:
        """Chains read by an expression, or {-1} when it holds a query-key product that would start one."""
        refs = self.reads.chain_value_refs(node)
        if refs:
            return refs
        finder = ProductFinder(self.scope)
        node.visit(finder)
        for product_node, product in finder.found:
            if not self.may_start(product_node):
                continue
            if self.reads.chain_value_refs(product.left) or self.reads.chain_value_refs(product.right):
                continue
            if product.form is p.ProductForm.EINSUM:
                if p.einsum_roles(product.spec or "", p.EinsumRole.SCORES) is not None:
                    return {-1}
            elif products.untranspose(self, product.right, product.rank) is not None:
                return {-1}
        return set()

# ------------------------------------------------------------------ helpers


def _changed_in_place(small: cst.BaseSmallStatement) -> set[str]:
    """The names whose value a statement changes without rebinding them: the receiver of an in-place method
    (`m.mul_(2)`, `m.masked_fill_(...)`) and the object an item or attribute is assigned into (`m[0] = 1`)."""
    out: set[str] = set()
    if isinstance(small, cst.Expr):
        found = p.method_call(small.value)
        if found is not None and found[1].endswith("_") and not found[1].startswith("_"):
            out |= {n.value for n in [_root_name(found[0])] if n is not None}
    elif isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        for target in targets:
            if isinstance(target, (cst.Subscript, cst.Attribute)):
                out |= {n.value for n in [_root_name(target)] if n is not None}
    return out


def _root_name(node: cst.BaseExpression) -> cst.Name | None:
    while isinstance(node, (cst.Subscript, cst.Attribute)):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def _all_params(params: cst.Parameters) -> list[cst.Param]:
    out = [*params.posonly_params, *params.params, *params.kwonly_params]
    if isinstance(params.star_arg, cst.Param):
        out.append(params.star_arg)
    if params.star_kwarg is not None:
        out.append(params.star_kwarg)
    return out


def _is_shape(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Attribute) and node.attr.value == "shape":
        return True
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size":
        return not node.args
    if isinstance(node, cst.Subscript):
        return _is_shape(node.value)
    return False


def _numeric_annotation(node: cst.BaseExpression) -> bool:
    """`float`, `int`, `float | None`, `Optional[float]`: a parameter that carries a number."""
    if isinstance(node, cst.Name):
        return node.value in ("float", "int")
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
        parts = [node.left, node.right]
        return any(_numeric_annotation(p) for p in parts) and all(
            _numeric_annotation(p) or (isinstance(p, cst.Name) and p.value == "None") for p in parts
        )
    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value == "Optional":
        inner = node.slice[0].slice
        return isinstance(inner, cst.Index) and _numeric_annotation(inner.value)
    return False


def _names_in(node: cst.CSTNode) -> set[str]:
    return p.walk_names(node)


def _unbound(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x` of `x.unbind(0)` / `x.unbind(dim=0)` / `torch.unbind(x, 0)` (the first dimension only)."""
    if not isinstance(value, cst.Call):
        return None
    dims = [a for a in value.args if a.keyword is None or a.keyword.value == "dim"]
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "unbind":
        if m.matches(value.func.value, m.Name("torch")):
            source, dims = (dims[0].value, dims[1:]) if dims else (None, [])
        else:
            source = value.func.value
        if source is not None and (not dims or m.matches(dims[0].value, m.Integer("0"))) and len(dims) <= 1:
            return source
    return None


