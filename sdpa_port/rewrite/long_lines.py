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

A statement that no layout brings within the line length (a long string) stays as it is.
"""

from __future__ import annotations

from functools import cached_property

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import LINE_LENGTH, code, fits
from sdpa_port.rewrite.edit import IndentTracking, lay_out_call


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
        for call in _outer_calls(updated):
            laid = lay_out_call(updated, call, indent)
            if fits(laid, indent):
                assert isinstance(laid, cst.SimpleStatementLine)
                return laid
        small = updated.body[0]
        value = getattr(small, "value", None)
        if isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return)) and value is not None:
            for layout in (_wrapped, _split):
                candidate = updated.with_changes(body=[small.with_changes(value=layout(value))])
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
        for layout in (_wrapped, _split):
            test = layout(updated.test)
            if all(indent + len(line) <= LINE_LENGTH for line in code(test).splitlines()):
                return updated.with_changes(test=test)
        return updated


def _commented(node: cst.CSTNode) -> bool:
    """A comment stands inside `node` (beyond its leading lines), whose whitespace a layout would replace."""
    inner = node.with_changes(leading_lines=()) if isinstance(node, cst.SimpleStatementLine) else node
    return bool(m.findall(inner, m.Comment()))


def _outer_calls(statement: cst.SimpleStatementLine) -> list[cst.Call]:
    """The calls a statement's value is a chain of (`f(a).g(b)`, `table[k](c)`), from the last opening bracket back;
    none where the value is no call (a call inside an operation is not split, the operation is)."""
    value = getattr(statement.body[0], "value", None)
    found: list[cst.Call] = []
    while isinstance(value, (cst.Call, cst.Attribute, cst.Subscript)) and not value.lpar:
        if isinstance(value, cst.Call):
            found.append(value)
            value = value.func
        else:
            value = value.value
    return found


def _line(indent: str) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(newline=cst.Newline()), indent=True, last_line=cst.SimpleWhitespace(indent)
    )


def _wrapped(value: cst.BaseExpression) -> cst.BaseExpression:
    """`value` in parentheses of its own, on one line between them."""
    return value.with_changes(
        lpar=[cst.LeftParen(whitespace_after=_line("    ")), *value.lpar],
        rpar=[*value.rpar, cst.RightParen(whitespace_before=_line(""))],
    )


def _split(value: cst.BaseExpression) -> cst.BaseExpression:
    """`value` in parentheses of its own, one operand of its outermost `and`/`or` per line (as `_wrapped` where it
    is no such operation)."""
    if not isinstance(value, cst.BooleanOperation) or value.lpar:
        return _wrapped(value)
    return _wrapped(_operands_per_line(value, type(value.operator)))


def _operands_per_line(node: cst.BaseExpression, kind: type[cst.BaseBooleanOp]) -> cst.BaseExpression:
    if not isinstance(node, cst.BooleanOperation) or node.lpar or not isinstance(node.operator, kind):
        return node
    operator = node.operator.with_changes(whitespace_before=_line("    "))
    return node.with_changes(left=_operands_per_line(node.left, kind), operator=operator)

