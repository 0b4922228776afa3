"""Follow the attention score chain through one function body (read-only).

The tracer walks the statements of a function in order, keeping an environment of what each local name holds.
A product of a query with a transposed key starts a *chain*; every later statement that feeds the chain is
classified as one of a closed set of operations (scale, additive term, masking fill, NaN guard, view, cast,
softmax, dropout, head mask, product with V). Anything else that touches the chain poisons it, with a reason.

The result says, statement by statement, what the chain does; `recognise.py` turns it into an AttentionSite
and the rewriting passes turn it into SDPA code.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Callable, NoReturn, Sequence, Union

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.additive import additive_in
from sdpa_port.analyse.known import Known, decide
from sdpa_port.analyse.cstutil import (
    assigned_names,
    binary,
    block_body,
    code,
    if_branches,
    nodes_of_type,
    parenthesized,
    precedence,
    primary,
    replace_names,
)
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.wrappers import identity_unless, inlined
from sdpa_port.refusals import Code, Reason

class Stage(enum.Enum):
    """How far along the chain a value is."""

    SCORES = "scores"
    PROBABILITIES = "probabilities"
    OUTPUT = "output"


SCORES, PROBS, OUT = Stage.SCORES, Stage.PROBABILITIES, Stage.OUTPUT


class KeepAction(enum.Enum):
    """How a kept statement's read of the scores is redirected once SDPA replaces them."""

    DTYPE = "dtype"  # `scores.dtype` -> `query.dtype`
    DEVICE = "device"  # `scores.device` -> `query.device`
    STRIP_EXPAND = "strip_expand"  # `x.expand_as(scores)` -> `x` (broadcasting does it)
    RESHAPE_AS = "reshape_as"  # `x.reshape_as(scores)` / `x.view_as(scores)` -> `x.reshape(<the scores' shape>)`


# ------------------------------------------------------------------ values and operations


@dataclass(frozen=True)
class ChainVal:
    cid: int
    stage: Stage
    rank: int | None


@dataclass(frozen=True)
class ExprVal:
    node: cst.BaseExpression


@dataclass(frozen=True)
class ScalarVal:
    """A local that holds a number on every path (e.g. a scale factor built up under conditions)."""


@dataclass(frozen=True)
class AnyExpr:
    """A local assigned differently on different paths: one of these expressions (e.g. a key extended by a cache)."""

    nodes: tuple[cst.BaseExpression, ...]


Value = Union[ChainVal, ExprVal, ScalarVal, AnyExpr]


@dataclass(frozen=True)
class Start:
    product: p.Product
    query: cst.BaseExpression
    key: cst.BaseExpression
    rank: int | None
    upcast: bool
    # the query was scaled before the product (`q = q / sqrt(d)`, `q_proj(x) * self.scaling`): (factor, divide)
    query_scale: tuple[cst.BaseExpression, bool] | None = None
    # the query or key names hold float32 copies made before the product (`query = query.to(torch.float32)`)
    operands_upcast: bool = False


@dataclass(frozen=True)
class View:
    rank_before: int | None
    rank_after: int | None
    heads: tuple[cst.BaseExpression, cst.BaseExpression] | None
    # a regrouping of 3-D or 4-D scores into 5-D (`scores.view(b // w, w, h, q, k)` to add a per-window term) and
    # the view back: the sizes given
    shape: tuple[cst.BaseExpression, ...] | None = None


@dataclass(frozen=True)
class Cast:
    upcast: bool


@dataclass(frozen=True)
class Scale:
    factor: cst.BaseExpression
    divide: bool
    # a tensor the same for every key (its last dimension has size 1): it multiplies the query instead of scale=
    per_query: bool = False


@dataclass(frozen=True)
class AddTerm:
    term: cst.BaseExpression
    rank: int | None
    # added whenever the term's operands are not None: no enclosing test other than `x is not None` of them
    always: bool = True
    # the term is a call of a helper that adds to the scores it is given (`analyse/additive.py`): the argument at
    # this index is to be zeros of the scores' shape (it holds `None` here)
    scores_arg: int | None = None
    # the term is a name that may hold a Python number rather than a tensor (a helper's `score = 0` returned when
    # it adds nothing): a reshape of the term must leave a number as it is
    may_be_number: bool = False


@dataclass(frozen=True)
class Fill:
    condition: cst.BaseExpression
    keep_where_true: bool  # torch.where(cond, scores, fill) keeps where cond is true
    fill: cst.BaseExpression
    causal: bool  # the condition is a bottom-right aligned lower-triangular slice of a causal buffer
    # the fill absorbs any score (-inf, finfo.min): replacing and adding agree even in fully masked rows
    absorbing: bool = True
    # every real query row keeps a key this fill leaves alone: a padding mask parameter or a bottom-right causal slice
    row_safe: bool = True
    # the condition is a top-left slice `bias[:, :, :q, :k]` of a lower-triangular buffer: each row keeps its own
    # position, hence a real token itself, when the keys are the queries' own positions (no cache, no other source)
    top_left: bool = False
    # where the fill happened: the enclosing branches, and how often each name of the condition had been assigned
    path: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    bindings: tuple[tuple[str, int], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class ZeroRows:
    """Probabilities set to 0 where an earlier absorbing fill masked the scores (`softmax(...).masked_fill(m, 0)`).

    Entries the fill masked are already exactly 0 after the softmax unless the row has no other key; so the only
    change is that a row whose every key is masked gives 0 (eager: NaN or uniform, then 0)."""

    condition: cst.BaseExpression
    keep_where_true: bool


@dataclass(frozen=True)
class Guard:
    """A floor on the scores (`torch.max(scores, finfo.min)`, `clamp(min=...)`): -inf entries become the bound."""

    bound: cst.BaseExpression
    absorbing: bool = True


@dataclass(frozen=True)
class Shift:
    """The row's maximum subtracted from the scores (`x - x.amax(-1, keepdim=True)`, a stabilised softmax such as
    CogView's PB-Relax): the same for every key of a row, so the softmax ignores it."""


@dataclass(frozen=True)
class Softmax:
    call: p.SoftmaxCall


@dataclass(frozen=True)
class Dropout:
    call: p.DropoutCall
    # the test of an innermost `if self.dropout is not None:` around it, where `self.dropout` is the module called:
    # the dropout happens whenever the module exists, so that branch is no condition on it
    guard: cst.BaseExpression | None = field(default=None, compare=False)


@dataclass(frozen=True)
class HeadMask:
    operand: cst.BaseExpression
    root: str | None


@dataclass(frozen=True)
class Output:
    product: p.Product
    node: cst.BaseExpression  # the product expression inside the statement
    value: cst.BaseExpression
    rank: int | None


Op = Union[Start, View, Cast, Scale, AddTerm, Fill, ZeroRows, Guard, Shift, Softmax, Dropout, HeadMask, Output]


def unreachable(value: NoReturn) -> NoReturn:
    """The end of an exhaustive `match` over a closed set of types: a type checker proves it is never reached."""
    raise AssertionError(f"unhandled {type(value).__name__}")


@dataclass
class ChainStmt:
    """A statement that only advances the chain; it disappears from SDPA code (its ops are re-targeted)."""

    ops: list[Op]
    targets: list[str]
    depth: int
    line: int


@dataclass
class OutputStmt:
    """The statement holding the product with V; the product node is replaced by the SDPA result."""

    ops: list[Op]  # ops on the probabilities inside the statement, then the Output
    output: Output
    depth: int
    line: int


@dataclass
class KeepStmt:
    """A statement kept as written, with chain `.dtype`/`.device` reads and `.expand_as(chain)` replaced."""

    replacements: dict[cst.CSTNode, KeepAction]
    # `scores.size(i)` / `scores.shape[i]` -> the query's size i, or None for the key length (the scores' last dim)
    sizes: dict[cst.CSTNode, int | None] = field(default_factory=dict)


StmtPlan = Union[ChainStmt, OutputStmt, KeepStmt]


@dataclass
class Candidate:
    cid: int
    start: Start | None
    start_line: int
    poison: Reason | None = None
    poison_line: int = 0
    stage: Stage = SCORES
    ops: list[tuple[Op, int, int]] = field(default_factory=list)  # (op, depth, line)
    absorbed: bool = False
    start_node: cst.CSTNode | None = None  # the query-key product (or the softmax, for an unknown origin)
    names_assigned_after_start: set[str] = field(default_factory=set)

    def poisoned(self, code: Code, detail: str, line: int) -> None:
        if self.poison is None:
            self.poison = Reason(code, detail)
            self.poison_line = line


@dataclass
class TraceResult:
    candidates: list[Candidate]
    plans: dict[cst.CSTNode, StmtPlan]  # small statements (and `if` tests) -> what the chain makes of them
    dropped_ifs: set[cst.If]
    returns: list[cst.Return]
    probs_names_after_output: set[str]
    params: tuple[str, ...]
    fallbacks: tuple[str, ...] = ()  # conditions under which only the eager computation is exact

    def attention(self) -> list[Candidate]:
        """Candidates that reach a product with V: the attention computations of the function."""
        return [c for c in self.candidates if c.stage == OUT and not c.absorbed]


class _Poison(Exception):
    def __init__(self, code: Code, detail: str, cids: set[int]) -> None:
        super().__init__(detail)
        self.reason = Reason(code, detail)
        self.cids = {cid for cid in cids if cid >= 0}  # -1 marks a product that has not started a chain yet


class _NotChain(Exception):
    pass


# ------------------------------------------------------------------ scope


class FunctionScope:
    """Names as the tracer currently knows them, plus `self.` attributes from the class's methods."""

    def __init__(self, facts: ModuleFacts, class_name: str | None, env: dict[str, Value]) -> None:
        self.facts = facts
        self.class_name = class_name
        self.env = env
        self._evaluating: set[str] = set()

    def qualify(self, node: cst.CSTNode) -> str | None:
        return self.facts.imports.qualify(node)

    def self_attribute(self, name: str) -> cst.BaseExpression | None:
        if self.class_name is None:
            return None
        return self.facts.find_attribute(self.class_name, name)

    def self_attribute_values(self, name: str) -> tuple[cst.BaseExpression, ...]:
        if self.class_name is None:
            return ()
        return self.facts.find_attribute_values(self.class_name, name)

    def local_value(self, name: str) -> cst.BaseExpression | None:
        value = self.env.get(name)
        return value.node if isinstance(value, ExprVal) else None

    def module_function(self, name: str) -> cst.FunctionDef | None:
        return None if name in self.env else self.facts.functions.get(name)

    def local_values(self, name: str) -> tuple[cst.BaseExpression, ...]:
        """What a local may hold: its one expression, or each of the expressions its paths assign."""
        value = self.env.get(name)
        if isinstance(value, ExprVal):
            return (value.node,)
        return value.nodes if isinstance(value, AnyExpr) else ()

    def local_is_scalar(self, name: str) -> bool:
        value = self.env.get(name)
        if isinstance(value, ScalarVal):
            return True
        if not isinstance(value, ExprVal) or name in self._evaluating:
            return False
        self._evaluating.add(name)
        try:
            return p.scalar(value.node, self) is not None
        finally:
            self._evaluating.discard(name)


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
        key_params: frozenset[str] = frozenset(),
    ) -> None:
        self.facts = facts
        # parameters every caller passes a key laid out (..., dim, length) (`self._attn(q, self.split_heads(k,
        # k=True), v)`): `q @ k` on them is a product with the key transposed
        self.key_params = key_params
        # what holds on the SDPA path: branches it decides are not followed (the eager fallback runs them)
        self.known = known
        self.class_name = class_name
        self.function = function
        self.line_of = line_of or (lambda node: 0)
        self.selected_start = selected_start
        self.env: dict[str, Value] = {}
        self.scope = FunctionScope(facts, class_name, self.env)
        self.candidates: list[Candidate] = []
        self.plans: dict[cst.CSTNode, StmtPlan] = {}
        self.dropped_ifs: set[cst.If] = set()
        self.returns: list[cst.Return] = []
        self.current_line = 0
        self.tests: list[cst.BaseExpression] = []
        # (id of the `if`, branch index) of the enclosing if/elif/else branches; `tests` holds the if/elif tests
        self.path: list[tuple[int, int]] = []
        self.assignments: dict[str, int] = {}  # how often each name has been assigned so far
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
        return TraceResult(
            candidates=self.candidates,
            plans=self.plans,
            dropped_ifs=self.dropped_ifs,
            returns=self.returns,
            probs_names_after_output=self.probs_after_output,
            params=self.params,
            fallbacks=tuple(dict.fromkeys(self.fallbacks)),
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
            self.if_statement(statement, depth)
        elif isinstance(statement, cst.With):
            for item in statement.items:
                self.poison_reads(item.item, self.line_of(statement), Code.SCORES_READ, "a `with` item reads the scores")
            self.block(block_body(statement.body), depth)
        elif isinstance(statement, (cst.For, cst.While)):
            self.loop(statement, depth)
        elif isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            self.env.pop(statement.name.value, None)
        elif isinstance(statement, cst.Try):
            before = set(self.live_cids())
            self.block(block_body(statement.body), depth + 1)
            for handler in statement.handlers:
                self.block(block_body(handler.body), depth + 1)
            self.poison_new(before, Code.REPEATED, "computed inside a try block", self.line_of(statement))
        else:
            self.poison_reads(statement, self.line_of(statement), Code.SCORES_READ, "read by an unsupported statement")

    def loop(self, statement: cst.For | cst.While, depth: int) -> None:
        line = self.line_of(statement)
        chain_names = {name for name, value in self.env.items() if isinstance(value, ChainVal)}
        before = set(self.live_cids())
        self.block(block_body(statement.body), depth + 1)
        touched = self.live_cids() - before
        for name in chain_names:
            value = self.env.get(name)
            if isinstance(value, ChainVal):
                touched.add(value.cid)
        for cid in touched:
            body_names = _names_in(statement.body)
            if cid in before and not (body_names & chain_names):
                continue
            self.candidates[cid].poisoned(Code.REPEATED, "the attention is computed inside a loop (chunked or iterative attention)", line)
        if isinstance(statement, cst.For):
            for name in assigned_names(statement.target):
                self.env.pop(name, None)

    def decided(self, test: cst.BaseExpression | None) -> bool | None:
        """What a branch test is on the SDPA path, when the known facts decide it."""
        if test is None or self.known == Known():
            return None
        return decide(test, self.known)

    def if_statement(self, node: cst.If, depth: int) -> None:
        line = self.line_of(node)
        branches = if_branches(node)
        if self.known != Known():
            kept: list[tuple[cst.BaseExpression | None, Sequence[cst.BaseStatement]]] = []
            for test, body in branches:
                decision = self.decided(test)
                if decision is False:
                    continue
                kept.append((None, body) if decision is True else (test, body))
                if decision is True:
                    break
            if not kept:
                return
            if kept[0][0] is None:  # the first branch left always runs
                self.block(kept[0][1], depth)
                return
            branches = kept
        # raise-guards on the scores' shape or dtype disappear with the scores
        if len(branches) == 1 and self.chain_refs(branches[0][0]) and _only_raises(branches[0][1]):
            self.dropped_ifs.add(node)
            return
        for test, _ in branches:
            if test is not None:
                self.keep_expression(test, line, test)
        start_env = dict(self.env)
        results: list[dict[str, Value]] = []
        has_else = branches[-1][0] is None
        for index, (test, body) in enumerate(branches):
            self.env.clear()
            self.env.update(start_env)
            if test is not None:
                self.tests.append(test)
            self.path.append((id(node), index))
            self.block(body, depth + 1)
            self.path.pop()
            if test is not None:
                self.tests.pop()
            results.append(dict(self.env))
        if not has_else:
            results.append(start_env)
        merged: dict[str, Value] = {}
        names = set().union(*(r.keys() for r in results))
        for name in names:
            values = [r.get(name) for r in results]
            first = values[0]
            if all(v is not None and _same_value(v, first) for v in values):
                merged[name] = first  # type: ignore[assignment]
                continue
            chains = [v for v in values if isinstance(v, ChainVal)]
            if not chains:
                if all(v is not None and self.value_is_scalar(v) for v in values):
                    merged[name] = ScalarVal()
                elif all(isinstance(v, (ExprVal, AnyExpr)) for v in values):
                    nodes = [n for v in values for n in ((v.node,) if isinstance(v, ExprVal) else v.nodes)]  # type: ignore[union-attr]
                    merged[name] = AnyExpr(tuple(dict.fromkeys(nodes)))
                continue
            cids = {c.cid for c in chains}
            stages = {c.stage for c in chains}
            ranks = {c.rank for c in chains}
            if len(cids) == 1 and len(chains) == len(values) and len(stages) == 1 and len(ranks) == 1:
                merged[name] = chains[0]
                continue
            cid = chains[0].cid
            if len(cids) == 1 and len(stages) == 1 and chains[0].stage == PROBS:
                # an alias of the weights made only in some branches (e.g. for output_attentions)
                merged[name] = chains[0]
                continue
            if len(cids) == 1 and len(chains) == len(values) and len(stages) == 1:
                self.candidates[cid].poisoned(Code.CONDITIONAL, "the scores change layout under a condition", line)
            elif len(cids) == 1 and len(stages) > 1:
                self.candidates[cid].poisoned(Code.CONDITIONAL, "the softmax or the product with V happens only under a condition", line)
            else:
                for c in cids:
                    self.candidates[c].poisoned(Code.CONDITIONAL, "the scores are replaced under a condition", line)
            merged[name] = chains[0]
        self.env.clear()
        self.env.update(merged)

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
        elif isinstance(small, cst.Assert) and self.chain_refs(small) and not self.chain_value_refs(small):
            self.plans[small] = ChainStmt([], [], depth, line)  # a shape check on the scores goes with them
        elif isinstance(small, cst.Return):
            self.returns.append(small)
            output = self.find_output(small.value) if small.value is not None else None
            if output is not None:
                assert small.value is not None
                self.output_statement(small, small.value, output, [], depth, line)
            elif small.value is not None:
                if not self.weights_passed_along(small.value):
                    for cid in self.chain_value_refs(small.value):
                        self.candidates[cid].poisoned(
                            Code.VALUE_SIDE,
                            f"the probabilities are used after the product with V, in `{_short(small.value)}`",
                            line,
                        )
                self.keep_expression(small.value, line, small, allow_probs=True)
        else:
            self.keep_expression(small, line, small)

    def assign(
        self, targets: list[cst.BaseExpression], value: cst.BaseExpression, small: cst.CSTNode, depth: int, line: int
    ) -> None:
        names = [n for t in targets for n in assigned_names(t)]
        simple = len(targets) == 1 and isinstance(targets[0], cst.Name)
        output = self.find_output(value)
        if output is not None:
            self.output_statement(small, value, output, names, depth, line)
            return
        if self.reads_only_weights(value):
            if not self.weights_passed_along(value):
                for cid in self.chain_value_refs(value):
                    self.candidates[cid].poisoned(
                        Code.VALUE_SIDE, f"the probabilities are used after the product with V, in `{_short(value)}`", line
                    )
            self.keep_expression(value, line, small, allow_probs=True)
            self.bind_plain(targets, value)
            return
        try:
            base, ops = self.decompose(value, line)
        except _NotChain:
            self.keep_expression(value, line, small, allow_probs=self.output_seen)
            self.bind_plain(targets, value)
            return
        except _Poison as poison:
            self.poison_statement(poison, value, names, line)
            return
        if not simple:
            self.candidates[base.cid].poisoned(Code.LAYOUT, "the scores are unpacked into several names", line)
            for name in names:
                self.env[name] = base
            return
        self.record(base, ops, depth, line)
        self.plans[small] = ChainStmt(ops, names, depth, line)
        self.env[names[0]] = self.advance(base, ops)
        self.note_assignment(names)

    def aug_assign(self, small: cst.AugAssign, depth: int, line: int) -> None:
        target = small.target
        if not isinstance(target, cst.Name):
            self.keep_expression(small, line, small)
            return
        current = self.env.get(target.value)
        if not isinstance(current, ChainVal):
            passed = (
                isinstance(small.operator, cst.AddAssign)
                and self.reads_only_weights(small.value)
                and self.weights_passed_along(small.value)
            )
            if passed:  # `outputs += (attention_probs,)`: the weights are returned, as `return out, probs` does
                self.keep_expression(small.value, line, small, allow_probs=True)
                self.env.pop(target.value, None)
                self.note_assignment([target.value])
                return
            if self.chain_value_refs(small.value):
                self.poison_reads(small.value, line, Code.SCORES_READ, f"the scores are folded into `{target.value}`")
            self.keep_expression(small.value, line, small)
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
                    self.candidates[cid].absorbed = True
                ops: list[Op] = [AddTerm(small.value, current.rank)]
            elif isinstance(operator, cst.AddAssign):
                ops = [self.add_term(current, small.value, line)]
            elif isinstance(operator, (cst.MultiplyAssign, cst.DivideAssign)):
                ops = [self.scale_or_head_mask(current, small.value, isinstance(operator, cst.DivideAssign), line)]
            else:
                raise _Poison(Code.SCORES_COMBINED, f"the scores are updated with `{code(operator).strip()}`", {current.cid})
        except _Poison as poison:
            self.poison_statement(poison, small.value, [target.value], line)
            return
        self.record(current, ops, depth, line)
        self.plans[small] = ChainStmt(ops, [target.value], depth, line)
        self.env[target.value] = self.advance(current, ops)

    def expression_statement(self, small: cst.Expr, depth: int, line: int) -> None:
        value = small.value
        output = self.find_output(value)
        if output is not None:  # `outputs.append(probs @ value)`
            self.output_statement(small, value, output, [], depth, line)
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
                            self.fill(p.arg(value, 0, "mask"), p.arg(value, 1, "value"), False, line, receiver.cid)
                        ]
                    elif name == "add_":
                        ops = [self.add_term(receiver, value.args[0].value, line)]
                    elif name in ("div_", "mul_"):
                        ops = [self.scale_or_head_mask(receiver, value.args[0].value, name == "div_", line)]
                    else:
                        raise _Poison(Code.SCORES_TRANSFORMED, f"`.{name}()` is applied to the scores in place", {receiver.cid})
                except _Poison as poison:
                    self.poison_statement(poison, value, [], line)
                    return
                self.record(receiver, ops, depth, line)
                self.plans[small] = ChainStmt(ops, [found[0].value], depth, line)
                self.env[found[0].value] = self.advance(receiver, ops)
                return
        self.keep_expression(value, line, small)

    def output_statement(
        self,
        small: cst.CSTNode,
        value: cst.BaseExpression,
        found: tuple[cst.BaseExpression, p.Product],
        names: list[str],
        depth: int,
        line: int,
    ) -> None:
        node, product = found
        try:
            base, ops = self.decompose(product.left, line)
        except (_NotChain, _Poison) as error:  # pragma: no cover - find_output checked the operand
            raise AssertionError(str(error))
        if self.advance(base, ops).stage != PROBS:
            self.candidates[base.cid].poisoned(Code.SOFTMAX_DIM, "the scores reach the product with V without a softmax", line)
        if self.candidates[base.cid].stage == OUT:
            self.candidates[base.cid].poisoned(Code.VALUE_SIDE, "the probabilities are multiplied by a second tensor", line)
        if self.chain_refs(product.right):
            self.candidates[base.cid].poisoned(Code.VALUE_SIDE, "the value operand depends on the scores", line)
        rank = product.rank if product.rank is not None else base.rank
        if product.form is p.ProductForm.EINSUM:
            roles = p.einsum_roles(product.spec or "")
            rank = roles.rank if roles else rank
        output = Output(product, node, product.right, rank)
        self.record(base, [*ops, output], depth, line)
        self.plans[small] = OutputStmt(list(ops), output, depth, line)
        candidate = self.candidates[base.cid]
        candidate.stage = OUT
        self.output_seen = True
        # the rest of the statement may only pass the weights along (`return output, weights`)
        for name, read in self.chain_names_in(value, exclude=node):
            value_of = self.env.get(name)
            if isinstance(value_of, ChainVal) and value_of.stage == PROBS and self.weights_passed_along(value, node):
                self.probs_after_output.add(name)
            else:
                candidate.poisoned(Code.VALUE_SIDE, f"the statement with the product with V also reads `{name}`", line)
        for name in names:
            self.env.pop(name, None)
        self.note_assignment(names)

    # -------------------------------------------------------------- chain expressions

    def decompose(self, node: cst.BaseExpression, line: int) -> tuple[ChainVal, list[Op]]:
        """Split an expression into the chain value it starts from and the operations applied to it."""
        if isinstance(node, cst.Name):
            value = self.env.get(node.value)
            if isinstance(value, ChainVal):
                return value, []
            raise _NotChain()
        start = self.start(node, line)
        if start is not None:
            return start
        softmax = p.softmax_call(node, self.scope)
        if softmax is not None:
            try:
                base, ops = self.decompose(softmax.operand, line)
            except _NotChain:
                return self.unknown_origin(node, softmax, line)
            self.require(base, ops, SCORES, "softmax", line, Code.SOFTMAX_DIM)
            if softmax.dim is not None:
                dim = p.number(softmax.dim)
                rank = self.advance(base, ops).rank
                if dim is None or not (dim == -1 or (rank is not None and dim == rank - 1)):
                    raise _Poison(Code.SOFTMAX_DIM, f"the softmax runs over dim={code(softmax.dim)}, not the key dimension", {base.cid})
            return base, [*ops, Softmax(softmax)]
        dropout = p.dropout_call(node, self.scope)
        if dropout is not None and self.chain_refs(dropout.operand):
            base, ops = self.decompose(dropout.operand, line)
            self.require(base, ops, PROBS, "dropout", line, Code.DROPOUT)
            return base, [*ops, Dropout(dropout, self.module_guard(dropout.module))]
        identity = identity_unless(node, self.facts, self.class_name) if isinstance(node, cst.Call) else None
        if identity is not None and self.chain_refs(identity[0]):
            # a module of the file that hands its input back unless its settings say otherwise (DeBERTa's
            # StableDropout in training): the SDPA class runs eager whenever they do
            base, ops = self.decompose(identity[0], line)
            self.require(base, ops, PROBS, "dropout", line, Code.DROPOUT)
            self.fallbacks.append(code(identity[1]))
            return base, ops
        if isinstance(node, cst.Call):
            return self.decompose_call(node, line)
        if isinstance(node, cst.BinaryOperation):
            return self.decompose_binary(node, line)
        refs = self.chain_value_refs(node)
        if refs:
            raise _Poison(Code.SCORES_READ, f"the scores are used in `{_short(node)}`", refs)
        raise _NotChain()

    def decompose_call(self, node: cst.Call, line: int) -> tuple[ChainVal, list[Op]]:
        qualified = self.scope.qualify(node.func)
        found = p.method_call(node)
        if found is not None and self.chain_or_start(found[0]):
            receiver, name = found
            base, ops = self.decompose(receiver, line)
            current = self.advance(base, ops)
            if name in p.RESHAPE_METHODS:
                after = self.view_rank(node.args)
                heads = None
                if current.rank == 3 and after == 4:
                    heads = (node.args[0].value, node.args[1].value) if len(node.args) == 4 else self.tuple_heads(node.args)
                if current.rank is None and after is not None and after != 4:
                    raise _Poison(Code.LAYOUT, "the scores are reshaped and their layout cannot be told", {base.cid})
                if after is not None and after == (current.rank or 4):
                    # a view that keeps the rank may still regroup the entries (`view(b, q, h, k)` of (b, h, q, k))
                    raise _Poison(
                        Code.LAYOUT,
                        f"the scores are viewed as `{_short(node)}`, a shape of the same rank that may regroup them",
                        {base.cid},
                    )
                shape = None
                if (current.rank, after) in ((3, 5), (4, 5), (5, 3), (5, 4)):
                    shape = self.view_shape(node.args)
                    if shape is None:
                        raise _Poison(Code.LAYOUT, f"the scores are regrouped by `{_short(node)}`, a shape that cannot be read", {base.cid})
                return base, [*ops, View(current.rank, after if after is not None else current.rank, heads, shape)]
            if name in p.CAST_METHODS:
                return base, [*ops, Cast(name in ("float", "double") or _casts_to_float32(node, self.scope))]
            if name in ("masked_fill", "masked_fill_"):
                return base, [*ops, self.fill(p.arg(node, 0, "mask"), p.arg(node, 1, "value"), False, line, base.cid, ops)]
            if name in ("clamp", "clamp_min"):
                bound = p.arg(node, 0, "min")
                upper = p.arg(node, 1, "max")
                if bound is not None and upper is None and p.is_very_negative(bound, self.scope):
                    return base, [*ops, Guard(self.detach(bound, base.cid), p.is_absorbing(bound, self.scope))]
            raise _Poison(Code.SCORES_TRANSFORMED, f"`.{name}()` is applied to the scores", {base.cid})
        if qualified in p.WHERE_FUNCTIONS and len(node.args) == 3:
            condition, when_true, when_false = (a.value for a in node.args)
            if self.chain_value_refs(condition):
                raise _Poison(Code.SCORES_READ, "the scores decide their own mask", self.chain_value_refs(condition))
            if self.chain_or_start(when_true) and not self.chain_value_refs(when_false):
                base, ops = self.decompose(when_true, line)
                return base, [*ops, self.fill(condition, when_false, True, line, base.cid, ops)]
            if self.chain_or_start(when_false) and not self.chain_value_refs(when_true):
                base, ops = self.decompose(when_false, line)
                return base, [*ops, self.fill(condition, when_true, False, line, base.cid, ops)]
        if qualified == "torch.masked_fill" and len(node.args) == 3:
            base, ops = self.decompose(node.args[0].value, line)
            return base, [*ops, self.fill(node.args[1].value, node.args[2].value, False, line, base.cid, ops)]
        if qualified in p.MAXIMUM_FUNCTIONS:
            operand = p.arg(node, 0, "input")
            bound = p.arg(node, 1, "min" if "clamp" in (qualified or "") else "other")
            if operand is not None and bound is not None and self.chain_or_start(operand) and not self.chain_value_refs(bound):
                if p.is_very_negative(bound, self.scope) and p.arg(node, 2, "max") is None:
                    base, ops = self.decompose(operand, line)
                    return base, [*ops, Guard(self.detach(bound, base.cid), p.is_absorbing(bound, self.scope))]
        refs = self.chain_value_refs(node)
        if refs:
            added = self.additive_helper(node, line)
            if added is not None:
                return added
            expression = inlined(node, self.facts, self.scope.class_name, self.scope.qualify)
            if expression is not None:
                return self.decompose(expression, line)  # a softmax wrapper of the file, read as what it computes
            raise _Poison(Code.SCORES_TRANSFORMED, f"the scores are passed to `{_short(node.func)}`", refs)
        raise _NotChain()

    def additive_helper(self, node: cst.Call, line: int) -> tuple[ChainVal, list[Op]] | None:
        """`helper(scores, ...)` where the helper (a function of this file or a method of the class) only adds
        terms that do not depend on the scores: the term `helper(zeros, ...)`."""
        function: cst.FunctionDef | None = None
        skip = 0
        if isinstance(node.func, cst.Name):
            function = self.facts.functions.get(node.func.value)
        elif m.matches(node.func, m.Attribute(value=m.Name("self"))) and self.scope.class_name is not None:
            assert isinstance(node.func, cst.Attribute)
            found = self.facts.find_method(self.scope.class_name, node.func.attr.value)
            function, skip = (found[1], 1) if found is not None else (None, 0)
        if function is None or any(a.star for a in node.args):
            return None
        chained = [i for i, a in enumerate(node.args) if self.chain_value_refs(a.value)]
        if len(chained) != 1:
            return None
        index = chained[0]
        argument = node.args[index]
        params = [*function.params.posonly_params, *function.params.params][skip:]
        if argument.keyword is not None:
            parameter = argument.keyword.value
        elif index < len(params):
            parameter = params[index].name.value
        else:
            return None
        shape = additive_in(function, parameter)
        if shape is None:
            return None
        base, ops = self.decompose(argument.value, line)
        current = self.advance(base, ops)
        if current.stage is not SCORES:
            return None
        if shape.reshaped and (shape.rank is None or shape.rank != current.rank):
            raise _Poison(Code.LAYOUT, f"`{_short(node.func)}` returns the scores in another shape", {base.cid})
        args = list(node.args)
        args[index] = argument.with_changes(value=cst.Name("None"))
        term = self.detach(node.with_changes(args=args), base.cid)
        return base, [*ops, AddTerm(term, current.rank, self.always_applied(term), scores_arg=index)]

    def decompose_binary(self, node: cst.BinaryOperation, line: int) -> tuple[ChainVal, list[Op]]:
        left_refs, right_refs = self.chain_or_start(node.left), self.chain_or_start(node.right)
        operator = node.operator
        if not left_refs and not right_refs:
            raise _NotChain()
        blend = self.blend(node)
        if blend is not None:
            kept, condition, fill = blend
            base, ops = self.decompose(kept, line)
            return base, [*ops, self.fill(condition, fill, True, line, base.cid, ops)]
        if isinstance(operator, cst.Add):
            if left_refs and right_refs:
                return self.add_two_chains(node, line)
            chain_side, other = (node.left, node.right) if left_refs else (node.right, node.left)
            base, ops = self.decompose(chain_side, line)
            current = self.advance(base, ops)
            return base, [*ops, self.add_term(current, other, line)]
        if isinstance(operator, (cst.Multiply, cst.Divide)):
            if left_refs and right_refs:
                if any(self.stage_of(cid) != SCORES for cid in left_refs | right_refs if cid >= 0):
                    raise _Poison(
                        Code.PROBABILITIES_CHANGED,
                        f"the probabilities are rescaled by themselves in `{_short(node)}`",
                        left_refs | right_refs,
                    )
                raise _Poison(Code.SCORES_COMBINED, "the scores are multiplied by themselves", left_refs | right_refs)
            if right_refs and isinstance(operator, cst.Divide):
                raise _Poison(Code.SCORES_COMBINED, "the scores are a divisor", right_refs)
            chain_side, other = (node.left, node.right) if left_refs else (node.right, node.left)
            base, ops = self.decompose(chain_side, line)
            current = self.advance(base, ops)
            return base, _cancelled(ops, self.scale_or_head_mask(current, other, isinstance(operator, cst.Divide), line))
        if isinstance(operator, cst.Subtract) and left_refs and self.row_maximum_of(node.right, node.left):
            base, ops = self.decompose(node.left, line)
            current = self.advance(base, ops)
            if current.stage != SCORES:
                raise _Poison(Code.PROBABILITIES_CHANGED, "the probabilities are shifted after the softmax", {base.cid})
            return base, [*ops, Shift()]
        raise _Poison(Code.SCORES_COMBINED, f"the scores are combined with `{code(operator).strip()}`", left_refs | right_refs)

    def row_maximum_of(self, node: cst.BaseExpression, scores: cst.BaseExpression) -> bool:
        """`node` is the maximum over the last dimension of `scores`, kept as a dimension: `scores.amax(-1,
        keepdim=True)`, `scores.amax(dim=-1).unsqueeze(-1)`, `scores.max(-1, keepdim=True)[0]` or `.values`,
        `torch.amax(scores, -1, keepdim=True)`; also through one local holding it."""
        if isinstance(node, cst.Name):
            values = self.scope.local_values(node.value)
            return len(values) == 1 and self.row_maximum_of(values[0], scores)
        kept = False
        if isinstance(node, cst.Call) and p.method_call(node, {"unsqueeze"}) is not None and len(node.args) == 1:
            if p.number(node.args[0].value) == -1:
                node, kept = p.method_call(node, {"unsqueeze"})[0], True  # type: ignore[index]
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and m.matches(node.slice[0].slice, m.Index(m.Integer("0"))):
            node = node.value
        elif isinstance(node, cst.Attribute) and node.attr.value == "values":
            node = node.value
        if not isinstance(node, cst.Call):
            return False
        found = p.method_call(node, {"amax", "max"})
        operand: cst.BaseExpression | None
        if found is not None:
            operand, dim, keepdim = found[0], p.arg(node, 0, "dim"), p.arg(node, 1, "keepdim")
        elif self.scope.qualify(node.func) in ("torch.amax", "torch.max"):
            operand, dim, keepdim = p.arg(node, 0, "input"), p.arg(node, 1, "dim"), p.arg(node, 2, "keepdim")
        else:
            return False
        if operand is None or dim is None or p.number(dim) not in (-1,):
            return False
        if not kept and (keepdim is None or not m.matches(keepdim, m.Name("True"))):
            return False
        return operand.deep_equals(scores)

    def blend(self, node: cst.BinaryOperation) -> tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression] | None:
        """`scores * b + v * (1 - b)` (or `- c * (1 - b)`), GPT's TensorFlow-era masking, with `b` a slice of a
        lower-triangular buffer of ones (every entry 0 or 1): exactly `torch.where(b.bool(), scores, v)` for finite
        scores. Gives (the scores' expression, the condition, the fill)."""
        if not isinstance(node.operator, (cst.Add, cst.Subtract)):
            return None
        kept = _times(node.left)
        masked = _times(node.right)
        if kept is None or masked is None:
            return None
        for scores, weight in (kept, kept[::-1]):
            if not self.chain_or_start(scores) or self.chain_value_refs(weight):
                continue
            for value, complement in (masked, masked[::-1]):
                if self.chain_value_refs(value) or not _one_minus(complement, weight):
                    continue
                if isinstance(node.operator, cst.Subtract):
                    value = cst.UnaryOperation(cst.Minus(), value if precedence(value) >= 12 else parenthesized(value))
                if self.triangle_slice(weight) is None:
                    return None
                condition = cst.Call(func=cst.Attribute(value=primary(weight), attr=cst.Name("bool")))
                return scores, condition, value
        return None

    def add_two_chains(self, node: cst.BinaryOperation, line: int) -> tuple[ChainVal, list[Op]]:
        """`scores + relative_scores`: the chain that continues is the older one; the other is an additive term."""
        left_cids, right_cids = self.chain_or_start(node.left), self.chain_or_start(node.right)
        if len(left_cids | right_cids) != 2 or left_cids & right_cids:
            raise _Poison(Code.SCORES_COMBINED, "the scores are added to themselves", left_cids | right_cids)
        def age(cids: set[int]) -> float:
            return min(cids) if min(cids) >= 0 else float("inf")  # a product starting here is the newest

        main_left = age(left_cids) < age(right_cids)
        chain_side, other = (node.left, node.right) if main_left else (node.right, node.left)
        absorbed = right_cids if main_left else left_cids
        for cid in absorbed:
            if cid >= 0:
                self.candidates[cid].absorbed = True
        base, ops = self.decompose(chain_side, line)
        current = self.advance(base, ops)
        return base, [*ops, AddTerm(other, current.rank)]

    # -------------------------------------------------------------- single operations

    def start(self, node: cst.BaseExpression, line: int) -> tuple[ChainVal, list[Op]] | None:
        product = p.product(node, self.scope)
        if product is None:
            return None
        if self.chain_refs(product.left) or self.chain_refs(product.right):
            return None
        if product.initial is not None and self.chain_refs(product.initial):
            return None
        if self.selected_start is not None and node is not self.selected_start:
            return None
        key: cst.BaseExpression | None
        key_factor: tuple[cst.BaseExpression, bool] | None = None
        unproven: tuple[cst.BaseExpression, cst.BaseExpression] | None = None
        rank = product.rank
        if product.form is p.ProductForm.EINSUM:
            roles = p.einsum_roles(product.spec or "")
            if roles is None or roles.kind is not p.EinsumRole.SCORES:
                return None
            key, rank = product.right, roles.rank
        else:
            right, key_factor = self.scaled_operand(product.right)
            unproven = self.unproven_key_factor(product.right, rank) if key_factor is None else None
            if unproven is not None:
                right = unproven[0]
            key = self.untranspose(right, rank)
            if key is None:
                return None
        query, query_upcast = _strip_casts(product.left, self.scope)
        key, key_upcast = _strip_casts(key, self.scope)
        if rank is None:
            rank = self.rank_of(query)
        start = Start(
            product,
            query,
            key,
            rank,
            query_upcast or key_upcast,
            self.query_scale(query),
            self.bound_to_float32(query) or self.bound_to_float32(key),
        )
        cid = len(self.candidates)
        candidate = Candidate(cid, start, line, start_node=node)
        self.candidates.append(candidate)
        ops: list[Op] = [start]
        base = ChainVal(cid, SCORES, rank)
        if key_factor is not None:
            # `q @ (k^T / s)` is `(q @ k^T) / s`: the factor scales the product, before any term
            ops.append(Scale(self.detach(key_factor[0], cid), key_factor[1]))
        if unproven is not None:
            raise _Poison(
                Code.SCALE_NOT_A_NUMBER, f"the key is scaled by `{_short(unproven[1])}`, which is not provably a number", {cid}
            )
        if product.form is p.ProductForm.BADDBMM:
            ops.extend(self.baddbmm_terms(product, base, line))
        return base, ops

    def scaled_operand(self, node: cst.BaseExpression) -> tuple[cst.BaseExpression, tuple[cst.BaseExpression, bool] | None]:
        """A product operand multiplied or divided by a number (`key.transpose(-1, -2) / scale`): the operand and
        (the number, whether it divides); otherwise the node as it is."""
        if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, (cst.Multiply, cst.Divide)):
            return node, None
        divide = isinstance(node.operator, cst.Divide)
        sides = [(node.left, node.right)] if divide else [(node.left, node.right), (node.right, node.left)]
        for operand, factor in sides:
            number = p.scalar(factor, self.scope)
            if number is not None and not self.chain_refs(factor):
                return operand, (number.node, divide)
        return node, None

    def unproven_key_factor(
        self, node: cst.BaseExpression, rank: int | None
    ) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        """A transposed key multiplied or divided by something not shown to be a number: (the key, the factor)."""
        if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, (cst.Multiply, cst.Divide)):
            return None
        if self.untranspose(node.left, rank) is not None:
            return node.left, node.right
        if isinstance(node.operator, cst.Multiply) and self.untranspose(node.right, rank) is not None:
            return node.right, node.left
        return None

    def bound_to_float32(self, node: cst.BaseExpression) -> bool:
        if not isinstance(node, cst.Name):
            return False
        local = self.scope.local_value(node.value)
        if local is None:
            return False
        _, upcast = _strip_casts(local, self.scope)
        return upcast

    def query_scale(self, query: cst.BaseExpression) -> tuple[cst.BaseExpression, bool] | None:
        """Follow the query back through reshapes to a multiplication by a number, for the report."""
        node: cst.BaseExpression | None = query
        for _ in range(6):
            if node is None:
                return None
            if isinstance(node, cst.Name):
                node = self.scope.local_value(node.value)
                continue
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
                for factor in (node.right, node.left):
                    if p.scalar(factor, self.scope) is not None:
                        return factor, isinstance(node.operator, cst.Divide)
                return None
            found = p.method_call(node, p.RESHAPE_METHODS | p.CAST_METHODS | {"transpose", "permute"})
            if found is not None:
                node = found[0]
                continue
            if isinstance(node, cst.Call) and len(node.args) >= 1:
                # a reshaping helper such as `self._shape(q, ...)` or `shape(q)`
                node = node.args[0].value
                continue
            return None
        return None

    def baddbmm_terms(self, product: p.Product, base: ChainVal, line: int) -> list[Op]:
        # beta * input + alpha * (batch1 @ batch2): alpha scales the product only, so it comes before the term
        ops: list[Op] = []
        if product.alpha is not None:
            factor = p.scalar(product.alpha, self.scope)
            if factor is None:
                raise _Poison(Code.SCALE_NOT_A_NUMBER, f"baddbmm's alpha `{code(product.alpha)}` is not a number", {base.cid})
            ops.append(Scale(factor.node, False))
        beta = product.beta
        beta_value = p.number(beta) if beta is not None else 1.0
        initial = product.initial
        assert initial is not None
        if beta_value != 0.0 and not self.is_zeros(initial):
            term = initial
            if beta is not None and beta_value != 1.0:
                if p.scalar(beta, self.scope) is None:
                    raise _Poison(Code.SCALE_NOT_A_NUMBER, f"baddbmm's beta `{code(beta)}` is not a number", {base.cid})
                term = binary(beta, cst.Multiply(), initial)
            ops.append(AddTerm(term, 3))
        return ops

    def is_zeros(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Name):
            local = self.scope.local_value(node.value)
            return local is not None and self.is_zeros(local)
        return isinstance(node, cst.Call) and self.scope.qualify(node.func) in p.ZEROS_FUNCTIONS

    def untranspose(self, node: cst.BaseExpression, rank: int | None) -> cst.BaseExpression | None:
        """The key operand of `q @ k^T`: undo a transpose of the last two dims, seen directly or through a name."""
        inner, _ = _strip_casts(node, self.scope)
        key = p.transposed_last_two(inner, rank)
        if key is not None:
            return key
        if self.transposed_key(inner):
            last, second = (cst.UnaryOperation(cst.Minus(), cst.Integer(str(n))) for n in (1, 2))
            return cst.Call(
                func=cst.Attribute(value=primary(inner), attr=cst.Name("transpose")),
                args=[cst.Arg(last), cst.Arg(second)],
            )
        return None

    def transposed_key(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """A key laid out (..., dim, length): a transpose of the last two dims or a permute putting the features second
        to last, a leading-dims flatten of one, a cat along the last dim with such a part (cat forces the others into
        the same layout), or a name that holds one on every path."""
        if depth > 6:
            return False
        node, _ = _strip_casts(node, self.scope)
        if p.transposed_last_two(node, None) is not None or p.features_second_last(node):
            return True
        reshaped = p.reshape_args(node)
        if reshaped is not None:
            return _flattens_leading(reshaped[1]) and self.transposed_key(reshaped[0], depth + 1)
        if isinstance(node, cst.Call) and self.scope.qualify(node.func) in p.CAT_FUNCTIONS:
            parts, dim = p.arg(node, 0, "tensors"), p.arg(node, 1, "dim")
            if not isinstance(parts, (cst.Tuple, cst.List)) or dim is None:
                return False
            transposed = [e.value for e in parts.elements if self.transposed_key(e.value, depth + 1)]
            return bool(transposed) and self.along_last(dim, transposed[0])
        if isinstance(node, cst.Name):
            values = self.scope.local_values(node.value)
            if not values:
                return node.value in self.key_params
            return all(self.transposed_key(v, depth + 1) for v in values)
        returned = self.returned_for(node)
        return bool(returned) and all(v is not None and p.features_second_last(v) for v in returned)

    def returned_for(self, node: cst.BaseExpression) -> list[cst.BaseExpression | None]:
        """What `self.method(x, k=True)` may return: the method's returns on the paths its literal boolean
        arguments (and defaults) leave open (`split_heads(key, k=True)` returns the key permuted to (b, h, d, s))."""
        if not (
            isinstance(node, cst.Call)
            and m.matches(node.func, m.Attribute(value=m.Name("self")))
            and self.scope.class_name is not None
            and not p.has_star_args(node)
        ):
            return []
        assert isinstance(node.func, cst.Attribute)
        found = self.facts.find_method(self.scope.class_name, node.func.attr.value)
        if found is None:
            return []
        method = found[1]
        params = [param for param in method.params.params if param.name.value != "self"]
        flags: dict[str, bool] = {}
        for index, param in enumerate(params):
            given = p.arg(node, index, param.name.value)
            value = given if given is not None else param.default
            if isinstance(value, cst.Name) and value.value in ("True", "False"):
                flags[param.name.value] = value.value == "True"
        return _open_returns(block_body(method.body), flags)

    def along_last(self, dim: cst.BaseExpression, part: cst.BaseExpression) -> bool:
        """`dim` names the last dimension of `part`: -1, or its rank minus one when the rank can be read."""
        value = p.number(dim)
        if value is None:
            return False
        if value == -1:
            return True
        rank = self.rank_of(part)
        return rank is not None and value == rank - 1

    def add_term(self, current: ChainVal, term: cst.BaseExpression, line: int) -> AddTerm:
        if current.stage != SCORES:
            raise _Poison(Code.PROBABILITIES_CHANGED, "a term is added to the probabilities after the softmax", {current.cid})
        if self.chain_value_refs(term):
            raise _Poison(Code.SCORES_READ, f"the additive term `{_short(term)}` depends on the scores", {current.cid})
        return AddTerm(
            self.detach(term, current.cid), current.rank, self.always_applied(term), may_be_number=self.may_be_number(term)
        )

    def may_be_number(self, term: cst.BaseExpression) -> bool:
        """A local that holds a number literal on some path, directly or as what a method of the module returns (a
        name the method returns that it assigns a number somewhere: `score = 0`, then `score += ...` under tests)."""
        if not isinstance(term, cst.Name):
            return False
        for value in self.scope.local_values(term.value):
            if p.number(value) is not None:
                return True
            if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
                continue
            if not (isinstance(value.func.value, cst.Name) and value.func.value.value == "self"):
                continue
            found = self.facts.find_method(self.class_name, value.func.attr.value) if self.class_name else None
            if found is not None and _returns_a_number(found[1]):
                return True
        return False

    def always_applied(self, term: cst.BaseExpression) -> bool:
        """Only `x is not None` tests of the term's own names enclose it (an `else` branch counts as a condition)."""
        if len(self.tests) != len(self.path):
            return False
        names = p.walk_names(term)
        for test in self.tests:
            checked = _only_not_none(test)
            if checked is None or not checked <= names:
                return False
        return True

    def scale_or_head_mask(self, current: ChainVal, factor: cst.BaseExpression, divide: bool, line: int) -> Op:
        if current.stage == SCORES:
            scalar = p.scalar(factor, self.scope)
            if scalar is None:
                if not self.chain_value_refs(factor) and p.constant_along_last(factor, self.scope):
                    return Scale(self.detach(factor, current.cid), divide, per_query=True)
                raise _Poison(
                    Code.SCALE_NOT_A_NUMBER,
                    f"the scores are scaled by `{_short(factor)}`, which is not provably a number nor a tensor the same "
                    "for every key",
                    {current.cid},
                )
            return Scale(self.detach(scalar.node, current.cid), divide)
        if current.stage == PROBS and not divide:
            root = _root_param(factor, self.params)
            guarded = root is not None and any(_tests_not_none(test, root) for test in self.tests)
            if not guarded:
                raise _Poison(
                    Code.PROBABILITIES_CHANGED,
                    f"the probabilities are multiplied by `{_short(factor)}` outside a `... is not None` head-mask guard",
                    {current.cid},
                )
            return HeadMask(factor, root)
        raise _Poison(Code.PROBABILITIES_CHANGED, "the probabilities are rescaled after the softmax", {current.cid})

    def fill(
        self,
        condition: cst.BaseExpression | None,
        fill: cst.BaseExpression | None,
        keep_where_true: bool,
        line: int,
        cid: int,
        pending: Sequence[Op] = (),
    ) -> Fill | ZeroRows:
        """A masking fill of the scores; after the softmax (`pending`, the ops of the expression so far, may hold
        it), a zeroing of the probabilities where an earlier fill masked the scores."""
        if condition is None or fill is None:
            raise _Poison(Code.FILL_VALUE, "a masking fill without a mask or a value", {cid})
        candidate = self.candidates[cid]
        if candidate.stage == PROBS or any(isinstance(op, Softmax) for op in pending):
            return self.zero_rows(condition, fill, keep_where_true, cid, pending)
        if not p.is_very_negative(fill, self.scope):
            raise _Poison(Code.FILL_VALUE, f"masked scores are set to `{_short(fill)}`, not to a large negative value", {cid})
        negated = None if keep_where_true else self.negated(condition)
        if negated is not None:  # `masked_fill(bias == 0, f)` keeps where `bias` is true
            condition, keep_where_true = negated, True
        triangle = self.triangle_slice(condition) if keep_where_true else None
        diagonal = triangle[0] if triangle is not None and _bottom_right(triangle[1]) else None
        top_left = triangle is not None and _top_left(triangle[1])
        causal = diagonal is Diagonal.CAUSAL
        absorbing = p.is_absorbing(fill, self.scope)
        row_safe = diagonal is not None or self.is_padding_condition(condition)
        detached = self.detach(condition, cid)
        return Fill(
            detached, keep_where_true, self.detach(fill, cid), causal, absorbing, row_safe, top_left,
            path=tuple(self.path), bindings=self.bindings_of(detached),
        )

    def bindings_of(self, node: cst.BaseExpression) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((name, self.assignments.get(name, 0)) for name in p.walk_names(node)))

    def zero_rows(
        self,
        condition: cst.BaseExpression,
        fill: cst.BaseExpression,
        keep_where_true: bool,
        cid: int,
        pending: Sequence[Op],
    ) -> ZeroRows:
        """`softmax(masked).masked_fill(mask, 0)`: exact on SDPA as zeroed output rows where `mask` masks every key,
        when the scores were masked by `mask` with an absorbing value, in the same or an enclosing branch, with no
        name of it reassigned since, and nothing else masks the scores (another mask could empty the rest of a
        row, whose probabilities at `mask` would then not be 0 before the zeroing)."""
        if p.fill_number(fill, self.scope) != 0:
            raise _Poison(Code.FILL_VALUE, f"the probabilities are set to `{_short(fill)}` after the softmax", {cid})
        negated = None if keep_where_true else self.negated(condition)
        if negated is not None:  # as `fill` reads it: `masked_fill(~keep, 0)` keeps where `keep` is true
            condition, keep_where_true = negated, True
        detached = self.detach(condition, cid)
        ops = [op for op, _, _ in self.candidates[cid].ops] + list(pending)
        fills = [op for op in ops if isinstance(op, Fill)]
        masks = [op for op in ops if isinstance(op, Guard)] + [
            op for op in ops if isinstance(op, AddTerm) and any("mask" in n for n in p.walk_names(op.term))
        ]
        matched = [f for f in fills if f.keep_where_true == keep_where_true and f.condition.deep_equals(detached)]
        if not matched or not matched[0].absorbing:
            raise _Poison(
                Code.FILL_VALUE,
                f"the probabilities are set to 0 where `{_short(condition)}` holds, which is not where the scores were "
                "masked with a value that absorbs them",
                {cid},
            )
        first = matched[0]
        if not p.is_minus_infinity(first.fill, self.scope):
            # a finite fill (finfo.min) gives a masked key weight exp(-s) against keys another term pushed to about
            # finfo.min too: an additive term handed in as a parameter may carry such a mask (T5's position_bias)
            masks += [op for op in ops if isinstance(op, AddTerm) and isinstance(op.term, cst.Name) and op.term.value in self.params]
        if len(fills) > 1 or masks:
            raise _Poison(
                Code.MASKED_ROWS,
                f"the probabilities are set to 0 where `{_short(condition)}` masked the scores, but other masks may "
                "mask the rest of a row, whose probabilities there would not be 0",
                {cid},
            )
        if first.bindings != self.bindings_of(detached) or tuple(self.path[: len(first.path)]) != first.path:
            raise _Poison(
                Code.FILL_VALUE,
                f"the probabilities are set to 0 where `{_short(condition)}` holds, but that mask may differ from the "
                "one the scores were masked with (reassigned, or masked in another branch)",
                {cid},
            )
        return ZeroRows(detached, keep_where_true)

    def is_padding_condition(self, node: cst.BaseExpression) -> bool:
        """A condition read from the mask parameters only (`~attention_mask`, `mask == 0`, `mask.bool()`)."""
        names = p.walk_names(node)
        masks = {n for n in names if n in self.params and "mask" in n and not n.endswith("head_mask")}
        return bool(masks) and names <= masks | {"torch"}

    def triangle_slice(self, node: cst.BaseExpression, depth: int = 0) -> tuple[Diagonal, cst.Subscript] | None:
        """A slice, sliced anywhere, of a registered buffer built as a triangle of ones (entries 0 or 1), through
        locals and casts: what the buffer keeps, and the slice."""
        if depth > 4:
            return None
        if isinstance(node, cst.Name):
            local = self.scope.local_value(node.value)
            return None if local is None else self.triangle_slice(local, depth + 1)
        found = p.method_call(node, p.CAST_METHODS | {"bool"})  # a cast keeps the 0/1 entries
        if found is not None:
            return self.triangle_slice(found[0], depth + 1)
        if not isinstance(node, cst.Subscript):
            return None
        buffer = p.self_attribute_name(node.value)
        if buffer is None or self.class_name is None:
            return None
        registered = self.facts.find_buffer(self.class_name, buffer)
        if registered is None:
            return None
        kind = buffer_diagonal(registered, self.facts.find_buffer_locals(self.class_name, buffer), self.scope)
        return None if kind is None else (kind, node)

    def negated(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """The condition a negation negates: `~x`, `x == 0`, `x.logical_not()`, `torch.logical_not(x)`."""
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            return node.expression
        if (
            isinstance(node, cst.Comparison)
            and len(node.comparisons) == 1
            and isinstance(node.comparisons[0].operator, cst.Equal)
            and p.number(node.comparisons[0].comparator) == 0.0
        ):
            return node.left
        found = p.method_call(node, {"logical_not"})
        if found is not None and isinstance(node, cst.Call) and not node.args:
            return found[0]
        if isinstance(node, cst.Call) and self.scope.qualify(node.func) == "torch.logical_not" and len(node.args) == 1:
            return node.args[0].value
        return None

    def unknown_origin(self, node: cst.BaseExpression, softmax: p.SoftmaxCall, line: int) -> tuple[ChainVal, list[Op]]:
        if self.selected_start is not None:
            raise _NotChain()
        cid = len(self.candidates)
        candidate = Candidate(cid, None, line, start_node=node)
        candidate.poisoned(
            Code.UNKNOWN_PRODUCT,
            f"the attention scores come from `{_short(softmax.operand)}`, not from a recognised query-key product",
            line,
        )
        candidate.stage = PROBS
        self.candidates.append(candidate)
        return ChainVal(cid, PROBS, None), [Softmax(softmax)]

    def require(self, base: ChainVal, ops: list[Op], stage: Stage, what: str, line: int, code: Code) -> None:
        current = self.advance(base, ops)
        if current.stage != stage:
            raise _Poison(code, f"{what} is applied to the {current.stage.value}, expected the {stage.value}", {base.cid})

    # -------------------------------------------------------------- bookkeeping

    def advance(self, base: ChainVal, ops: Sequence[Op]) -> ChainVal:
        value = base
        for op in ops:
            if isinstance(op, Softmax):
                value = replace(value, stage=PROBS)
            elif isinstance(op, Output):
                value = replace(value, stage=OUT)
            elif isinstance(op, View):
                value = replace(value, rank=op.rank_after)
        return value

    def record(self, base: ChainVal, ops: Sequence[Op], depth: int, line: int) -> None:
        candidate = self.candidates[base.cid]
        for op in ops:
            candidate.ops.append((op, depth, line))
            if isinstance(op, Softmax):
                candidate.stage = PROBS

    def module_guard(self, module: str | None) -> cst.BaseExpression | None:
        """The test of the innermost branch when it is the `if` of `if self.<module> is not None`."""
        if module is None or not self.tests or not self.path or self.path[-1][1] != 0:
            return None
        return self.tests[-1] if p.optional_module_test(self.tests[-1]) == module else None

    def note_assignment(self, names: Sequence[str]) -> None:
        for name in names:
            self.assignments[name] = self.assignments.get(name, 0) + 1
        for candidate in self.candidates:
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

    def poison_statement(self, poison: _Poison, value: cst.BaseExpression, names: list[str], line: int) -> None:
        for cid in poison.cids:
            self.candidates[cid].poisoned(poison.reason.code, poison.reason.detail, line)
        stages = [v.stage for v in (self.env.get(n) for n in _names_in(value)) if isinstance(v, ChainVal)]
        stage = PROBS if PROBS in stages or OUT in stages else SCORES
        if _contains_softmax(value, self.scope):
            stage = PROBS
        first: int | None = min(poison.cids) if poison.cids else None
        for name in names:
            if first is not None:
                self.env[name] = ChainVal(first, stage, None)
                if stage == PROBS:
                    self.candidates[first].stage = PROBS
            else:
                self.env.pop(name, None)

    def poison_reads(self, node: cst.CSTNode, line: int, code: Code, reason: str) -> None:
        for cid in self.chain_refs(node):
            self.candidates[cid].poisoned(code, reason, line)

    def poison_new(self, before: set[int], code: Code, reason: str, line: int) -> None:
        for cid in self.live_cids() - before:
            self.candidates[cid].poisoned(code, reason, line)

    def value_is_scalar(self, value: Value) -> bool:
        if isinstance(value, ScalarVal):
            return True
        return isinstance(value, ExprVal) and p.scalar(value.node, self.scope) is not None

    def stage_of(self, cid: int) -> Stage:
        stages = {v.stage for v in self.env.values() if isinstance(v, ChainVal) and v.cid == cid}
        return PROBS if PROBS in stages or OUT in stages else SCORES

    def live_cids(self) -> set[int]:
        return {value.cid for value in self.env.values() if isinstance(value, ChainVal)}

    def chain_refs(self, node: cst.CSTNode | None) -> set[int]:
        if node is None:
            return set()
        out: set[int] = set()
        for name in _names_in(node):
            value = self.env.get(name)
            if isinstance(value, ChainVal):
                out.add(value.cid)
        return out

    def chain_or_start(self, node: cst.CSTNode) -> set[int]:
        """Chains read by an expression, or {-1} when it holds a query-key product that would start one."""
        refs = self.chain_value_refs(node)
        if refs:
            return refs
        finder = _Products(self.scope)
        node.visit(finder)
        for product_node, product in finder.found:
            if self.selected_start is not None and product_node is not self.selected_start:
                continue
            if self.chain_value_refs(product.left) or self.chain_value_refs(product.right):
                continue
            if product.form is p.ProductForm.EINSUM:
                roles = p.einsum_roles(product.spec or "")
                if roles is not None and roles.kind is p.EinsumRole.SCORES:
                    return {-1}
            elif self.untranspose(product.right, product.rank) is not None:
                return {-1}
        return set()

    def reads_only_weights(self, node: cst.CSTNode) -> bool:
        """After the product with V, a statement that reads the probabilities only passes the weights along."""
        if not self.output_seen:
            return False
        finder = _ChainReads(self.env, None)
        node.visit(finder)
        values = [self.env[n.value] for n in finder.plain]
        return bool(values) and all(isinstance(v, ChainVal) and v.stage in (PROBS, OUT) for v in values)

    def weights_passed_along(self, node: cst.BaseExpression, exclude: cst.CSTNode | None = None) -> bool:
        """The probabilities appear only as themselves, in tuples, or as either side of a conditional expression."""
        if node is exclude or isinstance(node, cst.Name):
            return True
        if isinstance(node, (cst.Tuple, cst.List)):
            return all(self.weights_passed_along(e.value, exclude) for e in node.elements)
        if isinstance(node, cst.IfExp):
            return not self.chain_value_refs(node.test) and all(
                self.weights_passed_along(part, exclude) for part in (node.body, node.orelse)
            )
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            return self.weights_passed_along(node.left, exclude) and self.weights_passed_along(node.right, exclude)
        found = p.method_call(node, {"reshape", "view", "transpose", "permute", "contiguous"})
        if found is not None and self.asked_for_weights():
            # laid out for the caller under `if output_attentions:`, a path SDPA leaves to eager
            assert isinstance(node, cst.Call)
            return self.weights_passed_along(found[0], exclude) and not any(
                self.chain_value_refs(a.value) for a in node.args
            )
        if exclude is not None:
            finder = _ChainReads(self.env, exclude)
            node.visit(finder)
            return not finder.plain
        return not self.chain_value_refs(node)

    def asked_for_weights(self) -> bool:
        """An enclosing `if` tests `output_attentions` itself."""
        return any(m.matches(test, m.Name("output_attentions")) for test in self.tests)

    def chain_value_refs(self, node: cst.CSTNode | None) -> set[int]:
        """Chains whose values an expression reads (`.dtype`, `.device`, shapes and `expand_as` excluded)."""
        if node is None:
            return set()
        finder = _ChainReads(self.env, None)
        node.visit(finder)
        return {self.env[n.value].cid for n in finder.plain}  # type: ignore[union-attr]

    def detach(self, node: cst.BaseExpression, cid: int) -> cst.BaseExpression:
        """An operand of a chain op with its `.dtype`/`.device` reads of the scores pointed at the query."""
        finder = _ChainReads(self.env, None)
        node.visit(finder)
        if finder.plain or finder.shapes:
            raise _Poison(Code.SCORES_READ, f"`{_short(node)}` reads the scores", {cid})
        start = self.candidates[cid].start
        if start is None:
            return node
        mapping: dict[cst.CSTNode, cst.CSTNode] = {}
        query = primary(start.query)
        for attribute in finder.attributes:
            mapping[attribute] = cst.Attribute(value=query, attr=attribute.attr)
        for call in finder.expands:
            mapping[call] = call.func.value  # type: ignore[attr-defined]
        from sdpa_port.analyse.cstutil import replace_nodes

        return replace_nodes(node, mapping) if mapping else node

    def chain_names_in(self, node: cst.CSTNode, exclude: cst.CSTNode | None = None) -> list[tuple[str, cst.Name]]:
        finder = _ChainReads(self.env, exclude)
        node.visit(finder)
        return [(n.value, n) for n in finder.plain]

    def keep_expression(self, node: cst.CSTNode, line: int, key: cst.CSTNode, allow_probs: bool = False) -> None:
        """A statement that is not part of the chain: chain reads must be of `.dtype`/`.device`/`expand_as`."""
        finder = _ChainReads(self.env, None)
        node.visit(finder)
        replacements: dict[cst.CSTNode, KeepAction] = {}
        for attribute in finder.attributes:
            replacements[attribute] = KeepAction(attribute.attr.value)
        for call in finder.expands:
            replacements[call] = KeepAction.STRIP_EXPAND
        for call, name in finder.reshapes:
            value = self.env[name.value]
            assert isinstance(value, ChainVal)
            start = self.candidates[value.cid].start
            if value.stage is not SCORES or start is None or value.rank != start.rank:
                self.candidates[value.cid].poisoned(
                    Code.SCORES_READ, f"`{_short(node)}` takes the shape of scores that changed layout", line
                )
                continue
            replacements[call] = KeepAction.RESHAPE_AS
        for name in finder.plain:
            value = self.env[name.value]
            assert isinstance(value, ChainVal)
            if value.stage in (PROBS, OUT) and (allow_probs or self.output_seen):
                self.probs_after_output.add(name.value)
                continue
            self.candidates[value.cid].poisoned(Code.SCORES_READ, f"the scores are read by `{_short(node)}`", line)
        for name in finder.shapes:
            value = self.env[name.value]
            assert isinstance(value, ChainVal)
            self.candidates[value.cid].poisoned(Code.SCORES_READ, f"the shape of the scores is read by `{_short(node)}`", line)
        sizes: dict[cst.CSTNode, int | None] = {}
        for read, name, index in finder.sizes:
            value = self.env[name.value]
            assert isinstance(value, ChainVal)
            last = index == -1 or (value.rank is not None and index == value.rank - 1)
            if not last and index >= 0 and value.rank is None:
                self.candidates[value.cid].poisoned(
                    Code.SCORES_READ, f"the shape of the scores is read by `{_short(node)}`, their rank unknown", line
                )
                continue
            # the scores are (..., queries, keys): their leading sizes are the query's, the last the key length
            sizes[read] = None if last else index
        if replacements or sizes:
            self.plans[key] = KeepStmt(replacements, sizes)

    # -------------------------------------------------------------- shapes

    def view_rank(self, args: Sequence[cst.Arg]) -> int | None:
        if len(args) == 1:  # `view(shape)` or `view(*shape)`
            return self.tuple_length(args[0].value)
        if any(a.star for a in args):
            return None
        return len(args)

    def view_shape(self, args: Sequence[cst.Arg]) -> tuple[cst.BaseExpression, ...] | None:
        """The sizes of `view(a, b, ...)` or `view((a, b, ...))`; None when starred or not written out."""
        if any(a.star or a.keyword is not None for a in args):
            return None
        if len(args) == 1:
            node = args[0].value
            if isinstance(node, cst.Name):
                node = self.scope.local_value(node.value) or node
            if isinstance(node, (cst.Tuple, cst.List)) and not any(isinstance(e, cst.StarredElement) for e in node.elements):
                return tuple(e.value for e in node.elements)
            return None
        return tuple(a.value for a in args)

    def tuple_length(self, node: cst.BaseExpression) -> int | None:
        if isinstance(node, (cst.Tuple, cst.List)):
            if any(isinstance(e, cst.StarredElement) for e in node.elements):
                return None
            return len(node.elements)
        if isinstance(node, cst.Name):
            local = self.scope.local_value(node.value)
            if local is not None:
                return self.tuple_length(local)
        return None

    def tuple_heads(self, args: Sequence[cst.Arg]) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        if len(args) != 1:
            return None
        node = args[0].value
        if isinstance(node, cst.Name):
            node = self.scope.local_value(node.value) or node
        if isinstance(node, (cst.Tuple, cst.List)) and len(node.elements) == 4:
            return node.elements[0].value, node.elements[1].value
        return None

    def rank_of(self, node: cst.BaseExpression, depth: int = 0) -> int | None:
        if depth > 6:
            return None
        if isinstance(node, cst.Name):
            local = self.scope.local_value(node.value)
            return None if local is None else self.rank_of(local, depth + 1)
        reshaped = p.reshape_args(node)
        if reshaped is not None:
            return self.view_rank(reshaped[1])
        found = p.method_call(node, p.CAST_METHODS | {"transpose", "contiguous"})
        if found is not None:
            return self.rank_of(found[0], depth + 1)
        found = p.method_call(node, {"permute"})
        if found is not None:
            assert isinstance(node, cst.Call)
            return len(node.args) if all(not a.star for a in node.args) else None
        if (
            isinstance(node, cst.Subscript)
            and len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
            and isinstance(node.slice[0].slice.value, cst.Integer)
        ):
            inner = self.rank_of(node.value, depth + 1)  # `x[0]` drops the first dimension
            return inner - 1 if inner is not None else None
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Divide)):
            # a tensor scaled by a number keeps its rank
            for tensor, other in ((node.left, node.right), (node.right, node.left)):
                if p.scalar(other, self.scope) is not None:
                    return self.rank_of(tensor, depth + 1)
            return None
        if isinstance(node, cst.Call) and self.scope.qualify(node.func) in p.SHAPE_KEEPING_FUNCTIONS:
            operand = p.arg(node, 0, "input")  # `normalize(q, dim=-1)` (cosine attention) keeps q's shape
            return None if operand is None else self.rank_of(operand, depth + 1)
        return self.rank_returned(node, depth)

    def rank_returned(self, node: cst.BaseExpression, depth: int) -> int | None:
        """`self.split(x)`: the rank every `return` of that method gives, read from its last reshape or permute
        (`transpose_for_scores`); None when the returns disagree or one cannot be read."""
        if not (
            isinstance(node, cst.Call)
            and m.matches(node.func, m.Attribute(value=m.Name("self")))
            and self.scope.class_name is not None
        ):
            return None
        assert isinstance(node.func, cst.Attribute)
        found = self.facts.find_method(self.scope.class_name, node.func.attr.value)
        if found is None:
            return None
        values = [r.value for r in nodes_of_type(found[1].body, cst.Return)]
        ranks = {self.rank_in_method(value, found[1], depth + 1) if value is not None else None for value in values}
        return ranks.pop() if len(ranks) == 1 else None

    def rank_in_method(self, node: cst.BaseExpression, method: cst.FunctionDef, depth: int) -> int | None:
        if depth > 6:
            return None
        reshaped = p.reshape_args(node)
        if reshaped is not None:  # sizes written out only: the names of this function are not the method's
            sizes = reshaped[1]
            return len(sizes) if len(sizes) > 1 and not any(a.star for a in sizes) else None
        found = p.method_call(node, {"permute"})
        if found is not None:
            assert isinstance(node, cst.Call)
            return len(node.args) if all(not a.star for a in node.args) else None
        found = p.method_call(node, p.CAST_METHODS | {"transpose", "contiguous"})
        if found is not None:
            return self.rank_in_method(found[0], method, depth + 1)
        if isinstance(node, cst.Name):
            assigned = [
                a.value
                for a in nodes_of_type(method.body, cst.Assign)
                if len(a.targets) == 1 and m.matches(a.targets[0].target, m.Name(node.value))
            ]
            ranks = {self.rank_in_method(value, method, depth + 1) for value in assigned}
            return ranks.pop() if len(ranks) == 1 else None
        return None

    # -------------------------------------------------------------- output

    def find_output(self, value: cst.BaseExpression) -> tuple[cst.BaseExpression, p.Product] | None:
        """A product whose left operand is the probabilities, anywhere inside the expression."""
        finder = _Products(self.scope)
        value.visit(finder)
        for node, product in finder.found:
            refs = self.chain_refs(product.left)
            if not refs and not (self.selected_start is None and _contains_softmax(product.left, self.scope)):
                continue
            try:
                base, ops = self.decompose(product.left, 0)
            except _NotChain:
                continue
            except _Poison as poison:
                # a chain reaches this product through an operation SDPA cannot follow: it is attention all the
                # same, refused with that operation as the reason
                for cid in poison.cids:
                    self.candidates[cid].poisoned(poison.reason.code, poison.reason.detail, self.current_line)
                    self.candidates[cid].stage = OUT
                continue
            if self.advance(base, ops).stage == PROBS:
                if product.form is p.ProductForm.EINSUM:
                    roles = p.einsum_roles(product.spec or "")
                    if roles is None or roles.kind is not p.EinsumRole.OUTPUT:
                        continue
                return node, product
        return None


# ------------------------------------------------------------------ helpers


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


def _same_value(a: Value, b: Value | None) -> bool:
    if b is None:
        return False
    if isinstance(a, ChainVal) and isinstance(b, ChainVal):
        return a == b
    if isinstance(a, ExprVal) and isinstance(b, ExprVal):
        return a.node is b.node
    return False


def _only_raises(body: Sequence[cst.BaseStatement]) -> bool:
    return bool(body) and all(
        isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, cst.Raise) for x in s.body) for s in body
    )


def _short(node: cst.CSTNode, limit: int = 70) -> str:
    text = " ".join(code(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _open_returns(body: Sequence[cst.BaseStatement], flags: dict[str, bool]) -> list[cst.BaseExpression | None]:
    """The returned values on paths that `if name:` tests of the boolean `flags` do not close (every return on an
    undecided path counts)."""
    out: list[cst.BaseExpression | None] = []
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Return):
                    out.append(small.value)
                    return out
        elif isinstance(statement, cst.If):
            test = statement.test
            decided = flags.get(test.value) if isinstance(test, cst.Name) else None
            if decided is not False:
                out += _open_returns(block_body(statement.body), flags)
            if decided is not True and statement.orelse is not None:
                orelse = statement.orelse
                rest = [orelse] if isinstance(orelse, cst.If) else block_body(orelse.body)
                out += _open_returns(rest, flags)
        else:
            out += [small.value for small in nodes_of_type(statement, cst.Return)]
    return out


def _times(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The two factors of a product `a * b`."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return node.left, node.right
    return None


def _one_minus(node: cst.BaseExpression, weight: cst.BaseExpression) -> bool:
    """`1 - weight` (or `1.0 - weight`), the weight written the same way."""
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Subtract)
        and p.number(node.left) == 1.0
        and code(node.right) == code(weight)
    )


def _strip_casts(node: cst.BaseExpression, scope: p.Scope) -> tuple[cst.BaseExpression, bool]:
    upcast = False
    while True:
        found = p.method_call(node, p.CAST_METHODS)
        if found is None:
            return node, upcast
        receiver, name = found
        assert isinstance(node, cst.Call)
        if name in ("float", "double") or _casts_to_float32(node, scope):
            upcast = True
        elif name not in ("contiguous",) and not _is_dtype_cast(node):
            return node, upcast
        node = receiver


def _casts_to_float32(node: cst.Call, scope: p.Scope) -> bool:
    for a in node.args:
        if scope.qualify(a.value) in ("torch.float32", "torch.float", "torch.float64"):
            return True
    return False


def _is_dtype_cast(node: cst.Call) -> bool:
    """`.to(x.dtype)`, `.to(torch.float32)`, `.type(value.dtype)`, `.type_as(t)` (no device moves)."""
    for a in node.args:
        if a.keyword is not None and a.keyword.value not in ("dtype",):
            return False
    return True


def _flattens_leading(args: Sequence[cst.Arg]) -> bool:
    return len(args) == 3 and not any(a.star for a in args)


def _root_param(node: cst.BaseExpression, params: tuple[str, ...]) -> str | None:
    names = [n for n in p.walk_names(node) if n in params]
    return names[0] if len(names) == 1 else None


def _tests_not_none(test: cst.BaseExpression, name: str) -> bool:
    """`name is not None`, possibly inside an `and`."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _tests_not_none(test.left, name) or _tests_not_none(test.right, name)
    return m.matches(
        test,
        m.Comparison(left=m.Name(name), comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))]),
    )


def _size_read(node: cst.CSTNode) -> tuple[cst.Name, int] | None:
    """`x.size(i)` or `x.shape[i]` with a literal index: (x, i)."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "size"
        and isinstance(node.func.value, cst.Name)
        and len(node.args) == 1
        and node.args[0].keyword is None
    ):
        index = p.number(node.args[0].value)
        return (node.func.value, int(index)) if index is not None and index == int(index) else None
    if (
        isinstance(node, cst.Subscript)
        and isinstance(node.value, cst.Attribute)
        and node.value.attr.value == "shape"
        and isinstance(node.value.value, cst.Name)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
    ):
        index = p.number(node.slice[0].slice.value)
        return (node.value.value, int(index)) if index is not None and index == int(index) else None
    return None


def _only_not_none(test: cst.BaseExpression) -> set[str] | None:
    """The names of a test made only of `x is not None` joined by `and`, else None."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        left, right = _only_not_none(test.left), _only_not_none(test.right)
        return None if left is None or right is None else left | right
    if m.matches(
        test,
        m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))]),
    ):
        return {test.left.value}  # type: ignore[attr-defined]
    return None


class Diagonal(enum.Enum):
    """What a boolean buffer keeps around its diagonal (each query keeps at least itself in both)."""

    CAUSAL = "causal"  # tril(ones): every key up to the query
    BANDED = "banded"  # tril(ones) minus tril(ones, -w): a sliding window ending at the query


def buffer_diagonal(
    node: cst.BaseExpression,
    locals_: dict[str, list[cst.BaseExpression]],
    scope: p.Scope,
    depth: int = 0,
    resolving: frozenset[str] = frozenset(),
) -> Diagonal | None:
    """Read a registered buffer: `torch.tril(torch.ones(n, n))` (viewed, cast), or that XOR-ed with a tril shifted
    below the diagonal (`bitwise_xor(bias, tril(bias, -window))`), following the locals of the registering method."""
    if depth > 8:
        return None
    while True:
        found = p.method_call(node, {"view", "reshape", "bool", "to", "unsqueeze"})
        if found is not None:
            node = found[0]
        elif isinstance(node, cst.Subscript) and all(
            isinstance(e.slice, cst.Index) and m.matches(e.slice.value, m.Name("None")) for e in node.slice
        ):
            node = node.value  # `tril(...)[None, None]`
        else:
            break
    if isinstance(node, cst.Name):
        name = node.value
        values = locals_.get(name, [])
        if name in resolving:  # `bias = f(bias)`: inside it, `bias` is one of the assignments before it
            values = [value for value in values if name not in p.walk_names(value)]
        deeper = resolving | {name}
        kinds = [buffer_diagonal(value, locals_, scope, depth + 1, deeper) for value in values]
        if not kinds or any(kind is None for kind in kinds):
            return None
        return Diagonal.CAUSAL if all(kind is Diagonal.CAUSAL for kind in kinds) else Diagonal.BANDED
    if not isinstance(node, cst.Call):
        return None
    qualified = scope.qualify(node.func)
    if qualified == "torch.tril" and p.arg(node, 1, "diagonal") is None:
        inner = p.arg(node, 0, "input")
        return Diagonal.CAUSAL if isinstance(inner, cst.Call) and scope.qualify(inner.func) == "torch.ones" else None
    if qualified == "torch.bitwise_xor" and len(node.args) == 2:
        base, removed = node.args[0].value, node.args[1].value
        if buffer_diagonal(base, locals_, scope, depth + 1, resolving) is None or not isinstance(removed, cst.Call):
            return None
        if scope.qualify(removed.func) != "torch.tril":
            return None
        shift = p.arg(removed, 1, "diagonal")
        # a band: keys more than `window` before the query are removed; the diagonal stays when the shift is negative
        if shift is None or not _strictly_below(shift):
            return None
        return Diagonal.BANDED
    return None


def _strictly_below(shift: cst.BaseExpression) -> bool:
    """`-1`, `-w` for a configured window (a window size is at least 1): the removed tril lies below the diagonal."""
    value = p.number(shift)
    if value is not None:
        return value <= -1
    if isinstance(shift, cst.UnaryOperation) and isinstance(shift.operator, cst.Minus):
        return isinstance(shift.expression, (cst.Attribute, cst.Name))
    return False


def _rows_and_columns(node: cst.Subscript) -> tuple[cst.Slice, cst.Slice] | None:
    """`[:, :, rows, columns]` with the batch and head dimensions whole, and both last slices without a step."""
    slices = [e.slice for e in node.slice if isinstance(e.slice, cst.Slice)]
    if len(node.slice) != 4 or len(slices) != 4:
        return None
    first, second, rows, cols = slices
    if any(part is not None for part in (first.lower, first.upper, second.lower, second.upper)):
        return None
    if rows.step is not None or cols.step is not None:
        return None
    return rows, cols


def _top_left(node: cst.Subscript) -> bool:
    """`[:, :, :q, :k]`: the first q rows of the first k columns (row i is position i, keys start at position 0)."""
    found = _rows_and_columns(node)
    return found is not None and all(s.lower is None and s.upper is not None for s in found)


def _bottom_right(node: cst.Subscript) -> bool:
    """`[:, :, k - q : k, :k]`: the last q rows of the first k columns (each query at its own position)."""
    found = _rows_and_columns(node)
    if found is None:
        return False
    rows, cols = found
    upper, lower = rows.upper, rows.lower
    if cols.lower is not None or upper is None or cols.upper is None or lower is None:
        return False
    if not upper.deep_equals(cols.upper):
        return False
    return (
        isinstance(lower, cst.BinaryOperation)
        and isinstance(lower.operator, cst.Subtract)
        and lower.left.deep_equals(upper)
    )


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


def _contains_softmax(node: cst.CSTNode, scope: p.Scope) -> bool:
    finder = _Softmaxes(scope)
    node.visit(finder)
    return finder.found


class _Softmaxes(cst.CSTVisitor):
    def __init__(self, scope: p.Scope) -> None:
        self.scope = scope
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        if p.softmax_call(node, self.scope) is not None:
            self.found = True


class _Products(cst.CSTVisitor):
    def __init__(self, scope: p.Scope) -> None:
        self.scope = scope
        self.found: list[tuple[cst.BaseExpression, p.Product]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseExpression):
            product = p.product(node, self.scope)
            if product is not None:
                self.found.append((node, product))
        return True


class _ChainReads(cst.CSTVisitor):
    """Reads of chain names, sorted into `.dtype`/`.device` attributes, `expand_as(chain)`, shape reads and others."""

    def __init__(self, env: dict[str, Value], exclude: cst.CSTNode | None) -> None:
        self.env = env
        self.exclude = exclude
        self.attributes: list[cst.Attribute] = []
        self.expands: list[cst.Call] = []
        self.reshapes: list[tuple[cst.Call, cst.Name]] = []  # `x.reshape_as(scores)`, `x.view_as(scores)`
        self.shapes: list[cst.Name] = []
        self.sizes: list[tuple[cst.CSTNode, cst.Name, int]] = []  # `scores.size(i)`, `scores.shape[i]`
        self.plain: list[cst.Name] = []

    def is_chain(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Name) and isinstance(self.env.get(node.value), ChainVal)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.exclude:
            return False
        size = _size_read(node)
        if size is not None and self.is_chain(size[0]):
            self.sizes.append((node, size[0], size[1]))
            return False
        if isinstance(node, cst.Attribute) and self.is_chain(node.value):
            if node.attr.value in ("dtype", "device"):
                self.attributes.append(node)
                return False
            if node.attr.value in ("shape", "ndim"):
                self.shapes.append(node.value)  # type: ignore[arg-type]
                return False
            if node.attr.value in ("size", "dim"):
                self.shapes.append(node.value)  # type: ignore[arg-type]
                return False
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value == "expand_as" and len(node.args) == 1 and self.is_chain(node.args[0].value):
                self.expands.append(node)
                node.func.value.visit(self)
                return False
            if node.func.attr.value in ("reshape_as", "view_as") and len(node.args) == 1 and self.is_chain(node.args[0].value):
                target = node.args[0].value
                assert isinstance(target, cst.Name)
                self.reshapes.append((node, target))
                node.func.value.visit(self)
                return False
        if isinstance(node, cst.Name) and self.is_chain(node):
            self.plain.append(node)
        if isinstance(node, cst.Arg):
            node.value.visit(self)
            return False
        if isinstance(node, cst.Attribute):
            node.value.visit(self)
            return False
        return True


def _returns_a_number(function: cst.FunctionDef) -> bool:
    """Some return of the function is a number literal, or a name the function assigns a number literal."""
    returns = [node.value for node in nodes_of_type(function, cst.Return) if node.value is not None]
    numbers: set[str] = set()
    for assign in nodes_of_type(function, cst.Assign):
        if p.number(assign.value) is not None:
            numbers.update(t.target.value for t in assign.targets if isinstance(t.target, cst.Name))
    return any(p.number(value) is not None or (isinstance(value, cst.Name) and value.value in numbers) for value in returns)


def _cancelled(ops: list[Op], op: Op) -> list[Op]:
    """`ops` then `op`, where a scale undoing the expression's last one (`(x / a - shift) * a`, CogView's PB-Relax)
    removes both: views, casts and shifts between them commute with scaling."""
    if isinstance(op, Scale) and not op.per_query:
        for index in range(len(ops) - 1, -1, -1):
            earlier = ops[index]
            if isinstance(earlier, (Shift, Cast, View)):
                continue
            if (
                isinstance(earlier, Scale)
                and not earlier.per_query
                and earlier.divide != op.divide
                and earlier.factor.deep_equals(op.factor)
            ):
                return [*ops[:index], *ops[index + 1 :]]
            break
    return [*ops, op]
