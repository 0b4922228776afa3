"""Statements of forward that read the key's length (lengths, shape checks): they move into the eager function.

An implementation that keeps its own cache (continuous batching's paged cache is updated inside the attention
function) receives only the new keys: a length taken from them in forward, or a check of the mask against it, is
wrong there. Inside the eager function they read the keys that function receives, as before.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import assigned_names, block_body, if_chain
from sdpa_port.analyse.patterns import walk_names
from sdpa_port.analyse.sdpa_path import SdpaPath


def key_statements(path: SdpaPath) -> frozenset[cst.CSTNode]:
    """Assignments computed from the key operand, and `if ...: raise` checks reading them, between the key's last
    assignment and the product with V, whose values forward itself does not read elsewhere (the dispatch reads what
    the chain's operations hand over: terms, scale, dropout, operands)."""
    start = path.start
    assert start is not None
    keys = walk_names(start.key) - {"self"}
    walked = list(_walk(block_body(path.function.body)))
    output = next((i for i, node in enumerate(walked) if isinstance(path.plans.get(node), t.OutputStmt)), None)
    if output is None or not keys:
        return frozenset()
    last_key = max(
        (i for i, node in enumerate(walked[:output]) if _targets(node) & keys),
        default=-1,
    )
    derived = set(keys)
    moved: list[cst.CSTNode] = []
    for node in walked[last_key + 1 : output]:
        if path.plans.get(node) is not None:
            continue
        if isinstance(node, cst.Assign):
            targets = _targets(node)
            if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and walk_names(node.value) & derived:
                moved.append(node)
                derived |= targets
        elif isinstance(node, cst.If) and _is_check(node) and walk_names(node.test) & (derived - keys):
            moved.append(node)
    if not moved:
        return frozenset()
    # a moved value that forward still reads afterwards (outside the chain and the moved statements) must stay
    first = walked.index(moved[0])
    values = {name for node in moved for name in _targets(node)}
    if values & _handed_over(path):
        return frozenset()
    inside = {inner for node in moved if isinstance(node, cst.If) for inner in _walk([node])}
    for node in walked[first:]:
        if node in inside or isinstance(path.plans.get(node), (t.ChainStmt, t.OutputStmt)):
            continue
        if _reads(node) & values:
            return frozenset()
    return frozenset(moved)


def _walk(statements: Sequence[cst.BaseStatement]) -> Iterator[cst.CSTNode]:
    """Small statements and `if` statements in source order, entering every branch."""
    for statement in statements:
        if isinstance(statement, cst.SimpleStatementLine):
            yield from statement.body
        elif isinstance(statement, cst.If):
            yield statement
            for branch in if_chain(statement):
                yield from _walk(block_body(branch.body))
        elif isinstance(statement, (cst.With, cst.For, cst.While)):
            yield from _walk(block_body(statement.body))


def _targets(node: cst.CSTNode) -> set[str]:
    if isinstance(node, cst.Assign):
        return {name for target in node.targets for name in assigned_names(target.target)}
    if isinstance(node, (cst.AugAssign, cst.AnnAssign)):
        return set(assigned_names(node.target))
    return set()


def _handed_over(path: SdpaPath) -> set[str]:
    """Names the dispatch in forward reads through the chain's operations."""
    names: set[str] = set()
    for op in path.chain_ops:
        parts: list[cst.CSTNode | None] = []
        match op:
            case t.Start():
                parts = [op.query, op.key, op.query_scale[0] if op.query_scale else None]
            case t.View():
                parts = list(op.heads or ())
            case t.Scale():
                parts = [op.factor]
            case t.AddTerm():
                parts = [op.term]
            case t.Fill():
                parts = [op.condition, op.fill]
            case t.Guard():
                parts = [op.bound]
            case t.ZeroRows():
                parts = [op.condition]
            case t.Dropout():
                parts = [op.call.probability, op.call.training]
            case t.HeadMask():
                parts = [op.operand]
            case t.Output():
                parts = [op.value]
            case t.Cast() | t.Softmax() | t.Shift() | t.Transpose():
                parts = []
            case _:
                t.unreachable(op)
        for part in parts:
            if part is not None:
                names |= walk_names(part)
    return names


def _reads(node: cst.CSTNode) -> set[str]:
    if isinstance(node, cst.If):
        return walk_names(node.test)
    if isinstance(node, cst.Assign):
        return walk_names(node.value) | {
            name for target in node.targets for name in walk_names(target.target) - set(assigned_names(target.target))
        }
    return walk_names(node)


def _is_check(node: cst.If) -> bool:
    """`if <test>: raise ...` with no other branch."""
    if node.orelse is not None:
        return False
    body = block_body(node.body)
    return bool(body) and all(
        isinstance(s, cst.SimpleStatementLine) and all(isinstance(small, cst.Raise) for small in s.body) for s in body
    )


__all__ = ["key_statements"]
