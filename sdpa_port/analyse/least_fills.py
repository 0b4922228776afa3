"""Fills that hold the least number of the scores' dtype, made into a 0-d tensor only to be the fill.

Before (GPT-2's `_attn`; the statements before the fill are kept, their reads of the scores' dtype and device
turned into the query's):

    mask_value = torch.finfo(attn_weights.dtype).min
    # Need to be a tensor, otherwise we get error: ...
    mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
    attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)

What `least_fills` finds: the `torch.where` statement, whose fill is `torch.finfo(<the scores>.dtype).min` in a 0-d
tensor of the scores' dtype on their device. The port writes that number into its mask where the fill stands (the
mask is made in the query's dtype from zeros of that dtype, and the least number of a dtype is one of its numbers, so
the tensor changes no entry), and the statements that made the tensor, read by nothing else, go with their comments.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import assigned_values, block_body, if_chain, walk_names
from sdpa_port.analyse.names import ImportMap
from sdpa_port.analyse.shapes import assignment_of
from sdpa_port.rewrite.edit import replace_nodes

SCORES = "__scores__"  # the scores, where a kept statement reads their dtype or device

_DTYPE = m.Attribute(value=m.Name(SCORES), attr=m.Name("dtype"))
_DEVICE = m.Attribute(value=m.Name(SCORES), attr=m.Name("device"))
_KEYWORD_DTYPE = m.Arg(keyword=m.Name("dtype"), value=_DTYPE)
_KEYWORD_DEVICE = m.Arg(keyword=m.Name("device"), value=_DEVICE)


def least_fills(
    function: cst.FunctionDef, plans: Mapping[cst.CSTNode, t.StmtPlan], imports: ImportMap
) -> frozenset[cst.CSTNode]:
    """The statements of `function` whose fill is a name holding the least number of the scores' dtype (alone, or in
    a 0-d tensor of that dtype on their device), bound by statements of the same block just before."""
    found: set[cst.CSTNode] = set()
    _block(block_body(function.body), plans, imports, found)
    return frozenset(found)


def _block(
    statements: Sequence[cst.BaseStatement],
    plans: Mapping[cst.CSTNode, t.StmtPlan],
    imports: ImportMap,
    found: set[cst.CSTNode],
) -> None:
    for index, statement in enumerate(statements):
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                plan = plans.get(small)
                fills = [op for op in plan.ops if isinstance(op, t.Fill)] if isinstance(plan, t.ChainStmt) else []
                if len(fills) == 1 and isinstance(fills[0].fill, cst.Name):
                    if _holds_least(statements[:index], fills[0].fill.value, plans, imports):
                        found.add(small)
        elif isinstance(statement, cst.If):
            for branch in if_chain(statement):
                _block(block_body(branch.body), plans, imports, found)
        elif isinstance(statement, (cst.With, cst.For, cst.While)):
            _block(block_body(statement.body), plans, imports, found)


def _holds_least(
    before: Sequence[cst.BaseStatement], name: str, plans: Mapping[cst.CSTNode, t.StmtPlan], imports: ImportMap
) -> bool:
    """The last statements binding `name` in `before` make the least number of the scores' dtype, each the one
    before it wrapped (`x = torch.finfo(...).min`, then `x = torch.full([], x, ...)`)."""
    for statement in reversed(before):
        if name not in assigned_values([statement]):
            continue
        assign = assignment_of(statement, name)
        if assign is None:
            return False
        plan = plans.get(assign)
        redirected: dict[cst.CSTNode, cst.CSTNode] = {
            node: cst.Attribute(cst.Name(SCORES), cst.Name(action.value))
            for node, action in (plan.replacements.items() if isinstance(plan, t.KeepStmt) else ())
            if action in (t.KeepAction.DTYPE, t.KeepAction.DEVICE)
        }
        value = replace_nodes(assign.value, redirected)
        inner = _unwrapped(value, imports)
        if isinstance(inner, cst.Name) and inner.value == name:
            continue  # the value before, wrapped: read it
        return inner is not None and name not in walk_names(inner) and _least(inner, imports)
    return False


def _unwrapped(node: cst.BaseExpression, imports: ImportMap) -> cst.BaseExpression | None:
    """What a 0-d tensor of the scores' dtype on their device holds, through any number of such wrappings."""
    while True:
        if _least(node, imports) or isinstance(node, cst.Name):
            return node
        if not isinstance(node, cst.Call):
            return None
        qualified = imports.qualify(node.func)
        args = node.args
        if qualified == "torch.full" and len(args) == 4 and m.matches(args[0].value, m.List([]) | m.Tuple([])):
            keywords = args[2:]
            held = args[1]
        elif qualified == "torch.tensor" and len(args) == 3:
            keywords, held = args[1:], args[0]
        elif m.matches(node, m.Call(func=m.Attribute(attr=m.Name("to")), args=[m.Arg(value=_DEVICE, keyword=None)])):
            inner = node.func.value  # type: ignore[attr-defined]
            if not (isinstance(inner, cst.Call) and imports.qualify(inner.func) == "torch.tensor" and len(inner.args) == 2):
                return None
            keywords, held = [*inner.args[1:], node.args[0].with_changes(keyword=cst.Name("device"))], inner.args[0]
        else:
            return None
        if held.keyword is not None or held.star or not _scores_keywords(keywords):
            return None
        node = held.value


def _scores_keywords(keywords: Sequence[cst.Arg]) -> bool:
    """`dtype=<the scores>.dtype, device=<the scores>.device`, in either order."""
    dtype = [k for k in keywords if m.matches(k, _KEYWORD_DTYPE)]
    device = [k for k in keywords if m.matches(k, _KEYWORD_DEVICE)]
    return len(keywords) == 2 and len(dtype) == 1 and len(device) == 1


def _least(node: cst.BaseExpression, imports: ImportMap) -> bool:
    """`torch.finfo(<the scores>.dtype).min`."""
    return (
        m.matches(node, m.Attribute(value=m.Call(args=[m.Arg(value=_DTYPE, keyword=None)]), attr=m.Name("min")))
        and imports.qualify(node.value.func) == "torch.finfo"  # type: ignore[attr-defined]
    )
