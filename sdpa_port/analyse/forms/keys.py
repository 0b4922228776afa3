"""The key of a product `q @ b`: its right operand `b` with its last two dims swapped, a swap written there undone.

`untranspose` gives the key handed to SDPA; `transposed_key` tells a key its producer laid out (..., dim, length),
which reads so at any rank (a helper's parameters passed one, `helpers.key_layout_params`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.cstutil import all_assigned_names, block_body, nodes_of_type, primary
from sdpa_port.analyse.forms.channels import channels_flattened, transposed_query
from sdpa_port.analyse.forms.common import strip_casts

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView


def telling_query(product: p.Product) -> cst.BaseExpression | None:
    """The query of a `bmm`, whose rank is known: transposed from channels-first, it says the key is channels-first
    too (`forms/channels.py`); None for other products."""
    return product.left if product.form is p.ProductForm.BMM else None


def untranspose(
    tracer: TracerView, node: cst.BaseExpression, rank: int | None, query: cst.BaseExpression | None = None
) -> cst.BaseExpression | None:
    """The key of `q @ b` for SDPA: `b` with its last two dims swapped, a swap written there undone.

    `softmax(s * (q @ b)) @ v` is `SDPA(q, b.transpose(-1, -2), v, scale=s)` whatever made `b`: `k.transpose(-1, -2)`
    gives `k`, any other right operand `b.transpose(-1, -2)`. Where the swap is not written, the product's rank must
    be read and at least 3, both operands of that rank (SDPA broadcasts the leading dims as matmul does, but a
    product of unknown rank may be a vector's or a weight's). A key laid out (..., dim, length) by its producer
    (`transposed_key`), or the key of a 3-D product told channels-first by its query (`forms/channels.py`), is
    read so at any rank.
    """
    inner, _ = strip_casts(node, tracer.scope)
    key = p.transposed_last_two(inner, rank)
    if key is not None:
        return key
    if (
        (rank is not None and rank >= 3)
        or transposed_key(tracer, inner)
        or (query is not None and transposed_query(tracer, query))
    ):
        last, second = (cst.UnaryOperation(cst.Minus(), cst.Integer(str(n))) for n in (1, 2))
        return cst.Call(
            func=cst.Attribute(value=primary(inner), attr=cst.Name("transpose")),
            args=[cst.Arg(last), cst.Arg(second)],
        )
    return None


def transposed_key(tracer: TracerView, node: cst.BaseExpression, depth: int = 0) -> bool:
    """A key laid out as `(..., dim, length)`.

    A transpose of the last two dims or a permute putting the features second to last, a channels-first map with its
    positions flattened (`k.reshape(b, c, h * w)` after `b, c, h, w = x.shape`), a leading-dims flatten of one, a
    cat along the last dim with such a part (cat forces the others into the same layout), or a name that holds one on
    every path.
    """
    if depth > 6:
        return False
    node, _ = strip_casts(node, tracer.scope)
    if p.transposed_last_two(node, None) is not None or p.features_second_last(node):
        return True
    reshaped = p.reshape_args(node)
    if reshaped is not None:
        if channels_flattened(tracer, reshaped[1]):
            return True  # a channels-first map with its positions flattened (`forms/channels.py`)
        return _flattens_leading(reshaped[1]) and transposed_key(tracer, reshaped[0], depth + 1)
    chunked = chunk_item(node)
    if chunked is not None:
        # `qkv.chunk(3, dim=1)[1]`: a chunk along a leading dimension keeps the layout of the last two
        return along_leading(tracer, chunked[1], chunked[0]) and transposed_key(tracer, chunked[0], depth + 1)
    if isinstance(node, cst.Call) and tracer.scope.qualify(node.func) in p.CAT_FUNCTIONS:
        parts, dim = p.arg(node, 0, "tensors"), p.arg(node, 1, "dim")
        if not isinstance(parts, (cst.Tuple, cst.List)) or dim is None:
            return False
        transposed = [e.value for e in parts.elements if transposed_key(tracer, e.value, depth + 1)]
        return bool(transposed) and along_last(tracer, dim, transposed[0])
    if isinstance(node, cst.Name):
        values = tracer.scope.local_values(node.value)
        if not values:
            return node.value in tracer.key_params
        return all(transposed_key(tracer, v, depth + 1) for v in values)
    returned = returned_for(tracer, node)
    return bool(returned) and all(v is not None and p.features_second_last(v) for v in returned)


def returned_for(tracer: TracerView, node: cst.BaseExpression) -> list[cst.BaseExpression | None]:
    """What `tracer.method(x, k=True)` may return, on the paths its literal boolean arguments leave open.

    The method's returns on those paths, its defaults counted (`split_heads(key, k=True)` returns the key permuted to
    (b, h, d, s)).
    """
    if not (
        isinstance(node, cst.Call)
        and m.matches(node.func, m.Attribute(value=m.Name("self")))
        and tracer.scope.class_name is not None
        and not p.has_star_args(node)
    ):
        return []
    assert isinstance(node.func, cst.Attribute)
    found = tracer.facts.find_method(tracer.scope.class_name, node.func.attr.value)
    if found is None:
        return []
    method = found[1]
    params = [param for param in method.params.params if param.name.value != "self"]
    flags: dict[str, bool] = {}
    for index, param in enumerate(params):
        given = p.arg(node, index, param.name.value)
        value = given if given is not None else param.default
        if isinstance(value, cst.Name) and value.value in ("True", "False"):
            flags[param.name.value] = value.value == "True"
    return _open_returns(block_body(method.body), flags, same=lambda node: _sides_agree(tracer, node, method))


def along_last(tracer: TracerView, dim: cst.BaseExpression, part: cst.BaseExpression) -> bool:
    """`dim` names the last dimension of `part`: -1, or its rank minus one when the rank can be read."""
    value = p.number(dim)
    if value is None:
        return False
    if value == -1:
        return True
    rank = tracer.ranks.rank_of(part)
    return rank is not None and value == rank - 1


def chunk_item(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """`x.chunk(n, dim=d)[i]` (or `x.chunk(n, d)[i]`): `x` and `d`."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    call = node.value
    found = p.method_call(call, {"chunk"})
    if found is None or not isinstance(call, cst.Call) or len(call.args) != 2:
        return None
    dim = p.arg(call, 1, "dim")
    return (found[0], dim) if dim is not None else None


def along_leading(tracer: TracerView, dim: cst.BaseExpression, part: cst.BaseExpression) -> bool:
    """`dim` names a dimension of `part` before its last two: its rank is read and `0 <= dim < rank - 2`."""
    value = p.number(dim)
    rank = tracer.ranks.rank_of(part)
    return value is not None and rank is not None and value == int(value) and 0 <= value < rank - 2


def _open_returns(
    body: Sequence[cst.BaseStatement],
    flags: dict[str, bool],
    held: dict[str, cst.BaseExpression] | None = None,
    same: Callable[[cst.IfExp], bool] = lambda node: False,
) -> list[cst.BaseExpression | None]:
    """The returned values on paths that `if name:` tests of the boolean `flags` do not close.

    Every return on an undecided path counts. A returned name is read as the value its last plain binding before the
    return gave it on every such path (`x = x.permute(0, 2, 3, 1) if is_key else x.permute(0, 2, 1, 3)`, then
    `return x`), each conditional expression on a flag read as its side where its two sides are of one rank (`same`:
    the other side gives the query, of the key's rank); a name bound in a branch or otherwise (a loop, a tuple) is
    not read.
    """
    held = {} if held is None else held
    out: list[cst.BaseExpression | None] = []
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Return):
                    out.append(_held(small.value, held, flags, same))
                    return out
                _hold(small, held, flags, same)
        elif isinstance(statement, cst.If):
            test = statement.test
            decided = flags.get(test.value) if isinstance(test, cst.Name) else None
            if decided is not False:
                out += _open_returns(block_body(statement.body), flags, dict(held), same)
            if decided is not True and statement.orelse is not None:
                orelse = statement.orelse
                rest = [orelse] if isinstance(orelse, cst.If) else block_body(orelse.body)
                out += _open_returns(rest, flags, dict(held), same)
            for name in all_assigned_names([statement]):
                held.pop(name, None)
        else:
            out += [_held(small.value, held, flags, same) for small in nodes_of_type(statement, cst.Return)]
            for name in all_assigned_names([statement]):
                held.pop(name, None)
    return out


def _hold(
    small: cst.BaseSmallStatement,
    held: dict[str, cst.BaseExpression],
    flags: dict[str, bool],
    same: Callable[[cst.IfExp], bool],
) -> None:
    """Keep what a plain `name = value` of a method binds; forget any other name a statement binds."""
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        held[small.targets[0].target.value] = _flagged(small.value, flags, same)
        return
    for name in all_assigned_names([small]):
        held.pop(name, None)


def _held(
    node: cst.BaseExpression | None,
    held: dict[str, cst.BaseExpression],
    flags: dict[str, bool],
    same: Callable[[cst.IfExp], bool],
) -> cst.BaseExpression | None:
    """A returned value, a name read as what it holds, a conditional expression on a flag as its side."""
    if isinstance(node, cst.Name) and node.value in held:
        return held[node.value]
    return None if node is None else _flagged(node, flags, same)


def _flagged(
    node: cst.BaseExpression, flags: dict[str, bool], same: Callable[[cst.IfExp], bool]
) -> cst.BaseExpression:
    """`a if flag else b` as `a` or `b` where the call passes `flag` literally and `same` holds of it; any other
    expression as it is."""
    if isinstance(node, cst.IfExp) and isinstance(node.test, cst.Name) and node.test.value in flags and same(node):
        return _flagged(node.body if flags[node.test.value] else node.orelse, flags, same)
    return node


def _sides_agree(tracer: TracerView, node: cst.IfExp, method: cst.FunctionDef) -> bool:
    """Both sides of a conditional expression of `method` have one rank, read from its text."""
    ranks = {tracer.ranks.rank_in_method(side, method, 0) for side in (node.body, node.orelse)}
    return len(ranks) == 1 and None not in ranks


def _flattens_leading(args: Sequence[cst.Arg]) -> bool:
    return len(args) == 3 and not any(a.star for a in args)
