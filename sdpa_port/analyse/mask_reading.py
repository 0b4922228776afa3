"""How one method is read over mask values: the statement reader `Reader` and the expression evaluator `Evaluator`.

They name the mask flow by the protocol `FlowView`, not by `mask_flow.MaskFlow`, so that they do not import the
module that imports them.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import Iterator, Protocol, Sequence

from sdpa_port.analyse.mask_helpers import CAUSAL_FUNCTIONS, EXTENDED, MaskHelpers
from sdpa_port.analyse.mask_values import (
    BIDIRECTIONAL_BUILDER,
    CAUSAL_BUILDER,
    MASK_MODULES,
    PER_IMPLEMENTATION_HELPERS,
    Builder,
    Kind,
    MethodFlow,
    Origin,
    Param,
    State,
    Value,
    Values,
    arg_names,
    bind,
    bound_argument,
    join,
    merged,
    reads_implementation,
    refine,
    self_attribute,
    shortened,
    unknown_origin,
)
from sdpa_port.analyse.module_sites import ModuleCall, ModuleSites
from sdpa_port.analyse.names import ImportMap


class FlowView(Protocol):
    """What `Reader` and `Evaluator` read of the mask flow, as `mask_flow.MaskFlow` documents it."""

    derive: bool
    helpers: MaskHelpers | None
    imports: ImportMap
    modules: ModuleSites
    per_implementation: frozenset[str]
    own_functions: frozenset[str]
    stateful: frozenset[str]

    def decided(self, test: ast.expr, class_name: str) -> bool | None: ...

    def flow(self, class_name: str, name: str) -> MethodFlow: ...

    def reading(self, class_name: str, name: str) -> bool: ...


class Reader:
    """Abstract interpretation of one method over mask values, structured control flow only."""

    def __init__(self, flows: FlowView, class_name: str, function: ast.FunctionDef, flow: MethodFlow) -> None:
        self.flows = flows
        self.context = (class_name, function.name)
        self.function = function
        self.out = flow

    def run(self) -> None:
        args = self.function.args
        env: dict[str, Values] = {}
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            env[arg.arg] = frozenset({Param(arg.arg)})
        if self.flows.derive and arg_names(self.function)[:1] == ["self"]:
            env["self"] = frozenset()  # the module: no mask
        self.block(self.function.body, State(env, frozenset()))

    def block(self, statements: Sequence[ast.stmt], state: State | None) -> State | None:
        for statement in statements:
            if state is None:
                return None
            state = self.statement(statement, state)
        return state

    def record(self, node: ast.AST | None, state: State) -> None:
        if node is None:
            return
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call):
                previous = self.out.at_call.get(inner)
                self.out.at_call[inner] = state if previous is None else merged(previous, state)

    def value(self, node: ast.expr, state: State) -> Values:
        return Evaluator(self.flows, self.context, state).value(node)

    def statement(self, node: ast.stmt, state: State) -> State | None:
        walrus = {n.target.id for n in _header_nodes(node) if isinstance(n, ast.NamedExpr)}
        if walrus:  # `(name := ...)`: not followed
            state = bind(state, walrus, unknown_origin(node, "an assignment expression"))
        if isinstance(node, ast.Assign):
            self.record(node.value, state)
            for target in node.targets:
                state = self.assign(target, node.value, state)
            return state
        if isinstance(node, ast.AnnAssign):
            if node.value is None:
                return state
            self.record(node.value, state)
            return self.assign(node.target, node.value, state)
        if isinstance(node, ast.AugAssign):
            self.record(node.value, state)
            if self.flows.derive:
                changed = self.value(node.target, state) | self.value(node.value, state)
                return bind(state, _stored_names(node.target), changed)
            return bind(state, _stored_names(node.target), unknown_origin(node, "a mask changed in place"))
        if isinstance(node, ast.Expr):
            self.record(node.value, state)
            return state
        if isinstance(node, ast.Return):
            self.record(node.value, state)
            if node.value is not None:
                self.out.returns.append((node.value, state))
            return None
        if isinstance(node, ast.Raise):
            self.record(node, state)
            return None
        if isinstance(node, ast.If):
            self.record(node.test, state)
            yes, no = refine(node.test, state)
            decided = self.flows.decided(node.test, self.context[0])
            if decided is not None:  # a test of the implementation, on the SDPA side: one branch runs
                return self.block(node.body, yes) if decided else self.block(node.orelse, no)
            return join(self.block(node.body, yes), self.block(node.orelse, no))
        if isinstance(node, (ast.For, ast.While)):
            self.record(node.iter if isinstance(node, ast.For) else node.test, state)
            current = state
            if isinstance(node, ast.For):
                items = self.value(node.iter, state) if self.flows.derive else unknown_origin(node, "a loop variable")
                current = bind(current, _stored_names(node.target), items)
            for _ in range(4):
                after = self.block(node.body, current)
                joined = join(current, after)
                assert joined is not None
                if joined.env == current.env and joined.nonnull == current.nonnull:
                    break
                current = joined
            return join(current, self.block(node.orelse, current))
        if isinstance(node, ast.With):
            for item in node.items:
                self.record(item.context_expr, state)
                if item.optional_vars is not None:
                    state = bind(state, _stored_names(item.optional_vars), unknown_origin(node, "a `with` target"))
            return self.block(node.body, state)
        if isinstance(node, ast.Try):
            body = self.block(node.body, state)
            start = join(state, body)
            assert start is not None
            ends = [self.block(node.orelse, body) if body is not None else None]
            ends += [self.block(handler.body, start) for handler in node.handlers]
            end: State | None = None
            for one in ends:
                end = join(end, one)
            return self.block(node.finalbody, end) if node.finalbody and end is not None else end
        if isinstance(
            node, (ast.Pass, ast.Assert, ast.Global, ast.Nonlocal, ast.Import, ast.ImportFrom, ast.Break, ast.Continue)
        ):
            return state
        # anything else (nested definitions, match, delete): the names it binds are unknown, its calls seen as they are
        self.record(node, state)
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        return bind(state, names, unknown_origin(node, "a name bound by a statement not followed"))

    def assign(self, target: ast.expr, value: ast.expr, state: State) -> State:
        if isinstance(target, ast.Name):
            return bind(state, {target.id}, self.value(value, state))
        if isinstance(target, (ast.Tuple, ast.List)):
            parts = self.unpacked(value, len(target.elts), state)
            for element, part in zip(target.elts, parts):
                if isinstance(element, ast.Name):
                    state = bind(state, {element.id}, part)
                else:
                    state = bind(state, _stored_names(element), unknown_origin(target, "an unpacked value"))
            return state
        return state  # attributes and subscripts are not names

    def unpacked(self, value: ast.expr, count: int, state: State) -> list[Values]:
        unknown = unknown_origin(value, "an unpacked value")
        if (
            isinstance(value, (ast.Tuple, ast.List))
            and len(value.elts) == count
            and not any(isinstance(e, ast.Starred) for e in value.elts)
        ):
            return [self.value(e, state) for e in value.elts]
        if isinstance(value, ast.Call):
            method = _own_method_call(value)
            evaluator = Evaluator(self.flows, self.context, state)
            own = method is not None and self.flows.modules.method(self.context[0], method) is not None
            if own and not (self.flows.derive and evaluator.per_implementation(value, method) is not None):
                assert method is not None
                return evaluator.returned(value, method, count)
        if self.flows.derive:
            return [self.value(value, state)] * count
        return [unknown] * count


class Evaluator:
    """The mask values of an expression at one point of a method."""

    def __init__(self, flows: FlowView, context: tuple[str, str], state: State) -> None:
        self.flows = flows
        self.context = context
        self.state = state

    def value(self, node: ast.expr) -> Values:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and node.value is None:
            return frozenset({Origin(Kind.NONE, line)})
        if isinstance(node, ast.Name):
            if node.id in self.state.env:
                return self.state.env[node.id]
            if node.id == CAUSAL_BUILDER:
                return frozenset({Builder(Kind.CAUSAL, line)})
            if node.id == BIDIRECTIONAL_BUILDER:
                return frozenset({Builder(Kind.BIDIRECTIONAL, line)})
            helper = self.flows.helpers.builder(node.id) if self.flows.helpers is not None else None
            if helper is not None:
                return frozenset({Builder(Kind.CAUSAL if helper in CAUSAL_FUNCTIONS else Kind.BIDIRECTIONAL, line)})
            if self.flows.derive:
                return frozenset()  # a global, a builtin or `self`: no mask of this call
            return unknown_origin(node, f"`{node.id}`")
        if isinstance(node, ast.IfExp):
            body, orelse = self.value(node.body), self.value(node.orelse)
            kinds = {v.kind for v in body | orelse if isinstance(v, Builder)}
            if (
                len(body) == len(orelse) == 1
                and all(isinstance(v, Builder) for v in body | orelse)
                and kinds == {Kind.CAUSAL, Kind.BIDIRECTIONAL}
            ):
                condition = ast.unparse(node.test)
                if any(isinstance(v, Builder) and v.kind is Kind.BIDIRECTIONAL for v in body):
                    condition = f"not ({condition})"
                return frozenset({Builder(Kind.CONDITIONAL, line, condition)})
            return body | orelse
        if isinstance(node, ast.Call):
            return self.call(node)
        if self.flows.derive and self_attribute(node) in self.flows.stateful:
            return unknown_origin(node, f"`{shortened(node)}`, set outside `__init__`")
        if self.flows.derive:
            return self._parts(node)
        return unknown_origin(node, f"`{shortened(node)}`")

    def _parts(self, node: ast.AST) -> Values:
        """Derivation: the values of every expression `node` is computed from."""
        out: set[Value] = set()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                out |= self.value(child)
            elif isinstance(child, (ast.keyword, ast.comprehension)):
                out |= self._parts(child)
        return frozenset(out)

    def call(self, node: ast.Call) -> Values:
        line = node.lineno
        method = _own_method_call(node)
        if self.flows.derive:
            built = self.per_implementation(node, method)
            if built is not None:
                return frozenset({Origin(Kind.PER_IMPLEMENTATION, line, built)})
        if method is not None and self.flows.modules.method(self.context[0], method) is not None:
            return self.returned(node, method, 0)[0]
        helpers = self.flows.helpers
        if method == EXTENDED and helpers is not None and self.context[0] in helpers.extended:
            return frozenset({Origin(Kind.BIDIRECTIONAL, line, f"`self.{EXTENDED}(...)`")})
        if not self.flows.derive and _to_bool(node):
            assert isinstance(node.func, ast.Attribute)
            masks = self.value(node.func.value)
            if masks and all(isinstance(v, Origin) and v.kind in BUILT for v in masks):
                return frozenset(replace(v, to_bool=True) for v in masks if isinstance(v, Origin))
        functions = self.value(node.func) if isinstance(node.func, (ast.Name, ast.IfExp)) else frozenset()
        if functions and all(isinstance(f, Builder) for f in functions):
            out: set[Value] = set()
            for function in functions:
                assert isinstance(function, Builder)
                out.add(Origin(function.kind, line, function.condition))
            return frozenset(out)
        if self.flows.derive:
            if method is not None or isinstance(node.func, ast.Name) and node.func.id in self.state.env:
                return frozenset()  # a module of this one (`self.layer(...)`, a loop over layers): hidden states
            arguments = self._parts(ast.Tuple(elts=[*node.args], ctx=ast.Load()))
            arguments |= frozenset(v for k in node.keywords for v in self.value(k.value))
            if isinstance(node.func, ast.Attribute):  # `mask.to(dtype)`, `torch.cat(...)`
                arguments |= self.value(node.func.value)
            return arguments
        return unknown_origin(node, f"`{shortened(node.func)}(...)`")

    def per_implementation(self, node: ast.Call, method: str | None) -> str | None:
        """The name of what `node` calls when that builds masks per implementation."""
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name is None:
            return None
        if method is not None:
            found = self.flows.modules.method(self.context[0], method)
            if found is not None:
                return method if reads_implementation(found[1]) else None
            return method if method in PER_IMPLEMENTATION_HELPERS else None
        if isinstance(func, ast.Name) and name in self.state.env:
            return None
        if name in self.flows.per_implementation:
            return name
        if isinstance(func, ast.Name) and name in self.flows.own_functions:
            return None  # the file's own function of that name, read above: it builds nothing per implementation
        if name in PER_IMPLEMENTATION_HELPERS:
            return name
        qualified = self.flows.imports.aliases.get(name, "") if isinstance(func, ast.Name) else ""
        return name if any(part in qualified for part in MASK_MODULES) else None

    def returned(self, call: ast.Call, method: str, count: int) -> list[Values]:
        """What `self.<method>(...)` returns (each of `count` unpacked values, or the whole when 0), its parameters
        bound to this call's arguments."""
        unknown = unknown_origin(call, f"`self.{method}(...)`")
        found = self.flows.modules.method(self.context[0], method)
        if found is None:
            return [unknown] * max(count, 1)
        owner, function = found
        flow = self.flows.flow(owner, method)
        if self.flows.reading(owner, method):
            return [unknown] * max(count, 1)
        use = ModuleCall(("", ""), frozenset({owner}), call, tuple(call.args), tuple(call.keywords), self.context)
        parts: list[set[Value]] = [set() for _ in range(max(count, 1))]
        if not flow.returns:
            return [unknown] * max(count, 1)
        for returned, state in flow.returns:
            inner = Evaluator(self.flows, (owner, method), state)
            if count:
                if not (isinstance(returned, ast.Tuple) and len(returned.elts) == count):
                    return [unknown] * count
                values = [inner.value(e) for e in returned.elts]
            else:
                values = [inner.value(returned)]
            for index, value in enumerate(values):
                parts[index] |= self._substituted(value, use, function)
        return [frozenset(p) for p in parts]

    def _substituted(self, values: Values, use: ModuleCall, function: ast.FunctionDef) -> set[Value]:
        out: set[Value] = set()
        for value in values:
            if not isinstance(value, Param):
                out.add(value)
                continue
            bound = bound_argument(use, function, value.name, self.flows.derive)
            out |= {bound} if isinstance(bound, Origin) else self.value(bound)
        return out


def _header_nodes(statement: ast.stmt) -> Iterator[ast.AST]:
    """The nodes of a statement outside the blocks it holds."""
    blocks = ("body", "orelse", "finalbody", "handlers")
    for name, value in ast.iter_fields(statement):
        if name in blocks:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.AST):
                yield from ast.walk(item)


def _stored_names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


BUILT = (Kind.CAUSAL, Kind.BIDIRECTIONAL, Kind.CONDITIONAL)


def _to_bool(node: ast.Call) -> bool:
    """`x.to(torch.bool)` or `x.bool()`."""
    func = node.func
    if not isinstance(func, ast.Attribute) or node.keywords:
        return False
    if func.attr == "bool":
        return not node.args
    return (
        func.attr == "to"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Attribute)
        and node.args[0].attr == "bool"
        and isinstance(node.args[0].value, ast.Name)
        and node.args[0].value.id == "torch"
    )


def _own_method_call(node: ast.Call) -> str | None:
    """`self.<name>(...)`: the name."""
    return self_attribute(node.func)
