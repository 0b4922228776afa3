"""One SDPA call where forward chooses between helpers whose SDPA sides make the same call.

Before (GPT-2's forward; `_upcast_and_reordered_attn` flattens the heads for `baddbmm` and upcasts the operands,
which the port drops, SDPA accumulating in float32 anyway):

    if self.reorder_and_upcast_attn:
        attn_output, attn_weights = self._upcast_and_reordered_attn(query, key, value, attention_mask, head_mask)
    else:
        attn_output, attn_weights = self._attn(query, key, value, attention_mask, head_mask)

After: the SDPA side runs `attn_output, attn_weights = self._attn(...)` alone, written out once. Each branch must be
one statement calling a helper, the statements the same but for the helper; the test must call nothing; and every
helper's SDPA call must have the same value (`call_value`): the same operands, scale factors, masks, causality,
dropout and returns. Where one helper's port hands the operands over in the value's dtype and another's as they are,
the first is kept: SDPA takes one dtype, so the second runs only where the cast changes nothing. Anything else keeps
the branches, each with its own call.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import libcst as cst

from sdpa_port.analyse.call_value import Sizes, call_value
from sdpa_port.analyse.cstutil import block_body, code, if_chain, walk_names
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.sdpa_side import SdpaSide, WrittenOut
from sdpa_port.analyse.shapes import Context, plain_methods, shape_of, stable_names
from sdpa_port.rewrite.edit import replace_nodes
from sdpa_port.rewrite.sdpa_body import recast_value


def one_call(facts: ModuleFacts, class_name: str, side: SdpaSide) -> SdpaSide:
    """`side` with each choice between helpers that make the same SDPA call replaced by one of its calls (a choice
    among forward's own statements; one nested in other blocks stays)."""
    if len(side.calls) < 2:
        return side
    body = list(block_body(side.forward.body))
    calls: dict[cst.SimpleStatementLine, WrittenOut] = dict(side.calls)
    for index, statement in enumerate(body):
        lines = _helper_lines(statement, side) if isinstance(statement, cst.If) else None
        if lines is None:
            continue
        sizes = _sizes(facts, class_name, side.forward, body[:index], [side.calls[line] for line in lines])
        values = [call_value(side.calls[line], sizes, facts.imports) for line in lines]
        if None in values or any(value != values[0] for value in values):
            continue
        chosen = _chosen(lines, side)
        assert isinstance(statement, cst.If)
        kept = chosen.with_changes(leading_lines=statement.leading_lines)  # its call is the same node
        body[index] = kept
        for line in lines:
            del calls[line]
        calls[kept] = side.calls[chosen]
    if len(calls) == len(side.calls):
        return side
    forward = side.forward.with_changes(body=side.forward.body.with_changes(body=body))
    return replace(side, forward=forward, calls=MappingProxyType(calls))


def _helper_lines(statement: cst.If, side: SdpaSide) -> list[cst.SimpleStatementLine] | None:
    """The branches' statements, where each branch is one statement calling a helper and the statements are the same
    but for the helper; the chain ends in an `else`, and its tests call nothing (leaving them out changes nothing)."""
    branches = if_chain(statement)
    if not isinstance(branches[-1], cst.Else):
        return None
    lines: list[cst.SimpleStatementLine] = []
    for branch in branches:
        if isinstance(branch, cst.If) and not _inert(branch.test):
            return None
        body = block_body(branch.body)
        if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or body[0] not in side.calls:
            return None
        lines.append(body[0])
    shapes = {code(replace_nodes(line, {side.calls[line].call: cst.Name("_")})).strip() for line in lines}
    arguments = {code(cst.Call(cst.Name("_"), side.calls[line].call.args)) for line in lines}
    return lines if len(shapes) == 1 and len(arguments) == 1 else None


def _inert(test: cst.BaseExpression) -> bool:
    """A test that calls nothing, binds nothing, waits for nothing."""
    found: list[cst.CSTNode] = []

    class Active(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.Call, cst.NamedExpr, cst.Await, cst.Yield, cst.Lambda)):
                found.append(node)
            return not found

    test.visit(Active())
    return not found


def _sizes(
    facts: ModuleFacts,
    class_name: str,
    forward: cst.FunctionDef,
    before: list[cst.BaseStatement],
    calls: list[WrittenOut],
) -> Sizes:
    """The sizes forward's text tells of the names it hands the helpers, each size reading names that hold one
    value in forward."""
    params = {p.name.value for p in (*forward.params.params, *forward.params.kwonly_params)}
    stable = stable_names(block_body(forward.body), params)
    methods = plain_methods(facts, class_name)
    names = {name for written in calls for argument in written.bound.values() for name in walk_names(argument)}
    shapes: dict[str, tuple[str | None, ...]] = {}
    for name in sorted(names):
        shape = shape_of(cst.Name(name), Context(before), methods)
        if shape is None:
            continue
        shapes[name] = tuple(
            size if size is not None and walk_names(cst.parse_expression(size)) <= stable else None for size in shape
        )
    return Sizes(MappingProxyType(shapes))


def _chosen(lines: list[cst.SimpleStatementLine], side: SdpaSide) -> cst.SimpleStatementLine:
    """The branch kept: one whose port hands the operands over in the value's dtype where any does, else the last."""
    recasting = [line for line in lines if _recasts(side.calls[line])]
    return (recasting or lines)[-1]


def _recasts(written: WrittenOut) -> bool:
    assert written.path is not None
    return recast_value(written.path) is not None
