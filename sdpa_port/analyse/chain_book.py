"""The chains one trace finds, and how they relate: joined, merged after branches, made by which statement.

`ChainBook` keeps the candidates (`chain.Candidate`) and the values' steps. A chain starts at a query-key product
(`new_chain`), takes the operations each statement applies (`advance`, `record`), joins another (`join`), or
stands, after an `if`, for the products its branches each made (`alternatives`). It reads the tracer's
environment, plans and branch position, which the tracer hands it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Sequence

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import (
    OUT,
    PROBS,
    SCORES,
    AddTerm,
    Block,
    Candidate,
    Cast,
    ChainVal,
    Dropout,
    Fill,
    Guard,
    HeadMask,
    Op,
    Output,
    Scale,
    Shift,
    Softmax,
    Start,
    Transpose,
    StmtPlan,
    ChainStmt,
    composed,
    describe_layout,
    unreachable,
    Value,
    View,
    ZeroRows,
)
from sdpa_port.analyse.remakes import Made, Remakes
from sdpa_port.refusals import Code


class ChainBook:
    """The candidates of one trace and the bookkeeping that relates their values."""

    def __init__(
        self,
        env: dict[str, Value],
        plans: dict[cst.CSTNode, StmtPlan],
        path: list[tuple[int, int]],
        tests: list[cst.BaseExpression],
    ) -> None:
        # the tracer's, shared: what each name holds, the plan of each statement, the enclosing branches
        self.env = env
        self.plans = plans
        self.path = path
        self.tests = tests
        self.candidates: list[Candidate] = []
        self.steps = itertools.count(1)  # `ChainVal.step`
        self.remakes = Remakes()  # values made again by an equivalent statement
        self.products: dict[int, Products] = {}  # per chain that reached a product with V
        # a value's step -> its statement, the step of the value it went on from, its chain
        self.made_by: dict[int, tuple[cst.CSTNode, int, int]] = {}
        # a value a name holds after branches that each made one of their own -> the values of the other branches
        self._merged: dict[int, set[int]] = {}
        # chains joined into another (`join`) -> that chain, and the line where they joined
        self.joined: dict[int, tuple[int, int]] = {}
        # of a chain merged into another by `alternatives`: how many of its operations the merged chain took over
        self._taken: dict[int, int] = {}
        self.blocks: dict[int, Block] = {}  # chains whose scores are joined from blocks -> their operands
        # the arms of `if`s (their node's id, the arm's index) whose last statement returns: code after the `if`
        # never runs after them
        self.returned_arms: set[tuple[int, int]] = set()

    def new_chain(
        self,
        start: Start,
        node: cst.CSTNode,
        line: int,
        bindings: tuple[tuple[str, int], ...],
        members: tuple[cst.CSTNode, ...] = (),
    ) -> int:
        """Start a chain at the product `node` here, and give its id.

        The product is a recognised query-key product, or blocks joined into one; `bindings` are what its operands read
        (`Candidate.start_bindings`), `members` the products joined into it.
        """
        cid = len(self.candidates)
        self.candidates.append(
            Candidate(
                cid,
                start,
                line,
                start_node=node,
                start_path=tuple(self.path),
                start_tests=len(self.tests),
                start_bindings=bindings,
                members=members,
            )
        )
        return cid

    def layout_of(self, cid: int) -> p.Order | None:
        """How the chain's scores are laid out, where otherwise than SDPA's.

        That is `Start.layout`; None for SDPA's own.
        """
        start = self.candidates[cid].start
        return start.layout if start is not None else None

    def swap_roles(
        self, cid: int, pending: Sequence[Op], query_scale: tuple[cst.BaseExpression, bool] | None
    ) -> list[Op]:
        """Make the chain's product read its key as the query and its query as the key: `k @ q^T`, the transpose of
        what it computes (`forms/softmax.py`: a softmax over the queries). Its `Start` is replaced wherever it is
        recorded, and in `pending`, the operations not recorded yet, which are given back; `query_scale` is the new
        query's (`Start.query_scale`)."""
        candidate = self.candidates[cid]
        old = candidate.start
        assert old is not None
        new = replace(old, query=old.key, key=old.query, query_scale=query_scale)
        candidate.start = new
        candidate.ops = [(new if op is old else op, depth, line) for op, depth, line in candidate.ops]
        self._replace_in_plans(old, new)
        return [new if op is old else op for op in pending]

    def _replace_in_plans(self, old: Start | None, new: Start | None) -> None:
        """Put `new` where the statements' plans hold the product `old`; with None, take it out."""
        for plan in self.plans.values():
            if isinstance(plan, ChainStmt) and any(op is old for op in plan.ops):
                kept = [op for op in plan.ops if op is not old]
                plan.ops = kept if new is None else [new if op is old else op for op in plan.ops]

    def join(self, cid: int, into: int, line: int, drop: bool = False) -> None:
        """Make chain `cid` part of chain `into` from here on.

        A later use of its values is refused for `into`. With `drop`, its product is no operation of its own (a block,
        whose operands `into`'s product reads).
        """
        candidate = self.candidates[cid]
        candidate.absorbed = True
        self.joined[cid] = (into, line)
        if not drop:
            return
        self._replace_in_plans(candidate.start, None)

    def joined_into(self, cid: int) -> int:
        while cid in self.joined:
            cid = self.joined[cid][0]
        return cid

    def alternatives(self, values: Sequence[Value | None], first_new: int, line: int) -> ChainVal | None:
        """One chain for the query-key products each branch of an `if` made of its own for one name.

        LUKE's scores are joined from blocks when there are entities, one product otherwise; the Conformer's relative
        scores are `(ac + bd) / sqrt(d)` in one branch, `q @ kᵀ / sqrt(d)` in the other. From here on they are one
        chain, whose product is the one of the branch that ran.

        None where the values are not that: the products must be new in the branches, of one rank and dtype, and what
        each branch did to its scores after the product only scales them by a number or adds terms (each branch's
        statements update the side values SDPA is handed in that branch). Operands bound to float32 copies in some
        branches only (the LDM's `if _ATTN_PRECISION == "fp32": q, k = q.float(), k.float()`) are the same product
        up to rounding: the chain is then upcast, and SDPA runs in the dtype of the query the branch that ran hands
        over, its value and mask cast to it and its output cast back, a no-op in the branches without copies.
        """
        chains = [v for v in values if isinstance(v, ChainVal)]
        if len(chains) < 2 or len(chains) != len(values) or len({c.cid for c in chains}) != len(chains):
            return None
        candidates = [self.candidates[c.cid] for c in chains]
        for chain, candidate in zip(chains, candidates):
            start = candidate.start
            if chain.cid < first_new or chain.stage is not SCORES or start is None or candidate.poison is not None:
                return None
            ops = [op for op, _, _ in candidate.ops]
            if candidate.absorbed or not ops or ops[0] is not start or not all(_branch_op(op) for op in ops[1:]):
                return None
        starts = [c.start for c in candidates if c.start is not None]
        # a rank the tracer could not read in one branch is the one another branch shows (the product is the same
        # `(.., queries, keys)` matrix on every path); two known ranks must agree
        ranks = {c.rank for c in chains} - {None}
        if len({(s.upcast, s.layout) for s in starts}) != 1 or len(ranks) > 1:
            return None
        first = min(candidates, key=lambda c: c.cid)
        for candidate in candidates:
            if candidate is first:
                continue
            first.ops.extend(candidate.ops)
            self._taken[candidate.cid] = len(candidate.ops)
            first.members += tuple(n for n in (candidate.start_node, *candidate.members) if n is not None)
            first.names_assigned_after_start |= candidate.names_assigned_after_start
            self.join(candidate.cid, first.cid, line)
        first.start_path, first.start_tests = tuple(self.path), len(self.tests)
        held = next(c for c in chains if c.cid == first.cid)
        if held.rank is None and ranks:
            held = replace(held, rank=next(iter(ranks)))
        self.note_merged(held, chains)
        return held

    def note_merged(self, held: ChainVal, values: Sequence[Value | None]) -> None:
        """Note that after branches `held` stands for the chain values each branch made."""
        self._merged.setdefault(held.step, set()).update(v.step for v in values if isinstance(v, ChainVal))

    def advance(self, base: ChainVal, ops: Sequence[Op]) -> ChainVal:
        value = replace(base, step=next(self.steps)) if ops else base
        for op in ops:
            if isinstance(op, Softmax):
                value = replace(value, stage=PROBS)
            elif isinstance(op, Output):
                value = replace(value, stage=OUT)
            elif isinstance(op, View) and op.order is not None:
                value = replace(value, order=composed(value.order, op.order))
            elif isinstance(op, View):
                value = replace(value, rank=op.rank_after)
        return value

    def record(self, base: ChainVal, ops: Sequence[Op], depth: int, line: int) -> None:
        candidate = self.candidates[base.cid]
        later = self.later(base)
        if ops and later:
            # the chain forks: a name holds a value further along it than the one this statement goes on from, so
            # the operations recorded for the chain would mix two computations (`other = scores + bias` then
            # `scores = scores + bias` would add the bias twice)
            candidate.poisoned(
                Code.SCORES_READ,
                f"the {base.stage.value} fork: `{later[0]}` holds a later value of them than the one this statement "
                "goes on from",
                line,
            )
        layout = self.layout_of(base.cid)
        for op in ops:
            if candidate.ops and isinstance(candidate.ops[-1][0], Transpose) and not isinstance(op, Output):
                # `forms/transposed.py`: the transposed probabilities go to the product with V and nowhere else
                candidate.poisoned(
                    Code.LAYOUT, "the probabilities are transposed, then changed before the product with V", line
                )
            candidate.ops.append((op, depth, line))
            if isinstance(op, Softmax):
                candidate.stage = PROBS
            reads = _reads_sdpa_layout(op) if layout is not None else None
            if layout is not None and reads is not None:
                candidate.poisoned(
                    Code.LAYOUT,
                    f"the scores are laid out {describe_layout(layout)}, and {reads} reads their "
                    "dimensions as SDPA lays them out",
                    line,
                )

    def later(self, base: ChainVal) -> list[str]:
        """The names holding a value further along `base`'s chain than `base`.

        Remade values stand where the value they make again stands.
        """
        place = self.remakes.canonical(base.step)
        return sorted(
            name
            for name, value in self.env.items()
            if isinstance(value, ChainVal) and value.cid == base.cid and self.remakes.canonical(value.step) > place
        )

    def settle_joined(self) -> None:
        """What happened to a joined chain's values after it joined happened to the chain it joined."""
        for cid, (into, line) in self.joined.items():
            joined, target = self.candidates[cid], self.candidates[self.joined_into(cid)]
            if joined.poison is not None:
                target.poisoned(joined.poison.code, joined.poison.detail, joined.poison_line)
            else:
                later = [at for op, _, at in joined.ops[self._taken.get(cid, 0) :] if not isinstance(op, Start)]
                if later:  # `block += 1`, `block.mul_(2)`: the statement is gone with the block's product
                    detail = f"scores joined into others at line {line} are changed again at line {later[0]}"
                    target.poisoned(Code.SCORES_READ, detail, later[0])

    def other_streams(self) -> frozenset[cst.CSTNode]:
        """The statements of the streams after the first, where a chain's probabilities reach several products.

        They are the later products, and the statements making a place on the chain made more than once that the first
        product's values do not come from.
        """
        out: set[cst.CSTNode] = set()
        for cid, taken in self.products.items():
            outputs = taken.statements
            if len(outputs) < 2:
                continue
            first: set[cst.CSTNode] = set()
            steps, seen = [outputs[0][1]], set()
            while steps:  # back from the first product, through every branch that made a value it took
                step = steps.pop()
                if step in seen:
                    continue
                seen.add(step)
                steps.extend(self._merged.get(step, ()))
                if step in self.made_by:
                    small, base, _ = self.made_by[step]
                    first.add(small)
                    steps.append(base)
            makers: dict[int, list[cst.CSTNode]] = {}
            for made, (small, _, chain) in self.made_by.items():
                if chain == cid:
                    makers.setdefault(self.remakes.canonical(made), []).append(small)
            out.update(small for smalls in makers.values() if len(smalls) > 1 for small in smalls if small not in first)
            out.update(small for small, _ in outputs[1:])
        return frozenset(out)


@dataclass
class Products:
    """The products with V of one chain's probabilities.

    How the first one's probabilities were made, the dropout draw each took (None: none), and each one's statement with
    the step of the probabilities it took.
    """

    probabilities: Made
    draws: list[int | None] = field(default_factory=list)
    statements: list[tuple[cst.CSTNode, int]] = field(default_factory=list)
    paths: list[tuple[tuple[int, int], ...]] = field(default_factory=list)  # each one's arms of enclosing `if`s


def _reads_sdpa_layout(op: Op) -> str | None:
    """What an operation reads of the scores' dimensions by position as SDPA lays them out, in a few words.

    None for one that means the same on scores laid out otherwise, once what it adds or fills with is permuted as the
    scores are (a softmax's dimension is checked where it is recognised, an einsum product with V reads the layout).
    """
    match op:
        case Scale():
            return "a factor per query" if op.per_query else None
        case AddTerm():
            return "a helper handed the scores" if op.scores_arg is not None else None
        case Fill():
            return "a causal mask" if op.causal or op.top_left else None
        case View():
            return "a view"
        case ZeroRows():
            return "zeroing fully masked rows"
        case Shift():
            return "subtracting the row's maximum"
        case Transpose():
            return "transposing the probabilities"
        case Start() | Cast() | Guard() | Softmax() | Dropout() | HeadMask() | Output():
            return None
        case _:
            unreachable(op)


def _branch_op(op: Op) -> bool:
    """An operation one branch may apply to its own product before the branches meet.

    A scale by a number or an added term, which the emitters turn into updates of the scale and the mask inside that
    branch.
    """
    return isinstance(op, AddTerm) or (isinstance(op, Scale) and not op.per_query)
