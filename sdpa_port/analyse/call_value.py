"""The SDPA call a written-out helper makes, as values: what tells two helpers that make the same call.

A helper's SDPA side is its chain (`SdpaPath`) and the statements it keeps. `call_value` reads them in order, each
local standing for the value it holds (a branch's locals for a choice between values), and records what the call
is handed: the query, key and value, the scale factors and the masks in the order the chain applies them, each with
the tests it runs under, the dropout, and what the helper returns. Two helpers whose values are equal make the same
SDPA call, whatever their text.

Before (GPT-2's two helpers, each written out at its call):

    scale_factor = 1.0                                  |  attn_weights = torch.matmul(query, key.transpose(-1, -2))
    if self.scale_attn_weights:                         |  if self.scale_attn_weights:
        scale_factor /= float(value.size(-1)) ** 0.5    |      attn_weights = attn_weights / torch.full(
    ...                                                 |          [], value.size(-1) ** 0.5, ...)
    q = query.reshape(-1, q_seq_len, dk)                |  ...
    attn_weights = torch.baddbmm(w, q.float(), k.float(), beta=0, alpha=scale_factor)

Both read `query` and `key` whole (`views.py`), divide by `value.size(-1) ** 0.5` under `self.scale_attn_weights` (a
size is an integer: `float` of it changes no quotient), fill where the same causal slice is False with the smallest
number of the scores' dtype, add the mask and drop out with `self.attn_dropout.p`: one value. Casts are not part of
it: the port drops the upcasts and decides the operands' dtype itself (`recast_operands`).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from typing import Mapping, Sequence, TypeVar

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import assigned_names, block_body, code, if_chain, is_docstring, nodes_in
from sdpa_port.analyse.names import ImportMap
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.analyse.sdpa_side import WrittenOut
from sdpa_port.analyse.views import VIEW_METHODS, dtype_view, integers, reduced
from sdpa_port.refusals import Refuse
from sdpa_port.rewrite.cleanup import is_pure
from sdpa_port.rewrite.edit import replace_nodes
from sdpa_port.rewrite.sdpa_layout import decide_layout

CHAIN = "__chain__"  # a name holding the scores or the probabilities, which SDPA computes
OUTPUT = "__sdpa_output__"  # the SDPA call's result
SCORES = "__sdpa_operands__"  # the operands the call is handed, as `.dtype` and `.device` reads of the scores become
SCALAR = "__scalar_tensor__"  # a 0-d tensor: `torch.full([], x, dtype=d, device=v)`, `torch.tensor(x, dtype=d).to(v)`
SIZE = "__size__"  # a size read of forward's tensors where forward's text tells it
FORWARD = "^"  # prefixes forward's names: a helper's own global of the same name is another value

N = TypeVar("N", bound=ast.AST)


@dataclass(frozen=True)
class Sizes:
    """What forward's text tells of the tensors it hands a helper: the code of each size it knows (`shapes.py`)."""

    shapes: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict)

    def known(self, name: str, index: int) -> str | None:
        shape = self.shapes.get(name)
        return shape[index] if shape is not None and 0 <= index < len(shape) else None

    def rank(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return len(shape) if shape is not None else None


@dataclass(frozen=True)
class CallValue:
    """The SDPA call of one helper: each part as a dump of its value (`ast.dump`)."""

    operands: tuple[str, str, str]  # query, key, value
    steps: tuple[tuple[object, ...], ...]  # scale factors, masks, softmax, dropout, effects; with their tests
    returned: str
    upcast: bool  # SDPA runs on float32 copies of the operands


class _Unread(Exception):
    """A statement or operation the value does not account for: the helper's call is not compared."""


def call_value(written: WrittenOut, sizes: Sizes, imports: ImportMap) -> CallValue | None:
    """The SDPA call `written` makes, or None where some part of its side is not read as a value. A kept statement
    that calls anything but a pure function (`cleanup.is_pure`) is part of the value, as an effect."""
    if written.path is None:
        return None
    try:
        return _Reader(written, sizes, imports).value()
    except (_Unread, Refuse, SyntaxError):
        return None


class _Reader:
    """Reads a written-out helper's statements in order, its locals as values."""

    def __init__(self, written: WrittenOut, sizes: Sizes, imports: ImportMap) -> None:
        assert written.path is not None
        self.path: SdpaPath = written.path
        self.sizes = sizes
        self.imports = imports
        self.env: dict[str, ast.expr] = {}
        self.ranks: dict[str, int] = {}
        self.tests: list[ast.expr] = []
        self.steps: list[tuple[object, ...]] = []
        self.start: t.Start | None = None
        self.operands: tuple[ast.expr, ast.expr] | None = None
        self.heads: tuple[ast.expr, ast.expr] | None = None
        self.output: ast.expr | None = None
        self.returned: ast.expr | None = None
        self.guarded = 0  # inside `with` blocks
        function = written.function
        for param in [*function.params.posonly_params, *function.params.params, *function.params.kwonly_params]:
            name = param.name.value
            if name == "self":
                continue
            if name not in written.bound:
                raise _Unread(name)
            self.env[name] = _forward(_parsed(written.bound[name]))
        if function.params.star_arg is not cst.MaybeSentinel.DEFAULT or function.params.star_kwarg is not None:
            raise _Unread("*args")

    # ------------------------------------------------------------------ the value

    def value(self) -> CallValue:
        path = self.path
        if path.branched or path.built or path.other_streams:
            raise _Unread("operands built per branch")
        body = [s for s in block_body(self.path.function.body) if not is_docstring(s)]
        self.block(body)
        if self.returned is None or self.operands is None or self.output is None or self.start is None:
            raise _Unread("no return")
        layout = decide_layout(path, "b", "h")
        if layout.bound is not None or layout.flatten_output or layout.unflatten_value:
            raise _Unread("layout")
        query, key = self.operands
        if layout.heads is not None:
            if self.heads is None:
                raise _Unread("heads")
            query, key = (_call(x, "unflatten", ast.Constant(0), ast.Tuple(list(self.heads), ast.Load())) for x in (query, key))
        operands = tuple(self.operand(x) for x in (query, key, self.output))
        steps = tuple(self.dumped(step) for step in self.steps)
        returned = self.dump(self.returned)
        if CHAIN in returned or any(CHAIN in str(step) for step in steps) or any(CHAIN in o for o in operands):
            raise _Unread("the chain read elsewhere")
        upcast = any(isinstance(op, t.Start) and op.operands_upcast for op in path.chain_ops)
        return CallValue((operands[0], operands[1], operands[2]), steps, returned, upcast)

    def operand(self, node: ast.expr) -> str:
        return reduced(self.normal(node), self.rank_of, self.size_key)

    def dump(self, node: ast.AST) -> str:
        return ast.dump(self.normal(node))

    def dumped(self, step: tuple[object, ...]) -> tuple[object, ...]:
        """A step with each value in it dumped, the tests it runs under too."""
        return tuple(self.dumped(p) if isinstance(p, tuple) else self.dump(p) if isinstance(p, ast.AST) else p for p in step)

    # ------------------------------------------------------------------ statements

    def block(self, statements: Sequence[cst.BaseStatement]) -> None:
        for statement in statements:
            if self.returned is not None:
                raise _Unread("statements after the return")
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    self.small(small)
            elif isinstance(statement, cst.If):
                self.branches(statement)
            elif isinstance(statement, cst.With) and self.autocast(statement):
                self.guarded += 1
                self.block(block_body(statement.body))
                self.guarded -= 1
            else:
                raise _Unread(type(statement).__name__)

    def autocast(self, statement: cst.With) -> bool:
        """A `with` of autocast alone: it changes no value the block keeps that only views and casts compute."""
        return all(
            isinstance(item.item, cst.Call) and code(item.item.func).split(".")[-1] == "autocast" and item.asname is None
            for item in statement.items
        )

    def branches(self, statement: cst.If) -> None:
        if statement in self.path.dropped_ifs:
            return
        before = dict(self.env)
        ends: list[tuple[ast.expr | None, dict[str, ast.expr]]] = []
        negated: list[ast.expr] = []
        for branch in if_chain(statement):
            self.env = dict(before)
            test = None
            if isinstance(branch, cst.If):
                if nodes_in(branch.test, self.path.plans) or not self.pure(branch.test):
                    raise _Unread("a test the chain reads")
                test = self.resolve(branch.test)
            tests = [*negated, test] if test is not None else list(negated)
            self.tests.extend(tests)
            self.block(block_body(branch.body))
            del self.tests[len(self.tests) - len(tests) :]
            ends.append((test, self.env))
            if test is not None:
                negated.append(ast.UnaryOp(ast.Not(), test))
        if ends[-1][0] is not None:
            ends.append((None, before))
        names = {n for _, env in ends for n in env if env.get(n) is not before.get(n)}
        merged = dict(before)
        for name in names:
            value: ast.expr = ends[-1][1].get(name, ast.Name("__unbound__", ast.Load()))
            for test, env in reversed(ends[:-1]):
                chosen = env.get(name, ast.Name("__unbound__", ast.Load()))
                value = ast.IfExp(test, chosen, value)  # type: ignore[arg-type]
            merged[name] = value
        self.env = merged

    def small(self, small: cst.BaseSmallStatement) -> None:
        plan = self.path.plans.get(small)
        if isinstance(plan, t.ChainStmt):
            self.chain(plan.ops, small)
            return
        if isinstance(plan, t.OutputStmt):
            for op in plan.ops:
                self.operation(op)
            self.output = self.resolve(plan.output.value)
            small = replace_nodes(small, {plan.output.node: cst.Name(OUTPUT)})
            for name in self.path.probs_after_output:
                self.env[name] = ast.Constant(None)
        elif isinstance(plan, t.KeepStmt):
            if plan.sizes or plan.shaped:
                raise _Unread("the scores' sizes read")
            small = replace_nodes(
                small, {node: cst.Attribute(cst.Name(SCORES), cst.Name(action.value)) for node, action in plan.replacements.items()}
            )
        self.kept(small)

    def kept(self, small: cst.BaseSmallStatement) -> None:
        """A statement the SDPA side keeps: its binding, its effect where it calls anything else than a pure call."""
        if isinstance(small, cst.Pass):
            return
        if isinstance(small, cst.Return):
            if self.tests or self.guarded:
                raise _Unread("a return under a test")
            self.returned = self.resolve(small.value) if small.value is not None else ast.Constant(None)
            return
        if isinstance(small, cst.Assign):
            value = self.resolve(small.value)
            self.effect(small.value, value)
            for target in small.targets:
                self.bind(target.target, value, small.value)
            return
        if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
            operator = _AUGMENTED.get(type(small.operator))
            if operator is None or small.target.value not in self.env:
                raise _Unread("augmented assignment")
            value = ast.BinOp(self.env[small.target.value], operator(), self.resolve(small.value))
            self.effect(small.value, value)
            self.env[small.target.value] = value
            return
        if isinstance(small, cst.Expr):
            self.effect(small.value, self.resolve(small.value), always=True)
            return
        if isinstance(small, (cst.Raise, cst.Assert)) and not self.guarded:
            self.steps.append(("effect", self.tests_now(), self.resolve_statement(small)))
            return
        raise _Unread(type(small).__name__)

    def effect(self, node: cst.BaseExpression, value: ast.expr, always: bool = False) -> None:
        if not always and self.pure(node):
            return
        if self.guarded:
            raise _Unread("a call under autocast")
        self.steps.append(("effect", self.tests_now(), value))

    def pure(self, node: cst.CSTNode) -> bool:
        return is_pure(node, self.imports)

    def bind(self, target: cst.BaseExpression, value: ast.expr, written: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self.env[target.value] = value
            return
        if not isinstance(target, (cst.Tuple, cst.List)) or any(isinstance(e, cst.StarredElement) for e in target.elements):
            raise _Unread("target")
        names = [e.value for e in target.elements]
        if isinstance(value, ast.Tuple) and len(value.elts) == len(names):
            for name, part in zip(names, value.elts):
                self.bind(name, part, written)
            return
        shape = _shape_read(value)
        if shape is None:
            raise _Unread("unpacked")
        # `b, h, n, d = x.size()`: x has that many dimensions, or the statement raises
        self.ranks[ast.dump(self.normal(shape))] = len(names)
        for index, name in enumerate(names):
            size = _call(shape, "size", ast.Constant(index))
            self.bind(name, size, written)

    def chain(self, ops: Sequence[t.Op], small: cst.BaseSmallStatement) -> None:
        for op in ops:
            self.operation(op)
        for name in _targets(small):
            self.env[name] = ast.Name(CHAIN, ast.Load())

    def operation(self, op: t.Op) -> None:
        tests = self.tests_now()
        match op:
            case t.Start():
                if self.start is not None or op.operands is not None or op.heads is not None or op.single:
                    raise _Unread("start")
                if op.layout is not None or op.joined or op.orders != (None, None):
                    raise _Unread("start laid out")
                self.start = op
                self.operands = (self.resolve(op.query), self.resolve(op.key))
            case t.Scale():
                if op.per_query:
                    raise _Unread("scale per query")
                for factor_tests, divide, factor in _factors(self.resolve(op.factor)):
                    self.steps.append(("scale", (*tests, *factor_tests), divide != op.divide, _float_free(factor)))
            case t.AddTerm():
                if op.rank == 3 or op.scores_arg is not None or op.may_be_number:
                    raise _Unread("term")
                self.steps.append(("add", tests, self.resolve(op.term), op.always, op.with_chain, op.term_rank))
            case t.Fill():
                self.steps.append(
                    ("fill", tests, self.resolve(op.condition), op.keep_where_true, self.resolve(op.fill), op.causal,
                     op.absorbing, op.row_safe, op.top_left)
                )
            case t.View() if op.shape is None and op.heads is not None and op.rank_after == 4 and self.heads is None:
                self.heads = (self.resolve(op.heads[0]), self.resolve(op.heads[1]))
            case t.Softmax():
                dim = self.resolve(op.call.dim) if op.call.dim is not None else ast.Constant(None)
                self.steps.append(("softmax", dim))
            case t.Dropout():
                call = op.call
                self.steps.append(("dropout", tests, self.resolve(call.probability), self.resolve(call.training), call.module))
            case t.Cast():
                pass  # the port decides the operands' dtype itself
            case t.Output():
                if op.order is not None or op.value_order is not None or op.value_left or op.shared or op.single:
                    raise _Unread("output laid out")
            case t.View() | t.ZeroRows() | t.Guard() | t.Shift() | t.Transpose() | t.HeadMask():
                raise _Unread(type(op).__name__)
            case _:
                t.unreachable(op)

    def tests_now(self) -> tuple[ast.expr, ...]:
        return tuple(self.tests)

    # ------------------------------------------------------------------ expressions

    def resolve(self, node: cst.BaseExpression) -> ast.expr:
        """The expression with each local replaced by the value it holds."""
        return _Substitute(self.env).visit(_parsed(node))  # type: ignore[no-any-return]

    def resolve_statement(self, node: cst.BaseSmallStatement) -> ast.AST:
        parsed = ast.parse(code(cst.SimpleStatementLine(body=[node])).strip())
        return _Substitute(self.env).visit(parsed)  # type: ignore[no-any-return]

    def normal(self, node: N) -> N:
        normal = _Normal(self).visit(copy.deepcopy(node))
        assert isinstance(normal, type(node)) or isinstance(node, ast.expr)
        return normal  # type: ignore[no-any-return]

    def rank_of(self, node: ast.expr) -> int | None:
        if isinstance(node, ast.Name) and node.id.startswith(FORWARD):
            known = self.sizes.rank(node.id[1:])
            if known is not None:
                return known
        return self.ranks.get(ast.dump(node))

    def size_key(self, node: ast.expr) -> str | None:
        node = self.normal(node)
        if isinstance(node, ast.Constant) and node.value == -1:
            return None
        return ast.dump(node)


_AUGMENTED: dict[type, type[ast.operator]] = {
    cst.DivideAssign: ast.Div, cst.MultiplyAssign: ast.Mult, cst.AddAssign: ast.Add, cst.SubtractAssign: ast.Sub
}


def _parsed(node: cst.BaseExpression) -> ast.expr:
    return ast.parse(code(node).strip(), mode="eval").body


def _forward(node: ast.expr) -> ast.expr:
    """An argument forward passes: its names are forward's (`self` is the helper's too)."""
    for found in ast.walk(node):
        if isinstance(found, ast.Name) and found.id != "self":
            found.id = FORWARD + found.id
    return node


def _call(receiver: ast.expr, method: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Attribute(value=receiver, attr=method, ctx=ast.Load()), args=list(args), keywords=[])


def _targets(small: cst.BaseSmallStatement) -> list[str]:
    if isinstance(small, cst.Assign):
        return [n for target in small.targets for n in assigned_names(target.target)]
    if isinstance(small, (cst.AugAssign, cst.AnnAssign)):
        return assigned_names(small.target)
    return []


def _shape_read(node: ast.expr) -> ast.expr | None:
    """The tensor of `x.size()` or `x.shape`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size" and not node.args:
        return node.func.value
    if isinstance(node, ast.Attribute) and node.attr == "shape":
        return node.value
    return None


def _factors(node: ast.expr) -> list[tuple[tuple[ast.expr, ...], bool, ast.expr]]:
    """A scale as the factors it multiplies or divides 1 by, in order, each with the tests it runs under:
    `f = 1.0; if a: f /= x` is `[((a,), True, x)]`. A value of another form is one factor."""
    if isinstance(node, ast.Constant) and node.value in (1, 1.0) and not isinstance(node.value, bool):
        return []
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult)):
        return [*_factors(node.left), ((), isinstance(node.op, ast.Div), node.right)]
    if isinstance(node, ast.IfExp):
        taken, other = _factors(node.body), _factors(node.orelse)
        same = len(other) <= len(taken) and all(ast.dump(_as_expr(a)) == ast.dump(_as_expr(b)) for a, b in zip(taken, other))
        if same:
            return [*other, *(((node.test, *tests), divide, f) for tests, divide, f in taken[len(other) :])]
    return [((), False, node)]


def _as_expr(factor: tuple[tuple[ast.expr, ...], bool, ast.expr]) -> ast.expr:
    tests, divide, value = factor
    return ast.Tuple([ast.Tuple(list(tests), ast.Load()), ast.Constant(divide), value], ast.Load())


def _float_free(node: ast.expr) -> ast.expr:
    """A factor with `float(n)` of a size read as `n`: an integer size divides or multiplies a float exactly as its
    float does (`n ** 0.5` converts it alike)."""
    return _FloatFree().visit(copy.deepcopy(node))  # type: ignore[no-any-return]


class _FloatFree(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "float" and len(node.args) == 1 and not node.keywords:
            inner = node.args[0]
            if _shape_read(inner) is None and _size_read(inner):
                return inner
        return node


def _size_read(node: ast.expr) -> bool:
    """`x.size(i)`, `x.size()[i]`, `x.shape[i]`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size":
        return len(node.args) == 1
    return isinstance(node, ast.Subscript) and _shape_read(node.value) is not None


class _Substitute(ast.NodeTransformer):
    """Names read replaced by the values they hold."""

    def __init__(self, env: Mapping[str, ast.expr]) -> None:
        self.env = env

    def visit_Name(self, node: ast.Name) -> ast.AST:
        held = self.env.get(node.id)
        return copy.deepcopy(held) if held is not None and isinstance(node.ctx, ast.Load) else node


class _Normal(ast.NodeTransformer):
    """One form for reads that are the same value: `x.size()[i]`, `x.shape[i]` and `x.size(i)` as `x.size(i)` with
    `i` counted from the front (where x's rank is known), a size forward's text tells as that size, the dtype or
    device of a view as its tensor's, a 0-d tensor however it is made, `a if t else a` as `a`."""

    def __init__(self, reader: _Reader) -> None:
        self.reader = reader

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        tensor = _shape_read(node.value)
        if tensor is not None and isinstance(node.slice, (ast.Constant, ast.UnaryOp)):
            return self.visit_Call(_call(tensor, "size", node.slice))
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "size" and len(node.args) == 1 and not node.keywords:
            return self.size(func.value, node)
        scalar = _scalar_tensor(node)
        return scalar if scalar is not None else node

    def size(self, tensor: ast.expr, node: ast.Call) -> ast.AST:
        rank = self.reader.rank_of(tensor)
        (index,) = integers(node.args)
        if index is None:
            return node
        if rank is not None and -rank <= index < 0:
            index += rank
        if isinstance(tensor, ast.Name) and tensor.id.startswith(FORWARD) and index >= 0:
            known = self.reader.sizes.known(tensor.id[1:], index)
            if known is not None:
                return ast.Call(ast.Name(SIZE, ast.Load()), [ast.Constant(known)], [])
        return _call(tensor, "size", ast.Constant(index))

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        """`x.reshape(...).dtype` as `x.dtype`: views keep the dtype and the device."""
        self.generic_visit(node)
        if node.attr in ("dtype", "device"):
            viewed = node.value
            while _viewed(viewed):
                viewed = viewed.func.value  # type: ignore[attr-defined]
            return ast.Attribute(viewed, node.attr, ast.Load())
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        return node.body if ast.dump(node.body) == ast.dump(node.orelse) else node


def _viewed(node: ast.expr) -> bool:
    """A view of a tensor in its own dtype (`views.dtype_view` tells the others)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in VIEW_METHODS
        and not dtype_view(node)
    )


def _scalar_tensor(node: ast.Call) -> ast.Call | None:
    """`torch.full([], x, dtype=d, device=v)`, `torch.tensor(x, dtype=d, device=v)` and `torch.tensor(x, dtype=d)
    .to(v.device)` as one form: a 0-d tensor of x in dtype d on device v."""
    func = ast.unparse(node.func)
    keywords = {k.arg: k.value for k in node.keywords}
    device = keywords.pop("device", None)
    dtype = keywords.pop("dtype", None)
    if func.endswith(".to") and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Attribute):
        made = node.func.value  # type: ignore[attr-defined]
        if (
            node.args[0].attr == "device"
            and isinstance(made, ast.Call)
            and ast.unparse(made.func) == SCALAR
            and ast.dump(made.args[2]) == ast.dump(ast.Constant(None))
        ):
            return ast.Call(made.func, [made.args[0], made.args[1], node.args[0]], [])
        return None
    if keywords or dtype is None:
        return None
    if func == "torch.full" and len(node.args) == 2 and isinstance(node.args[0], (ast.List, ast.Tuple)) and not node.args[0].elts:
        value = node.args[1]
    elif func == "torch.tensor" and len(node.args) == 1:
        value = node.args[0]
    else:
        return None
    return ast.Call(ast.Name(SCALAR, ast.Load()), [value, dtype, device or ast.Constant(None)], [])
