"""The values and operations of an attention score chain, as the tracer (`trace.py`) and the recognisers of its
forms (`forms/`) build them (read-only data).

A chain starts at a query-key product and goes through a closed set of operations (`Op`) to the product with V;
`Poison` ends one with a reason when an expression touches it in a way no form accounts for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Hashable, NoReturn, Union

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.cstutil import code
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
    TYPE = "type"  # `scores.type()` -> `query.type()` (the dtype's name)
    STRIP_EXPAND = "strip_expand"  # `x.expand_as(scores)` -> `x` (broadcasting does it)
    RESHAPE_AS = "reshape_as"  # `x.reshape_as(scores)` / `x.view_as(scores)` -> `x.reshape(<the scores' shape>)`


# the query SDPA is handed, where an operation reads the scores' dtype or device and the tracer cannot write that
# query as an expression valid wherever the operation runs (a product joined from blocks, or one computed by each
# branch its own way): the emitters name their query operand and put the name in its place
HANDED_QUERY = "__sdpa_port_query__"


# ------------------------------------------------------------------ values and operations


@dataclass(frozen=True)
class ChainVal:
    cid: int
    stage: Stage
    rank: int | None
    # when the value was made (`ChainBook.advance`, counting the statements that change a chain): a value made later
    # from the same chain is further along it; not part of the value's identity
    step: int = field(default=0, compare=False)
    # regrouped scores permuted (`View.order`): the order their dimensions are in since the regrouping; None where
    # they are in their own order
    order: tuple[int, ...] | None = field(default=None, compare=False)


def composed(order: tuple[int, ...] | None, then: tuple[int, ...]) -> tuple[int, ...] | None:
    """The order of dimensions after permuting by `order` (None: their own order), then by `then`; None where the
    two undo each other."""
    current = order or tuple(range(len(then)))
    moved = tuple(current[index] for index in then)
    return None if moved == tuple(range(len(moved))) else moved


@dataclass(frozen=True)
class ExprVal:
    node: cst.BaseExpression


@dataclass(frozen=True)
class ScalarVal:
    """A local that holds a number on every path (e.g. a scale factor built up under conditions)."""

    # a size unpacked from a tensor's whole shape (`b, c, h, w = x.shape`): the shape unpacked (its node), the size's
    # position and how many sizes it unpacks
    size_of: tuple[cst.CSTNode, int, int] | None = field(default=None, compare=False)


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
    # an einsum's operands in another dimension order: `query` and `key` above are them permuted to SDPA's layout;
    # these are the orders and the operands as the product reads them
    orders: tuple[p.Order | None, p.Order | None] = (None, None)
    operands: tuple[cst.BaseExpression, cst.BaseExpression] | None = None
    # the query and key of a score matrix joined from blocks (`forms/blocks.py`): built, not read, so always named
    joined: bool = False
    # scores an einsum lays out otherwise than SDPA (`ibnd,jbnd->ijbn`: query, key, batch, heads): the order taking
    # them to SDPA's (batch, heads, query, key); what the chain adds to them or fills them with is permuted the same
    layout: p.Order | None = None
    # an einsum's key shared by every head (`bhid,bjd->bhij`, multi-query): `key` is it viewed with that axis added,
    # expanded to the query's heads; `heads` the query's size there, which a value shared alike is expanded to
    heads: cst.BaseExpression | None = None
    # one query per head with no length axis (an einsum's `bhd,bhld->bhl`, `forms/single_query.py`): `query` is it
    # given a length axis of 1 for SDPA; the scores (`rank` theirs) have no query axis, so whatever joins SDPA's mask
    # is given that axis of 1 too, and the output has it removed
    single: bool = False


@dataclass(frozen=True)
class View:
    rank_before: int | None
    rank_after: int | None
    heads: tuple[cst.BaseExpression, cst.BaseExpression] | None
    # a regrouping of 3-D or 4-D scores into 5-D or 6-D (`scores.view(b // w, w, h, q, k)` to add a per-window term)
    # and the view back: the sizes given
    shape: tuple[cst.BaseExpression, ...] | None = None
    # a permutation of regrouped scores (`.permute(0, 2, 1, 3, 4, 5)` to add a term laid out otherwise): the order
    order: tuple[int, ...] | None = None


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
    # added whenever the chain runs and the operands are not None: as `always`, but the branches enclosing the
    # query-key product too do not count (`if self.training and fused: ... else: <the chain>`)
    with_chain: bool = True
    # otherwise: added whenever the chain runs, the operands are not None and this test of the module's settings
    # holds (`if self.use_mask and mask is not None:`), if that is all the branches enclosing it test
    setting: cst.BaseExpression | None = field(default=None, compare=False)
    # the term is a call of a helper that adds to the scores it is given (`analyse/additive.py`): the argument at
    # this index is to be zeros of the scores' shape (it holds `None` here)
    scores_arg: int | None = None
    # the term is a name that may hold a Python number rather than a tensor (a helper's `score = 0` returned when
    # it adds nothing): a reshape of the term must leave a number as it is
    may_be_number: bool = False
    # the term's own rank where known (`rank` above is the scores'): below 2 (`torch.arange(k)`, along the keys
    # only), SDPA, which takes masks of two dimensions or more, is handed it with a leading dimension of 1
    term_rank: int | None = None


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
    # filled whenever the chain runs and the condition's names are not None (as `AddTerm.with_chain`)
    with_chain: bool = field(default=True, compare=False)
    # the condition's rank where known (scores laid out otherwise than SDPA's permute it: `Start.layout`)
    rank: int | None = field(default=None, compare=False)


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
    # the dropout happens whenever the module exists, so that branch is no condition on it; or of an innermost `if`
    # testing the module's settings alone (`if self.training:`), which `call.training` then includes
    guard: cst.BaseExpression | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Transpose:
    """The probabilities with their last two dimensions swapped (`probs.permute(0, 2, 1)`), for a value multiplying
    them from the left: `value @ probs^T` is `(probs @ value^T)^T`. Only that product may follow it."""


@dataclass(frozen=True)
class HeadMask:
    operand: cst.BaseExpression
    root: str | None


@dataclass(frozen=True)
class Output:
    product: p.Product
    node: cst.BaseExpression  # the product expression inside the statement
    value: cst.BaseExpression  # laid out as SDPA takes it
    rank: int | None
    # how SDPA's (batch, heads, query, dim) output is permuted into the product's layout (an einsum's `...->bind`),
    # and how the product's value operand (`product.right`) was permuted into `value`
    order: p.Order | None = None
    value_order: p.Order | None = None
    # the value multiplies the transposed probabilities from the left (`torch.bmm(value, probs.permute(0, 2, 1))`):
    # `product.left` is the value and `product.right` the probabilities
    value_left: bool = False
    # an einsum's value shared by every head (`bhij,bjd->bhid`): `value` is it expanded to the query's heads
    shared: bool = False
    # the product with V of single-query probabilities (`Start.single`): SDPA's output has its query axis of 1
    # squeezed before `order` lays it out
    single: bool = False


Op = Union[
    Start, View, Cast, Scale, AddTerm, Fill, ZeroRows, Guard, Shift, Softmax, Dropout, Transpose, HeadMask, Output
]
# what a recogniser of `forms/` returns for an expression it claims: the chain value it starts from, the operations
Recognised = tuple[ChainVal, list[Op]]


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
    # no effect at all (`scores.masked_fill(...)` with its result thrown away): the eager function leaves it out too
    discarded: bool = False


@dataclass
class OutputStmt:
    """The statement holding the product with V; the product node is replaced by the SDPA result."""

    ops: list[Op]  # ops on the probabilities inside the statement, then the Output
    output: Output
    depth: int
    line: int
    # the names holding the probabilities the product takes, as it runs (which output the weights returned go with
    # where the probabilities reach several products)
    holders: frozenset[str] = frozenset()


@dataclass
class KeepStmt:
    """A statement kept as written, with chain `.dtype`/`.device` reads and `.expand_as(chain)` replaced."""

    replacements: dict[cst.CSTNode, KeepAction]
    # `scores.size(i)` / `scores.shape[i]` -> the query's size i, or None for the key length (the scores' last dim)
    sizes: dict[cst.CSTNode, int | None] = field(default_factory=dict)
    # `scores.shape[i]` of scores of unknown rank, the same as their query-key product -> size i of that product's
    # shape, `broadcast_shapes(query.shape[:-2], key.shape[:-2]) + (query.shape[-2], key.shape[-2])`
    shaped: dict[cst.CSTNode, int] = field(default_factory=dict)


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
    # the if/elif/else branches enclosing the query-key product (`Tracer.path`) and how many of them are if/elif
    # tests (`Tracer.tests`): a step inside these alone runs whenever the product does
    start_path: tuple[tuple[int, int], ...] = ()
    start_tests: int = 0
    # how often each name the product's operands read had been assigned when it was computed
    start_bindings: tuple[tuple[str, int], ...] = ()
    # the query-key products (and concatenations) of the chains joined into this one: blocks of its scores, or the
    # products of other branches (`ChainBook.alternatives`)
    members: tuple[cst.CSTNode, ...] = ()

    def start_ops(self) -> list[Start]:
        """The chain's query-key products: more than one where branches each compute their own."""
        return [op for op, _, _ in self.ops if isinstance(op, Start)]

    def branched(self) -> bool:
        """Branches each compute their own product (`ChainBook.alternatives`)."""
        return len(self.start_ops()) > 1

    def built(self) -> bool:
        """The operands SDPA is handed are built, not read: a product joined from blocks, or one per branch. The
        emitters name them, and operations reading the scores' dtype read it through that name (`HANDED_QUERY`)."""
        return self.branched() or (self.start is not None and self.start.joined)

    def operands(self) -> tuple[cst.BaseExpression, cst.BaseExpression]:
        """The query and key of the chain's product; where branches each compute their own, a tuple of each one's:
        what the queries or the keys read on any path (where the keys come from is judged over all of them)."""
        starts = self.start_ops()
        if len(starts) < 2:
            assert self.start is not None
            return self.start.query, self.start.key
        return (
            cst.Tuple([cst.Element(s.query) for s in starts]),
            cst.Tuple([cst.Element(s.key) for s in starts]),
        )

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
    # where a chain's probabilities reach several products with V: the statements of the streams after the first
    # (made again for them, and their products), which one eager computation leaves out
    other_streams: frozenset[cst.CSTNode] = frozenset()

    def attention(self) -> list[Candidate]:
        """Candidates that reach a product with V: the attention computations of the function."""
        return [c for c in self.candidates if c.stage == OUT and not c.absorbed]


class Poison(Exception):
    """An expression touches the chain in a way no form accounts for: the chain is refused with `reason`."""

    def __init__(self, code: Code, detail: str, cids: set[int]) -> None:
        super().__init__(detail)
        self.reason = Reason(code, detail)
        self.cids = {cid for cid in cids if cid >= 0}  # -1 marks a product that has not started a chain yet


class NotChain(Exception):
    """An expression that does not touch any chain."""

    pass


def describe_layout(layout: p.Order) -> str:
    """`(query, key, batch, heads)`: what each dimension of scores laid out so holds."""
    names = ("batch", "heads", "query", "key")[-len(layout) :]
    held = [""] * len(layout)
    for sdpa_dim, computed in enumerate(layout):
        held[computed] = names[sdpa_dim]
    return "(" + ", ".join(held) + ")"


def short(node: cst.CSTNode, limit: int = 70) -> str:
    text = " ".join(code(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Block:
    """A block's operands laid out for one product, and what they are.

    What they are: equal ids, the same tensor (None: not known). Zeros beside an operand take their leading sizes from
    its `like` (a plain operand where there is one) and their widths from an operand of the same side per slice of the
    head dimension (`query_widths`, `key_widths`): the joined query reads only what the queries read, the joined key
    what the keys read, as analyses of where the keys come from (caches, cross-attention states) expect.
    """

    query: cst.BaseExpression
    key: cst.BaseExpression
    query_id: Hashable | None
    key_id: Hashable | None
    query_like: cst.BaseExpression
    key_like: cst.BaseExpression
    query_widths: tuple[cst.BaseExpression, ...]
    key_widths: tuple[cst.BaseExpression, ...]
