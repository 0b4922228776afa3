"""SDPA takes the `(b, h, L, d)` operands eager flattened to `(b * h, L, d)` only for `torch.bmm`, and its output as is.

Before (BART's layout, ported: `q` flattened, SDPA given it split again, its output flattened, checked, viewed back):

    proj_shape = (bsz * self.num_heads, -1, self.head_dim)
    q = self._shape(q, tgt_len, bsz).view(*proj_shape)
    out = torch.nn.functional.scaled_dot_product_attention(q.unflatten(0, (bsz, self.num_heads)), ...).flatten(0, 1)
    if out.size() != (bsz * self.num_heads, tgt_len, self.head_dim):
        raise ValueError(...)
    out = out.view(bsz, self.num_heads, tgt_len, self.head_dim)

After: `q = self._shape(q, tgt_len, bsz)`, SDPA given `q`, and `out = <the SDPA call>`. An operand is passed whole only
where its text proves it `(b, h, _, d)` before the flattening (`shape_of`: views with their sizes written out,
transposes, `torch.cat`, a method returning one of those; through every branch that binds it); its other reads must
be `.dtype`, `.device` or `.size(k)` (k > 0 moves one dimension on). The output's check and view back go only where
they provably hold: the query's length and the value's last size are the sizes they name. Names the sizes read must
hold one value in forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import assigned_values, block_body, code, nodes_of_type, walk_names
from sdpa_port.analyse.shapes import Context, Methods, Shape, assignment_of, shape_of, stable_names
from sdpa_port.rewrite.edit import replace_nodes

SDPA = "torch.nn.functional.scaled_dot_product_attention"
LAYOUT_FREE = ("dtype", "device")  # reads the flattening does not change


@dataclass(frozen=True)
class _Flattening:
    index: int  # of the statement `x = e.view(b * h, -1, d)` in the body
    name: str
    source: cst.BaseExpression  # e
    last: cst.BaseExpression  # d
    held: str | None  # the name of the tuple holding the sizes (`view(*proj_shape)`)
    shape: Shape | None  # e's, where its text tells


def keep_heads(function: cst.FunctionDef, methods: Methods) -> cst.FunctionDef:
    """`function` with each operand it flattens for the SDPA call passed whole where its shape is proven, and the
    output's flatten, size check and view back dropped where they provably undo each other."""
    # generated code may share one node object between places; each read must be told apart from the others
    body = [statement.deep_clone() for statement in block_body(function.body)]
    found = _sdpa_statement(body)
    if found is None:
        return function
    index, output, call, heads = found
    batch, heads_code = code(heads.elements[0].value), code(heads.elements[1].value)
    params = {p.name.value for p in function.params.params} | {p.name.value for p in function.params.kwonly_params}
    stable = stable_names(body, params)
    caches = _caches(body, params)
    flattenings = [_flattening(body, index, arg.value, heads, methods, stable, caches) for arg in call.args[:3]]
    operands: dict[cst.CSTNode, cst.CSTNode] = {}
    replaced: dict[cst.CSTNode, cst.CSTNode] = {}
    dropped: set[int] = set()
    rewritten: dict[int, cst.BaseStatement] = {}
    held: set[str] = set()
    for arg, flat in zip(call.args[:3], flattenings):
        if flat is None or not _proven(flat.shape, batch, heads_code, code(flat.last), stable):
            continue
        reads = _other_reads(body[flat.index + 1 :], flat.name, arg.value)
        statement = body[flat.index]
        assert isinstance(statement, cst.SimpleStatementLine)
        if reads is None or statement.trailing_whitespace.comment is not None:
            continue
        operands[arg.value] = cst.Name(flat.name)
        replaced.update(reads)
        held |= {flat.held} if flat.held else set()
        if isinstance(flat.source, cst.Name) and flat.source.value == flat.name:
            dropped.add(flat.index)
        else:
            assign = statement.body[0]
            assert isinstance(assign, cst.Assign)
            rewritten[flat.index] = statement.with_changes(body=[assign.with_changes(value=flat.source)])
    query, value = flattenings[0], flattenings[2]
    if query is not None and value is not None and query.shape is not None and len(query.shape) == 4:
        undone = _undone(body, index, output, batch, heads_code, query.shape[2], code(value.last), stable)
        if undone is not None:
            dropped |= undone
            assignment = assignment_of(body[index])
            assert assignment is not None
            replaced[assignment.value] = replace_nodes(call, operands)
    replaced.update(operands)
    if not replaced and not dropped:
        return function
    body = [rewritten.get(position, statement) for position, statement in enumerate(body)]
    for name in held:
        # the tuple of the flattened sizes, where nothing else reads it any more
        binding = {position for position, s in enumerate(body) if _binds_tuple(s, name)}
        rest = [replace_nodes(s, replaced) for position, s in enumerate(body) if position not in dropped | binding]
        if len(binding) == 1 and not any(name in walk_names(s) for s in rest):
            dropped |= binding
    return function.with_changes(body=function.body.with_changes(body=_dropping(body, dropped, replaced)))


def _dropping(
    body: Sequence[cst.BaseStatement], dropped: set[int], replaced: dict[cst.CSTNode, cst.CSTNode]
) -> list[cst.BaseStatement]:
    """`body` without the dropped statements, their blank lines and comments kept above the next statement."""
    out: list[cst.BaseStatement] = []
    carried: list[cst.EmptyLine] = []
    for position, statement in enumerate(body):
        if position in dropped:
            carried.extend(getattr(statement, "leading_lines", ()))
            continue
        statement = replace_nodes(statement, replaced)
        if carried and hasattr(statement, "leading_lines"):
            lines: list[cst.EmptyLine] = []
            for line in [*carried, *statement.leading_lines]:
                if line.comment is None and lines and lines[-1].comment is None:
                    continue  # one blank line where two statements each had one
                lines.append(line)
            statement = statement.with_changes(leading_lines=lines)
            carried = []
        out.append(statement)
    return out


def _binds_tuple(statement: cst.BaseStatement, name: str) -> bool:
    return m.matches(
        statement,
        m.SimpleStatementLine(
            body=[m.Assign(targets=[m.AssignTarget(m.Name(name))], value=m.Tuple())],
            trailing_whitespace=m.TrailingWhitespace(comment=None),
        ),
    )


def _sdpa_statement(
    body: Sequence[cst.BaseStatement],
) -> tuple[int, str, cst.Call, cst.Tuple] | None:
    """The statement `out = <SDPA call on (b * h, L, d) operands split by `unflatten(0, (b, h))`>.flatten(0, 1)`."""
    flatten = m.Call(func=m.Attribute(attr=m.Name("flatten")), args=[m.Arg(m.Integer("0")), m.Arg(m.Integer("1"))])
    for index, statement in enumerate(body):
        small = assignment_of(statement)
        if small is None:
            continue
        value = small.value
        if not m.matches(value, flatten):
            continue
        assert isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
        call = value.func.value
        if not (isinstance(call, cst.Call) and code(call.func) == SDPA and len(call.args) >= 3):
            continue
        heads = [_split_heads(arg) for arg in call.args[:3]]
        if any(h is None for h in heads) or any(a.keyword is not None for a in call.args[:3]):
            continue
        if len({code(h) for h in heads if h is not None}) != 1:
            continue
        assert heads[0] is not None and isinstance(small.targets[0].target, cst.Name)
        return index, small.targets[0].target.value, call, heads[0]
    return None


def _split_heads(arg: cst.Arg) -> cst.Tuple | None:
    """`(b, h)` of `x.unflatten(0, (b, h))` with `x` a name."""
    node = arg.value
    pattern = m.Call(
        func=m.Attribute(value=m.Name(), attr=m.Name("unflatten")),
        args=[m.Arg(m.Integer("0")), m.Arg(m.Tuple(elements=[m.Element(), m.Element()]))],
    )
    if not m.matches(node, pattern):
        return None
    assert isinstance(node, cst.Call)
    heads = node.args[1].value
    assert isinstance(heads, cst.Tuple)
    return heads


def _flattening(
    body: Sequence[cst.BaseStatement],
    before: int,
    operand: cst.BaseExpression,
    heads: cst.Tuple,
    methods: Methods,
    stable: set[str],
    caches: dict[str, list[int]],
) -> _Flattening | None:
    """The statement flattening `operand`'s name to `(b * h, -1, d)`: the last top-level one binding it before the
    call, a view of the sizes written out or held in a tuple bound once. Its shape is read taking each cache element
    that forward stores the flattened tensor in (`caches`, `_stored`) to be `(b, h, _, d)`."""
    assert isinstance(operand, cst.Call) and isinstance(operand.func, cst.Attribute)
    name = operand.func.value
    assert isinstance(name, cst.Name)
    for index in range(before - 1, -1, -1):
        statement = body[index]
        if name.value not in assigned_values([statement]):
            continue
        small = assignment_of(statement, name.value)
        if small is None:
            return None
        view = small.value
        if not (
            isinstance(view, cst.Call)
            and isinstance(view.func, cst.Attribute)
            and view.func.attr.value in ("view", "reshape")
        ):
            return None
        sizes = _sizes(view.args, body[:index], stable)
        if sizes is None or len(sizes) != 3 or not _is_product(sizes[0], heads):
            return None
        held = view.args[0].value.value if view.args[0].star else None  # type: ignore[attr-defined]
        prior = list(body[:index])
        source = view.func.value
        stored = [(c, at) for c, places in caches.items() for at in places if _stored(body, index, c, at, source)]
        if stored:
            assumed = {f"{cache}[{at}]": _assumed(cache, at, heads, sizes[2]) for cache, at in stored}
            prior = [_with_cached(s, assumed) for s in prior]
        shape = shape_of(source, Context(prior), methods)
        return _Flattening(index, name.value, source, sizes[2], held, shape)
    return None


def _caches(body: Sequence[cst.BaseStatement], params: set[str]) -> dict[str, list[int]]:
    """The parameters forward returns as its cache: returned as an element of the final `return`'s tuple, and bound
    only to tuples of names; each with the positions its tuples hold."""
    if not body or not m.matches(body[-1], m.SimpleStatementLine(body=[m.Return(value=m.Tuple())])):
        return {}
    last = body[-1]
    assert isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)
    returned = last.body[0].value
    assert isinstance(returned, cst.Tuple)
    out: dict[str, list[int]] = {}
    bound = assigned_values(body)
    for element in returned.elements:
        name = element.value
        if not isinstance(name, cst.Name) or name.value not in params or name.value not in bound:
            continue
        values = bound[name.value]
        if all(isinstance(v, cst.Tuple) and all(isinstance(e.value, cst.Name) for e in v.elements) for v in values):
            lengths = {len(v.elements) for v in values if isinstance(v, cst.Tuple)}
            if len(lengths) == 1:
                out[name.value] = list(range(lengths.pop()))
    return out


def _stored(body: Sequence[cst.BaseStatement], index: int, cache: str, at: int, source: cst.BaseExpression) -> bool:
    """Every tuple bound to `cache` holds `source`, a name, at `at`, bound before the statement `index` (which
    flattens `source`) in a statement not binding the name, and no statement between binds the name either."""
    if not isinstance(source, cst.Name):
        return False
    name = source
    places = [i for i, s in enumerate(body) if cache in assigned_values([s])]
    if not places or places[-1] >= index:
        return False
    for place in places:
        values = assigned_values([body[place]])
        if any(not isinstance(v, cst.Tuple) or code(v.elements[at].value) != name.value for v in values[cache]):
            return False
        if name.value in values or name.value in assigned_values(body[place + 1 : index]):
            return False
    return True


def _assumed(cache: str, at: int, heads: cst.Tuple, last: cst.BaseExpression) -> cst.BaseExpression:
    """`cache[at].view(b, h, -1, d)`: the element as forward stores it, read with its shape written out."""
    sizes = f"{code(heads.elements[0].value)}, {code(heads.elements[1].value)}, -1, {code(last)}"
    return cst.parse_expression(f"{cache}[{at}].view({sizes})")


def _with_cached(statement: cst.BaseStatement, assumed: dict[str, cst.BaseExpression]) -> cst.BaseStatement:
    """`statement` with each `cache[at]` read as `_assumed` gives it (for reading shapes only: never written)."""
    found: dict[cst.CSTNode, cst.CSTNode] = {}
    for node in nodes_of_type(statement, cst.Subscript):
        if code(node) in assumed:
            found[node] = assumed[code(node)]
    return replace_nodes(statement, found)  # type: ignore[no-any-return]


def _sizes(
    args: Sequence[cst.Arg], before: Sequence[cst.BaseStatement], stable: set[str]
) -> Sequence[cst.BaseExpression] | None:
    if len(args) == 1 and args[0].star == "*" and isinstance(args[0].value, cst.Name) and args[0].value.value in stable:
        values = [v for s in before for v in assigned_values([s]).get(args[0].value.value, [])]
        held = values[-1] if values else None
        if isinstance(held, cst.Tuple) and not any(isinstance(e, cst.StarredElement) for e in held.elements):
            return [e.value for e in held.elements]
        return None
    if any(a.star or a.keyword is not None for a in args):
        return None
    return [a.value for a in args]


def _is_product(node: cst.BaseExpression, heads: cst.Tuple) -> bool:
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Multiply)
        and not node.lpar
        and code(node.left) == code(heads.elements[0].value)
        and code(node.right) == code(heads.elements[1].value)
    )


def _steady(size: str, stable: set[str]) -> bool:
    """A size whose names each hold one value."""
    return walk_names(cst.parse_expression(size)) <= stable


def _proven(shape: Shape | None, batch: str, heads: str, last: str, stable: set[str]) -> bool:
    if shape is None or len(shape) != 4:
        return False
    if (shape[0], shape[1], shape[3]) != (batch, heads, last):
        return False
    return all(_steady(size, stable) for size in (batch, heads, last))


def _other_reads(
    after: Sequence[cst.BaseStatement], name: str, operand: cst.BaseExpression
) -> dict[cst.CSTNode, cst.CSTNode] | None:
    """The reads of `name` after its flattening, other than the SDPA operand, rewritten for the whole tensor:
    `.dtype` and `.device` as they are, `.size(k)` with k > 0 as `.size(k + 1)`; None where another read or a binding
    is found."""
    if name in assigned_values(after):
        return None
    assert isinstance(operand, cst.Call) and isinstance(operand.func, cst.Attribute)
    skip = operand.func.value  # the name split by `unflatten`
    rewritten: dict[cst.CSTNode, cst.CSTNode] = {}
    # a function or lambda defined after the flattening reads the flat tensor too
    attributes = {id(a.value): a for s in after for a in nodes_of_type(s, cst.Attribute, into_scopes=True)}
    calls = [c for s in after for c in nodes_of_type(s, cst.Call, into_scopes=True)]
    sized = {id(c.func): c for c in calls if isinstance(c.func, cst.Attribute)}
    for statement in after:
        for node in nodes_of_type(statement, cst.Name, into_scopes=True):
            if node.value != name or node is skip:
                continue
            attribute = attributes.get(id(node))
            if attribute is None:
                return None
            if attribute.attr.value in LAYOUT_FREE:
                continue
            size = sized.get(id(attribute))
            if attribute.attr.value != "size" or size is None or len(size.args) != 1:
                return None
            dim = size.args[0].value
            if isinstance(dim, cst.Integer) and int(dim.value) > 0 and size.args[0].keyword is None:
                rewritten[dim] = cst.Integer(str(int(dim.value) + 1))
            elif not m.matches(dim, m.UnaryOperation(operator=m.Minus(), expression=m.Integer())):
                return None
    return rewritten


def _undone(
    body: Sequence[cst.BaseStatement],
    index: int,
    output: str,
    batch: str,
    heads: str,
    length: str | None,
    last: str,
    stable: set[str],
) -> set[int] | None:
    """The statements after the SDPA call that only check the flattened output's size and view it back to
    `(b, h, L, d)`, where the output provably has that shape; None where they are not exactly that."""
    if length is None or not all(_steady(size, stable) for size in (batch, heads, length, last)):
        return None
    drop: set[int] = set()
    at = index + 1
    if at < len(body) and _size_check(body[at], output, [f"{batch} * {heads}", length, last]):
        drop.add(at)
        at += 1
    if at >= len(body):
        return None
    back = body[at]
    view = m.Call(func=m.Attribute(value=m.Name(output), attr=m.Name("view") | m.Name("reshape")))
    if not (
        isinstance(back, cst.SimpleStatementLine)
        and len(back.body) == 1
        and m.matches(back.body[0], m.Assign(targets=[m.AssignTarget(m.Name(output))], value=view))
    ):
        return None
    assign = back.body[0]
    assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
    args = assign.value.args
    if any(a.star or a.keyword for a in args) or [code(a.value) for a in args] != [batch, heads, length, last]:
        return None
    drop.add(at)
    return drop


def _size_check(statement: cst.BaseStatement, output: str, sizes: list[str]) -> bool:
    """`if out.size() != (sizes): raise ...` and nothing else."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return False
    body = statement.body.body
    if len(body) != 1 or not m.matches(body[0], m.SimpleStatementLine(body=[m.Raise()])):
        return False
    test = statement.test
    size = m.Call(func=m.Attribute(value=m.Name(output), attr=m.Name("size")), args=[])
    if not (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.NotEqual)
        and m.matches(test.left, size)
    ):
        return False
    expected = test.comparisons[0].comparator
    return isinstance(expected, cst.Tuple) and [code(e.value) for e in expected.elements] == sizes
