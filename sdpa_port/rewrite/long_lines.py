"""Lay out the lines a port wrote that run past the line length, the way ruff format would.

Only statements the port wrote or changed are laid out: a statement of the original file, as it was, keeps its
lines, long or not. A port inside a checkout is formatted by the checkout's pinned ruff afterwards; this pass is for
every other port (remote code, a file alone), which no formatter sees.

A call's arguments go on one line below it, else one per line, trying the calls from the last opening bracket back:

    sdpa_mask = torch.where(causal, zeros if mask is None else mask, torch.finfo(dtype).min).to(dtype)    (too long)

    sdpa_mask = torch.where(
        causal,
        zeros if mask is None else mask,
        torch.finfo(dtype).min,
    ).to(dtype)

A condition, or a value that is no call, goes in parentheses on a line of its own, else one operand of its `and` or
`or` per line:

    if self.config._attn_implementation == "sdpa" and not output_attentions and head_mask is None:       (too long)

    if (
        self.config._attn_implementation == "sdpa"
        and not output_attentions
        and head_mask is None
    ):

An argument still too long on its line is laid out in turn, and an operation splits at its operands' own brackets
or one operand per line: `rewrite/nested_layout.py` holds the layouts, tried in order until every line fits. A
statement that no layout brings within the line length (a long string) stays as it is.
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterator

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import LINE_LENGTH, code, fits, precedence
from sdpa_port.rewrite.edit import IndentTracking
from sdpa_port.rewrite.nested_layout import Layouts, chain


def lay_out_long_lines(original: cst.Module, ported: cst.Module) -> cst.Module:
    """`ported` with each statement it wrote or changed, past the line length, laid out to fit where one layout does."""
    result = ported.visit(_LayOut(original, len(ported.default_indent)))
    assert isinstance(result, cst.Module)
    return result


def _line_key(statement: cst.SimpleStatementLine) -> str:
    return code(statement.with_changes(leading_lines=()))


def _header_key(node: cst.If) -> str:
    return code(node.test)


class _LayOut(IndentTracking, cst.CSTTransformer):
    def __init__(self, original: cst.Module, unit: int) -> None:
        self.original = original
        self.unit = unit or 4

    @cached_property
    def known(self) -> set[str]:
        """The original's simple lines and `if` conditions, as written: read once, where a line is too long."""
        found = m.findall(self.original, m.SimpleStatementLine() | m.If())
        lines = {_line_key(n) for n in found if isinstance(n, cst.SimpleStatementLine)}
        return lines | {_header_key(n) for n in found if isinstance(n, cst.If)}

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        indent = self.depth * self.unit
        if fits(updated, indent) or _line_key(original) in self.known or len(updated.body) != 1 or _commented(updated):
            return updated
        small = updated.body[0]
        value = getattr(small, "value", None)
        if not isinstance(value, cst.BaseExpression):
            return updated
        for layout in _value_layouts(value, Layouts(indent), isinstance(small, _ASSIGNING)):
            candidate = updated.with_changes(body=[small.with_changes(value=layout)])
            if fits(candidate, indent):
                return candidate
        return updated

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        # the header alone: `if <test>:` at this depth (the body is laid out on its own)
        indent = self.depth * self.unit
        header = len("elif ") + len(code(updated.test)) + 1
        if indent + header <= LINE_LENGTH or _header_key(original) in self.known or "\n" in code(updated.test):
            return updated
        if _commented(updated.test):
            return updated
        test = updated.test if updated.test.lpar else _parenthesized(updated.test)
        for test in Layouts(indent).opened(test, "") if len(test.lpar) == 1 else ():
            if all(indent + len(line) <= LINE_LENGTH for line in code(test).splitlines()):
                return updated.with_changes(test=test)
        return updated


_ASSIGNING = (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return)


def _value_layouts(value: cst.BaseExpression, layouts: Layouts, assigning: bool) -> Iterator[cst.BaseExpression]:
    """A statement's value laid out: a call chain at its brackets; an operation with one operator at its operands'
    own brackets (the last operand's, else a parenthesized first operand's); an assigned value in parentheses."""
    calls, base = chain(value)
    if calls:
        yield from layouts.chain_layouts(value, calls, base, "")
    elif isinstance(value, cst.BinaryOperation) and not value.lpar and _one_operator(value):
        right, left = value.right, value.left
        if chain(right)[0] or len(right.lpar) == 1:
            yield from (value.with_changes(right=laid) for laid in layouts.layouts(right, ""))
        if len(left.lpar) == 1:
            yield from (value.with_changes(left=laid) for laid in layouts.opened(left, ""))
    if assigning and not value.lpar:
        yield from layouts.opened(_parenthesized(value), "")


def _one_operator(operation: cst.BinaryOperation) -> bool:
    """`a + b(c)`, not `a + b + c(d)`: with more than one operator of a kind, the parentheses read better."""
    return not any(
        isinstance(side, cst.BinaryOperation) and not side.lpar and precedence(side) == precedence(operation)
        for side in (operation.left, operation.right)
    )


def _parenthesized(value: cst.BaseExpression) -> cst.BaseExpression:
    return value.with_changes(lpar=[cst.LeftParen(), *value.lpar], rpar=[*value.rpar, cst.RightParen()])


def _commented(node: cst.CSTNode) -> bool:
    """A comment stands inside `node` (beyond its leading lines), whose whitespace a layout would replace."""
    inner = node.with_changes(leading_lines=()) if isinstance(node, cst.SimpleStatementLine) else node
    return bool(m.findall(inner, m.Comment()))
