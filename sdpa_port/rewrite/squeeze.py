"""Drop the names of an SDPA forward that only forward a value: each rule keeps every value the same.

`None` held in a name (bound once, never bound again) is written where the name is read:

    attn_weights_reshaped = None
    return attn_output, attn_weights_reshaped, past_key_value   ->   return attn_output, None, past_key_value

A name set to None, then to `a` under `if a is not None:`, is set to `a` where it was set to None (both are None
where the branch does not run):

    mask = None
    if attention_mask is not None:                     mask = attention_mask
        check(attention_mask)                     ->   if attention_mask is not None:
        mask = attention_mask                              check(attention_mask)

Two lines handing a value on are one: `x = y` then `x = f(x)` is `x = f(y)` (x read once, first); `t = e` then
`x = t` is `x = e` (t read nowhere else). A merged line must fit the line length, and no comment is lost.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import assigned_values, block_body, fits
from sdpa_port.rewrite.edit import replace_nodes
from sdpa_port.rewrite.walk import StatementWalker

FORWARD_INDENT = 8  # a method's body, inside its class
SCOPED = (
    cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp,
    cst.Global, cst.Nonlocal, cst.Import, cst.ImportFrom, cst.Match, cst.ExceptHandler, cst.Del, cst.NamedExpr,
)


def squeeze(function: cst.FunctionDef) -> cst.FunctionDef:
    """`function` with each rule applied: None held in a name, the None-then-set mask, lines handing a value on."""
    params = {p.name.value for p in _params(function.params)}
    body = list(block_body(function.body))
    body = _none_names(body, params)
    body = _hoisted(body, params)
    body = _Merger(body, params).block(body)
    return function.with_changes(body=function.body.with_changes(body=body))


def _params(params: cst.Parameters) -> list[cst.Param]:
    out = [*params.posonly_params, *params.params, *params.kwonly_params]
    out += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return out


class _Mentions(cst.CSTVisitor):
    """The `Name` nodes of one name, read or bound (attribute names and keywords are not the name); `unsafe` where
    one stands in a scope of its own, a declaration, a `del`, a pattern or `:=` (what the rules do not follow)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.found: list[cst.Name] = []
        self.unsafe = False
        self.depth = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, SCOPED):
            self.depth += 1
        if isinstance(node, cst.Attribute):
            node.value.visit(self)
            return False
        if isinstance(node, cst.Arg):
            node.value.visit(self)
            return False
        if isinstance(node, cst.Name) and node.value == self.name:
            self.found.append(node)
            self.unsafe |= self.depth > 0
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, SCOPED):
            self.depth -= 1


def _mentions(nodes: Sequence[cst.CSTNode], name: str) -> tuple[list[cst.Name], bool]:
    visitor = _Mentions(name)
    for node in nodes:
        node.visit(visitor)
    return visitor.found, visitor.unsafe


def _single_assign(statement: cst.BaseStatement) -> tuple[str, cst.BaseExpression] | None:
    """(name, value) of a line holding only `name = value`."""
    if m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())])])):
        assert isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Assign)
        target = statement.body[0].targets[0].target
        assert isinstance(target, cst.Name)
        return target.value, statement.body[0].value
    return None


def _commented(statement: cst.BaseStatement) -> bool:
    lines = getattr(statement, "leading_lines", ())
    trailing = getattr(statement, "trailing_whitespace", None)
    return any(line.comment is not None for line in lines) or (trailing is not None and trailing.comment is not None)


def _bound_once(body: Sequence[cst.BaseStatement], name: str, params: set[str]) -> bool:
    return name not in params and len(assigned_values(body).get(name, [])) == 1


def _none_names(body: list[cst.BaseStatement], params: set[str]) -> list[cst.BaseStatement]:
    """`x = None` at the top of forward, x bound nowhere else and read only after it: None where x is read."""
    for index, statement in enumerate(body):
        assign = _single_assign(statement)
        if assign is None or not m.matches(assign[1], m.Name("None")) or _commented(statement):
            continue
        name = assign[0]
        found, unsafe = _mentions(body, name)
        later, _ = _mentions(body[index + 1 :], name)
        if unsafe or not _bound_once(body, name, params) or len(later) != len(found) - 1:
            continue
        rest = [replace_nodes(s, {n: cst.Name("None") for n in later}) for s in body[index + 1 :]]
        return _none_names(_dropping(body[:index], statement, rest), params)
    return body


def _dropping(
    before: list[cst.BaseStatement], dropped: cst.BaseStatement, after: list[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """`before + after`, the blank lines above `dropped` kept above the statement after it."""
    if after and getattr(dropped, "leading_lines", None) and hasattr(after[0], "leading_lines"):
        lines = after[0].leading_lines or dropped.leading_lines  # type: ignore[attr-defined]
        after = [after[0].with_changes(leading_lines=lines), *after[1:]]
    return [*before, *after]


def _hoisted(body: list[cst.BaseStatement], params: set[str]) -> list[cst.BaseStatement]:
    """`x = None` ... `if a is not None: ...; x = a` as `x = a` ... `if a is not None: ...`, where nothing between
    reads or binds x nor binds a."""
    for index, statement in enumerate(body):
        assign = _single_assign(statement)
        if assign is None or not m.matches(assign[1], m.Name("None")) or assign[0] in params:
            continue
        name = assign[0]
        if _mentions(body, name)[1]:
            continue  # a function of forward's could read it while the statements between run
        for at in range(index + 1, len(body)):
            moved = _moved(body, index, at, name)
            if moved is not None:
                return _hoisted(moved, params)
            if _mentions(body[at : at + 1], name)[0]:
                break
    return body


def _moved(body: list[cst.BaseStatement], index: int, at: int, name: str) -> list[cst.BaseStatement] | None:
    branch = body[at]
    test = m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))])
    if not (isinstance(branch, cst.If) and branch.orelse is None and m.matches(branch.test, test)):
        return None
    assert isinstance(branch.test, cst.Comparison) and isinstance(branch.test.left, cst.Name)
    source = branch.test.left.value
    inner = list(block_body(branch.body))
    for position, statement in enumerate(inner):
        assign = _single_assign(statement)
        if assign is not None and assign[0] == name and m.matches(assign[1], m.Name(source)):
            between = [*body[index + 1 : at], *inner[:position]]
            if _mentions([*between, branch.test], name)[0] or source in assigned_values(between):
                return None
            if _mentions(body, source)[1] or _commented(statement) or position == len(inner) - 1 == 0:
                return None
            first = body[index]
            assert isinstance(first, cst.SimpleStatementLine)
            body = list(body)
            body[index] = first.with_changes(body=[cst.Assign([cst.AssignTarget(cst.Name(name))], cst.Name(source))])
            kept = [*inner[:position], *inner[position + 1 :]]
            body[at] = branch.with_changes(body=branch.body.with_changes(body=kept))
            return body
        if name in assigned_values([statement]) or source in assigned_values([statement]):
            return None
    return None


class _Merger(StatementWalker):
    """Two lines handing a value on, merged in every block: `x = y; x = f(x)` and `t = e; x = t`."""

    def __init__(self, function: Sequence[cst.BaseStatement], params: set[str]) -> None:
        self.function = function
        self.params = params
        self.depth = 0

    def block(self, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        self.depth += 1
        out: list[cst.BaseStatement] = []
        for statement in super().block(statements):
            merged = self.merged(out[-1], statement) if out else None
            if merged is not None:
                out[-1] = merged
            else:
                out.append(statement)
        self.depth -= 1
        return out

    def merged(self, first: cst.BaseStatement, second: cst.BaseStatement) -> cst.BaseStatement | None:
        one, two = _single_assign(first), _single_assign(second)
        if one is None or two is None or _commented(second) or _commented(first.with_changes(leading_lines=())):
            return None
        value: cst.BaseExpression | None = None
        if one[0] == two[0] and isinstance(one[1], cst.Name) and one[1].value != one[0]:
            value = _forwarded(two[1], one[0], one[1])
        elif isinstance(two[1], cst.Name) and two[1].value == one[0] and one[0] != two[0]:
            found, unsafe = _mentions(self.function, one[0])
            if not unsafe and len(found) == 2 and _bound_once(self.function, one[0], self.params):
                value = one[1]
        if value is None:
            return None
        assert isinstance(first, cst.SimpleStatementLine) and isinstance(second, cst.SimpleStatementLine)
        assign = second.body[0]
        assert isinstance(assign, cst.Assign)
        line = first.with_changes(body=[assign.with_changes(value=value)])
        return line if fits(line, FORWARD_INDENT + 4 * (self.depth - 1)) else None


def _forwarded(value: cst.BaseExpression, name: str, source: cst.Name) -> cst.BaseExpression | None:
    """`value` reading `source` where it reads `name`, once and before anything else is evaluated; None otherwise."""
    found, unsafe = _mentions([value], name)
    if unsafe or len(found) != 1 or _first_evaluated(value) is not found[0]:
        return None
    new = replace_nodes(value, {found[0]: source})
    assert isinstance(new, cst.BaseExpression)
    return new


def _first_evaluated(node: cst.BaseExpression) -> cst.BaseExpression:
    """The operand Python evaluates first in `node`: the receiver of a call chain, the left of an operation."""
    while True:
        if isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        elif isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
            node = node.left
        elif isinstance(node, cst.Comparison):
            node = node.left
        else:
            return node
