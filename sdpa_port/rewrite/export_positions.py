"""`torch.arange(past, length + past, dtype=<int>)` -> `torch.arange(length, dtype=<int>) + past` in the file's classes.

With a static cache the past length is a tensor; `torch.export` cannot start a range at a traced value (it would
read it with `.item()`), but it exports a range of the traced length shifted by it. For integer dtypes the two are
the same values.
"""

from __future__ import annotations

import ast

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.rewrite.targeted import transform_named

INTEGER_DTYPES = frozenset({"long", "int64", "int32", "int"})


def shifted_ranges(facts: ModuleFacts) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(class, line) of every `torch.arange(start, stop + start)` in the classes: those of an integer dtype
    (rewritten), and the others (reported: with a static cache `start` is a tensor, which export cannot start at)."""
    integer: list[tuple[str, int]] = []
    other: list[tuple[str, int]] = []
    if facts.tree is None:
        return integer, other
    for node in facts.tree.body:
        if isinstance(node, ast.ClassDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and _shifted(inner) is not None:
                    (integer if _integer_dtype(inner) else other).append((node.name, inner.lineno))
    return integer, other


def _integer_dtype(call: ast.Call) -> bool:
    keywords = {k.arg: k.value for k in call.keywords}
    dtype = keywords.get("dtype")
    return not set(keywords) - {"dtype", "device"} and (
        isinstance(dtype, ast.Attribute) and dtype.attr in INTEGER_DTYPES and isinstance(dtype.value, ast.Name)
    )


def _shifted(call: ast.Call) -> ast.expr | None:
    """The length of a range started at a name and ending at that name plus a length, or None."""
    if not (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "arange"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "torch"
        and len(call.args) == 2
    ):
        return None
    start, stop = call.args
    if not isinstance(start, ast.Name) or not isinstance(stop, ast.BinOp) or not isinstance(stop.op, ast.Add):
        return None
    if isinstance(stop.right, ast.Name) and stop.right.id == start.id:
        return stop.left
    if isinstance(stop.left, ast.Name) and stop.left.id == start.id:
        return stop.right
    return None


def shift_ranges(module: cst.Module, classes: set[str]) -> cst.Module:
    return transform_named(module, classes, _ShiftRanges())


class _ShiftRanges(cst.CSTTransformer):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not m.matches(updated.func, m.Attribute(value=m.Name("torch"), attr=m.Name("arange"))):
            return updated
        positional = [a for a in updated.args if a.keyword is None]
        if len(positional) != 2 or any(a.star for a in updated.args):
            return updated
        start, stop = positional[0].value, positional[1].value
        if not isinstance(start, cst.Name) or not isinstance(stop, cst.BinaryOperation) or not isinstance(stop.operator, cst.Add):
            return updated
        if m.matches(stop.right, m.Name(start.value)):
            length = stop.left
        elif m.matches(stop.left, m.Name(start.value)):
            length = stop.right
        else:
            return updated
        dtype = next((a.value for a in updated.args if a.keyword is not None and a.keyword.value == "dtype"), None)
        if not (isinstance(dtype, cst.Attribute) and dtype.attr.value in INTEGER_DTYPES):
            return updated
        arguments = [positional[1].with_changes(value=length), *(a for a in updated.args if a.keyword is not None)]
        shortened = updated.with_changes(args=arguments)
        # parenthesised: the range may be the object of a method call (`torch.arange(...).expand(...)`)
        return cst.BinaryOperation(
            left=shortened,
            operator=cst.Add(whitespace_before=cst.SimpleWhitespace(" "), whitespace_after=cst.SimpleWhitespace(" ")),
            right=start,
            lpar=[cst.LeftParen()],
            rpar=[cst.RightParen()],
        )


__all__ = ["shift_ranges", "shifted_ranges"]
