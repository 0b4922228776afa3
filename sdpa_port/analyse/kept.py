"""Keep a statement that is not part of a chain, with what it may read of the chains rewritten.

Such a statement may read the scores' `.dtype` and `.device` (pointed at the query once the scores are gone), their
sizes (the query's, or the key length; of scores of unknown rank, the product's shape, from the query and key),
`expand_as(scores)` and `reshape_as(scores)`; after the product with V, the
weights. Any other read of a chain poisons it. The rewrites are the statement's `KeepStmt`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import (
    OUT,
    PROBS,
    SCORES,
    Candidate,
    Cast,
    ChainVal,
    Dropout,
    KeepAction,
    KeepStmt,
    Scale,
    Softmax,
    Start,
    short,
)
from sdpa_port.analyse.chain_reads import ReadFinder
from sdpa_port.analyse.cstutil import walk_names
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView


def keep_expression(tracer: TracerView, node: cst.CSTNode, line: int, key: cst.CSTNode, allow_probs: bool = False) -> None:
    """A statement that is not part of the chain: chain reads must be of `.dtype`/`.device`/`expand_as`."""
    for joined in sorted(walk_names(node)):
        held = tracer.env.get(joined)
        if isinstance(held, ChainVal) and held.cid in tracer.chains.joined:
            tracer.chains.candidates[tracer.chains.joined_into(held.cid)].poisoned(
                Code.SCORES_READ, f"`{joined}`, scores joined into others, is read by `{short(node)}`", line
            )
    finder = ReadFinder(tracer.env, None)
    node.visit(finder)
    replacements: dict[cst.CSTNode, KeepAction] = {}
    for attribute in finder.attributes:
        replacements[attribute] = KeepAction(attribute.attr.value)
    for call in finder.expands:
        replacements[call] = KeepAction.STRIP_EXPAND
    for call, name in finder.reshapes:
        value = tracer.env[name.value]
        assert isinstance(value, ChainVal)
        start = tracer.chains.candidates[value.cid].start
        if value.stage is not SCORES or start is None or value.rank != start.rank:
            tracer.chains.candidates[value.cid].poisoned(
                Code.SCORES_READ, f"`{short(node)}` takes the shape of scores that changed layout", line
            )
            continue
        replacements[call] = KeepAction.RESHAPE_AS
    for name in finder.values_read():
        value = tracer.env[name.value]
        assert isinstance(value, ChainVal)
        if value.stage in (PROBS, OUT) and (allow_probs or tracer.output_seen):
            tracer.probs_after_output.add(name.value)
            continue
        tracer.chains.candidates[value.cid].poisoned(Code.SCORES_READ, f"the scores are read by `{short(node)}`", line)
    for name in finder.shapes:
        value = tracer.env[name.value]
        assert isinstance(value, ChainVal)
        tracer.chains.candidates[value.cid].poisoned(Code.SCORES_READ, f"the shape of the scores is read by `{short(node)}`", line)
    sizes: dict[cst.CSTNode, int | None] = {}
    shaped: dict[cst.CSTNode, int] = {}
    for read, name, index in finder.sizes:
        value = tracer.env[name.value]
        assert isinstance(value, ChainVal)
        layout = tracer.chains.layout_of(value.cid)
        if layout is not None:
            # scores laid out otherwise: size `index` is SDPA's size at the dimension the layout takes it to
            if not -len(layout) <= index < len(layout):
                tracer.chains.candidates[value.cid].poisoned(
                    Code.SCORES_READ, f"`{short(node)}` reads no size of the scores", line
                )
                continue
            index = layout.index(index % len(layout))
        last = index == -1 or (value.rank is not None and index == value.rank - 1)
        if not last and index >= 0 and value.rank is None and product_shaped(tracer.chains.candidates[value.cid]):
            shaped[read] = index  # read from the product's shape, which the query and key give at any rank
            continue
        if not last and index >= 0 and value.rank is None:
            tracer.chains.candidates[value.cid].poisoned(
                Code.SCORES_READ, f"the shape of the scores is read by `{short(node)}`, their rank unknown", line
            )
            continue
        # the scores are (..., queries, keys): their leading sizes are the query's, the last the key length
        sizes[read] = None if last else index
    if replacements or sizes or shaped:
        tracer.plans[key] = KeepStmt(replacements, sizes, shaped)


# products whose result is `broadcast(left[:-2], right[:-2]) + (left[-2], right[-1])` for operands of rank 2 or more
SHAPED_PRODUCTS = (p.ProductForm.MATMUL, p.ProductForm.BMM, p.ProductForm.OPERATOR)


def product_shaped(candidate: Candidate) -> bool:
    """The scores have the shape of their one query-key product, whatever its rank: a matmul of the query and the
    transposed key as SDPA takes them (no einsum, no layout of their own, no blocks joined), followed so far only by
    operations that keep the shape (number scales, casts, the softmax, dropout)."""
    starts = candidate.start_ops()
    if len(starts) != 1 or candidate.start is None:
        return False
    start = starts[0]
    if start.product.form not in SHAPED_PRODUCTS or start.joined or start.layout is not None:
        return False
    if start.orders != (None, None):
        return False
    kept = (Start, Cast, Softmax, Dropout)
    return all(isinstance(op, kept) or (isinstance(op, Scale) and not op.per_query) for op, _, _ in candidate.ops)
