"""Follow the attention score chains through one function body, statement by statement.

The tracer only reads. It walks the statements of a function in order, keeping an environment of what each local name
holds. A product of a query with a transposed key starts a *chain*; what each later expression that feeds the chain
does to it is decided by the recognisers of `forms/` (one per form), each an operation of the closed set in `chain.py`.
Anything else that touches the chain poisons it, with a reason.

The tracer dispatches each kind of statement to its module: `branches` (if statements), `assignments`, `in_place`
(augmented assignments and in-place methods), `outputs` (the product with V and the weights after it) and `kept`
(statements off the chain). It holds the chains' bookkeeping (`chain_book`), the reads of chains (`chain_reads`) and
the ranks of tensors (`ranks`). The result says what the chain does; `recognise.py` turns it into an AttentionSite and
the rewriting passes turn it into SDPA code.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.assignments import assign
from sdpa_port.analyse.branches import if_statement
from sdpa_port.analyse.certain import certain
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
    Transpose,
    unreachable,
    Value,
    View,
    ZeroRows,
)
from sdpa_port.analyse.chain_book import ChainBook
from sdpa_port.analyse.chain_reads import ChainReads, ProductFinder, contains_softmax, type_name
from sdpa_port.analyse.cstutil import assigned_names, block_body, code, walk_names
from sdpa_port.analyse.forms import FORMS, keys, products, single_query
from sdpa_port.analyse.in_place import aug_assign, changed_in_place, expression_statement
from sdpa_port.analyse.kept import keep_expression
from sdpa_port.analyse.known import Known, holding
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.outputs import find_output, output_statement, weights_passed_along
from sdpa_port.analyse.ranks import Ranks
from sdpa_port.analyse.remakes import Branch
from sdpa_port.analyse.scope import FunctionScope
from sdpa_port.analyse.tracing import LineOf
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
    "Transpose",
    "Value",
    "View",
    "ZeroRows",
    "describe_layout",
    "unreachable",
]


class Tracer:
    """Trace one function's statements in order and find the attention score chains they compute.

    It reads one function of a modeling file: a method of `class_name` or a module-level function, with the module's
    `facts`; under `known` facts, branches they decide off the SDPA path are not followed; with `selected_start`, a
    re-trace, only that chain starts. `run()` produces a `TraceResult`: every chain found (a `Candidate` with its
    operations, or the reason it is poisoned) and the plan of each statement that touches one.

    Only `analyse/` constructs one: `recognise.py` (forward and its helpers), `diagnose.py`, `sdpa_path.py` and
    `sdpa_side.py`. The recognisers of `forms/` and the statement modules take it first and read its parts: `env`
    and `scope` (what each local holds), `chains` (a `ChainBook`: the candidates and how their values relate),
    `reads` (a `ChainReads`: which chains an expression reads), `ranks` (a `Ranks`), and `plans`, `tests`, `path`
    and `branches` (each statement's plan, the enclosing branches).
    """

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
        enclosing: Mapping[str, Value] = MappingProxyType({}),
        enclosing_params: tuple[str, ...] = (),
    ) -> None:
        self.facts = facts
        # parameters every caller passes a key laid out (..., dim, length) (`self._attn(q, self.split_heads(k,
        # k=True), v)`): `q @ k` on them is a product with the key transposed
        self.key_params = key_params
        # what holds on the SDPA path: branches it decides are not followed (the eager fallback runs them)
        self.known = holding(known, block_body(function.body)) if known != Known() else known
        # tests the file decides whenever they run (`certain.py`): the sides they rule out are not followed either
        self.certain = certain(facts)
        self.class_name = class_name
        self.function = function
        self.line_of = line_of or (lambda node: 0)
        # on a re-trace for one chain: its query-key product, and the products joined into it (`Candidate.members`)
        self.selected_start = selected_start
        self.selected_members = selected_members
        # a function defined in another (`analyse/closures.py`) starts knowing what that one's trace knew of the
        # names it reads from it, where it was defined
        self.env: dict[str, Value] = dict(enclosing)
        self.defined: dict[cst.FunctionDef, dict[str, Value]] = {}  # each function defined here: the names then
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
        self.reads = ChainReads(self.env, self.chains, lambda: self.current_line)
        self.assignments: dict[str, int] = {}  # how often each name has been assigned so far
        self.ranks = Ranks(self.scope, function, param_ranks, self.assignments)
        self.output_seen = False
        self.probs_after_output: set[str] = set()
        # conditions under which a module the chain passes through is not the identity: eager runs then
        self.fallbacks: list[str] = []
        # with the parameters of the function defining this one that it reads, bound nowhere else: what a caller
        # passed, as its own are (a head mask tested against None)
        own = tuple(param.name.value for param in _all_params(function.params))
        self.params = own + tuple(name for name in enclosing_params if name not in own)
        for param in _all_params(function.params):
            if param.annotation is not None and _numeric_annotation(param.annotation.annotation):
                self.env[param.name.value] = ScalarVal()

    # -------------------------------------------------------------- entry

    def run(self) -> TraceResult:
        """Trace the whole body."""
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
        """One statement, handed to its module by kind; a `with` or `try` body is traced in place."""
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
            if isinstance(statement, cst.FunctionDef):
                self.defined[statement] = dict(self.env)
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
        """A loop body, traced once: a chain it computes or changes is computed inside a loop, refused."""
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
            body_names = walk_names(statement.body)
            if cid in before and not (body_names & chain_names):
                continue
            self.chains.candidates[cid].poisoned(Code.REPEATED, "the attention is computed inside a loop (chunked or iterative attention)", line)
        if isinstance(statement, cst.For):
            for name in assigned_names(statement.target):
                self.env.pop(name, None)

    def small(self, small: cst.BaseSmallStatement, depth: int, line: int) -> None:
        """One statement of a line, handed to its module by kind; a `return` is read here."""
        if isinstance(small, cst.Assign):
            assign(self, [t.target for t in small.targets], small.value, small, depth, line)
        elif isinstance(small, cst.AnnAssign):
            if small.value is not None:
                assign(self, [small.target], small.value, small, depth, line)
        elif isinstance(small, cst.AugAssign):
            aug_assign(self, small, depth, line)
        elif isinstance(small, cst.Expr):
            expression_statement(self, small, depth, line)
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
        for name in changed_in_place(small):
            self.assignments[name] = self.assignments.get(name, 0) + 1

    # -------------------------------------------------------------- chain expressions

    def decompose(self, node: cst.BaseExpression, line: int) -> tuple[ChainVal, list[Op]]:
        """Split an expression into the chain value it starts from and the operations applied to it.

        The first of the recognisers in `forms.FORMS` that claims it decides; what none claims is refused when it
        touches a chain.
        """
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
        if type_name(node):
            raise NotChain()  # `probs.type()` is a string naming their dtype: read like `probs.dtype`
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
            stage = "probabilities" if any(self.reads.stage_of(cid) == PROBS for cid in refs) else "scores"
            raise Poison(
                Code.SCORES_TRANSFORMED,
                f"the {stage} are passed to `{short(node.func)}`"
                f"{self.module_of(node.func)}{self.parameter_of(node.func)}{self.imported_of(node.func)}",
                refs,
            )
        if refs:
            raise Poison(Code.SCORES_READ, f"the scores are used in `{short(node)}`", refs)
        raise NotChain()

    def module_of(self, func: cst.BaseExpression) -> str:
        """`, a module of this file (`FusedScaleMaskSoftmax`) ...` for a callee `self.x` every binding of which
        builds one class of the file: the tool reads no such module's computation (a fused softmax)."""
        attribute = p.self_attribute_name(func)
        if attribute is None or self.class_name is None:
            return ""
        values = self.facts.find_attribute_values(self.class_name, attribute)
        built = {
            value.func.value
            for value in values
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in self.facts.classes
        }
        calls = [value for value in values if isinstance(value, cst.Call)]
        if not values or len(values) != len(calls):
            return ""
        if len(built) == 1 and all(isinstance(v.func, cst.Name) and v.func.value in built for v in calls):
            return f", a `{built.pop()}` module of this file whose computation the tool does not read"
        # a class of another package (Megatron's `FusedScaleMaskSoftmax` of megatron_util): what it computes is not here
        imported = {self.scope.qualify(value.func) for value in calls}
        if len(imported) != 1 or None in imported:
            return ""
        qualified = str(imported.pop())
        package, _, klass = qualified.rpartition(".")
        if not package or package.split(".")[0] in ("torch", "transformers") or klass in self.facts.classes:
            return ""
        # `from .quant_modules import IntSoftmax` (I-BERT): a file beside this one, not another package
        elsewhere = "another file of this package" if package.startswith(".") else "another package"
        return f", a `{klass}` module of `{package}`, {elsewhere}, whose computation this file does not show"

    def imported_of(self, func: cst.BaseExpression) -> str:
        """`, a function of `fairseq.utils`, another package, ...` for a callee the file imports from another package
        (fairseq's `utils.softmax`): what it computes is not here."""
        written = get_full_name_for_node(func)
        if written is None or written.partition(".")[0] not in self.facts.imports.aliases:
            return ""  # a local, an attribute of the module, a function of the file: not imported
        package, _, _ = str(self.scope.qualify(func)).rpartition(".")
        if not package or package.split(".")[0] in ("torch", "transformers", "math", "numpy"):
            return ""
        elsewhere = "another file of this package" if package.startswith(".") else "another package"
        return f", a function of `{package}`, {elsewhere}, whose computation this file does not show"

    def parameter_of(self, func: cst.BaseExpression) -> str:
        """`, a parameter of `attention`, whose value the tool does not follow` for a callee the function is handed."""
        if not isinstance(func, cst.Name) or func.value not in self.params:
            return ""
        if isinstance(self.env.get(func.value), ExprVal):
            return ""  # rebound in the function
        return f", a parameter of `{self.function.name.value}`, whose value the tool does not follow"

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
                if single_query.starts_single_query(product):
                    return {-1}
            elif keys.untranspose(
                self, product.right, products.product_rank(self, product), keys.telling_query(product)
            ) is not None:
                return {-1}
        return set()

    def may_start(self, node: cst.CSTNode) -> bool:
        """Whether a query-key product, or a concatenation of them, may start a chain.

        On a re-trace for one chain, only its own may.
        """
        return self.selected_start is None or node is self.selected_start or node in self.selected_members

    def require(self, base: ChainVal, ops: list[Op], stage: Stage, what: str, line: int, code: Code) -> None:
        """Refuse `what` with `code` unless the chain, after `ops`, is at `stage`."""
        current = self.chains.advance(base, ops)
        if current.stage != stage:
            raise Poison(code, f"{what} is applied to the {current.stage.value}, expected the {stage.value}", {base.cid})

    # -------------------------------------------------------------- the enclosing branches

    def module_guard(self, module: str | None) -> cst.BaseExpression | None:
        """The test of the innermost branch when it is the `if` of `if self.<module> is not None`, or of `if x is not
        None` where `x` holds `self.<module>` (a helper's parameter the call binds to it)."""
        if module is None or not self.tests or not self.path or self.path[-1][1] != 0:
            return None
        test = self.tests[-1]
        tested = p.optional_module_test(test)
        if tested is None and isinstance(test, cst.Comparison) and isinstance(test.left, cst.Name):
            held = self.scope.local_value(test.left.value)
            if held is not None:
                tested = p.optional_module_test(test.with_changes(left=held))
        return test if tested == module else None

    def setting_guard(self) -> cst.BaseExpression | None:
        """The test of the innermost branch, when it is an `if` testing the module's settings alone.

        Not an `elif` or `else`; the settings are `self.training`, `self.config.use_dropout`, combined by `not`, `and`,
        `or`.
        """
        if not self.tests or not self.path or self.path[-1][1] != 0:
            return None
        test = self.tests[-1]
        return test if self.reads_settings(test) else None

    def reads_settings(self, test: cst.BaseExpression) -> bool:
        """A test of the module's settings alone, the same on every call of the module's forward.

        `self.training`, `self.config.x`, with `not`/`and`/`or`, and no chain value among its reads.
        """
        return p.reads_settings_only(test) and not self.reads.chain_refs(test)

    # -------------------------------------------------------------- names and poison

    def note_assignment(self, names: Sequence[str]) -> None:
        """Count an assignment of each name; the chains not yet multiplied by V see them assigned after their start."""
        for name in names:
            self.assignments[name] = self.assignments.get(name, 0) + 1
        for candidate in self.chains.candidates:
            if candidate.stage != OUT:
                candidate.names_assigned_after_start.update(names)

    def poison_statement(self, poison: Poison, value: cst.BaseExpression, names: list[str], line: int) -> None:
        """Poison the chains a statement refused reaches; its names then hold the first, poisoned, chain."""
        for cid in poison.cids:
            self.chains.candidates[cid].poisoned(poison.reason.code, poison.reason.detail, line)
        stages = [v.stage for v in (self.env.get(n) for n in walk_names(value)) if isinstance(v, ChainVal)]
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
        """The value is a number."""
        if isinstance(value, ScalarVal):
            return True
        return isinstance(value, ExprVal) and p.scalar(value.node, self.scope) is not None


# ------------------------------------------------------------------ helpers


def _all_params(params: cst.Parameters) -> list[cst.Param]:
    out = [*params.posonly_params, *params.params, *params.kwonly_params]
    if isinstance(params.star_arg, cst.Param):
        out.append(params.star_arg)
    if params.star_kwarg is not None:
        out.append(params.star_kwarg)
    return out


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
