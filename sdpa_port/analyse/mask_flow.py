"""Which masks reach each construction of a module: followed from the mask builders through the calls (read-only).

A module is built at a *site* (`module_sites.py`: `self.self_attn = BartAttention(...)`, `self.layers =
nn.ModuleList([Layer(...) for ...])`). Its forward receives, as its mask, the argument of the calls made through that
attribute (`self.self_attn(..., attention_mask=attention_mask)`, `for layer in self.layers: layer(hidden_states,
mask)`), which is a parameter of the calling forward, followed in turn through the calls of its own class, until it
is built: by `create_causal_mask(...)`, by `create_bidirectional_mask(...)`, by
one of them chosen under a condition, or not at all (None). Anything else (a mask from outside the file, a call not
followed, a module handed away) is an unknown origin, and a site with one is not decided.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Sequence

from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.mask_helpers import CAUSAL_FUNCTIONS, EXTENDED, MaskHelpers
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.names import ImportMap
from sdpa_port.analyse.module_sites import ModuleCall, Site, module_sites, parameter_default

CAUSAL_BUILDER = "create_causal_mask"
BIDIRECTIONAL_BUILDER = "create_bidirectional_mask"


class Kind(enum.Enum):
    CAUSAL = "create_causal_mask"
    BIDIRECTIONAL = "create_bidirectional_mask"
    CONDITIONAL = "a mask builder chosen by a condition"
    NONE = "no mask"
    UNKNOWN = "a mask of unknown origin"
    # followed for derivation only (`MaskFlow(derive=True)`): anything computed from a mask built per implementation
    PER_IMPLEMENTATION = "a value computed from a mask built per implementation"
    INPUT = "the model's own inputs"


@dataclass(frozen=True)
class Origin:
    """Where a mask reaching a module comes from."""

    kind: Kind
    line: int
    detail: str = ""  # the condition of a conditional builder, or why the origin is unknown
    # the builder's mask converted to booleans before it is handed on (`create_causal_mask(...).to(torch.bool)`):
    # under eager, True where the float mask masks; under the other implementations their own mask, converted
    to_bool: bool = False

    def describe(self) -> str:
        if self.to_bool:
            return f"`{self.kind.value}` converted to booleans (line {self.line})"
        if self.kind in (Kind.CAUSAL, Kind.BIDIRECTIONAL):
            return f"`{self.kind.value}` (line {self.line})"
        if self.kind is Kind.CONDITIONAL:
            return f"a builder chosen by `{self.detail}` (line {self.line})"
        if self.kind is Kind.NONE:
            return f"no mask (line {self.line})"
        if self.kind is Kind.PER_IMPLEMENTATION:
            return f"`{self.detail}` (line {self.line}), built per implementation"
        return f"{self.detail} (line {self.line})" if self.line else self.detail


@dataclass(frozen=True)
class _Param:
    """The value of a parameter of the function being read, resolved at its callers."""

    name: str


@dataclass(frozen=True)
class _Builder:
    """A mask builder itself (`build = create_causal_mask if c else create_bidirectional_mask`), not yet called."""

    kind: Kind
    line: int
    condition: str = ""


_Value = Origin | _Param | _Builder
_Values = frozenset[_Value]


@dataclass(frozen=True)
class SiteMasks:
    """The masks reaching the modules built at one site, over every call made through it."""

    site: Site
    origins: frozenset[Origin]
    calls: int  # self-attention calls followed
    cross_calls: int  # calls shown to hand the module encoder states (never causal)

    @property
    def kinds(self) -> frozenset[Kind]:
        return frozenset(o.kind for o in self.origins)

    @property
    def causal(self) -> bool | None:
        """True when every mask is causal, False when none is (bidirectional or absent), None when undecided."""
        kinds = self.kinds
        if Kind.UNKNOWN in kinds or Kind.CONDITIONAL in kinds:
            return None
        if not self.calls and not self.cross_calls:
            return None
        if kinds == {Kind.CAUSAL}:
            return True
        if Kind.CAUSAL in kinds:
            return None
        return False

    def why(self) -> str:
        """What the masks reaching the site are, or what keeps them from being known."""
        if not self.origins:
            return "it is only called for cross-attention" if self.cross_calls else "it is never called in this file"
        unknown = sorted((o for o in self.origins if o.kind is Kind.UNKNOWN), key=_order)
        known = sorted((o for o in self.origins if o.kind is not Kind.UNKNOWN), key=_order)
        if Kind.CAUSAL in self.kinds and len({o.kind for o in known}) > 1:
            return "it receives masks from " + _listed(known)
        conditional = [o for o in known if o.kind is Kind.CONDITIONAL]
        if conditional:
            return "its masks come from " + _listed(conditional)
        if unknown:
            return "its mask cannot be followed past " + _listed(unknown)
        return "its masks come from " + _listed(known)

    def not_causal(self) -> str | None:
        """The masks reaching the site that are not causal (bidirectional, absent, conditional), if any."""
        found = sorted((o for o in self.origins if o.kind not in (Kind.CAUSAL, Kind.UNKNOWN)), key=_order)
        return _listed(found) if found else None


def _order(origin: Origin) -> tuple[int, str, str]:
    return (origin.line, origin.kind.name, origin.detail)


def _listed(origins: Sequence[Origin], most: int = 4) -> str:
    parts = list(dict.fromkeys(o.describe() for o in origins))
    if len(parts) > most:
        parts = [*parts[: most - 1], f"{len(parts) - most + 1} more"]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


@dataclass
class _State:
    env: dict[str, _Values]
    nonnull: frozenset[str]  # names an enclosing test showed are not None


@dataclass
class _Flow:
    """One method read once: the values of its names before each call, and what it returns."""

    at_call: dict[ast.Call, _State] = field(default_factory=dict)
    returns: list[tuple[ast.expr, _State]] = field(default_factory=list)


Restriction = tuple[str, tuple[str, str]]  # (class, site): its forward is reached only through that site


class MaskFlow:
    """The mask flow of one file, computed on demand and kept.

    With `derive`, a value follows every mask it is computed from (`mask.to(dtype)`, `1.0 - mask`, what a method of
    the module returns from it), a call of anything that builds masks per implementation (the builders, the 4.x
    `_prepare_4d_*` helpers, a function or method of the file reading `_attn_implementation`) gives
    `Kind.PER_IMPLEMENTATION`, the parameters of a model's forward are `Kind.INPUT`, and what modules return (hidden
    states) carries no mask: the question answered is whether a parameter can hold anything built per
    implementation, not which builder built it.
    """

    def __init__(self, facts: ModuleFacts, derive: bool = False, helpers: MaskHelpers | None = None) -> None:
        self.derive = derive
        # with `helpers` (the class style's question: where may a `_for_sdpa` helper's None arrive, and what does it
        # mean), Transformers' own 4.x helpers and their twins build masks too: the causal ones causal masks, the
        # plain ones and the inherited `get_extended_attention_mask` (swapped only where the config is no decoder)
        # masks whose None means no mask
        self.helpers = helpers
        self.facts = facts
        self.imports = facts.imports
        self.modules = module_sites(facts)
        self.per_implementation = _per_implementation_functions(self.modules.tree, facts.imports)
        # the file's own module-level functions (another library's helper may have transformers' name)
        self.own_functions = frozenset(n.name for n in self.modules.tree.body if isinstance(n, ast.FunctionDef))
        # attributes of a module set outside `__init__`: state a derivation cannot follow
        self.stateful = frozenset(
            name
            for class_name in self.modules.classes
            for function in self.modules.methods(class_name)
            if function.name != "__init__"
            for node in ast.walk(function)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            for name in [_self_attribute(node)]
            if name is not None
        )
        self._flows: dict[tuple[str, str], _Flow] = {}
        self._reading: set[tuple[str, str]] = set()
        self._params: dict[tuple[str, str, str, Restriction | None], frozenset[Origin]] = {}
        self._active: set[tuple[str, str, str, Restriction | None]] = set()

    def decided(self, test: ast.expr, class_name: str) -> bool | None:
        """With `helpers`, the value on the SDPA side of a test of the implementation (`config._attn_implementation
        == "flash_attention_2"`, or a flag of the module's `__init__` set so), None for any other test."""
        if self.helpers is None:
            return None
        return implementation_test(test, lambda name: self._flag_values(class_name, name))

    def _flag_values(self, class_name: str, name: str) -> list[ast.expr] | None:
        values = self.facts.find_attribute_values(class_name, name)
        if not values:
            return None
        parsed = [ast.parse(code(v).strip(), mode="eval").body for v in values]
        return parsed

    # ------------------------------------------------------------------ values inside one method

    def flow(self, class_name: str, name: str) -> _Flow:
        """The values of `class_name.name`'s names (the class defining it), read once."""
        key = (class_name, name)
        if key not in self._flows:
            found = self.modules.method(class_name, name)
            flow = _Flow()
            self._flows[key] = flow
            if found is not None and key not in self._reading:
                self._reading.add(key)
                _Reader(self, found[0], found[1], flow).run()
                self._reading.discard(key)
        return self._flows[key]

    def reading(self, class_name: str, name: str) -> bool:
        """That method is being read (a method returning through itself): its returns are not all known yet."""
        return (class_name, name) in self._reading

    # ------------------------------------------------------------------ masks at sites

    def site_masks(
        self,
        site: Site,
        callee: str,
        mask_param: str,
        key_only: Sequence[str] = (),
        restrict: Restriction | None = None,
        cross_origins: bool = False,
    ) -> SiteMasks:
        """The masks `callee`'s forward receives in `mask_param` from the calls through `site`.

        A call handing a key-only parameter (encoder states) a value an enclosing test shows is not None is a
        cross-attention call, never causal; its mask does not count, unless `cross_origins` (where the question is
        what the mask is, not whether the call is causal). With `restrict`, the forward of that class is followed
        only into calls through that site (a module built there, and what it builds in turn).
        """
        found = self.modules.method(callee, "forward")
        if found is None:
            return SiteMasks(
                site, frozenset({Origin(Kind.UNKNOWN, site.line, f"`{callee}`, which has no forward")}), 0, 0
            )
        function = found[1]
        origins: set[Origin] = set()
        calls = cross = 0
        for use in self.modules.uses:
            if use.site != site.key:
                continue
            state = self._state_at(use)
            if any(_is_nonnull(_bound(use, function, k), state) for k in key_only):
                cross += 1
                if cross_origins:
                    origins |= self._argument_origins(use, function, mask_param, state, restrict)
                continue
            calls += 1
            origins |= self._argument_origins(use, function, mask_param, state, restrict)
        for line in self.modules.escapes(site.key):
            origins.add(Origin(self._escaped(site), line, f"`{site.name}`, used in a way not followed"))
        return SiteMasks(site, frozenset(origins), calls, cross)

    def _state_at(self, use: ModuleCall) -> _State:
        flow = self.flow(*use.context)
        return flow.at_call.get(use.call, _State({}, frozenset()))

    def _argument_origins(
        self, use: ModuleCall, function: ast.FunctionDef, param: str, state: _State, restrict: Restriction | None
    ) -> frozenset[Origin]:
        bound = _bound(use, function, param, self.derive)
        if isinstance(bound, Origin):
            return frozenset({bound})
        values = _Evaluator(self, use.context, state).value(bound)
        return self._expand(values, use.context, restrict)

    def _expand(self, values: _Values, context: tuple[str, str], restrict: Restriction | None) -> frozenset[Origin]:
        out: set[Origin] = set()
        for value in values:
            if isinstance(value, Origin):
                out.add(value)
            elif isinstance(value, _Param):
                out |= self.param_origins(context[0], context[1], value.name, restrict)
            else:
                out.add(Origin(Kind.UNKNOWN, value.line, "a mask builder passed on uncalled"))
        return frozenset(out)

    def param_origins(
        self, class_name: str, method: str, param: str, restrict: Restriction | None = None
    ) -> frozenset[Origin]:
        """The masks parameter `param` of `class_name.method` (the class defining it) receives from its callers."""
        key = (class_name, method, param, restrict)
        if key in self._params:
            return self._params[key]
        found = self.modules.method(class_name, method)
        line = found[1].lineno if found is not None else 0
        if key in self._active or found is None:
            return frozenset(
                {Origin(Kind.UNKNOWN, line, f"`{param}` of `{class_name}.{method}`, passed round in a cycle")}
            )
        self._active.add(key)
        origins: set[Origin] = set()
        callers = list(self._callers(class_name, method, restrict))
        for use in callers:
            state = self._state_at(use)
            origins |= self._argument_origins(use, found[1], param, state, restrict)
        origins |= self._outside_callers(class_name, method, param, line, restrict)
        if not callers and not origins:
            origins.add(
                Origin(Kind.UNKNOWN, line, f"`{param}` of `{class_name}.{method}`, which nothing in this file calls")
            )
        self._active.discard(key)
        result = frozenset(origins)
        self._params[key] = result
        return result

    def _callers(self, class_name: str, method: str, restrict: Restriction | None) -> Iterator[ModuleCall]:
        if method == "forward":
            for use in self.modules.uses:
                if not any(self._defines_forward(held) == class_name for held in use.classes):
                    continue
                if (
                    restrict is not None
                    and self._defines_forward(restrict[0]) == class_name
                    and use.site != restrict[1]
                ):
                    continue
                yield use
        for other in self.modules.subclasses(class_name):
            resolved = self.modules.method(other, method)
            own = method != "forward" and resolved is not None and resolved[0] == class_name
            for function in self.modules.methods(other):
                flow = self.flow(other, function.name)
                for call in flow.at_call:
                    if _calls_method(call, method, by_self=own, by_super=other != class_name):
                        context = (other, function.name)
                        yield ModuleCall(
                            ("", ""), frozenset({other}), call, tuple(call.args), tuple(call.keywords), context
                        )

    def _outside_callers(
        self, class_name: str, method: str, param: str, line: int, restrict: Restriction | None
    ) -> set[Origin]:
        out: set[Origin] = set()
        if method != "forward":
            return out
        runs = {c for c in self.modules.classes if self._defines_forward(c) == class_name}
        if restrict is not None and self._defines_forward(restrict[0]) == class_name:
            return out  # only the modules of that site
        for construction in self.modules.constructions():
            if construction.site is None and construction.class_name in runs:
                out.add(
                    Origin(
                        Kind.UNKNOWN,
                        construction.line,
                        f"`{construction.class_name}`, built outside a module attribute",
                    )
                )
        for site in self.modules.sites_of(runs):
            for escape in self.modules.escapes(site.key):
                out.add(Origin(self._escaped(site), escape, f"`{site.name}`, used in a way not followed"))
        for name in sorted(runs):
            if self.modules.is_pretrained(name):
                kind = Kind.INPUT if self.derive else Kind.UNKNOWN
                out.add(Origin(kind, line, f"`{param}` of `{name}.forward`, which callers outside this file pass"))
                break
        return out

    def _escaped(self, site: Site) -> Kind:
        """What a module handed away (`get_encoder()` returning it) may be called with: anything, except that,
        deriving, a model's own forward is called with a model's inputs (`generate` calls the encoder so)."""
        if self.derive and site.classes and all(self.modules.is_pretrained(c) for c in site.classes):
            return Kind.INPUT
        return Kind.UNKNOWN

    def _defines_forward(self, class_name: str) -> str | None:
        found = self.modules.method(class_name, "forward")
        return found[0] if found is not None else None


# ------------------------------------------------------------------ reading one method


class _Reader:
    """Abstract interpretation of one method over mask values, structured control flow only."""

    def __init__(self, flows: MaskFlow, class_name: str, function: ast.FunctionDef, flow: _Flow) -> None:
        self.flows = flows
        self.context = (class_name, function.name)
        self.function = function
        self.out = flow

    def run(self) -> None:
        args = self.function.args
        env: dict[str, _Values] = {}
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            env[arg.arg] = frozenset({_Param(arg.arg)})
        if self.flows.derive and arg_names(self.function)[:1] == ["self"]:
            env["self"] = frozenset()  # the module: no mask
        self.block(self.function.body, _State(env, frozenset()))

    def block(self, statements: Sequence[ast.stmt], state: _State | None) -> _State | None:
        for statement in statements:
            if state is None:
                return None
            state = self.statement(statement, state)
        return state

    def record(self, node: ast.AST | None, state: _State) -> None:
        if node is None:
            return
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call):
                previous = self.out.at_call.get(inner)
                self.out.at_call[inner] = state if previous is None else _merged(previous, state)

    def value(self, node: ast.expr, state: _State) -> _Values:
        return _Evaluator(self.flows, self.context, state).value(node)

    def statement(self, node: ast.stmt, state: _State) -> _State | None:
        walrus = {n.target.id for n in _header_nodes(node) if isinstance(n, ast.NamedExpr)}
        if walrus:  # `(name := ...)`: not followed
            state = _bind(state, walrus, _unknown(node, "an assignment expression"))
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
                return _bind(state, _stored_names(node.target), changed)
            return _bind(state, _stored_names(node.target), _unknown(node, "a mask changed in place"))
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
            yes, no = _refine(node.test, state)
            decided = self.flows.decided(node.test, self.context[0])
            if decided is not None:  # a test of the implementation, on the SDPA side: one branch runs
                return self.block(node.body, yes) if decided else self.block(node.orelse, no)
            return _join(self.block(node.body, yes), self.block(node.orelse, no))
        if isinstance(node, (ast.For, ast.While)):
            self.record(node.iter if isinstance(node, ast.For) else node.test, state)
            current = state
            if isinstance(node, ast.For):
                items = self.value(node.iter, state) if self.flows.derive else _unknown(node, "a loop variable")
                current = _bind(current, _stored_names(node.target), items)
            for _ in range(4):
                after = self.block(node.body, current)
                joined = _join(current, after)
                assert joined is not None
                if joined.env == current.env and joined.nonnull == current.nonnull:
                    break
                current = joined
            return _join(current, self.block(node.orelse, current))
        if isinstance(node, ast.With):
            for item in node.items:
                self.record(item.context_expr, state)
                if item.optional_vars is not None:
                    state = _bind(state, _stored_names(item.optional_vars), _unknown(node, "a `with` target"))
            return self.block(node.body, state)
        if isinstance(node, ast.Try):
            body = self.block(node.body, state)
            start = _join(state, body)
            assert start is not None
            ends = [self.block(node.orelse, body) if body is not None else None]
            ends += [self.block(handler.body, start) for handler in node.handlers]
            end: _State | None = None
            for one in ends:
                end = _join(end, one)
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
        return _bind(state, names, _unknown(node, "a name bound by a statement not followed"))

    def assign(self, target: ast.expr, value: ast.expr, state: _State) -> _State:
        if isinstance(target, ast.Name):
            return _bind(state, {target.id}, self.value(value, state))
        if isinstance(target, (ast.Tuple, ast.List)):
            parts = self.unpacked(value, len(target.elts), state)
            for element, part in zip(target.elts, parts):
                if isinstance(element, ast.Name):
                    state = _bind(state, {element.id}, part)
                else:
                    state = _bind(state, _stored_names(element), _unknown(target, "an unpacked value"))
            return state
        return state  # attributes and subscripts are not names

    def unpacked(self, value: ast.expr, count: int, state: _State) -> list[_Values]:
        unknown = _unknown(value, "an unpacked value")
        if (
            isinstance(value, (ast.Tuple, ast.List))
            and len(value.elts) == count
            and not any(isinstance(e, ast.Starred) for e in value.elts)
        ):
            return [self.value(e, state) for e in value.elts]
        if isinstance(value, ast.Call):
            method = _own_method_call(value)
            evaluator = _Evaluator(self.flows, self.context, state)
            own = method is not None and self.flows.modules.method(self.context[0], method) is not None
            if own and not (self.flows.derive and evaluator.per_implementation(value, method) is not None):
                assert method is not None
                return evaluator.returned(value, method, count)
        if self.flows.derive:
            return [self.value(value, state)] * count
        return [unknown] * count


class _Evaluator:
    """The mask values of an expression at one point of a method."""

    def __init__(self, flows: MaskFlow, context: tuple[str, str], state: _State) -> None:
        self.flows = flows
        self.context = context
        self.state = state

    def value(self, node: ast.expr) -> _Values:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and node.value is None:
            return frozenset({Origin(Kind.NONE, line)})
        if isinstance(node, ast.Name):
            if node.id in self.state.env:
                return self.state.env[node.id]
            if node.id == CAUSAL_BUILDER:
                return frozenset({_Builder(Kind.CAUSAL, line)})
            if node.id == BIDIRECTIONAL_BUILDER:
                return frozenset({_Builder(Kind.BIDIRECTIONAL, line)})
            helper = self.flows.helpers.builder(node.id) if self.flows.helpers is not None else None
            if helper is not None:
                return frozenset({_Builder(Kind.CAUSAL if helper in CAUSAL_FUNCTIONS else Kind.BIDIRECTIONAL, line)})
            if self.flows.derive:
                return frozenset()  # a global, a builtin or `self`: no mask of this call
            return _unknown(node, f"`{node.id}`")
        if isinstance(node, ast.IfExp):
            body, orelse = self.value(node.body), self.value(node.orelse)
            kinds = {v.kind for v in body | orelse if isinstance(v, _Builder)}
            if (
                len(body) == len(orelse) == 1
                and all(isinstance(v, _Builder) for v in body | orelse)
                and kinds == {Kind.CAUSAL, Kind.BIDIRECTIONAL}
            ):
                condition = ast.unparse(node.test)
                if any(isinstance(v, _Builder) and v.kind is Kind.BIDIRECTIONAL for v in body):
                    condition = f"not ({condition})"
                return frozenset({_Builder(Kind.CONDITIONAL, line, condition)})
            return body | orelse
        if isinstance(node, ast.Call):
            return self.call(node)
        if self.flows.derive and _self_attribute(node) in self.flows.stateful:
            return _unknown(node, f"`{_short(node)}`, set outside `__init__`")
        if self.flows.derive:
            return self._parts(node)
        return _unknown(node, f"`{_short(node)}`")

    def _parts(self, node: ast.AST) -> _Values:
        """Derivation: the values of every expression `node` is computed from."""
        out: set[_Value] = set()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                out |= self.value(child)
            elif isinstance(child, (ast.keyword, ast.comprehension)):
                out |= self._parts(child)
        return frozenset(out)

    def call(self, node: ast.Call) -> _Values:
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
        if functions and all(isinstance(f, _Builder) for f in functions):
            out: set[_Value] = set()
            for function in functions:
                assert isinstance(function, _Builder)
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
        return _unknown(node, f"`{_short(node.func)}(...)`")

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

    def returned(self, call: ast.Call, method: str, count: int) -> list[_Values]:
        """What `self.<method>(...)` returns (each of `count` unpacked values, or the whole when 0), its parameters
        bound to this call's arguments."""
        unknown = _unknown(call, f"`self.{method}(...)`")
        found = self.flows.modules.method(self.context[0], method)
        if found is None:
            return [unknown] * max(count, 1)
        owner, function = found
        flow = self.flows.flow(owner, method)
        if self.flows.reading(owner, method):
            return [unknown] * max(count, 1)
        use = ModuleCall(("", ""), frozenset({owner}), call, tuple(call.args), tuple(call.keywords), self.context)
        parts: list[set[_Value]] = [set() for _ in range(max(count, 1))]
        if not flow.returns:
            return [unknown] * max(count, 1)
        for returned, state in flow.returns:
            inner = _Evaluator(self.flows, (owner, method), state)
            if count:
                if not (isinstance(returned, ast.Tuple) and len(returned.elts) == count):
                    return [unknown] * count
                values = [inner.value(e) for e in returned.elts]
            else:
                values = [inner.value(returned)]
            for index, value in enumerate(values):
                parts[index] |= self._substituted(value, use, function)
        return [frozenset(p) for p in parts]

    def _substituted(self, values: _Values, use: ModuleCall, function: ast.FunctionDef) -> set[_Value]:
        out: set[_Value] = set()
        for value in values:
            if not isinstance(value, _Param):
                out.add(value)
                continue
            bound = _bound(use, function, value.name, self.flows.derive)
            out |= {bound} if isinstance(bound, Origin) else self.value(bound)
        return out


# ------------------------------------------------------------------ small helpers

# what builds masks per implementation, called by name: transformers' 5.x builders, the 4.x helpers (swapped for
# their `_for_sdpa` variants by a class-style port) and the models' own builders reading `_attn_implementation`
PER_IMPLEMENTATION_HELPERS = frozenset(
    {
        "create_causal_mask",
        "create_bidirectional_mask",
        "create_sliding_window_causal_mask",
        "create_chunked_causal_mask",
        "create_masks_for_generate",
        "_prepare_4d_causal_attention_mask",
        "_prepare_4d_attention_mask",
        "_prepare_4d_causal_attention_mask_for_sdpa",
        "_prepare_4d_attention_mask_for_sdpa",
        "get_extended_attention_mask",
        "_update_causal_mask",
        "_update_full_mask",
        "_update_cross_attn_mask",
    }
)
MASK_MODULES = ("masking_utils", "modeling_attn_mask_utils")


SDPA = "sdpa"


def implementation_test(test: ast.expr, flag: Callable[[str], list[ast.expr] | None]) -> bool | None:
    """The value of `test` where the implementation is "sdpa": a comparison of `<x>._attn_implementation` with
    string literals (`==`, `!=`, `in`, `not in`), `self.<flag>` where every value `flag` gives the attribute is
    such a comparison deciding alike, and `not`, `and`, `or` of them; None when the test does not follow."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = implementation_test(test.operand, flag)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        parts = [implementation_test(v, flag) for v in test.values]
        decisive = isinstance(test.op, ast.Or)  # `or`: one True decides; `and`: one False
        if decisive in parts:
            return decisive
        return None if None in parts else not decisive
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if not (isinstance(left, ast.Attribute) and left.attr == "_attn_implementation"):
            return None
        if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(right, ast.Constant) and isinstance(right.value, str):
            return (right.value == SDPA) == isinstance(op, ast.Eq)
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in right.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(names) != len(right.elts):
                return None
            return (SDPA in names) == isinstance(op, ast.In)
        return None
    attribute = _self_attribute(test)
    values = flag(attribute) if attribute is not None else None
    if not values:
        return None
    decisions = {implementation_test(v, lambda _: None) for v in values}
    return decisions.pop() if len(decisions) == 1 and None not in decisions else None


def reads_implementation(function: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr in ("_attn_implementation", "attn_implementation")
        or isinstance(n, ast.Name) and n.id in PER_IMPLEMENTATION_HELPERS
        for n in ast.walk(function)
    )


def _per_implementation_functions(tree: ast.Module, imports: ImportMap) -> frozenset[str]:
    """The file's module-level functions that read the implementation or call what builds masks per implementation
    (one level: enough for a helper wrapping a builder)."""
    out: set[str] = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        called = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        if reads_implementation(node) or any(
            any(part in imports.aliases.get(name, "") for part in MASK_MODULES) for name in called
        ):
            out.add(node.name)
    return frozenset(out)



def _unknown(node: ast.AST, why: str) -> _Values:
    return frozenset({Origin(Kind.UNKNOWN, getattr(node, "lineno", 0), why)})


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 40 else text[:37] + "..."


def _bind(state: _State, names: Iterable[str], values: _Values) -> _State:
    names = set(names)
    if not names:
        return state
    env = dict(state.env)
    for name in names:
        env[name] = values
    return _State(env, state.nonnull - names)


def _join(left: _State | None, right: _State | None) -> _State | None:
    if left is None:
        return right
    if right is None:
        return left
    env = dict(left.env)
    for name, values in right.env.items():
        env[name] = env.get(name, frozenset()) | values
    return _State(env, left.nonnull & right.nonnull)


def _merged(left: _State, right: _State) -> _State:
    joined = _join(left, right)
    assert joined is not None
    return joined


def _refine(test: ast.expr, state: _State) -> tuple[_State, _State]:
    """The states where `test` is true and where it is false: `x is not None` (in an `and` chain), `x is None`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yes, no = _refine(test.operand, state)
        return no, yes
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        yes = state
        for value in test.values:
            yes = _refine(value, yes)[0]
        return yes, state
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        no = state
        for value in test.values:
            no = _refine(value, no)[1]
        return state, no
    compared = none_comparison(test)
    if compared is not None:
        name, is_not = compared
        present = state.env.get(name, frozenset())
        not_none = _State(
            {**state.env, name: frozenset(v for v in present if not (isinstance(v, Origin) and v.kind is Kind.NONE))},
            state.nonnull | {name},
        )
        none = _State({**state.env, name: frozenset({Origin(Kind.NONE, test.lineno)})}, state.nonnull - {name})
        return (not_none, none) if is_not else (none, not_none)
    return state, state


def none_comparison(test: ast.expr) -> tuple[str, bool] | None:
    """`name is None` -> (name, False), `name is not None` -> (name, True); None for any other test."""
    if (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Is, ast.IsNot))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        return test.left.id, isinstance(test.ops[0], ast.IsNot)
    return None


def _is_nonnull(bound: ast.expr | Origin, state: _State) -> bool:
    return isinstance(bound, ast.Name) and bound.id in state.nonnull


def _bound(use: ModuleCall, function: ast.FunctionDef, param: str, derive: bool = False) -> ast.expr | Origin:
    """The argument a call binds to `param` of `function` (a method: `self` is not passed), or the origin of the
    value it gets otherwise (its None default, any constant default when deriving, or unknown)."""
    line = use.call.lineno
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    positional = arg_names(function)[0 if static else 1 :]
    for keyword in use.keywords:
        if keyword.arg == param:
            return keyword.value
    starred = next((i for i, a in enumerate(use.args) if isinstance(a, ast.Starred)), None)
    if param in positional:
        index = positional.index(param)
        if starred is not None and starred <= index:
            return Origin(Kind.UNKNOWN, line, f"`*{_short(use.args[starred])}`, which may hold `{param}`")
        if index < len(use.args):
            return use.args[index]
    spread = [k.value for k in use.keywords if k.arg is None]
    typed = all(isinstance(v, ast.Name) and v.id == use.typed_kwargs for v in spread)
    if spread and typed and derive:
        # the caller's own typed keywords, never written to: what the model's callers passed
        return Origin(Kind.INPUT, line, f"`**{use.typed_kwargs}`")
    if spread and not (typed and "mask" in param):
        return Origin(Kind.UNKNOWN, line, f"`**` keywords, which may hold `{param}`")
    default = parameter_default(function, param)
    if isinstance(default, ast.Constant) and (default.value is None or derive):
        return Origin(Kind.NONE, line)
    return Origin(Kind.UNKNOWN, line, f"`{param}`, not passed")


def arg_names(function: ast.FunctionDef) -> list[str]:
    return [a.arg for a in [*function.args.posonlyargs, *function.args.args]]


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


def _self_attribute(node: ast.AST) -> str | None:
    """`self.<name>`: the name."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _own_method_call(node: ast.Call) -> str | None:
    """`self.<name>(...)`: the name."""
    return _self_attribute(node.func)


def _calls_method(node: ast.Call, method: str, by_self: bool, by_super: bool) -> bool:
    """`self.<method>(...)` (when by_self) or `super().<method>(...)` (when by_super)."""
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == method):
        return False
    if isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) and func.value.func.id == "super":
        return by_super
    return by_self and isinstance(func.value, ast.Name) and func.value.id == "self"


__all__ = ["Kind", "MaskFlow", "Origin", "SiteMasks", "none_comparison", "reads_implementation"]
