"""Read and write the order of a tensor's dimensions: transposes, permutes, indexing."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import primary
from sdpa_port.analyse.patterns.calls import method_call
from sdpa_port.analyse.patterns.numbers import number

Order = tuple[int, ...]


def permuted(node: cst.BaseExpression, order: Order | None) -> cst.BaseExpression:
    """The node with its dimensions in `order`.

    `node.transpose(i, j)` for a swap of two dimensions, `node.permute(...)` for any other order.
    """
    if order is None or order == tuple(range(len(order))):
        return node
    moved = [i for i, o in enumerate(order) if i != o]
    if len(moved) == 2:
        args = [cst.Arg(cst.Integer(str(i))) for i in moved]
        method = "transpose"
    else:
        args = [cst.Arg(cst.Integer(str(i))) for i in order]
        method = "permute"
    return cst.Call(func=cst.Attribute(value=primary(node), attr=cst.Name(method)), args=args)


def then(first: Order, second: Order) -> Order:
    """The order `x.permute(first).permute(second)` takes `x`'s dimensions in."""
    return tuple(first[i] for i in second)


def inverse(order: Order) -> Order:
    """The order that undoes `order`.

    `then(order, inverse(order))` keeps every dimension in place.
    """
    out = [0] * len(order)
    for i, o in enumerate(order):
        out[o] = i
    return tuple(out)


def least_rank(node: cst.BaseExpression) -> int | None:
    """The fewest dimensions `x[None, :, :, None]` can have, whatever `x`'s rank.

    One per slice and per `None` of an index of slices, `None`s and integers without an Ellipsis; None for any other
    expression.
    """
    if not isinstance(node, cst.Subscript):
        return None
    least = 0
    for element in node.slice:
        index = element.slice
        if isinstance(index, cst.Slice) or m.matches(index, m.Index(m.Name("None"))):
            least += 1
        elif not m.matches(index, m.Index(m.Integer() | m.UnaryOperation(operator=m.Minus(), expression=m.Integer()))):
            return None
    return least


def transposed_last_two(node: cst.BaseExpression, rank: int | None) -> cst.BaseExpression | None:
    """The `k` of a transpose of its last two dimensions.

    `k.transpose(-1, -2)` / `k.transpose(2, 3)` / `k.permute(0, 1, 3, 2)` / `k.mT` -> k.
    """
    found = method_call(node, {"transpose", "permute"})
    if found is not None:
        receiver, name = found
        assert isinstance(node, cst.Call)
        values = [number(a.value) for a in node.args]
        if any(v is None for v in values) or any(a.keyword is not None for a in node.args):
            return None
        dims = [int(v) for v in values]  # type: ignore[arg-type]
        if name == "transpose" and len(dims) == 2:
            pair = set(dims)
            if pair == {-1, -2}:
                return receiver
            if rank in (None, 4) and pair == {2, 3}:
                return receiver
            if rank == 3 and pair == {1, 2}:
                return receiver
        if name == "permute":
            if dims == [0, 1, 3, 2] or dims == [0, 2, 1]:
                return receiver
        return None
    if isinstance(node, cst.Attribute) and node.attr.value == "mT":
        return node.value
    return None


def features_second_last(node: cst.BaseExpression) -> bool:
    """A permutation that puts the last, feature, dimension second to last.

    `k.permute(0, 2, 3, 1)`: the result is a key laid out for `query @ key` (..., dim, length) without an explicit
    transpose.
    """
    found = method_call(node, {"permute"})
    if found is None:
        return False
    assert isinstance(node, cst.Call)
    dims = [number(a.value) for a in node.args]
    if len(dims) < 3 or any(d is None for d in dims) or any(a.keyword is not None or a.star for a in node.args):
        return False
    order = [int(d) % len(dims) for d in dims if d is not None]
    last = len(order) - 1
    return sorted(order) == list(range(len(order))) and order[-2] == last and order[-1] != last


def expanded(node: cst.BaseExpression, axis: int, size: cst.BaseExpression, rank: int) -> cst.BaseExpression:
    """The node with an axis added at `axis`, expanded to `size`: `node.unsqueeze(1).expand(-1, size, -1, -1)`."""
    unsqueezed = cst.Call(
        func=cst.Attribute(value=primary(node), attr=cst.Name("unsqueeze")), args=[cst.Arg(cst.Integer(str(axis)))]
    )
    sizes = [size if i == axis else cst.UnaryOperation(cst.Minus(), cst.Integer("1")) for i in range(rank)]
    return cst.Call(func=cst.Attribute(value=unsqueezed, attr=cst.Name("expand")), args=[cst.Arg(s) for s in sizes])
