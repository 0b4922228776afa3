"""Find the attention modules of a modeling file and describe each eager computation as an AttentionSite."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cross import is_cache_parameter, is_mask_parameter
from sdpa_port.analyse.cstutil import code, nodes_of_type, reads_only_self_attributes
from sdpa_port.rewrite.edit import replace_names
from sdpa_port.analyse.forms import products
from sdpa_port.analyse.known import Known, decide, negated_comparison
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.site import AttentionSite, CausalSource, Dropout, Layout, Scaling, ScaleSite, Term, TermKind
from sdpa_port.refusals import Code, Refusal

LineOf = Callable[[cst.CSTNode], int]


@dataclass(frozen=True)
class Helper:
    """A function forward calls to compute the attention: a method (`self._attn(...)`), or a module-level function
    (`attention_fn(self, q, k, v, mask)`) read as a method by naming its module parameter `self`."""

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
class ClassAnalysis:
    class_name: str
    sites: tuple[AttentionSite, ...]
    helpers: tuple[HelperCall, ...]
    refusal: Refusal | None
    eager_only_params: tuple[str, ...]  # forward parameters whose use only eager can take (head masks, optional terms)
    output_attentions: str | None  # the forward parameter asking for the weights
    eager_only_flags: tuple[str, ...] = ()  # `self.` switches, off by default, whose branches only eager can take
    # of those, the comparisons of the module's settings whose side holds another computation of the output as a
    # whole (`if self.num_landmarks == self.seq_len: <attention> else: <an approximation>`, `_one_branch`)
    alternatives: tuple[str, ...] = ()
    # why the side of `alternatives` that stays eager is not ported (`_one_branch`, read from that side's own trace):
    # told in the warning that the SDPA class falls back there; None where that side computes no attention
    eager_side: Refusal | None = None

    @property
    def ported(self) -> bool:
        return self.refusal is None and bool(self.sites)


@dataclass(frozen=True)
class Operands:
    """A site's key and query expressions, and where they are read: in `forward`, or in the helper method computing
    the attention (with the arguments `forward` binds to its parameters)."""

    key: cst.BaseExpression
    query: cst.BaseExpression
    helper: tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None


def site_operands(analysis: "ClassAnalysis") -> list[Operands] | None:
    """The operands of every site of the class; None when the helper's arguments cannot be bound."""
    helper: tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None = None
    if analysis.helpers:
        bound = analysis.helpers[0].bound()
        if bound is None:
            return None
        helper = (analysis.helpers[0].helper.function, bound)
    return [
        Operands(cst.parse_expression(site.key), cst.parse_expression(site.query), helper) for site in analysis.sites
    ]


def attention_classes(facts: ModuleFacts, lines: Lines, only: frozenset[str] | None = None) -> list[ClassAnalysis]:
    """Every class whose forward computes eager attention (itself or through a helper method).

    `only` limits the search to classes known (from the ast screen) to contain a softmax or inherit one.
    """
    out: list[ClassAnalysis] = []
    for name in facts.classes:
        if only is not None and name not in only:
            continue
        lines.prepare(info.name for info in facts.mro(name))
        analysis = analyse_class(facts, name, lines)
        if analysis is not None:
            out.append(analysis)
    return out


def _without_optional(
    facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, line_of: LineOf
) -> tuple[Known, t.TraceResult, t.Candidate] | None:
    """The trace of `forward` taking one optional argument (default None, tested with `is not None`) to be None,
    or one flag of the module that `__init__` sets to False (`self.save_attention`) to be false, when that leaves
    one attention computation SDPA can take."""
    for known in _optional_facts(facts, class_name, forward):
        result = t.Tracer(facts, class_name, forward, line_of, known=known).run()
        inline = result.attention()
        if len(inline) == 1 and inline[0].poison is None:
            return known, result, inline[0]
    return None


def _optional_facts(facts: ModuleFacts, class_name: str, forward: cst.FunctionDef) -> list[Known]:
    """The facts `_without_optional` tries, in order: each optional argument None, each flag off by default false,
    each switch of the call false, the request for the weights false alone and with each of those."""
    tested = {
        node.left.value
        for node in nodes_of_type(forward.body, cst.Comparison)
        if isinstance(node.left, cst.Name)
        and len(node.comparisons) == 1
        and isinstance(node.comparisons[0].operator, cst.IsNot)
        and m.matches(node.comparisons[0].comparator, m.Name("None"))
    }
    params = [*forward.params.params, *forward.params.kwonly_params]
    # not the inputs every call passes (masks, caches, key/value states): falling back whenever they are given
    # would leave SDPA unused
    trials = [
        Known(none=frozenset({param.name.value}))
        for param in params
        if param.name.value in tested
        and param.default is not None
        and m.matches(param.default, m.Name("None"))
        and (not is_mask_parameter(param.name.value) or "head_mask" in param.name.value)  # head masks return to eager
        and not is_cache_parameter(param.name.value)
        and "states" not in param.name.value
    ]
    trials += [Known(falsy=frozenset({flag})) for flag in _flags_off_by_default(facts, class_name, forward)]
    # a switch of the call itself, off by default, whose branch only eager takes (fairseq's `before_softmax`, which
    # returns the scores): the SDPA class falls back when it is set
    switched = {test.test.value for test in nodes_of_type(forward.body, cst.If) if isinstance(test.test, cst.Name)}
    switches = frozenset(
        param.name.value
        for param in params
        if param.name.value in switched
        and param.name.value not in WEIGHT_REQUESTS  # tried below, with each other fact
        and param.default is not None
        and m.matches(param.default, m.Name("False"))
    )
    trials += [Known(falsy=frozenset({name})) for name in sorted(switches)]
    optional = _optional_modules(facts, class_name, forward)
    trials += [Known(none=frozenset({name})) for name in optional]
    if len(optional) > 1:
        trials.append(Known(none=frozenset(optional)))  # DeBERTa's talking heads: one projection on each side
    trials = trials[:MAX_OPTIONAL_TRIED]
    request = weights_request(param.name.value for param in params)
    if request is not None:
        # asked for weights, the SDPA class returns to eager: a step only that request takes (ProphetNet returns the
        # scores before the softmax) is off on the SDPA path, alone or with one of the other facts
        weights = frozenset({request})
        trials += [Known(falsy=weights)] + [Known(falsy=k.falsy | weights, none=k.none) for k in trials]
        if len(switches) > 1:
            # fairseq's `need_head_weights` turns `need_weights` on: every switch off with the request
            trials.append(Known(falsy=switches | weights))
    return trials


@dataclass(frozen=True)
class OneBranch:
    """What `_one_branch` found: the facts on the SDPA path (the side known false, with any optional fact), the trace
    and its one attention, the side, and why the other side stays eager."""

    known: Known
    result: t.TraceResult
    candidate: t.Candidate
    side: str
    eager_side: Refusal | None


def _one_branch(facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, line_of: LineOf) -> OneBranch | None:
    """Several attentions, one per side of a test of the module's own settings (`if self.num_landmarks ==
    self.seq_len:` exact attention, else an approximation): the trace taking the side with the one attention SDPA
    can take, known through the comparison that sends the SDPA class back to eager otherwise. Where that side's one
    attention has a step only an optional argument or a switch of the call takes (`if return_scores: return
    scores`), that fact is known too, as `_without_optional` tries them."""
    optional: list[Known] | None = None
    for test in nodes_of_type(forward.body, cst.If):
        if not _settings_only(test.test):
            continue
        if negated_comparison(test.test) is None and (test.orelse is None or _reads_training(test.test)):
            # a flag choosing between two computations, not a step only one setting takes (a hook, a talking-heads
            # projection: `_without_optional` tries those, off by default), nor the module's training mode
            continue
        sides = _sides(test.test)
        for index, other_side in enumerate(sides):
            side = code(other_side)
            known = Known(falsy=frozenset({side}))
            result = t.Tracer(facts, class_name, forward, line_of, known=known).run()
            inline = result.attention()
            if len(inline) != 1:
                continue
            if inline[0].poison is not None:
                # one attention on this side, with a step an optional fact may rule out
                optional = _optional_facts(facts, class_name, forward) if optional is None else optional
                for extra in optional:
                    known = Known(falsy=extra.falsy | {side}, none=extra.none)
                    result = t.Tracer(facts, class_name, forward, line_of, known=known).run()
                    inline = result.attention()
                    if len(inline) == 1 and inline[0].poison is None:
                        break
            if len(inline) == 1 and inline[0].poison is None:
                opposite = Known(falsy=(known.falsy - {side}) | {code(sides[1 - index])}, none=known.none)
                why = _why_eager(facts, class_name, forward, line_of, opposite)
                return OneBranch(known, result, inline[0], side, why)
    return None


def _why_eager(
    facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, line_of: LineOf, known: Known
) -> Refusal | None:
    """Why the side of a settings test that `known` leaves is not ported: its one attention's refusal, or that it
    computes several; None where it computes no attention, or one SDPA could take."""
    inline = t.Tracer(facts, class_name, forward, line_of, known=known).run().attention()
    if len(inline) == 1 and inline[0].poison is not None:
        return Refusal.of(inline[0].poison, class_name, inline[0].poison_line or inline[0].start_line)
    if len(inline) > 1:
        return Refusal(Code.REPEATED, class_name, inline[1].start_line, "that side computes several attentions")
    return None


def one_side_helpers(facts: ModuleFacts, analysis: ClassAnalysis) -> ClassAnalysis | None:
    """Helpers computing the attention, one on each side of a test of the module's settings (ImageGPT's `if
    self.reorder_and_upcast_attn: self._upcast_and_reordered_attn(...) else: self._attn(...)`): the analysis of the
    one helper forward calls where a side of the test is false, that side recorded as an alternative (it runs as
    written, `ClassAnalysis.alternatives`); None where no such test leaves exactly one helper call."""
    if analysis.refusal is not None or len(analysis.sites) < 2 or len(analysis.helpers) != len(analysis.sites):
        return None
    found = facts.find_method(analysis.class_name, "forward")
    if found is None:
        return None
    forward = found[1]
    for test in nodes_of_type(forward.body, cst.If):
        if not _settings_only(test.test):
            continue
        for other_side in _sides(test.test):
            known = Known(falsy=frozenset({code(other_side)}))
            reached = _Calls(known)
            forward.body.visit(reached)
            kept = [
                index
                for index, helper in enumerate(analysis.helpers)
                if any(call is helper.call for call in reached.calls)
            ]
            if len(kept) != 1:
                continue
            index = kept[0]
            return replace(
                analysis,
                sites=(analysis.sites[index],),
                helpers=(analysis.helpers[index],),
                eager_only_flags=tuple(dict.fromkeys((*analysis.eager_only_flags, code(other_side)))),
                alternatives=tuple(dict.fromkeys((*analysis.alternatives, code(other_side)))),
            )
    return None


def _reads_training(test: cst.BaseExpression) -> bool:
    return any(m.matches(a, m.Attribute(value=m.Name("self"), attr=m.Name("training"))) for a in nodes_of_type(test, cst.Attribute))


def _sides(test: cst.BaseExpression) -> tuple[cst.BaseExpression, ...]:
    """The expressions that, known false, decide `test` either way, in the order tried: a comparison's negation (its
    `if` branch) then the comparison; for a flag (`self.x`, `self.config.x`), the flag itself first, so that the side
    where it is off (usually the default) is the one tried first (`if not self.fast:` its `if` branch, `if
    self.upcast:` its `else`), then `not` the flag."""
    negated = negated_comparison(test)
    if negated is not None:
        return (negated, test)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return (test.expression, test)
    return (test, cst.UnaryOperation(operator=cst.Not(), expression=test))


def _settings_only(test: cst.BaseExpression) -> bool:
    """A test that reads nothing but `self.` attributes and literals (no argument, no tensor it computes)."""
    selfs = [a for a in nodes_of_type(test, cst.Attribute) if m.matches(a.value, m.Name("self"))]
    return bool(selfs) and reads_only_self_attributes(test)


def _flags_off_by_default(facts: ModuleFacts, class_name: str, forward: cst.FunctionDef) -> list[str]:
    """`self.x` attributes that forward tests and that the class's first assignment sets to a literal False (a switch
    like BLIP-2's `save_attention`, turned on by a method) or to a config setting defaulting to False
    (`getattr(config, "talking_head", False)`)."""
    tested = {
        code(node)
        for test in nodes_of_type(forward.body, cst.If)
        for node in nodes_of_type(test.test, cst.Attribute)
        if m.matches(node, m.Attribute(value=m.Name("self")))
    }
    out = []
    for name in sorted(tested):
        values = facts.find_attribute_values(class_name, name.removeprefix("self."))
        if values and (m.matches(values[0], m.Name("False")) or _config_flag_off_by_default(values[0])):
            out.append(name)
    return out


def _config_flag_off_by_default(value: cst.BaseExpression) -> bool:
    """`getattr(config, "talking_head", False)`: a setting off unless the config turns it on."""
    return m.matches(
        value,
        m.Call(func=m.Name("getattr"), args=[m.Arg(m.Name("config")), m.Arg(m.SimpleString()), m.Arg(m.Name("False"))]),
    )


def _optional_modules(facts: ModuleFacts, class_name: str, forward: cst.FunctionDef) -> list[str]:
    """`self.x` attributes that forward tests with `is not None` and that the class sets to None on some path (a
    projection built only under a config flag, DeBERTa's `head_logits_proj`): the SDPA class may fall back to eager
    whenever they are set."""
    tested = {
        code(node.left)
        for node in nodes_of_type(forward.body, cst.Comparison)
        if m.matches(node.left, m.Attribute(value=m.Name("self")))
        and len(node.comparisons) == 1
        and isinstance(node.comparisons[0].operator, cst.IsNot)
        and m.matches(node.comparisons[0].comparator, m.Name("None"))
    }
    out = []
    for name in sorted(tested):
        values = facts.find_attribute_values(class_name, name.removeprefix("self."))
        arms = [arm for value in values for arm in ((value.body, value.orelse) if isinstance(value, cst.IfExp) else (value,))]
        if any(m.matches(arm, m.Name("None")) for arm in arms):
            out.append(name)
    return out


MAX_OPTIONAL_TRIED = 6

# the parameters by which a call asks an attention module for its weights: transformers' `output_attentions`, and
# `need_weights` of fairseq's and torch's multi-head attention (on by default there: the SDPA class falls back for
# it, and a port whose every call leaves it on is refused, W406)
WEIGHT_REQUESTS = ("output_attentions", "need_weights")


def weights_request(names: Iterable[str]) -> str | None:
    """The parameter among `names` by which a call asks for the attention weights, if any."""
    present = set(names)
    return next((name for name in WEIGHT_REQUESTS if name in present), None)


def analyse_class(facts: ModuleFacts, class_name: str, line_of: LineOf) -> ClassAnalysis | None:
    found = facts.find_method(class_name, "forward")
    if found is None:
        return None
    owner, forward = found
    tracer = t.Tracer(facts, class_name, forward, line_of)
    result = tracer.run()
    inline = result.attention()
    helpers = _helper_calls(facts, class_name, forward, line_of, tracer)
    params = result.params
    output_attentions = weights_request(params)
    if not inline and not helpers:
        # a step SDPA cannot take on the probabilities under a test of an optional input or module (a talking-heads
        # projection) can leave the product with V unrecognised; on the path where it is absent it is attention
        if not any(c.poison is not None and c.stage is t.Stage.PROBABILITIES for c in result.candidates):
            return None
        first = _without_optional(facts, class_name, forward, line_of)
        if first is None:
            return None
        known, result, found_candidate = first
        inline = [found_candidate]
    else:
        known = Known()
    refusal: Refusal | None = None
    sites: list[AttentionSite] = []
    head_masks: list[str] = sorted(known.none)
    flags: list[str] = sorted(known.falsy)
    alternatives: list[str] = []
    eager_side: Refusal | None = None
    helper_calls: list[HelperCall] = []
    if inline and helpers:
        refusal = Refusal(Code.REPEATED, class_name, line_of(forward), "attention is computed both in forward and in a helper method")
    elif inline:
        candidate: t.Candidate | None = inline[0] if len(inline) == 1 else None
        if candidate is None or candidate.poison is not None:
            # several attentions may sit on the two sides of a test of the module's settings, and a step SDPA cannot
            # take under `if extra is not None:` for an optional argument: the SDPA class then falls back to eager
            # on the other side, or when that argument is given, as for a head mask
            optional = None if candidate is None else _without_optional(facts, class_name, forward, line_of)
            branch = None if optional is not None else _one_branch(facts, class_name, forward, line_of)
            retried = optional or (None if branch is None else (branch.known, branch.result, branch.candidate))
            whole = candidate  # the computation read across both sides of the test
            if retried is not None:
                known, result, candidate = retried
                head_masks.extend(sorted(known.none))
                flags.extend(sorted(known.falsy))
                if branch is not None:
                    alternatives.append(branch.side)
                    eager_side = branch.eager_side
                    if eager_side is None and whole is not None and whole.poison is not None:
                        # the other side would port alone, not in one computation with this side: why, said
                        eager_side = Refusal.of(whole.poison, class_name, whole.poison_line or whole.start_line)
        if candidate is None:
            refusal = Refusal(Code.REPEATED, class_name, inline[1].start_line, "forward computes several attentions")
        elif candidate.poison is not None:
            refusal = Refusal.of(candidate.poison, class_name, candidate.poison_line or candidate.start_line)
        else:
            site = describe(facts, class_name, "forward", owner.name, candidate, result)
            sites.append(site)
            if site.head_mask:
                head_masks.append(site.head_mask)
            flags.extend(result.fallbacks)  # settings of a module the probabilities pass through
    else:
        for helper, call, helper_result, candidate in helpers:
            method = helper.name
            if candidate.poison is not None:
                refusal = Refusal.of(candidate.poison, class_name, candidate.poison_line or candidate.start_line)
                break
            site = describe(facts, class_name, method, helper.owner, candidate, helper_result)
            sites.append(site)
            flags.extend(helper_result.fallbacks)
            forward_heads: list[str] = []
            if site.head_mask:
                binding = bind_arguments(helper.function, helper.as_method_call(call))
                bound = None if binding is None else binding.get(site.head_mask)
                roots = [n for n in p.walk_names(bound) if n in params] if bound is not None else []
                if len(roots) != 1:
                    refusal = Refusal(
                        Code.HELPER_CALL,
                        class_name,
                        site.line,
                        f"the head mask reaches `{method}` from an expression it cannot trace",
                    )
                    break
                forward_heads.append(roots[0])
                head_masks.append(roots[0])
            helper_calls.append(HelperCall(helper, call, tuple(forward_heads)))
    if refusal is None:
        for site in sites:
            if site.dropout is not None and site.dropout.conditional:
                refusal = Refusal(Code.DROPOUT, class_name, site.line, "dropout is applied only under a condition")
    return ClassAnalysis(
        class_name=class_name,
        sites=tuple(sites),
        helpers=tuple(helper_calls),
        refusal=refusal,
        eager_only_params=tuple(dict.fromkeys(head_masks)),
        eager_only_flags=tuple(dict.fromkeys(flags)),
        alternatives=tuple(dict.fromkeys(alternatives)),
        eager_side=eager_side,
        output_attentions=output_attentions,
    )


def _helper_calls(
    facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, line_of: LineOf, caller: t.Tracer
) -> list[tuple[Helper, cst.Call, t.TraceResult, t.Candidate]]:
    finder = _Calls()
    forward.body.visit(finder)
    out = []
    cache: dict[
        tuple[str, frozenset[str], frozenset[str], tuple[tuple[str, int], ...]],
        tuple[Helper, t.TraceResult, list[t.Candidate]] | None,
    ] = {}
    weights = weights_request(p.name.value for p in forward.params.params)
    for call in finder.calls:
        helper = helper_for(facts, class_name, call)
        bound = bind_arguments(helper.function, helper.as_method_call(call)) if helper is not None else None
        keys = key_layout_params(bound, caller)
        ranks = passed_ranks(bound, caller, forward)
        asked = _bound_to(helper, call, weights) if helper is not None and weights is not None else frozenset()
        key = (code(call.func), keys, asked, ranks)
        if key not in cache:
            cache[key] = _traced_helper(facts, class_name, call, line_of, keys, asked, ranks)
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
) -> tuple[Helper, t.TraceResult, list[t.Candidate]] | None:
    """The helper's trace; where it finds no one attention SDPA can take, the trace with its parameters that receive
    forward's `output_attentions` false (the SDPA class returns to eager when it is true, and the inlined helper is
    specialised so): XLNet returns its weights permuted under `if output_attentions:`."""
    helper = helper_for(facts, class_name, call)
    if helper is None:
        return None
    result = t.Tracer(facts, class_name, helper.function, line_of, key_params=keys, param_ranks=ranks).run()
    attention = result.attention()
    if asked and not (len(attention) == 1 and attention[0].poison is None):
        known = Known(falsy=asked)
        retried = t.Tracer(
            facts, class_name, helper.function, line_of, known=known, key_params=keys, param_ranks=ranks
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
    """The helper's parameters that a call (its arguments `bound` to them) passes a key laid out (..., dim, length),
    as the caller's trace reads its argument (`self.split_heads(key, k=True)` permuting the features second to
    last)."""
    if bound is None:
        return frozenset()
    return frozenset(name for name, value in bound.items() if products.transposed_key(caller, value))


def passed_ranks(
    bound: dict[str, cst.BaseExpression] | None, caller: t.Tracer, forward: cst.FunctionDef
) -> tuple[tuple[str, int], ...]:
    """The helper's parameters a call (its arguments `bound` to them) passes a tensor of known rank, read from
    forward's text alone: an expression whose last reshape or permute gives it, or a name every assignment of which
    in forward does and that is no parameter of forward (so it is that rank whenever the call runs)."""
    if bound is None:
        return ()
    ranks = (
        (name, caller.ranks.rank_in_method(value, forward, 0))
        for name, value in bound.items()
        if not (isinstance(value, cst.Name) and value.value in caller.params)
    )
    return tuple(sorted((name, rank) for name, rank in ranks if rank is not None))


def helper_for(facts: ModuleFacts, class_name: str, call: cst.Call) -> Helper | None:
    """The method (`self.name(...)`) or module-level function (`name(...)`, perhaps given `self`) a call invokes."""
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


class _Calls(cst.CSTVisitor):
    """Calls of methods on self and of plain names (candidate helpers), not inside nested functions, nor in a branch
    the `known` facts rule out."""

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
    """Map a method's parameters (without self) to the call's argument expressions, defaults filled in."""
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


def describe(
    facts: ModuleFacts,
    class_name: str,
    method: str,
    owner: str,
    candidate: t.Candidate,
    result: t.TraceResult,
) -> AttentionSite:
    """Summarise a traced chain as the frozen facts reviewers read."""
    start = candidate.start
    assert start is not None
    scaling: list[Scaling] = []
    terms: list[Term] = []
    seen_term = False
    guards = 0
    zero_rows = False
    softmax = ""
    upcast = start.upcast
    dropout: Dropout | None = None
    head_mask: str | None = None
    causal = CausalSource.NONE
    output_line = candidate.start_line
    values: list[str] = []  # of each product with V
    layout = Layout.HEADS if start.rank in (4, None) else Layout.FLAT
    query_scale = start.query_scale
    if query_scale is not None:
        scaling.append(Scaling(ScaleSite.QUERY, code(query_scale[0]), query_scale[1], False))
    # depths count from the product's own: a computation wholly inside one branch is unconditional within it
    start_depth = min((depth for _, depth, _ in candidate.ops), default=0)
    for op, depth, line in candidate.ops:
        conditional = depth > start_depth
        match op:
            case t.Scale():
                if op.per_query:
                    where = ScaleSite.QUERY
                elif not scaling and not seen_term and start.product.form is p.ProductForm.BADDBMM:
                    where = ScaleSite.PRODUCT
                else:
                    where = ScaleSite.AFTER_TERMS if seen_term else ScaleSite.SCORES
                scaling.append(Scaling(where, code(op.factor), op.divide, conditional))
            case t.AddTerm():
                seen_term = True
                terms.append(Term(_term_kind(op.term, result.params), code(op.term), conditional, line, op.always))
            case t.Fill():
                seen_term = True
                if op.causal:
                    causal = CausalSource.BUFFER
                kind = TermKind.CAUSAL_BUFFER if op.causal else TermKind.MASKED_FILL
                terms.append(Term(kind, code(op.condition), conditional, line))
            case t.Guard():
                guards += 1
            case t.ZeroRows():
                zero_rows = True
            case t.Softmax():
                call = op.call
                dim = code(call.dim) if call.dim is not None else "-1"
                softmax = f"{call.form.value}(dim={dim})"
                upcast = upcast or call.upcast
            case t.Cast():
                upcast = upcast or op.upcast
            case t.Dropout():
                # inside its own `if self.dropout is not None:`, the dropout is as conditional as that `if`
                own_depth = depth - 1 if op.guard is not None else depth
                dropout = Dropout(code(op.call.probability), own_depth > start_depth)
            case t.HeadMask():
                head_mask = op.root
            case t.View():
                if op.heads is not None:
                    layout = Layout.FLAT_TO_HEADS
            case t.Output():
                if not values:
                    output_line = line
                values.append(code(op.value))
            case t.Start() | t.Shift():
                pass
            case _:
                t.unreachable(op)
    if causal is CausalSource.NONE and any(term.kind is TermKind.MASK for term in terms):
        causal = CausalSource.MASK
    queries, keys = candidate.operands()
    return AttentionSite(
        class_name=class_name,
        method=method,
        owner=owner,
        line=candidate.start_line,
        output_line=output_line,
        query=code(queries),
        key=code(keys),
        value=values[0] if values else "",
        product=start.product.form,
        layout=layout,
        scaling=tuple(scaling),
        terms=tuple(terms),
        softmax=softmax + ("+upcast" if upcast else ""),
        upcast=upcast,
        dropout=dropout,
        head_mask=head_mask,
        guards=guards,
        zero_rows=zero_rows,
        causal=causal,
        returns_weights=bool(result.probs_names_after_output),
        more_values=tuple(values[1:]),
    )


def _term_kind(term: cst.BaseExpression, params: tuple[str, ...]) -> TermKind:
    names = p.walk_names(term)
    roots = [n for n in names if n in params]
    if isinstance(term, cst.Name) and term.value in params:
        return TermKind.MASK if "mask" in term.value else TermKind.PARAMETER
    if any("bias" in n for n in names):
        return TermKind.POSITION_BIAS
    if roots and all("mask" in n for n in roots):
        return TermKind.MASK
    return TermKind.OTHER
