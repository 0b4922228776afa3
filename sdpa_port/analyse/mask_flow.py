"""Which masks reach each construction of a module: followed from the mask builders through the calls (read-only).

A module is built at a *site* (`module_sites.py`: `self.self_attn = BartAttention(...)`, `self.layers =
nn.ModuleList([Layer(...) for ...])`). Its forward receives, as its mask, the argument of the calls made through that
attribute (`self.self_attn(..., attention_mask=attention_mask)`, `for layer in self.layers: layer(hidden_states,
mask)`), which is a parameter of the calling forward, followed in turn through the calls of its own class, until it
is built: by `create_causal_mask(...)`, by `create_bidirectional_mask(...)`, by
one of them chosen under a condition, or not at all (None). Anything else (a mask from outside the file, a call not
followed, a module handed away) is an unknown origin, and a site with one is not decided.

The values followed (`Origin`, `Kind`, `SiteMasks`) and their pure helpers are in `mask_values.py`; one method is
read over them by `mask_reading.py`.
"""

from __future__ import annotations

import ast
from typing import Iterator, Sequence

from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.mask_helpers import MaskHelpers
from sdpa_port.analyse.mask_reading import Evaluator, Reader
from sdpa_port.analyse.mask_values import (
    MASK_MODULES,
    Kind,
    MethodFlow,
    Origin,
    Param,
    Restriction,
    SiteMasks,
    State,
    Values,
    bound_argument,
    implementation_test,
    reads_implementation,
    self_attribute,
)
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.module_sites import ModuleCall, Site, module_sites
from sdpa_port.analyse.names import ImportMap


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
            for name in [self_attribute(node)]
            if name is not None
        )
        self._flows: dict[tuple[str, str], MethodFlow] = {}
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

    def flow(self, class_name: str, name: str) -> MethodFlow:
        """The values of `class_name.name`'s names (the class defining it), read once."""
        key = (class_name, name)
        if key not in self._flows:
            found = self.modules.method(class_name, name)
            flow = MethodFlow()
            self._flows[key] = flow
            if found is not None and key not in self._reading:
                self._reading.add(key)
                Reader(self, found[0], found[1], flow).run()
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
            if any(_is_nonnull(bound_argument(use, function, k), state) for k in key_only):
                cross += 1
                if cross_origins:
                    origins |= self._argument_origins(use, function, mask_param, state, restrict)
                continue
            calls += 1
            origins |= self._argument_origins(use, function, mask_param, state, restrict)
        for line in self.modules.escapes(site.key):
            origins.add(Origin(self._escaped(site), line, f"`{site.name}`, used in a way not followed"))
        return SiteMasks(site, frozenset(origins), calls, cross)

    def _state_at(self, use: ModuleCall) -> State:
        flow = self.flow(*use.context)
        return flow.at_call.get(use.call, State({}, frozenset()))

    def _argument_origins(
        self, use: ModuleCall, function: ast.FunctionDef, param: str, state: State, restrict: Restriction | None
    ) -> frozenset[Origin]:
        bound = bound_argument(use, function, param, self.derive)
        if isinstance(bound, Origin):
            return frozenset({bound})
        values = Evaluator(self, use.context, state).value(bound)
        return self._expand(values, use.context, restrict)

    def _expand(self, values: Values, context: tuple[str, str], restrict: Restriction | None) -> frozenset[Origin]:
        out: set[Origin] = set()
        for value in values:
            if isinstance(value, Origin):
                out.add(value)
            elif isinstance(value, Param):
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


def _is_nonnull(bound: ast.expr | Origin, state: State) -> bool:
    return isinstance(bound, ast.Name) and bound.id in state.nonnull


def _calls_method(node: ast.Call, method: str, by_self: bool, by_super: bool) -> bool:
    """`self.<method>(...)` (when by_self) or `super().<method>(...)` (when by_super)."""
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == method):
        return False
    if isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) and func.value.func.id == "super":
        return by_super
    return by_self and isinstance(func.value, ast.Name) and func.value.id == "self"


__all__ = ["MaskFlow"]
