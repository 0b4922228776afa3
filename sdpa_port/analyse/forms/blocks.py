"""A score matrix assembled from blocks: `torch.cat` of query-key products along the keys or along the queries.

LUKE scores words and entities with four query projections: word-to-word and word-to-entity products concatenated
along the keys make the words' rows, entity-to-word and entity-to-entity products the entities' rows, and the two
rows are concatenated along the queries. Such a matrix is one product `Q @ Kᵀ` whose operands are concatenated along
the head dimension, each block on a slice of its own: its query on its rows and its key on its columns, zeros
elsewhere, so that every entry is its own block's product plus exact zeros. Blocks side by side that read one query
share its slice, as do rows of blocks that read the same keys (LUKE's matrix is then one product over twice the head
dimension). The blocks must be bare products whose operands are unchanged up to the `torch.cat`; what follows the
concatenation (a scale, a mask) applies to the whole matrix as to any product. SDPA is always given the scale, so the
wider head dimension does not change it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Iterable, Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import SCORES, Block, Candidate, ChainVal, ExprVal, NotChain, Poison, Start, short
from sdpa_port.analyse.cstutil import code, primary
from sdpa_port.analyse.forms.common import Example, scored, sdpa
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView

CONCATENATIONS = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})


def joined_blocks(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    """Query-key products joined along the keys or the queries by `torch.cat`: a new chain starts.

    `torch.cat([scores_a, scores_b], dim=-1)` of bare query-key products (or of blocks joined so before); the chain
    starts at one product of operands joined as the module docstring says.
    """
    if not isinstance(node, cst.Call) or tracer.scope.qualify(node.func) not in CONCATENATIONS:
        return None
    listed = p.arg(node, 0, "tensors")
    if not isinstance(listed, (cst.List, cst.Tuple)) or not listed.elements:
        return None
    if not any(tracer.chain_or_start(element.value) for element in listed.elements):
        return None
    if not tracer.may_start(node):
        return None
    parts: list[tuple[Candidate, Block]] = []
    for element in listed.elements:
        try:
            if isinstance(element, cst.StarredElement):
                raise Poison(Code.SCORES_TRANSFORMED, "the scores are concatenated from a starred list", set())
            parts.append(_part(tracer, element.value, line))
        except Poison as poison:
            # refused for every chain listed, those read by name and the products listed before this one
            poison.cids |= tracer.reads.chain_refs(listed) | {candidate.cid for candidate, _ in parts}
            raise
    cids = {candidate.cid for candidate, _ in parts}
    ranks = {candidate.start.rank for candidate, _ in parts if candidate.start is not None}
    if len(ranks) != 1:
        raise Poison(Code.LAYOUT, "the concatenated scores differ in rank", cids)
    (rank,) = ranks
    dim = p.arg(node, 1, "dim")
    axis = _axis(dim, rank)
    if axis is None:
        where = f"dimension `{code(dim)}`" if dim is not None else "dimension 0"
        raise Poison(Code.SCORES_TRANSFORMED, f"the scores are concatenated along {where}, not the queries or the keys", cids)
    starts = [candidate.start for candidate, _ in parts if candidate.start is not None]
    if len({(s.upcast, s.operands_upcast) for s in starts}) != 1:
        raise Poison(Code.SCORES_TRANSFORMED, "the concatenated scores are computed in different dtypes", cids)
    if any(s.layout is not None for s in starts):
        raise Poison(
            Code.LAYOUT, "the concatenated scores are laid out otherwise than (batch, heads, query, key)", cids
        )
    block = _joined([b for _, b in parts], along_keys=axis == -1)
    start = Start(
        starts[0].product,
        block.query,
        block.key,
        rank,
        starts[0].upcast,
        operands_upcast=starts[0].operands_upcast,
        joined=True,
    )
    members = tuple(member for candidate, _ in parts for member in (candidate.start_node, *candidate.members) if member is not None)
    bindings = tuple(sorted({binding for part, _ in parts for binding in part.start_bindings}))
    cid = tracer.chains.new_chain(start, node, line, bindings, members)
    tracer.chains.blocks[cid] = block
    for part, _ in parts:
        tracer.chains.join(part.cid, cid, line, drop=True)
    return ChainVal(cid, SCORES, rank), [start]


def _part(tracer: TracerView, node: cst.BaseExpression, line: int) -> tuple[Candidate, Block]:
    """One listed tensor: a bare query-key product, named or inline, or a block matrix joined before."""
    try:
        base, ops = tracer.decompose(node, line)
    except NotChain as error:
        raise Poison(
            Code.SCORES_TRANSFORMED, f"the scores are concatenated with `{short(node)}`, which is no query-key product", tracer.reads.chain_refs(node)
        ) from error
    candidate = tracer.chains.candidates[base.cid]
    start = candidate.start
    recorded = [op for op, _, _ in candidate.ops]
    named, inline = recorded == [start] and not ops, ops == [start] and not recorded
    bare = base.stage is SCORES and start is not None and (named or inline)
    if candidate.poison is not None:  # refused already (a block concatenated wrongly): that reason stands
        raise Poison(candidate.poison.code, candidate.poison.detail, {base.cid})
    if not bare or candidate.absorbed:
        raise Poison(
            Code.SCORES_TRANSFORMED,
            f"`{short(node)}` is changed before the scores are concatenated (only bare query-key products join into one)",
            {base.cid},
        )
    assert start is not None
    if inline:
        candidate.ops.append((start, 0, line))  # an inline product: its chain starts here
    changed = sorted(
        name for name, count in candidate.start_bindings if tracer.assignments.get(name, 0) != count
    )
    if changed:
        raise Poison(
            Code.SCORES_TRANSFORMED,
            f"`{changed[0]}` changes between the product `{short(node)}` and the concatenation of the scores",
            {base.cid},
        )
    if candidate.cid in tracer.chains.blocks:
        return candidate, tracer.chains.blocks[candidate.cid]
    query, key = start.query, start.key
    return candidate, Block(query, key, _identity(tracer, query), _identity(tracer, key), query, key, (query,), (key,))


def _axis(dim: cst.BaseExpression | None, rank: int | None) -> int | None:
    """-1 for the keys' dimension, -2 for the queries', else None."""
    value = p.number(dim) if dim is not None else 0.0
    if value is None or value != int(value):
        return None
    index = int(value)
    if index in (-1, -2):
        return index
    if rank is not None and index in (rank - 1, rank - 2):
        return index - rank
    return None


def _identity(tracer: TracerView, node: cst.BaseExpression) -> Hashable | None:
    """What a block operand is, comparable between blocks.

    Its expression (a name read through the expression it holds), when every name it reads has kept one value
    throughout (a parameter never assigned, a local assigned once), else None.
    """
    for _ in range(4):
        if not isinstance(node, cst.Name):
            break
        held = tracer.env.get(node.value)
        if not isinstance(held, ExprVal):
            break
        node = held.node
    for name in p.walk_names(node):
        count = tracer.assignments.get(name, 0)
        if count > (0 if name in tracer.params else 1):
            return None
    return code(node)


def _joined(blocks: Sequence[Block], along_keys: bool) -> Block:
    """One query and one key whose product is the blocks' joined matrix.

    The blocks sit side by side (`along_keys`) or stacked; stacking is joining side by side with the roles of query and
    key exchanged.
    """
    if not along_keys:
        return _swapped(_side_by_side([_swapped(b) for b in blocks]))
    return _side_by_side(blocks)


def _side_by_side(blocks: Sequence[Block]) -> Block:
    """The query and key of blocks side by side.

    The keys one after another, and the queries either one shared query (its slices) or each on slices of its own, the
    keys padded with zeros to match.
    """
    first = blocks[0]
    if _same(b.query_id for b in blocks):
        keys = _cat([b.key for b in blocks], -2)
        key_id = _ids("keys", [b.key_id for b in blocks])
        return Block(first.query, keys, first.query_id, key_id, first.query_like, keys, first.query_widths, first.key_widths)
    keys = _cat([_on_own_slices(blocks, index) for index in range(len(blocks))], -2)
    return Block(
        _cat([b.query for b in blocks], -1),
        keys,
        _ids("slices", [b.query_id for b in blocks]),
        _ids("sliced", [b.key_id for b in blocks]),
        first.query_like,
        keys,
        tuple(w for b in blocks for w in b.query_widths),
        tuple(w for b in blocks for w in b.key_widths),
    )


def _swapped(block: Block) -> Block:
    """The block with the roles of its query and key exchanged, for its transposed product."""
    return Block(
        block.key, block.query, block.key_id, block.query_id, block.key_like, block.query_like, block.key_widths, block.query_widths
    )


def _same(ids: Iterable[Hashable | None]) -> bool:
    listed = list(ids)
    return listed[0] is not None and all(i == listed[0] for i in listed)


def _ids(kind: str, ids: Sequence[Hashable | None]) -> Hashable | None:
    return None if any(i is None for i in ids) else (kind, *ids)


def _on_own_slices(blocks: Sequence[Block], index: int) -> cst.BaseExpression:
    """Block `index`'s key on its own slices of the head dimension.

    Zeros as wide as each slice of the other blocks around it, read from their keys, so that the joined key reads only
    what the keys read.
    """
    own = blocks[index]
    pieces: list[cst.BaseExpression] = []
    for i, block in enumerate(blocks):
        pieces.extend([own.key] if i == index else [_zeros(own.key_like, width) for width in block.key_widths])
    return _cat(pieces, -1)


def _zeros(like: cst.BaseExpression, wide: cst.BaseExpression) -> cst.BaseExpression:
    """Zeros shaped as `like` but as wide as `wide`: `like.new_zeros(like.shape[:-1] + wide.shape[-1:])`."""
    shape = cst.BinaryOperation(_shape_slice(like, upper=True), cst.Add(), _shape_slice(wide, upper=False))
    return cst.Call(func=cst.Attribute(value=primary(like.deep_clone()), attr=cst.Name("new_zeros")), args=[cst.Arg(shape)])


def _shape_slice(node: cst.BaseExpression, upper: bool) -> cst.BaseExpression:
    """The leading sizes `node.shape[:-1]` with `upper`, else the last `node.shape[-1:]`."""
    bound = cst.UnaryOperation(cst.Minus(), cst.Integer("1"))
    piece = cst.Slice(lower=None, upper=bound) if upper else cst.Slice(lower=bound, upper=None)
    return cst.Subscript(
        value=cst.Attribute(value=primary(node.deep_clone()), attr=cst.Name("shape")), slice=[cst.SubscriptElement(piece)]
    )


def _cat(pieces: Sequence[cst.BaseExpression], dim: int) -> cst.BaseExpression:
    """The pieces joined by `torch.cat([...], dim=dim)`, or one piece alone.

    A piece that is itself concatenated along `dim` is spliced in.
    """
    flat = [inner for piece in pieces for inner in (_cat_pieces(piece, dim) or [piece])]
    if len(flat) == 1:
        return flat[0]
    dimension = cst.UnaryOperation(cst.Minus(), cst.Integer(str(-dim)))
    return cst.Call(
        func=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("cat")),
        args=[
            cst.Arg(cst.List([cst.Element(piece.deep_clone()) for piece in flat])),
            cst.Arg(dimension, keyword=cst.Name("dim"), equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))),
        ],
    )


def _cat_pieces(node: cst.BaseExpression, dim: int) -> list[cst.BaseExpression] | None:
    """The pieces of `torch.cat([...], dim=dim)` as `_cat` writes it, else None."""
    if not (isinstance(node, cst.Call) and m.matches(node.func, m.Attribute(m.Name("torch"), m.Name("cat")))):
        return None
    listed, given = p.arg(node, 0, "tensors"), p.arg(node, 1, "dim")
    if not isinstance(listed, cst.List) or given is None or p.number(given) != dim:
        return None
    if any(isinstance(e, cst.StarredElement) for e in listed.elements):
        return None
    return [e.value for e in listed.elements]


_WORDS_AND_ENTITIES = """entities = query.flip(-2)
to_words = query @ key.transpose(-1, -2)
to_entities = (query * 2) @ entities.transpose(-1, -2)
"""
# what the port of those blocks builds: the queries side by side, the keys block-diagonal (zeros off the blocks)
_BLOCK_KEYS = (
    "sdpa_key = torch.cat([torch.cat([key, key.new_zeros(key.shape[:-1] + entities.shape[-1:])], dim=-1), "
    "torch.cat([entities.new_zeros(entities.shape[:-1] + key.shape[-1:]), entities], dim=-1)], dim=-2)\n"
)
_BLOCK_CALL = "return " + sdpa("scale=1.0", operands="sdpa_query, sdpa_key, torch.cat([value, value.flip(-2)], dim=-2)")

EXAMPLES = {
    "joined_blocks": (
        # two blocks side by side, each with its own query: one product over both queries' slices
        Example(
            _WORDS_AND_ENTITIES
            + "scores = torch.cat([to_words, to_entities], dim=-1)\nprobs = scores.softmax(-1)\n"
            "return probs @ torch.cat([value, value.flip(-2)], dim=-2)",
            Start,
            becomes="sdpa_query = torch.cat([query, (query * 2)], dim=-1)\n" + _BLOCK_KEYS + _BLOCK_CALL,
        ),
        # LUKE's four blocks: rows of blocks along the keys, then the rows along the queries
        Example(
            _WORDS_AND_ENTITIES
            + "from_entities = torch.cat([(query + 1) @ key.transpose(-1, -2), query.flip(-1) @ entities.transpose(-1, -2)], dim=-1)\n"
            "scores = torch.cat([torch.cat([to_words, to_entities], dim=-1), from_entities], dim=-2)\n"
            "probs = scores.softmax(-1)\nreturn probs @ torch.cat([value, value.flip(-2)], dim=-2)",
            Start,
            # the rows of blocks stacked along the queries
            becomes="sdpa_query = torch.cat([torch.cat([query, (query * 2)], dim=-1), "
            "torch.cat([(query + 1), query.flip(-1)], dim=-1)], dim=-2)\n" + _BLOCK_KEYS + _BLOCK_CALL,
        ),
        # a block scaled on its own is not a block of one product
        Example(
            _WORDS_AND_ENTITIES
            + "scores = torch.cat([to_words / 8.0, to_entities], dim=-1)\nprobs = scores.softmax(-1)\n"
            "return probs @ torch.cat([value, value], dim=-2)",
            refused=Code.SCORES_TRANSFORMED,
        ),
        # scores padded with a tensor of no product: refused for the scores (it was read as an unknown origin)
        Example(
            scored("probs = torch.cat([scores, query.new_zeros(query.shape[:-1] + (3,))], dim=-1).softmax(-1)"),
            refused=Code.SCORES_TRANSFORMED,
        ),
        # concatenated along the heads: no product of the query and key dimensions
        Example(
            _WORDS_AND_ENTITIES
            + "scores = torch.cat([to_words, to_entities], dim=1)\nprobs = scores.softmax(-1)\nreturn probs @ value",
            refused=Code.SCORES_TRANSFORMED,
        ),
        # an operand reassigned between its product and the concatenation
        Example(
            _WORDS_AND_ENTITIES
            + "entities = entities * 2\nscores = torch.cat([to_words, to_entities], dim=-1)\n"
            "probs = scores.softmax(-1)\nreturn probs @ torch.cat([value, value], dim=-2)",
            refused=Code.SCORES_TRANSFORMED,
        ),
        # a block read again after it joined the matrix
        Example(
            _WORDS_AND_ENTITIES
            + "scores = torch.cat([to_words, to_entities], dim=-1)\nself.kept = to_words.sum()\n"
            "probs = scores.softmax(-1)\nreturn probs @ torch.cat([value, value], dim=-2)",
            refused=Code.SCORES_READ,
        ),
    ),
}
