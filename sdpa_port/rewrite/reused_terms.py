"""A score term built once and handed on to later layers is laid out contiguously where it is built.

T5's relative position bias is computed by the first layer only (`if position_bias is None:`), returned, and passed
to every later layer, which adds it to its scores; the port hands it to SDPA as the mask. It is built by a
`permute` of an embedding, so its last dimension is strided, and SDPA's kernels copy a mask laid out that way at
every call (on the CPU, one copy of `(1, heads, queries, keys)` per layer: about 8 % of a T5 forward at 512 tokens).
Made contiguous once, where it is built, no layer copies it; the values, and so eager's and SDPA's outputs, are the
same.

Before:

    if position_bias is None:
        position_bias = self.compute_bias(query_length, key_length)
        if mask is not None:
            position_bias = position_bias + mask
    ...
    return attn_output, position_bias

After (before the optional additions that end the block: a sum of contiguous operands is contiguous, and is
computed faster; a slice before them, as the rows of a cached decoding step, is laid out as small as it is):

    if position_bias is None:
        position_bias = self.compute_bias(query_length, key_length)
        # later layers reuse it: made contiguous once, not copied by each layer's SDPA kernel
        position_bias = position_bias.contiguous()
        if mask is not None:
            position_bias = position_bias + mask

Only the method that calls SDPA (or the attention interface) is edited: a class-style port's eager class keeps its
code. The rule applies to a term the port hands to SDPA (a site's term, or a name it is bound from), built under
`if term is None:` and returned by the method; a term built at every call gains nothing from a copy. A term the
block may bind to a number (a literal, a conditional or a name, a function or method of the file that may return
one) is left as it is: a number has no `.contiguous()`.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.forms.terms import number_arm
from sdpa_port.analyse.site import AttentionSite

COMMENT = "# later layers reuse it: made contiguous once, not copied by each layer's SDPA kernel"
_CALLS = ("scaled_dot_product_attention", "attention_interface")


def laid_out_once(module: cst.Module, sites: Sequence[AttentionSite]) -> cst.Module:
    """`module` with each reused term of `sites` made contiguous in the block that builds it, before an optional
    mask joins it."""
    wanted: dict[tuple[str, str], set[str]] = {}
    for site in sites:
        names = {term.expression for term in site.terms if term.expression.isidentifier()}
        if names:
            wanted.setdefault((site.owner, site.method), set()).update(names)
    if not wanted:
        return module
    return module.visit(_Layout(wanted, _numbers(module)))


def _numbers(module: cst.Module) -> set[str]:
    """The functions and methods of `module` that may return a number (`return 0.0`, `return 0 if x else y`): a term
    bound from one may be no tensor, and has no `.contiguous()`."""
    out: set[str] = set()
    for function in m.findall(module, m.FunctionDef()):
        assert isinstance(function, cst.FunctionDef)
        for node in m.findall(function, m.Return()):
            assert isinstance(node, cst.Return)
            if node.value is not None and number_arm(node.value):
                out.add(function.name.value)
    return out


class _Layout(cst.CSTTransformer):
    def __init__(self, wanted: dict[tuple[str, str], set[str]], numbers: set[str]) -> None:
        super().__init__()
        self.wanted = wanted
        self.numbers = numbers
        self.classes: list[cst.ClassDef] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        return updated_node

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not self.classes or not _calls_attention(original_node):
            return updated_node
        klass = self.classes[-1]
        owners = {klass.name.value} | {base.value.value for base in klass.bases if isinstance(base.value, cst.Name)}
        names = set().union(*(self.wanted.get((owner, original_node.name.value), set()) for owner in owners))
        names = _bound_from(original_node, names) & _returned(original_node)
        if not names:
            return updated_node
        return updated_node.visit(_AtBuild(names, self.numbers))  # type: ignore[return-value]


def _calls_attention(function: cst.FunctionDef) -> bool:
    found = m.findall(function, m.Call(func=m.Name() | m.Attribute()))
    for call in found:
        assert isinstance(call, cst.Call)
        func = call.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value  # type: ignore[attr-defined]
        if name in _CALLS:
            return True
    return False


def _bound_from(function: cst.FunctionDef, names: set[str]) -> set[str]:
    """`names` and the names they are bound from as they are (`position_bias_masked = position_bias`)."""
    out = set(names)
    for assign in m.findall(function, m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Name())):
        assert isinstance(assign, cst.Assign)
        if assign.targets[0].target.value in names and assign.value.value != "None":  # type: ignore[attr-defined]
            out.add(assign.value.value)  # type: ignore[attr-defined]
    return out


def _returned(function: cst.FunctionDef) -> set[str]:
    """The names a return hands on as they are: itself, an item of a tuple it returns, or of a tuple bound to a
    name it returns (`outputs = (attn_output, position_bias)`); not the names a returned value is computed from."""
    handed: set[str] = set()
    for node in m.findall(function, m.Return()):
        assert isinstance(node, cst.Return)
        handed |= _handed(node.value)
    packed = [
        node for node in m.findall(function, m.Assign(targets=[m.AssignTarget(target=m.Name())]))
        if isinstance(node, cst.Assign)
    ]
    for _ in range(2):  # a tuple bound to a name, then that name in a returned tuple
        for assign in packed:
            if assign.targets[0].target.value in handed:  # type: ignore[attr-defined]
                handed |= _handed(assign.value)
    return handed


def _handed(node: cst.BaseExpression | None) -> set[str]:
    if isinstance(node, cst.Name):
        return {node.value}
    if isinstance(node, (cst.Tuple, cst.List)):
        return set().union(*(_handed(element.value) for element in node.elements))
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):  # `(out,) + (bias,)`
        return _handed(node.left) | _handed(node.right)
    if isinstance(node, cst.IfExp):
        return _handed(node.body) | _handed(node.orelse)
    return set()


class _AtBuild(cst.CSTTransformer):
    """Lays out `name` in each `if name is None:` body that binds it: at the end of the body, or before the optional
    additions that end it (`if mask is not None: name = name + mask`), whose sum of contiguous operands is
    contiguous too and is computed from them faster."""

    def __init__(self, names: set[str], numbers: set[str]) -> None:
        super().__init__()
        self.names = names
        self.numbers = numbers

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        test = original_node.test
        if not m.matches(test, m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(m.Is(), m.Name("None"))])):
            return updated_node
        name = test.left.value  # type: ignore[attr-defined]
        body = updated_node.body
        if name not in self.names or not isinstance(body, cst.IndentedBlock):
            return updated_node
        statements = list(body.body)
        if not _binds(body, name) or any(_laid_out(statement, name) for statement in statements):
            return updated_node
        if not all(_tensor_valued(value, name, self.numbers) for value in _bound_values(body, name)):
            return updated_node  # a number on some path (`position_bias = 0.0`) has no `.contiguous()`
        at = len(statements)
        while at > 1 and _optional_addition(statements[at - 1], name):
            at -= 1
        after = statements[at] if at < len(statements) else None
        line = cst.SimpleStatementLine(
            body=[
                cst.Assign(
                    targets=[cst.AssignTarget(cst.Name(name))],
                    value=cst.Call(func=cst.Attribute(value=cst.Name(name), attr=cst.Name("contiguous"))),
                )
            ],
            # the blank lines before the statement it goes ahead of stay above it, with the reason
            leading_lines=[*_leading(after), cst.EmptyLine(comment=cst.Comment(COMMENT))],
        )
        if after is not None:
            statements[at] = after.with_changes(leading_lines=[])
        statements.insert(at, line)
        return updated_node.with_changes(body=body.with_changes(body=statements))


def _bound_values(block: cst.IndentedBlock, name: str) -> list[cst.BaseExpression]:
    """The values `block` binds `name` to, at any depth (`name += x` as its `x`)."""
    values: list[cst.BaseExpression] = []
    for node in m.findall(block, _assigning(name)):
        assert isinstance(node, cst.Assign)
        values.append(node.value)
    for node in m.findall(block, m.AugAssign(target=m.Name(name))):
        assert isinstance(node, cst.AugAssign)
        values.append(cst.BinaryOperation(cst.Name(name), cst.Add(), node.value))
    return values


def _tensor_valued(value: cst.BaseExpression, name: str, numbers: set[str]) -> bool:
    """Whether `value` is shown a tensor: a call of a method or function that returns no number (`self.bias(n)`,
    `torch.zeros(...)`, `x.permute(...)`), a subscript of one, or `name` plus something; no literal, conditional or
    name, which may hold a number."""
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Attribute):
            return func.attr.value not in numbers
        return isinstance(func, cst.Name) and func.value not in numbers
    if isinstance(value, cst.Subscript):
        return _tensor_valued(value.value, name, numbers) or m.matches(value.value, m.Name(name))
    if isinstance(value, cst.BinaryOperation):
        return m.matches(value.left, m.Name(name)) or m.matches(value.right, m.Name(name))
    return False


def _leading(statement: cst.BaseStatement | None) -> Sequence[cst.EmptyLine]:
    """The blank and comment lines above a statement (none above the end of a block)."""
    if isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        return statement.leading_lines
    return ()


def _optional_addition(statement: cst.BaseStatement, name: str) -> bool:
    """`if x is not None:` (no else) whose body ends by adding to `name` (`name = name + x`, `name += x`)."""
    if not m.matches(
        statement,
        m.If(test=m.Comparison(comparisons=[m.ComparisonTarget(m.IsNot(), m.Name("None"))]), orelse=None),
    ):
        return False
    last = statement.body.body[-1]  # type: ignore[attr-defined]
    return m.matches(
        last,
        m.SimpleStatementLine(
            body=[
                m.Assign(targets=[m.AssignTarget(m.Name(name))], value=m.BinaryOperation(m.Name(name), m.Add()))
                | m.AugAssign(target=m.Name(name), operator=m.AddAssign())
            ]
        ),
    )


def _binds(block: cst.IndentedBlock, name: str) -> bool:
    """Whether an assignment in `block`, at any depth, binds `name`."""
    return bool(m.findall(block, _assigning(name)))


def _assigning(name: str) -> m.Assign:
    """An assignment with `name` among its targets."""
    return m.Assign(targets=[m.ZeroOrMore(), m.AssignTarget(m.Name(name)), m.ZeroOrMore()])


def _laid_out(statement: cst.BaseStatement, name: str) -> bool:
    return m.matches(
        statement,
        m.SimpleStatementLine(
            body=[m.Assign(value=m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("contiguous"))))]
        ),
    )
