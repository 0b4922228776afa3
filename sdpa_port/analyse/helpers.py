"""Find the helpers forward calls to compute the attention, and trace each one.

A helper is a method (`self._attn(q, k, v)`) or a module-level function handed the module (`attention_fn(self, q,
k, v)`, read as a method). Each call is traced with what the caller's trace knows of its arguments: the keys it
passes laid out (..., dim, length), the ranks of the tensors it passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.forms import keys
from sdpa_port.analyse.known import Known, decide
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.optional_facts import weights_request
from sdpa_port.analyse.tracing import LineOf
from sdpa_port.refusals import Code
from sdpa_port.rewrite.edit import replace_names


@dataclass(frozen=True)
class Helper:
    """A function forward calls to compute the attention.

    A method (`self._attn(...)`), or a module-level function (`attention_fn(self, q, k, v, mask)`) read as a method by
    naming its module parameter `self`.
    """

    name: str
    owner: str  # the class defining the method, or "<module>"
    function: cst.FunctionDef  # as a method: its first parameter is `self` when it takes the module
    module_parameter: str | None  # a module-level function's parameter that receives `self`
    is_method: bool

    def as_method_call(self, call: cst.Call) -> cst.Call:
        """A call of the helper as its method view binds it: without the argument that passes `self`."""
        if self.is_method or self.module_parameter is None:
            return call
        kept = [a for a in call.args if not (isinstance(a.value, cst.Name) and a.value.value == "self")]
        return call.with_changes(args=kept)

    def calls(self, call: cst.Call) -> bool:
        func = call.func
        if self.is_method:
            return m.matches(func, m.Attribute(value=m.Name("self"), attr=m.Name(self.name)))
        return isinstance(func, cst.Name) and func.value == self.name


@dataclass(frozen=True)
class HelperCall:
    """A call of a helper inside forward, where the helper computes the attention."""

    helper: Helper
    call: cst.Call
    # helper parameter -> forward-level head-mask parameter name it receives
    eager_only_params: tuple[str, ...]

    @property
    def method(self) -> str:
        return self.helper.name

    def bound(self) -> dict[str, cst.BaseExpression] | None:
        return bind_arguments(self.helper.function, self.helper.as_method_call(self.call))


@dataclass(frozen=True)
class BoundFacts:
    """What a call binds some of a helper's parameters to, which holds in the helper wherever it keeps them.

    `none`: parameters bound to `None`, written or by default (`attention(q, k, v)` leaves `dropout=None`), so an `if
    dropout is not None:` is not taken. `modules`: parameters bound to an attribute of the module that only
    `__init__` binds (`attention(q, k, v, dropout=self.dropout)`), as (parameter, attribute): the helper's
    `dropout(p)` is `self.dropout(p)`. The Annotated Transformer's `attention(query, key, value, mask=None,
    dropout=None)` is read so for each call.
    """

    none: frozenset[str] = frozenset()
    modules: tuple[tuple[str, str], ...] = ()

    def known(self) -> Known:
        return Known(none=self.none)

    def enclosing(self) -> dict[str, t.Value]:
        return {
            name: t.ExprVal(cst.Attribute(value=cst.Name("self"), attr=cst.Name(attribute)))
            for name, attribute in self.modules
        }


def bound_facts(bound: dict[str, cst.BaseExpression] | None, facts: ModuleFacts, class_name: str) -> BoundFacts:
    """The parameters a call binds to `None` or to a module of `self` built in `__init__` alone (`BoundFacts`)."""
    if bound is None:
        return BoundFacts()
    none = frozenset(name for name, value in bound.items() if m.matches(value, m.Name("None")))
    modules = []
    for name, value in bound.items():
        if not m.matches(value, m.Attribute(value=m.Name("self"), attr=m.Name())):
            continue
        assert isinstance(value, cst.Attribute)
        bindings = facts.find_attribute_bindings(class_name, value.attr.value)
        if bindings and all(b.method.name.value == "__init__" and b.value is not None for b in bindings):
            modules.append((name, value.attr.value))
    return BoundFacts(none, tuple(sorted(modules)))


def traced_helpers(
    facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, line_of: LineOf, caller: t.Tracer
) -> list[tuple[Helper, cst.Call, t.TraceResult, t.Candidate]]:
    finder = CandidateCalls()
    forward.body.visit(finder)
    out = []
    cache: dict[
        tuple[str, frozenset[str], frozenset[str], tuple[tuple[str, int], ...], BoundFacts],
        tuple[Helper, t.TraceResult, list[t.Candidate]] | None,
    ] = {}
    weights = weights_request(p.name.value for p in forward.params.params)
    for call in finder.calls:
        helper = helper_for(facts, class_name, call)
        bound = bind_arguments(helper.function, helper.as_method_call(call)) if helper is not None else None
        keys = key_layout_params(bound, caller)
        ranks = passed_ranks(bound, caller, forward)
        asked = _bound_to(helper, call, weights) if helper is not None and weights is not None else frozenset()
        passed = bound_facts(bound, facts, class_name)
        key = (code(call.func), keys, asked, ranks, passed)
        if key not in cache:
            cache[key] = _traced_helper(facts, class_name, call, line_of, keys, asked, ranks, passed)
        found = cache[key]
        if found is None:
            continue
        helper, helper_result, attention = found
        if len(attention) == 1:
            out.append((helper, call, helper_result, attention[0]))
        elif len(attention) > 1:
            bad = attention[1]
            bad.poisoned(Code.REPEATED, "the helper computes several attentions", bad.start_line)
            out.append((helper, call, helper_result, bad))
    return out


def _traced_helper(
    facts: ModuleFacts,
    class_name: str,
    call: cst.Call,
    line_of: LineOf,
    keys: frozenset[str],
    asked: frozenset[str],
    ranks: tuple[tuple[str, int], ...] = (),
    passed: BoundFacts = BoundFacts(),
) -> tuple[Helper, t.TraceResult, list[t.Candidate]] | None:
    """The helper's trace, specialised to `output_attentions` false where that leaves one attention.

    Where the plain trace finds no one attention SDPA can take, the helper is traced with its parameters that receive
    forward's `output_attentions` false (the SDPA class returns to eager when it is true, and the inlined helper is
    specialised so): XLNet returns its weights permuted under `if output_attentions:`. The parameters the call binds
    to None or to a module of `self` (`passed`) hold them throughout.
    """
    helper = helper_for(facts, class_name, call)
    if helper is None:
        return None
    result = t.Tracer(
        facts, class_name, helper.function, line_of, known=passed.known(), key_params=keys, param_ranks=ranks,
        enclosing=passed.enclosing(),
    ).run()
    attention = result.attention()
    if asked and not (len(attention) == 1 and attention[0].poison is None):
        known = Known(falsy=asked, none=passed.none)
        retried = t.Tracer(
            facts, class_name, helper.function, line_of, known=known, key_params=keys, param_ranks=ranks,
            enclosing=passed.enclosing(),
        ).run()
        found = retried.attention()
        if len(found) == 1 and found[0].poison is None:
            return helper, retried, found
    return helper, result, attention


def _bound_to(helper: Helper, call: cst.Call, name: str) -> frozenset[str]:
    """The helper's parameters this call passes forward's `name` as is."""
    bound = bind_arguments(helper.function, helper.as_method_call(call))
    if bound is None:
        return frozenset()
    return frozenset(param for param, value in bound.items() if m.matches(value, m.Name(name)))


def key_layout_params(bound: dict[str, cst.BaseExpression] | None, caller: t.Tracer) -> frozenset[str]:
    """The helper's parameters that a call passes a key laid out as `(..., dim, length)`.

    `bound` holds the call's arguments, bound to the parameters; the caller's trace reads each argument
    (`self.split_heads(key, k=True)` permuting the features second to last).
    """
    if bound is None:
        return frozenset()
    return frozenset(name for name, value in bound.items() if keys.transposed_key(caller, value))


def passed_ranks(
    bound: dict[str, cst.BaseExpression] | None, caller: t.Tracer, forward: cst.FunctionDef
) -> tuple[tuple[str, int], ...]:
    """The helper's parameters a call passes a tensor of known rank, read from forward's text alone.

    `bound` holds the call's arguments, bound to the parameters. A rank is known for an expression whose last reshape
    or permute gives it, or a name every assignment of which in forward does and that is no parameter of forward (so it
    is that rank whenever the call runs).
    """
    if bound is None:
        return ()
    ranks = (
        (name, caller.ranks.rank_in_method(value, forward, 0))
        for name, value in bound.items()
        if not (isinstance(value, cst.Name) and value.value in caller.params)
    )
    return tuple(sorted((name, rank) for name, rank in ranks if rank is not None))


def helper_for(facts: ModuleFacts, class_name: str, call: cst.Call) -> Helper | None:
    """The method or module-level function a call invokes.

    `self.name(...)` calls a method; `name(...)`, perhaps given `self`, a module-level function.
    """
    func = call.func
    if m.matches(func, m.Attribute(value=m.Name("self"))):
        name = func.attr.value  # type: ignore[attr-defined]
        found = facts.find_method(class_name, name) if name != "forward" else None
        return None if found is None else Helper(name, found[0].name, found[1], None, True)
    if isinstance(func, cst.Name) and func.value in facts.functions:
        return function_as_method(facts.functions[func.value], call)
    return None


def function_as_method(function: cst.FunctionDef, call: cst.Call) -> Helper | None:
    """A module-level function read as a method: the parameter receiving `self` becomes `self`, first."""
    params = function.params
    if params.star_arg is not None and isinstance(params.star_arg, cst.Param) or params.posonly_params:
        return None
    positional = [a for a in call.args if a.keyword is None]
    receiving: str | None = None
    for index, argument in enumerate(call.args):
        if isinstance(argument.value, cst.Name) and argument.value.value == "self":
            if argument.keyword is not None:
                receiving = argument.keyword.value
            elif argument in positional and positional.index(argument) < len(params.params):
                receiving = params.params[positional.index(argument)].name.value
            break
    if receiving is None:
        view = function.with_changes(params=params.with_changes(params=[cst.Param(cst.Name("self")), *params.params]))
        return Helper(function.name.value, "<module>", view, None, False)
    if receiving in {"self"}:
        ordered = [p for p in params.params if p.name.value == "self"] + [p for p in params.params if p.name.value != "self"]
        return Helper(function.name.value, "<module>", function.with_changes(params=params.with_changes(params=ordered)), "self", False)
    renamed_params = [p.with_changes(name=cst.Name("self")) for p in params.params if p.name.value == receiving]
    others = [p for p in params.params if p.name.value != receiving]
    body = replace_names(function.body, {receiving: cst.Name("self")})
    view = function.with_changes(params=params.with_changes(params=[*renamed_params, *others]), body=body)
    return Helper(function.name.value, "<module>", view, receiving, False)


class CandidateCalls(cst.CSTVisitor):
    """Calls of methods on self and of plain names, the candidate helpers.

    Not inside nested functions, nor in a branch the `known` facts rule out.
    """

    def __init__(self, known: Known | None = None) -> None:
        self.calls: list[cst.Call] = []
        self.known = known

    def visit_If(self, node: cst.If) -> bool:
        decided = None if self.known is None else decide(node.test, self.known)
        if decided is None:
            return True
        node.test.visit(self)
        taken = node.body if decided else node.orelse
        if taken is not None:
            taken.visit(self)
        return False

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name) or m.matches(func, m.Attribute(value=m.Name("self"))):
            self.calls.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


def bind_arguments(helper: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression] | None:
    """Map a method's parameters, without self, to the call's argument expressions, defaults filled in."""
    params = [*helper.params.posonly_params, *helper.params.params]
    if params and params[0].name.value == "self":
        params = params[1:]
    kwonly = list(helper.params.kwonly_params)
    bound: dict[str, cst.BaseExpression] = {}
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args):
        return None
    if len(positional) > len(params):
        return None
    for param, argument in zip(params, positional):
        bound[param.name.value] = argument.value
    names = {param.name.value for param in params + kwonly}
    for argument in call.args:
        if argument.keyword is not None:
            if argument.keyword.value not in names:
                return None
            bound[argument.keyword.value] = argument.value
    for param in params + kwonly:
        name = param.name.value
        if name not in bound:
            if param.default is None:
                return None
            bound[name] = param.default
    return bound
