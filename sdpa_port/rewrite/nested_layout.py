"""Layouts of one expression over lines, bracket inside bracket, the way ruff format breaks them: what
`rewrite/long_lines.py` tries, in order, until the lines fit.

A call's arguments go on one line below it, else one per line; an argument whose line is still too long is laid out
in turn, one level deeper (its own call's arguments, a list's elements one per line with a trailing comma). In a
method's body:

    x = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=add_positions_past_cls(...).to(q.dtype))

    x = torch.nn.functional.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=add_positions_past_cls(
            k.new_zeros(scores_shape), q, self.has_cls, (H, W), (H, W), self.pos_h, self.pos_w
        ).to(q.dtype),
    )

An operation with one operator splits its operands' own brackets first; else it goes in parentheses, on one line
between them, else one operand per line with the operator leading (a conditional expression: `body`, `if test`,
`else orelse`):

    sdpa_mask = sdpa_mask + (q.new_zeros(scores_shape).view(B_ // nW, nW, self.num_heads, N, N) + mask...).to(q.dtype)

    sdpa_mask = sdpa_mask + (
        q.new_zeros(scores_shape).view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
    ).to(q.dtype)

    sdpa_mask = torch.where(mask, q.new_zeros(()), torch.finfo(q.dtype).min).to(q.dtype) if sdpa_mask is None else ...

    sdpa_mask = (
        torch.where(mask, q.new_zeros(()), torch.finfo(q.dtype).min).to(q.dtype)
        if sdpa_mask is None
        else torch.where(attention_mask, sdpa_mask, torch.finfo(query_layer.dtype).min)
    )

`at` is the indentation, relative to the statement's, of the line where an expression starts; a `Fit` says whether
an expression's lines, placed where it stands, stay within the line length.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import libcst as cst

from sdpa_port.analyse.cstutil import LINE_LENGTH, code, precedence
from sdpa_port.rewrite.edit import replace_nodes

Fit = Callable[[cst.BaseExpression], bool]
_STEP = "    "


def line_fit(indent: int, column: int, tail: int) -> Fit:
    """An expression whose first line starts at `column`, whose other lines start at `indent` plus their own
    indentation, and whose last line is followed by `tail` characters."""

    def fit(node: cst.BaseExpression) -> bool:
        lines = code(node).splitlines() or [""]
        widths = [column + len(lines[0]), *(indent + len(line) for line in lines[1:])]
        widths[-1] += tail
        return max(widths) <= LINE_LENGTH

    return fit


def _line(at: str) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(newline=cst.Newline()), indent=True, last_line=cst.SimpleWhitespace(at)
    )


def parenthesized_on_lines(node: cst.BaseExpression, at: str) -> cst.BaseExpression:
    """`node` in parentheses of its own, on a line between them."""
    return node.with_changes(
        lpar=[cst.LeftParen(whitespace_after=_line(at + _STEP))], rpar=[cst.RightParen(whitespace_before=_line(at))]
    )


class Layouts:
    """The layouts of expressions in a statement placed `indent` columns in."""

    def __init__(self, indent: int) -> None:
        self.indent = indent

    def fitted(self, node: cst.BaseExpression, at: str, fit: Fit) -> cst.BaseExpression | None:
        """`node` as it is where it fits, else its first layout that fits; None where none does."""
        if fit(node):
            return node
        return next((laid for laid in self.layouts(node, at) if fit(laid)), None)

    def layouts(self, node: cst.BaseExpression, at: str) -> Iterator[cst.BaseExpression]:
        """The layouts of `node` standing inside brackets (or alone on its line), the preferred first."""
        if len(node.lpar) == 1:
            yield from self.opened(node, at)
            return
        if node.lpar:
            return
        calls, base = chain(node)
        if calls:
            yield from self.chain_layouts(node, calls, base, at)
        elif isinstance(node, cst.List) and node.elements:
            yield from self._elements(node, at)
        else:
            split = self.split(node, at)
            if split is not None:
                yield split

    def chain_layouts(
        self, node: cst.BaseExpression, calls: Sequence[cst.Call], base: cst.BaseExpression, at: str
    ) -> Iterator[cst.BaseExpression]:
        """`f(a).g(b)` broken at one pair of brackets, from the last opening bracket back to a parenthesized base."""
        for call in calls:
            if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
                # laid out over lines already: one argument per line stays so (a magic trailing comma), each fitted
                laid = self._arguments(call, at) if _one_per_line_already(call) else None
                if laid is not None:
                    yield replace_nodes(node, {call: laid})
                continue
            if not call.args:
                continue
            yield replace_nodes(node, {call: _hugged(call, at)})
            laid = self._arguments(_one_per_line(call, at), at)
            if laid is not None:
                yield replace_nodes(node, {call: laid})
        if len(base.lpar) == 1:
            for opened in self.opened(base, at):
                yield replace_nodes(node, {base: opened})

    def opened(self, node: cst.BaseExpression, at: str) -> Iterator[cst.BaseExpression]:
        """`(content)` with the content on lines of its own between the parentheses, one line, else laid out."""
        inner = at + _STEP
        content = node.with_changes(lpar=[], rpar=[])
        yield parenthesized_on_lines(content, at)
        for laid in self.layouts(content, inner):
            if line_fit(self.indent, self.indent + len(inner), 0)(laid):
                yield parenthesized_on_lines(laid, at)
                return

    def split(self, node: cst.BaseExpression, at: str) -> cst.BaseExpression | None:
        """An operation inside brackets, one operand per line with the operator leading (`and`/`or`, a binary
        operator of the lowest precedence in it), or a conditional expression as `body` / `if test` / `else orelse`;
        None where it is no such operation or an operand does not fit."""
        column = self.indent + len(at)
        if isinstance(node, cst.IfExp):
            body = self.fitted(node.body, at, line_fit(self.indent, column, 0))
            test = self.fitted(node.test, at, line_fit(self.indent, column + len("if "), 0))
            orelse = self.fitted(node.orelse, at, line_fit(self.indent, column + len("else "), 0))
            if body is None or test is None or orelse is None:
                return None
            return node.with_changes(
                body=body, test=test, orelse=orelse, whitespace_before_if=_line(at), whitespace_before_else=_line(at)
            )
        if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
            return self._operands(node, precedence(node), at)
        return None

    def _operands(self, node: cst.BaseExpression, level: int, at: str) -> cst.BaseExpression | None:
        column = self.indent + len(at)
        if not isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)) or precedence(node) != level:
            return self.fitted(node, at, line_fit(self.indent, column, 0))
        left = self._operands(node.left, level, at)
        operator = node.operator.with_changes(whitespace_before=_line(at))
        right = self.fitted(node.right, at, line_fit(self.indent, column + len(code(node.operator).strip()) + 1, 0))
        if left is None or right is None:
            return None
        return node.with_changes(left=left, operator=operator, right=right)

    def _arguments(self, call: cst.Call, at: str) -> cst.Call | None:
        """A call laid out one argument per line, each argument that is still too long laid out one level deeper."""
        inner = at + _STEP
        args = []
        for arg in call.args:
            prefix = code(arg.with_changes(value=cst.Name("_"), comma=cst.MaybeSentinel.DEFAULT))
            fit = line_fit(self.indent, self.indent + len(inner) + len(prefix.rstrip()) - 1, 1)
            value = self.fitted(arg.value, inner, fit)
            if value is None:
                return None
            args.append(arg.with_changes(value=value))
        return call.with_changes(args=args)

    def _elements(self, node: cst.List, at: str) -> Iterator[cst.BaseExpression]:
        inner = at + _STEP
        flat = [e.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for e in node.elements]
        flat[-1] = flat[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        yield node.with_changes(
            lbracket=cst.LeftSquareBracket(whitespace_after=_line(inner)),
            elements=flat,
            rbracket=cst.RightSquareBracket(whitespace_before=_line(at)),
        )
        elements = []
        for i, element in enumerate(node.elements):
            fit = line_fit(self.indent, self.indent + len(inner), 1)
            value = self.fitted(element.value, inner, fit)
            if value is None:
                return
            closing = _line(at) if i == len(node.elements) - 1 else _line(inner)
            elements.append(element.with_changes(value=value, comma=cst.Comma(whitespace_after=closing)))
        yield node.with_changes(
            lbracket=cst.LeftSquareBracket(whitespace_after=_line(inner)),
            elements=elements,
            rbracket=cst.RightSquareBracket(),
        )


def chain(node: cst.BaseExpression) -> tuple[list[cst.Call], cst.BaseExpression]:
    """The calls `node` is a chain of (`f(a).g(b)`, `table[k](c)`), from the last opening bracket back, and what the
    chain starts from."""
    found: list[cst.Call] = []
    while isinstance(node, (cst.Call, cst.Attribute, cst.Subscript)) and not node.lpar:
        if isinstance(node, cst.Call):
            found.append(node)
            node = node.func
        else:
            node = node.value
    return found, node


def _one_per_line_already(call: cst.Call) -> bool:
    return all(
        isinstance(arg.comma, cst.Comma) and isinstance(arg.comma.whitespace_after, cst.ParenthesizedWhitespace)
        for arg in call.args
    )


class _Deeper(cst.CSTTransformer):
    """Every line break inside an expression indented one level more: the expression moved to a line below."""

    def leave_ParenthesizedWhitespace(
        self, original: cst.ParenthesizedWhitespace, updated: cst.ParenthesizedWhitespace
    ) -> cst.ParenthesizedWhitespace:
        return updated.with_changes(last_line=cst.SimpleWhitespace(_STEP + updated.last_line.value))


def _moved_down(arg: cst.Arg) -> cst.Arg:
    """An argument whose value is laid out over lines already, its lines indented one level more, as it moves from
    its call's line to a line of its own below it."""
    return arg.with_changes(value=arg.value.visit(_Deeper())) if "\n" in code(arg.value) else arg


def _hugged(call: cst.Call, at: str) -> cst.Call:
    """`f(a, b)` with its arguments on one line below it and the closing parenthesis on a line of its own."""
    flat = [_moved_down(arg).with_changes(whitespace_after_arg=cst.SimpleWhitespace("")) for arg in call.args]
    last = flat[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=_line(at))
    return call.with_changes(whitespace_before_args=_line(at + _STEP), args=[*flat[:-1], last])


def _one_per_line(call: cst.Call, at: str) -> cst.Call:
    """`f(a, b)` with one argument per line and a trailing comma."""
    flat = [_moved_down(arg).with_changes(whitespace_after_arg=cst.SimpleWhitespace("")) for arg in call.args]
    args = [arg.with_changes(comma=cst.Comma(whitespace_after=_line(at + _STEP))) for arg in flat[:-1]]
    args.append(flat[-1].with_changes(comma=cst.Comma(whitespace_after=_line(at))))
    return call.with_changes(whitespace_before_args=_line(at + _STEP), args=args)
