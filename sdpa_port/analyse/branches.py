"""Trace an `if` statement: each branch from the same environment, then what each name holds after it.

A branch the known facts or the file's certain tests rule out is not followed; one they decide always runs is traced
as the only one. A name
the branches bind alike holds that value after the `if`; products each branch makes of its own become one chain
(`ChainBook.alternatives`); scores that change layout, or a softmax or product with V that happens only under a
condition, poison their chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import libcst as cst

from sdpa_port.analyse.branch_locals import unread_after
from sdpa_port.analyse.certain import fallback, reads_module
from sdpa_port.analyse.chain import PROBS, SCORES, AnyExpr, ChainVal, ExprVal, ScalarVal, Value
from sdpa_port.analyse.cstutil import code, if_branches, walk_names
from sdpa_port.analyse.kept import keep_expression
from sdpa_port.analyse.known import decide
from sdpa_port.analyse.remakes import Branch
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView

# an `if`'s branches: each one's test (None for `else`) and body
Arms = Sequence[tuple[cst.BaseExpression | None, Sequence[cst.BaseStatement]]]


def if_statement(tracer: TracerView, node: cst.If, depth: int) -> None:
    """Trace the branches the known facts leave, and merge what they bind."""
    line = tracer.line_of(node)
    branches: Arms = if_branches(node)
    kept = _followed(tracer, branches)
    if not kept:
        return
    if kept[0][0] is None:  # the first branch left always runs
        tracer.block(kept[0][1], depth)
        return
    branches = kept
    # raise-guards on the scores' shape or dtype disappear with the scores
    if len(branches) == 1 and tracer.reads.chain_refs(branches[0][0]) and _only_raises(branches[0][1]):
        tracer.dropped_ifs.add(node)
        return
    for test, _ in branches:
        if test is not None:
            keep_expression(tracer, test, line, test)
    start_env = dict(tracer.env)
    first_new = len(tracer.chains.candidates)
    results = _traced(tracer, node, branches, start_env, depth)
    merged = _merged(tracer, results, first_new, line, node)
    tracer.env.clear()
    tracer.env.update(merged)


def _followed(tracer: TracerView, branches: Arms) -> Arms:
    """The branches the known facts and the file's certain tests (`certain.py`) leave, up to the first they decide
    always runs.

    That one's test is then None.
    """
    kept: list[tuple[cst.BaseExpression | None, Sequence[cst.BaseStatement]]] = []
    for test, body in branches:
        decision = None if test is None else decide(test, tracer.known)
        if decision is None and test is not None:
            decision = tracer.certain.decide(test, tracer.class_name)
            if decision is not None and reads_module(test):
                tracer.fallbacks.append(fallback(test, decision))  # set from outside, eager runs the other side
        if decision is False:
            continue
        kept.append((None, body) if decision is True else (test, body))
        if decision is True:
            break
    return kept


def _traced(tracer: TracerView, node: cst.If, branches: Arms, start_env: dict[str, Value], depth: int) -> list[dict[str, Value]]:
    """The environment after each branch, each traced from `start_env`.

    `start_env` itself comes last when there is no `else`.
    """
    results: list[dict[str, Value]] = []
    for index, (test, body) in enumerate(branches):
        tracer.env.clear()
        tracer.env.update(start_env)
        if test is not None:
            tracer.tests.append(test)
        tracer.path.append((id(node), index))
        tracer.branches.append(branch_of(branches, index))
        tracer.block(body, depth + 1)
        if body and _returns(body[-1]):
            tracer.chains.returned_arms.add((id(node), index))
        tracer.branches.pop()
        tracer.path.pop()
        if test is not None:
            tracer.tests.pop()
        results.append(dict(tracer.env))
    if branches[-1][0] is not None:
        results.append(start_env)
    return results


def _merged(
    tracer: TracerView, results: list[dict[str, Value]], first_new: int, line: int, node: cst.If
) -> dict[str, Value]:
    """What each name holds after the branches whose environments are `results`.

    A name nothing reads after the `if` holds nothing after it (`branch_locals.py`): a branch's temporary.
    """
    merged: dict[str, Value] = {}
    names = set().union(*(r.keys() for r in results))
    # the names made alternatives first: a name holding, in some branches only, a step of a chain that
    # alternatives then merge (the Conformer's `scores_ac` before `scores = (scores_ac + scores_bd) / d`)
    # is one of its earlier values, read later as any earlier value is (a fork, or a read of the scores)
    alternated: set[int] = set()
    deferred: list[str] = []
    for name in names:
        values = [r.get(name) for r in results]
        chained = any(isinstance(v, ChainVal) for v in values)
        if chained and not all(v == values[0] for v in values) and unread_after(tracer.function, node, name):
            continue
        value = _merge(tracer, values, first_new, line, alternated)
        if value is not None:
            merged[name] = value
        elif chained:
            deferred.append(name)
    for name in deferred:
        values = [r.get(name) for r in results]
        chains = [v for v in values if isinstance(v, ChainVal)]
        merged[name] = chains[0]
        _refuse_conditional(tracer, values, chains, alternated, line)
    return merged


def _merge(
    tracer: TracerView, values: list[Value | None], first_new: int, line: int, alternated: set[int]
) -> Value | None:
    """What a name holds after the branches, given its value after each.

    A value is None where the name is unbound in that branch. The result is None where it holds nothing known, or, for
    a name holding chain values, where `_refuse_conditional` decides once every name is merged. A chain the branches'
    own products make one is added to `alternated`.
    """
    first = values[0]
    if all(v is not None and _same_value(v, first) for v in values):
        if isinstance(first, ChainVal):  # the same place on the chain, made in each branch its own way
            tracer.chains.note_merged(first, values)
        return first
    alternative = tracer.chains.alternatives(values, first_new, line)
    if alternative is not None:
        alternated.add(alternative.cid)
        return alternative
    chains = [v for v in values if isinstance(v, ChainVal)]
    if chains and all(c.cid in tracer.chains.joined for c in chains):
        return chains[0]  # scores joined into others: a later use is refused for those
    if not chains:
        if all(v is not None and tracer.value_is_scalar(v) for v in values):
            return ScalarVal()
        if all(isinstance(v, (ExprVal, AnyExpr)) for v in values):
            nodes = [n for v in values for n in ((v.node,) if isinstance(v, ExprVal) else v.nodes)]  # type: ignore[union-attr]
            return AnyExpr(tuple(dict.fromkeys(nodes)))
        return None
    cids = {c.cid for c in chains}
    stages = {c.stage for c in chains}
    ranks = {c.rank for c in chains}
    if len(cids) == 1 and len(chains) == len(values) and len(stages) == 1 and len(ranks) == 1:
        tracer.chains.note_merged(chains[0], chains)
        return chains[0]
    if len(cids) == 1 and len(stages) == 1 and chains[0].stage == PROBS:
        # an alias of the weights made only in some branches (e.g. for output_attentions)
        tracer.chains.note_merged(chains[0], chains)
        return chains[0]
    return None


def _refuse_conditional(
    tracer: TracerView, values: list[Value | None], chains: list[ChainVal], alternated: set[int], line: int
) -> None:
    """Poison the chains of a name whose branches left it different chain values.

    Unless those are the scores of products `alternatives` made one chain.
    """
    if all(c.stage is SCORES and tracer.chains.joined_into(c.cid) in alternated for c in chains):
        return
    cids = {c.cid for c in chains}
    stages = {c.stage for c in chains}
    candidates = tracer.chains.candidates
    if len(cids) == 1 and len(chains) == len(values) and len(stages) == 1:
        candidates[chains[0].cid].poisoned(Code.CONDITIONAL, "the scores change layout under a condition", line)
    elif len(cids) == 1 and len(stages) > 1:
        candidates[chains[0].cid].poisoned(
            Code.CONDITIONAL, "the softmax or the product with V happens only under a condition", line
        )
    else:
        for c in cids:
            candidates[c].poisoned(Code.CONDITIONAL, "the scores are replaced under a condition", line)


def branch_of(branches: Sequence[tuple[cst.BaseExpression | None, object]], index: int) -> Branch:
    """Branch `index` of an `if` whose branches are `branches`, each with its test, None for `else`."""
    tests = [test for test, _ in branches if test is not None]
    return Branch(" | ".join(code(test) for test in tests), index, frozenset(n for t in tests for n in walk_names(t)))


def _same_value(a: Value, b: Value | None) -> bool:
    if b is None:
        return False
    if isinstance(a, ChainVal) and isinstance(b, ChainVal):
        return a == b
    if isinstance(a, ExprVal) and isinstance(b, ExprVal):
        return a.node is b.node
    return False


def _returns(statement: cst.BaseStatement) -> bool:
    """A statement ending in a `return`: the arm it ends leaves the function."""
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[-1], cst.Return)


def _only_raises(body: Sequence[cst.BaseStatement]) -> bool:
    return bool(body) and all(
        isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, cst.Raise) for x in s.body) for s in body
    )
