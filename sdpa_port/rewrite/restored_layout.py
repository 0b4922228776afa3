"""Interface style: fold the layout the dispatch restores into the permutation the next statement applies.

The attention implementations return (batch, query, heads, dim). Where eager's product gave (batch, heads, query,
dim), the dispatch restores that layout, and eager's next statement often undoes it at once. The two permutations
compose into one (here none), so the restored name is read straight from the dispatch's output:

    attn_output = attention_output.transpose(1, 2)
    attn_output = attn_output.transpose(1, 2).contiguous()

becomes

    attn_output = attention_output.contiguous()

A view permuted and permuted back has the output's own shape and strides, so every later value is the same, bit
for bit. The fold applies only where the next statement assigns the same name and reads it once, as the receiver of
the permutation: the restored value is then never seen.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from sdpa_port.analyse.patterns import Order, permuted, then
from sdpa_port.analyse.patterns.calls import method_call


def fold_restored_layouts(statements: Sequence[cst.BaseStatement], outputs: set[str]) -> list[cst.BaseStatement]:
    """`statements` with each restore of an output in `outputs` folded into the next statement where it applies."""
    out: list[cst.BaseStatement] = []
    for statement in statements:
        statement = _in_blocks(statement, outputs)
        if out and isinstance(statement, cst.SimpleStatementLine):
            folded = _folded(out[-1], statement, outputs)
            if folded is not None:
                out[-1] = folded
                continue
        out.append(statement)
    return out


def _in_blocks(statement: cst.BaseStatement, outputs: set[str]) -> cst.BaseStatement:
    """The statement with the fold applied inside the indented blocks it holds (`if`/`elif`/`else`, `with`)."""
    if isinstance(statement, cst.If):
        orelse = statement.orelse
        if isinstance(orelse, cst.If):
            orelse = _in_blocks(orelse, outputs)  # type: ignore[assignment]
        elif isinstance(orelse, cst.Else):
            orelse = orelse.with_changes(body=_in_suite(orelse.body, outputs))
        return statement.with_changes(body=_in_suite(statement.body, outputs), orelse=orelse)
    if isinstance(statement, cst.With):
        return statement.with_changes(body=_in_suite(statement.body, outputs))
    return statement


def _in_suite(suite: cst.BaseSuite, outputs: set[str]) -> cst.BaseSuite:
    if isinstance(suite, cst.IndentedBlock):
        return suite.with_changes(body=fold_restored_layouts(suite.body, outputs))
    return suite


def _folded(
    first: cst.BaseStatement, second: cst.SimpleStatementLine, outputs: set[str]
) -> cst.SimpleStatementLine | None:
    """`second` reading the dispatch's output itself, where `first` restores its layout into the name `second`
    reassigns and permutes once; None where the pair is not of that form."""
    restore = _restore(first, outputs)
    name = _single_assign(second)
    if restore is None or name is None or name[0] != restore[0]:
        return None
    restored, output, order = restore
    value = name[1].value
    if _reads_count(value, restored) != 1:
        return None
    receiver_call = _permutation_of(value, restored, len(order))
    if receiver_call is None:
        return None
    call, second_order = receiver_call
    replacement = permuted(cst.Name(output), then(order, second_order))
    new_value = value.deep_replace(call, replacement)
    assert isinstance(new_value, cst.BaseExpression)
    return second.with_changes(body=[name[1].with_changes(value=new_value)])


def _restore(statement: cst.BaseStatement, outputs: set[str]) -> tuple[str, str, Order] | None:
    """(restored name, output name, order) of `name = output.transpose(...)` / `.permute(...)`, `output` in
    `outputs`."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    assign = _single_assign(statement)
    if assign is None:
        return None
    found = method_call(assign[1].value, {"transpose", "permute"})
    if found is None or not isinstance(found[0], cst.Name) or found[0].value not in outputs:
        return None
    order = _order(assign[1].value, 4)
    if order is None:
        return None
    return assign[0], found[0].value, order


def _single_assign(statement: cst.SimpleStatementLine) -> tuple[str, cst.Assign] | None:
    if len(statement.body) != 1 or not isinstance(statement.body[0], cst.Assign):
        return None
    assign = statement.body[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return None
    return assign.targets[0].target.value, assign


def _reads_count(node: cst.CSTNode, name: str) -> int:
    """How many times `name` is read in `node` (walk_names gives a set)."""
    counter = _NameCounter(name)
    node.visit(counter)
    return counter.count


class _NameCounter(cst.CSTVisitor):
    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name:
            self.count += 1

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # the attribute's own name is no read
        return False


def _permutation_of(value: cst.BaseExpression, name: str, rank: int) -> tuple[cst.Call, Order] | None:
    """The call in `value`'s chain that permutes `name` itself (`name.transpose(...)` at the chain's root), with its
    order."""
    node: cst.BaseExpression = value
    while True:
        found = method_call(node, {"transpose", "permute"})
        if found is not None and isinstance(found[0], cst.Name) and found[0].value == name:
            assert isinstance(node, cst.Call)
            order = _order(node, rank)
            return (node, order) if order is not None else None
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        elif isinstance(node, cst.Attribute):
            node = node.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        else:
            return None


def _order(call: cst.BaseExpression, rank: int) -> Order | None:
    """The order `x.transpose(i, j)` / `x.permute(...)` takes a rank-`rank` tensor's dimensions in; None where the
    arguments are not plain integers."""
    found = method_call(call, {"transpose", "permute"})
    if found is None or not isinstance(call, cst.Call):
        return None
    if any(a.keyword is not None or a.star for a in call.args):
        return None
    values = [_integer(a.value) for a in call.args]
    if any(v is None for v in values):
        return None
    dims = [v for v in values if v is not None]
    if any(not -rank <= d < rank for d in dims):
        return None
    dims = [d % rank for d in dims]
    if found[1] == "transpose":
        if len(dims) != 2 or dims[0] == dims[1]:
            return None
        order = list(range(rank))
        order[dims[0]], order[dims[1]] = order[dims[1]], order[dims[0]]
        return tuple(order)
    if sorted(dims) != list(range(rank)):
        return None
    return tuple(dims)



def _integer(node: cst.BaseExpression) -> int | None:
    """The value of `3` or `-1`; None for anything else."""
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _integer(node.expression)
        return None if inner is None else -inner
    return None
