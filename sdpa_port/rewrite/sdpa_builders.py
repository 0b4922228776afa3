"""Small libcst builders the SDPA emitter writes its statements with: tests for None, keyword arguments, shapes."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import binary, nodes_of_type, parenthesized, primary
from sdpa_port.analyse.patterns import DropoutCall
from sdpa_port.refusals import Code, Refuse

COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, written without spaces around the equal sign."""
    return cst.Arg(value, keyword=cst.Name(name), equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def is_none(name: str) -> cst.Comparison:
    """`name is None`."""
    return cst.Comparison(left=cst.Name(name), comparisons=[cst.ComparisonTarget(cst.Is(), cst.Name("None"))])


def if_not_none(name: str, statement: cst.SimpleStatementLine) -> cst.If:
    """`if name is not None: statement`."""
    test = cst.Comparison(left=cst.Name(name), comparisons=[cst.ComparisonTarget(cst.IsNot(), cst.Name("None"))])
    return cst.If(test=test, body=cst.IndentedBlock(body=[statement]))


def not_none_names(test: cst.BaseExpression) -> set[str]:
    """Names an `if` test shows are not None in its body: `x is not None`, alone or joined by `and`."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return not_none_names(test.left) | not_none_names(test.right)
    if (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    ):
        return {test.left.value}
    return set()


def clamp(mask: cst.BaseExpression, bound: cst.BaseExpression) -> cst.Call:
    """`mask.clamp(min=bound)`."""
    return cst.Call(
        func=cst.Attribute(value=primary(mask), attr=cst.Name("clamp")),
        args=[keyword_arg("min", bound)],
    )


def scaled(left: cst.BaseExpression, factor: cst.BaseExpression, divide: bool) -> cst.BinaryOperation:
    """`left / factor` or `left * factor`."""
    return binary(left, cst.Divide() if divide else cst.Multiply(), factor)


def shape_slice(node: cst.BaseExpression, bounds: str) -> cst.BaseExpression:
    """`node.shape[<bounds>]` for bounds such as `:-1` or `-2:-1`."""
    lower, upper = bounds.split(":")
    shape = cst.Attribute(value=primary(node), attr=cst.Name("shape"))
    return cst.Subscript(
        value=shape, slice=[cst.SubscriptElement(cst.Slice(lower=_integer(lower), upper=_integer(upper)))]
    )


def _integer(text: str) -> cst.BaseExpression | None:
    if not text:
        return None
    if text.startswith("-"):
        return cst.UnaryOperation(cst.Minus(), cst.Integer(text[1:]))
    return cst.Integer(text)


def tensor_only(reshaped: cst.BaseExpression, term: cst.BaseExpression) -> cst.BaseExpression:
    """`reshaped if isinstance(term, torch.Tensor) else term`."""
    test = cst.Call(
        func=cst.Name("isinstance"),
        args=[cst.Arg(term, comma=COMMA), cst.Arg(cst.Attribute(value=cst.Name("torch"), attr=cst.Name("Tensor")))],
    )
    return parenthesized(cst.IfExp(test=test, body=reshaped, orelse=term))


def unflatten(node: cst.BaseExpression, heads: tuple[cst.BaseExpression, cst.BaseExpression]) -> cst.BaseExpression:
    """`node.unflatten(0, (batch, heads))`: a `(batch * heads, ...)` operand split into its heads."""
    shape = cst.Tuple(elements=[cst.Element(heads[0]), cst.Element(heads[1])])
    return cst.Call(
        func=cst.Attribute(value=primary(node), attr=cst.Name("unflatten")),
        args=[cst.Arg(cst.Integer("0")), cst.Arg(shape)],
    )


def dropout_expression(call: DropoutCall) -> cst.BaseExpression:
    """The dropout rate SDPA takes for a dropout call: its probability while training, else 0.0."""
    training = call.training
    if isinstance(training, cst.Name) and training.value == "True":
        return call.probability
    if isinstance(training, cst.Name) and training.value == "False":
        return cst.Float("0.0")
    return cst.IfExp(test=training, body=call.probability, orelse=cst.Float("0.0"))


def query_root(query: cst.BaseExpression | None) -> cst.BaseExpression:
    """The query of the product as a primary expression, read for the scores' dtype and device."""
    if query is None:
        raise Refuse(Code.SCORES_READ, "the scores' dtype is read before the query-key product")
    return primary(query)


# operations whose SDPA side builds a mask, reading the query's shape and dtype
_MASKING = (t.AddTerm, t.Fill, t.ZeroRows, t.Guard, t.Shift)


def computed_and_reread(operand: cst.BaseExpression, ops: Sequence[tuple[t.Op, int, int]]) -> bool:
    """Whether a query computed where it is multiplied (`(q * self.scale) @ k.T`) may be read again, for its shape
    and dtype, by the mask the chain builds: such a query is named once (`sdpa_query = q * self.scale`), never
    computed once per read."""
    return bool(nodes_of_type(operand, cst.BinaryOperation)) and any(isinstance(op, _MASKING) for op, _, _ in ops)
