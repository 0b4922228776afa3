"""The sizes of a tensor where the text of a function tells them, read before the point that uses them.

Before (a function's statements; `self._shape` returns `t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2)`):

    proj_shape = (bsz * self.num_heads, -1, self.head_dim)
    q = self._shape(q, tgt_len, bsz).view(*proj_shape)
    handed = q.unflatten(0, (bsz, self.num_heads))

What `shape_of(handed, ...)` reads: `("bsz", "self.num_heads", "tgt_len", "self.head_dim")`, the code of each size as
written. A size is the value its code had where the view was written: a caller that compares a size with a name makes
sure the name holds one value (`stable_names`). `-1` in a view is read from the viewed tensor's sizes where the others
account for all but one of them; a size the text does not tell is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.cstutil import (
    assignment,
    assigned_values,
    block_body,
    code,
    if_branches,
    is_docstring,
    nodes_of_type,
    walk_names,
)

Shape = tuple[str | None, ...]  # the code of each size, None where the text does not tell
Methods = Callable[[str], cst.FunctionDef | None]  # a method of the class by name (None: not a plain method)


def plain_methods(facts: ModuleFacts, class_name: str) -> Methods:
    """The methods `self.<name>` calls in the class, where no attribute of that name hides them."""

    def method(name: str) -> cst.FunctionDef | None:
        found = facts.find_method(class_name, name)
        return found[1] if found is not None and facts.find_attribute(class_name, name) is None else None

    return method


@dataclass(frozen=True)
class Context:
    """Statements run before a point, innermost block first (`parent`: the block around them)."""

    statements: Sequence[cst.BaseStatement]
    parent: Context | None = None


def assignment_of(statement: cst.BaseStatement, name: str | None = None) -> cst.Assign | None:
    """The assignment of a line holding only `name = value` (any name where `name` is None)."""
    target = m.Name() if name is None else m.Name(name)
    if m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target)])])):
        assert isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Assign)
        return statement.body[0]
    return None



def stable_names(body: Sequence[cst.BaseStatement], params: set[str]) -> set[str]:
    """The names that hold one value wherever the function reads them: parameters never bound again, names bound
    once; `self` only where the function sets none of its attributes."""
    counts = {name: len(values) for name, values in assigned_values(body).items()}
    stable = {name for name in params if name not in counts} | {name for name, n in counts.items() if n == 1}
    assigns = [a for s in body for a in nodes_of_type(s, cst.Assign)]
    targets: list[cst.BaseExpression] = [t.target for a in assigns for t in a.targets]
    targets += [a.target for s in body for a in nodes_of_type(s, cst.AugAssign)]
    targets += [a.target for s in body for a in nodes_of_type(s, cst.AnnAssign)]
    if any(nodes_of_type(t, cst.Attribute) or nodes_of_type(t, cst.Subscript) for t in targets):
        stable.discard("self")
    return stable


def shape_of(
    node: cst.BaseExpression, context: Context, methods: Methods, depth: int = 0, rank: int | None = None
) -> Shape | None:
    """The sizes of `node` where its text tells them: a view or reshape with its sizes written out (`-1` unknown),
    a transpose, a permute, `contiguous()`, `torch.cat`, a name through every statement binding it, a method of
    assignments and one return.

    `rank`: the rank `node` must have where it is read (a permute of that many dimensions raises otherwise), which
    tells how many leading sizes a view keeps where it writes only its last ones (`x.view(x.size()[:-1] + (h, d))`).
    """
    if depth > 8:
        return None
    if isinstance(node, cst.Name):
        return _bound_shape(node.value, context, methods, depth + 1, rank)
    if not isinstance(node, cst.Call):
        return None
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value in ("view", "reshape"):
        return _view_shape(node, func.value, context, methods, depth, rank)
    if any(a.star for a in node.args):
        return None
    if code(func) == "torch.cat":
        return _cat_shape(node, context, methods, depth)
    if not isinstance(func, cst.Attribute):
        return None
    method = func.attr.value
    if isinstance(func.value, cst.Name) and func.value.value == "self":
        return _method_shape(node, method, context, methods, depth, rank)
    if method == "permute":
        return _permuted_shape(node, func.value, context, methods, depth)
    inner = shape_of(func.value, context, methods, depth + 1)
    if inner is None:
        return None
    if method == "contiguous" and not node.args:
        return inner
    if method == "unflatten" and len(node.args) == 2 and not any(a.keyword for a in node.args):
        # `x.unflatten(0, (a, b))`: the first size split in two (unflatten raises where a * b is not that size)
        split = node.args[1].value
        if _dim(node.args[0].value, len(inner)) != 0 or not isinstance(split, (cst.Tuple, cst.List)):
            return None
        if any(isinstance(e, cst.StarredElement) for e in split.elements):
            return None
        return (*(code(e.value) for e in split.elements), *inner[1:])
    if method == "transpose" and len(node.args) == 2 and not any(a.keyword for a in node.args):
        dims = [_dim(a.value, len(inner)) for a in node.args]
        if dims[0] is None or dims[1] is None:
            return None
        swapped = list(inner)
        swapped[dims[0]], swapped[dims[1]] = inner[dims[1]], inner[dims[0]]
        return tuple(swapped)
    return None


def _permuted_shape(
    node: cst.Call, source: cst.BaseExpression, context: Context, methods: Methods, depth: int
) -> Shape | None:
    """`x.permute(0, 2, 1, 3)`: x's sizes in that order; x has as many dimensions as the permute names (or it
    raises)."""
    args = node.args
    if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)):
        values = [e.value for e in args[0].value.elements if not isinstance(e, cst.StarredElement)]
        if len(values) != len(args[0].value.elements):
            return None
    else:
        values = [a.value for a in args]
    if any(a.keyword for a in args):
        return None
    dims = [_dim(v, len(values)) for v in values]
    if not dims or sorted(d for d in dims if d is not None) != list(range(len(dims))):
        return None
    inner = shape_of(source, context, methods, depth + 1, rank=len(dims))
    if inner is None or len(inner) != len(dims):
        return None
    return tuple(inner[d] for d in dims if d is not None)


def _view_shape(
    node: cst.Call, source: cst.BaseExpression, context: Context, methods: Methods, depth: int, rank: int | None
) -> Shape | None:
    """A view or reshape: its sizes written out, or held in a tuple (`view(*proj_shape)`) bound before; a `-1` is
    read from the source's sizes where the others account for all but one of them. Sizes written only for the
    last dimensions, after a tensor's leading ones (`view(x.size()[:-1] + (h, d))`), are read with those leading
    sizes (unknown where x's are), where the number of dimensions is known."""
    if len(node.args) == 1 and node.args[0].star in ("", "*") and node.args[0].keyword is None:
        kept = _kept_leading(node.args[0].value, context, methods, depth, rank)
        if kept is not None or not node.args[0].star:
            return kept
    sizes = _written_sizes(node.args, context)
    if sizes is None or len(sizes) < 2:
        return None
    if sizes.count(None) != 1:
        return tuple(sizes)
    whole = shape_of(source, context, methods, depth + 1)
    return tuple(sizes) if whole is None else _unknown_read(sizes, whole)


def _kept_leading(
    node: cst.BaseExpression, context: Context, methods: Methods, depth: int, rank: int | None
) -> Shape | None:
    """The sizes `x.size()[:-k] + (a, b)` (or `x.shape[:-k] + ...`, or a name bound to either) gives a view, as one
    argument or unpacked: x's leading sizes, then those written."""
    if isinstance(node, cst.Name):
        held = _bound_value(node.value, context)
        if held is None:
            return None
        node = held
    kept = m.Subscript(
        value=m.Call(func=m.Attribute(attr=m.Name("size")), args=[]) | m.Attribute(attr=m.Name("shape")),
        slice=[m.SubscriptElement(m.Slice(lower=None, upper=m.UnaryOperation(m.Minus(), m.Integer()), step=None))],
    )
    if not m.matches(node, m.BinaryOperation(left=kept, operator=m.Add(), right=m.Tuple())):
        return None
    assert isinstance(node, cst.BinaryOperation) and isinstance(node.right, cst.Tuple)
    left = node.left
    assert isinstance(left, cst.Subscript)
    dropped = int(left.slice[0].slice.upper.expression.value)  # type: ignore[attr-defined]
    if any(isinstance(e, cst.StarredElement) for e in node.right.elements):
        return None
    written = tuple(code(e.value) for e in node.right.elements)
    read = left.value.func.value if isinstance(left.value, cst.Call) else left.value  # type: ignore[attr-defined]
    whole = shape_of(read, context, methods, depth + 1)
    if whole is not None and len(whole) >= dropped:
        sizes = (*whole[: len(whole) - dropped], *written)
        return sizes if rank is None or len(sizes) == rank else None
    if rank is None or rank < len(written):
        return None
    return (*(None,) * (rank - len(written)), *written)


def _written_sizes(args: Sequence[cst.Arg], context: Context) -> list[str | None] | None:
    unknown = m.UnaryOperation(m.Minus(), m.Integer("1"))
    if any(a.keyword for a in args):
        return None
    if len(args) == 1 and args[0].star == "*" and isinstance(args[0].value, cst.Name):
        held = _bound_value(args[0].value.value, context)
        if not isinstance(held, cst.Tuple) or any(isinstance(e, cst.StarredElement) for e in held.elements):
            return None
        values = [e.value for e in held.elements]
    elif any(a.star for a in args):
        return None
    else:
        values = [a.value for a in args]
    return [None if m.matches(v, unknown) else code(v) for v in values]


def _bound_value(name: str, context: Context | None) -> cst.BaseExpression | None:
    """The value of the last statement binding `name` before the point, where it is `name = value` alone."""
    while context is not None:
        for statement in reversed(context.statements):
            if name in assigned_values([statement]):
                small = assignment_of(statement, name) if isinstance(statement, cst.SimpleStatementLine) else None
                return None if small is None else small.value
        context = context.parent
    return None


def _unknown_read(sizes: list[str | None], whole: Shape) -> Shape:
    """`sizes` with its one `-1` read from `whole`: every other size is one of `whole`'s, or two neighbours'
    product written `a * b`, matched from both ends, and exactly one size of `whole` is left for the `-1`."""
    at = sizes.index(None)
    left = _consumed(sizes[:at], list(whole))
    right = _consumed(list(reversed(sizes[at + 1 :])), list(reversed(whole)), swap=True)
    if left is None or right is None or left + right != len(whole) - 1:
        return tuple(sizes)
    return (*sizes[:at], whole[left], *sizes[at + 1 :])


def _consumed(sizes: list[str | None], whole: list[str | None], swap: bool = False) -> int | None:
    """How many of `whole`'s sizes `sizes` account for, in order; None where one is not read off them."""
    used = 0
    for size in sizes:
        if size is not None and used < len(whole) and size == whole[used]:
            used += 1
            continue
        if size is not None and used + 1 < len(whole) and whole[used] is not None and whole[used + 1] is not None:
            first, second = (whole[used + 1], whole[used]) if swap else (whole[used], whole[used + 1])
            if size == f"{first} * {second}":
                used += 2
                continue
        return None
    return used


def _dim(node: cst.BaseExpression, rank: int) -> int | None:
    if isinstance(node, cst.Integer):
        value = int(node.value)
    elif m.matches(node, m.UnaryOperation(m.Minus(), m.Integer())):
        assert isinstance(node, cst.UnaryOperation) and isinstance(node.expression, cst.Integer)
        value = -int(node.expression.value)
    else:
        return None
    value = value + rank if value < 0 else value
    return value if 0 <= value < rank else None


def _cat_shape(node: cst.Call, context: Context, methods: Methods, depth: int) -> Shape | None:
    """`torch.cat([a, b], dim=k)`: the sizes a known part has, but along `k`; every part has them (or cat raises)."""
    if not node.args or not isinstance(node.args[0].value, (cst.List, cst.Tuple)) or node.args[0].keyword:
        return None
    dims = [a.value for a in node.args[1:] if a.keyword is None or a.keyword.value == "dim"]
    if len(node.args) != 2 or len(dims) != 1:
        return None
    elements = node.args[0].value.elements
    if any(isinstance(e, cst.StarredElement) for e in elements):
        return None
    for element in elements:
        shape = shape_of(element.value, context, methods, depth + 1)
        if shape is None:
            continue
        along = _dim(dims[0], len(shape))
        if along is None:
            return None
        return tuple(None if i == along else size for i, size in enumerate(shape))
    return None


def _method_shape(
    node: cst.Call, name: str, context: Context, methods: Methods, depth: int, rank: int | None
) -> Shape | None:
    """The shape a method gives whose body is assignments `name = value` and one `return`, its parameters read as
    the arguments of the call: a parameter it never binds again stands for its argument, the others and its locals
    are names of their own, bound in the order the method binds them."""
    function = methods(name)
    if function is None or function.decorators or any(a.keyword or a.star for a in node.args):
        return None
    body = [s for s in block_body(function.body) if not is_docstring(s)]
    if not body or not m.matches(body[-1], m.SimpleStatementLine(body=[m.Return(value=m.DoNotCare())])):
        return None
    assignments = [assignment_of(s) for s in body[:-1]]
    returned = body[-1].body[0].value  # type: ignore[attr-defined]
    params = function.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.kwonly_params or params.posonly_params:
        return None
    names = [p.name.value for p in params.params]
    if not names or names[0] != "self" or len(names) - 1 != len(node.args) or returned is None:
        return None
    locals_ = {a.targets[0].target.value for a in assignments if a is not None}  # type: ignore[attr-defined]
    read = set().union(*(walk_names(s) for s in body))
    if None in assignments or read - set(names) - locals_ - {"torch"}:
        return None  # other statements, or a name of the method's module, which forward may bind to something else
    arguments = dict(zip(names[1:], (a.value for a in node.args)))
    taken = _names_before(context)
    own = {n: cst.Name(_own_name(name, n, taken)) for n in locals_}
    bound: dict[str, cst.BaseExpression] = {**{n: v for n, v in arguments.items() if n not in locals_}, **own}
    prelude = [assignment(own[n].value, v) for n, v in arguments.items() if n in locals_]
    statements = [*prelude, *(s.visit(_Substitute(bound)) for s in body[:-1])]
    substituted = returned.visit(_Substitute(bound))
    assert isinstance(substituted, cst.BaseExpression)
    inner = Context(statements, context) if statements else context  # type: ignore[arg-type]
    return shape_of(substituted, inner, methods, depth + 1, rank)


def _names_before(context: Context | None) -> set[str]:
    names: set[str] = set()
    while context is not None:
        for statement in context.statements:
            names |= walk_names(statement)
        context = context.parent
    return names


def _own_name(method: str, name: str, taken: set[str]) -> str:
    """A name for a local of `method`, read inside the caller's statements, that none of them uses."""
    own = f"_{method.lstrip('_')}_{name}"
    while own in taken:
        own = "_" + own
    return own


class _Substitute(cst.CSTTransformer):
    """A method's parameters replaced by the arguments of a call (the method's `self` is the caller's)."""

    def __init__(self, bound: dict[str, cst.BaseExpression]) -> None:
        self.bound = bound

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.bound.get(original.value, updated)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return updated.with_changes(attr=original.attr)  # `x.<name>`: the attribute is no parameter

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)  # nor is a keyword


def _bound_shape(
    name: str, context: Context | None, methods: Methods, depth: int, rank: int | None = None
) -> Shape | None:
    """The shape the name holds after `context`'s statements: the last statement binding it, through each branch of
    an if/elif/else chain (the sizes the branches agree on)."""
    while context is not None:
        for position in range(len(context.statements) - 1, -1, -1):
            statement = context.statements[position]
            if name not in assigned_values([statement]):
                continue
            before = Context(context.statements[:position], context.parent)
            if isinstance(statement, cst.SimpleStatementLine):
                small = assignment_of(statement, name)
                return None if small is None else shape_of(small.value, before, methods, depth, rank)
            if not isinstance(statement, cst.If):
                return None
            branches = if_branches(statement)
            if name in assigned_values([test for test, _ in branches if test is not None]):
                return None  # bound in a test (`:=`)
            if branches[-1][0] is not None:
                branches.append((None, []))  # no else: the name as it was before the `if`
            shapes = [_bound_shape(name, Context(body, before), methods, depth + 1, rank) for _, body in branches]
            return _agreed(shapes)
        context = context.parent
    return None


def _agreed(shapes: list[Shape | None]) -> Shape | None:
    first = shapes[0]
    if first is None or any(s is None or len(s) != len(first) for s in shapes):
        return None
    return tuple(size if all(s[i] == size for s in shapes if s is not None) else None for i, size in enumerate(first))
