"""Find the attention modules of a modeling file and describe each eager computation as an AttentionSite.

`analyse_class` traces a class's forward and the helpers it calls; where that finds no one attention SDPA can
take, it tries the facts of `optional_facts` and the sides of `settings_sides`. Each chain found is described by
`describe`, and the class's analysis says what stays eager.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse import trace as t
from sdpa_port.analyse.certain import certain
from sdpa_port.analyse.closures import computes_attention, defined_functions, nested_sites, read_closure
from sdpa_port.analyse.cstutil import code, nodes_of_type
from sdpa_port.analyse.describe import describe
from sdpa_port.analyse.helpers import CandidateCalls, Helper, HelperCall, bind_arguments, traced_helpers
from sdpa_port.analyse.known import Known
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.optional_facts import weights_request, without_optional
from sdpa_port.analyse.settings_sides import one_branch, settings_only, sides_of
from sdpa_port.analyse.site import AttentionSite
from sdpa_port.analyse.tracing import LineOf
from sdpa_port.discover.eager_sites import EagerSite
from sdpa_port.refusals import Code, Refuse, Refusal


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
    # whole (`if self.num_landmarks == self.seq_len: <attention> else: <an approximation>`, `one_branch`)
    alternatives: tuple[str, ...] = ()
    # why the side of `alternatives` that stays eager is not ported (`one_branch`, read from that side's own trace):
    # told in the warning that the SDPA class falls back there; None where that side computes no attention
    eager_side: Refusal | None = None
    # the function forward defines that computes the attention, ported where it stands (`closures.py`)
    closure: str | None = None

    @property
    def ported(self) -> bool:
        return self.refusal is None and bool(self.sites)


@dataclass(frozen=True)
class Operands:
    """A site's key and query expressions, and where they are read.

    In `forward`, or in the helper method computing the attention, with the arguments `forward` binds to its
    parameters.
    """

    key: cst.BaseExpression
    query: cst.BaseExpression
    helper: tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None


def site_operands(analysis: "ClassAnalysis") -> list[Operands] | None:
    """The operands of every site of the class; None when the helper's arguments cannot be bound."""
    helper: tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None = None
    if analysis.closure is not None:
        return None  # its operands are its parameters, each call binding them its own way
    if analysis.helpers:
        bound = analysis.helpers[0].bound()
        if bound is None:
            return None
        helper = (analysis.helpers[0].helper.function, bound)
    return [
        Operands(cst.parse_expression(site.key), cst.parse_expression(site.query), helper) for site in analysis.sites
    ]


def attention_classes(facts: ModuleFacts, lines: Lines, only: frozenset[str] | None = None) -> list[ClassAnalysis]:
    """Every class whose forward computes eager attention, itself or through a helper method.

    `only` limits the search to classes known (from the ast screen) to contain a softmax or inherit one.
    """
    out: list[ClassAnalysis] = []
    nested = nested_sites(facts)
    for name in facts.classes:
        if only is not None and name not in only:
            continue
        lines.prepare(info.name for info in facts.mro(name))
        analysis = _with_nested(analyse_class(facts, name, lines), name, nested.get(name, []))
        if analysis is not None:
            out.append(analysis)
    return out


def _with_nested(analysis: ClassAnalysis | None, class_name: str, sites: list[EagerSite]) -> ClassAnalysis | None:
    """The analysis, refused (F601) where a function defined in the class's methods, or in a module-level function it
    calls, holds eager attention that the analysis did not read: a port would leave it eager, unsaid."""
    read = {f"{site.owner}.{site.method}" for site in analysis.sites} if analysis is not None else set()
    unread = [site for site in sites if site.where not in read]
    if not unread or (analysis is not None and analysis.refusal is not None):
        return analysis
    site = unread[0]
    outer, _, inner = site.where.rpartition(".")
    refusal = Refusal(
        Code.UNRECOGNISED,
        class_name,
        site.line,
        f"eager attention (a softmax over a product of two tensors, multiplied by a third) in `{inner}`, a function "
        f"`{outer}` defines, in a form the tool does not read there",
    )
    if analysis is None:
        return ClassAnalysis(class_name, (), (), refusal, (), None)
    return replace(analysis, refusal=refusal)


def one_side_helpers(facts: ModuleFacts, analysis: ClassAnalysis) -> ClassAnalysis | None:
    """The analysis of the one helper forward calls on one side of a test of the module's settings.

    Helpers compute the attention, one on each side of such a test (ImageGPT's `if self.reorder_and_upcast_attn:
    self._upcast_and_reordered_attn(...) else: self._attn(...)`): the analysis keeps the helper forward calls where a
    side of the test is false, that side recorded as an alternative (it runs as written, `ClassAnalysis.alternatives`).
    None where no such test leaves exactly one helper call.
    """
    if analysis.refusal is not None or len(analysis.sites) < 2 or len(analysis.helpers) != len(analysis.sites):
        return None
    found = facts.find_method(analysis.class_name, "forward")
    if found is None:
        return None
    forward = found[1]
    for test in nodes_of_type(forward.body, cst.If):
        if not settings_only(test.test):
            continue
        for other_side in sides_of(test.test):
            known = Known(falsy=frozenset({code(other_side)}))
            reached = CandidateCalls(known)
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


def analyse_class(facts: ModuleFacts, class_name: str, line_of: LineOf) -> ClassAnalysis | None:
    """The analysis of a class whose forward computes eager attention, itself or through helpers; None for others.

    Where the class does not port, it is read again deciding the tests of the module's attributes that are certain
    (`certain.py`: `self.scale_mask_softmax` left None for good), falling back to eager where they do not hold; that
    reading is kept where the class then ports.
    """
    plain = _analyse_class(facts, class_name, line_of)
    if plain is not None and plain.ported:
        return plain
    file_tests = certain(facts)
    if not file_tests.decides_attributes(class_name):
        return plain
    file_tests.attributes.add(class_name)
    retried = _analyse_class(facts, class_name, line_of)
    if retried is not None and retried.ported:
        return retried
    file_tests.attributes.discard(class_name)
    return plain


def _analyse_class(facts: ModuleFacts, class_name: str, line_of: LineOf) -> ClassAnalysis | None:
    found = facts.find_method(class_name, "forward")
    if found is None:
        return None
    owner, forward = found
    tracer = t.Tracer(facts, class_name, forward, line_of)
    result = tracer.run()
    inline = result.attention()
    helpers = traced_helpers(facts, class_name, forward, line_of, tracer)
    params = result.params
    output_attentions = weights_request(params)
    closures = [f for f in defined_functions(forward) if computes_attention(facts, class_name, f, line_of)]
    if closures:
        return _closure_analysis(facts, class_name, owner.name, forward, line_of, tracer, closures, bool(inline or helpers))
    if not inline and not helpers:
        # a step SDPA cannot take on the probabilities under a test of an optional input or module (a talking-heads
        # projection) can leave the product with V unrecognised; on the path where it is absent it is attention
        if not any(c.poison is not None and c.stage is t.Stage.PROBABILITIES for c in result.candidates):
            return None
        first = without_optional(facts, class_name, forward, line_of)
        if first is None:
            return None
        known, result, found_candidate = first
        inline = [found_candidate]
    else:
        known = Known()
    gathered = _Gathered(head_masks=sorted(known.none), flags=sorted(known.falsy))
    if inline and helpers:
        gathered.refusal = Refusal(
            Code.REPEATED, class_name, line_of(forward), "attention is computed both in forward and in a helper method"
        )
    elif inline:
        _inline_site(gathered, facts, class_name, forward, line_of, owner.name, inline, result)
    else:
        _helper_sites(gathered, facts, class_name, helpers, params)
    if gathered.refusal is None:
        for site in gathered.sites:
            if site.dropout is not None and site.dropout.conditional:
                gathered.refusal = Refusal(Code.DROPOUT, class_name, site.line, "dropout is applied only under a condition")
    return ClassAnalysis(
        class_name=class_name,
        sites=tuple(gathered.sites),
        helpers=tuple(gathered.helper_calls),
        refusal=gathered.refusal,
        eager_only_params=tuple(dict.fromkeys(gathered.head_masks)),
        eager_only_flags=tuple(dict.fromkeys(gathered.flags)),
        alternatives=tuple(dict.fromkeys(gathered.alternatives)),
        eager_side=gathered.eager_side,
        output_attentions=output_attentions,
    )


def _closure_analysis(
    facts: ModuleFacts,
    class_name: str,
    owner: str,
    forward: cst.FunctionDef,
    line_of: LineOf,
    caller: t.Tracer,
    closures: list[cst.FunctionDef],
    beside: bool,
) -> ClassAnalysis:
    """The site of the one function forward defines that computes the attention (`closures.py`), or the refusal of
    it; `beside`: forward computes attention too, itself or through a helper."""
    function = closures[-1]
    name = function.name.value
    output_attentions = weights_request(caller.params)

    def refused(refusal: Refusal) -> ClassAnalysis:
        return ClassAnalysis(class_name, (), (), refusal, (), output_attentions, closure=name)

    if beside or len(closures) > 1:
        where = "itself and in" if beside else "in several functions it defines, such as"
        return refused(Refusal(Code.REPEATED, class_name, line_of(function), f"forward computes attention {where} `{name}`"))
    try:
        closure = read_closure(facts, forward, function, caller, line_of)
    except Refuse as error:
        return refused(error.placed(class_name, line_of(function)))
    result = closure.tracer(facts, class_name, line_of).run()
    attention = result.attention()
    if len(attention) != 1:
        line = attention[-1].start_line if attention else line_of(function)
        return refused(Refusal(Code.REPEATED, class_name, line, f"`{name}` computes {len(attention)} attentions"))
    if attention[0].poison is not None:
        return refused(Refusal.of(attention[0].poison, class_name, attention[0].poison_line or attention[0].start_line))
    site = describe(facts, class_name, f"forward.{name}", owner, attention[0], result)
    if site.returns_weights:
        return refused(
            Refusal(
                Code.VALUE_SIDE,
                class_name,
                site.output_line,
                f"`{name}` reads the probabilities after the product with V (it returns them, say): its callers may use "
                "them, and SDPA does not give them",
            )
        )
    if site.head_mask is not None and site.head_mask not in closure.inputs:
        return refused(
            Refusal(Code.CLOSURE_READS, class_name, site.line, f"the head mask reaches `{name}` otherwise than as a parameter of forward")
        )
    if site.dropout is not None and site.dropout.conditional:
        return refused(Refusal(Code.DROPOUT, class_name, site.line, "dropout is applied only under a condition"))
    return ClassAnalysis(
        class_name=class_name,
        sites=(site,),
        helpers=(),
        refusal=None,
        eager_only_params=(site.head_mask,) if site.head_mask else (),
        output_attentions=output_attentions,
        eager_only_flags=tuple(dict.fromkeys(result.fallbacks)),
        closure=name,
    )


@dataclass
class _Gathered:
    """What `analyse_class` gathers of a class, in the order it finds it."""

    head_masks: list[str]  # forward parameters only eager takes, each once where first found
    flags: list[str]  # settings and switches only eager takes
    sites: list[AttentionSite] = field(default_factory=list)
    helper_calls: list[HelperCall] = field(default_factory=list)
    alternatives: list[str] = field(default_factory=list)
    eager_side: Refusal | None = None
    refusal: Refusal | None = None


def _inline_site(
    gathered: _Gathered,
    facts: ModuleFacts,
    class_name: str,
    forward: cst.FunctionDef,
    line_of: LineOf,
    owner: str,
    inline: list[t.Candidate],
    result: t.TraceResult,
) -> None:
    """The site of the one attention forward computes itself, or the refusal of it."""
    candidate: t.Candidate | None = inline[0] if len(inline) == 1 else None
    if candidate is None or candidate.poison is not None:
        # several attentions may sit on the two sides of a test of the module's settings, and a step SDPA cannot
        # take under `if extra is not None:` for an optional argument: the SDPA class then falls back to eager
        # on the other side, or when that argument is given, as for a head mask
        optional = None if candidate is None else without_optional(facts, class_name, forward, line_of)
        branch = None if optional is not None else one_branch(facts, class_name, forward, line_of)
        retried = optional or (None if branch is None else (branch.known, branch.result, branch.candidate))
        whole = candidate  # the computation read across both sides of the test
        if retried is not None:
            known, result, candidate = retried
            gathered.head_masks.extend(sorted(known.none))
            gathered.flags.extend(sorted(known.falsy))
            if branch is not None:
                gathered.alternatives.append(branch.side)
                gathered.eager_side = branch.eager_side
                if gathered.eager_side is None and whole is not None and whole.poison is not None:
                    # the other side would port alone, not in one computation with this side: why, said
                    gathered.eager_side = Refusal.of(whole.poison, class_name, whole.poison_line or whole.start_line)
    if candidate is None:
        gathered.refusal = Refusal(Code.REPEATED, class_name, inline[1].start_line, "forward computes several attentions")
    elif candidate.poison is not None:
        gathered.refusal = Refusal.of(candidate.poison, class_name, candidate.poison_line or candidate.start_line)
    else:
        site = describe(facts, class_name, "forward", owner, candidate, result)
        gathered.sites.append(site)
        if site.head_mask:
            gathered.head_masks.append(site.head_mask)
        gathered.flags.extend(result.fallbacks)  # settings of a module the probabilities pass through


def _helper_sites(
    gathered: _Gathered,
    facts: ModuleFacts,
    class_name: str,
    helpers: list[tuple[Helper, cst.Call, t.TraceResult, t.Candidate]],
    params: tuple[str, ...],
) -> None:
    """The site of each helper call computing the attention, or the first refusal; forward's parameters `params`."""
    for helper, call, helper_result, candidate in helpers:
        method = helper.name
        if candidate.poison is not None:
            gathered.refusal = Refusal.of(candidate.poison, class_name, candidate.poison_line or candidate.start_line)
            break
        site = describe(facts, class_name, method, helper.owner, candidate, helper_result)
        gathered.sites.append(site)
        gathered.flags.extend(helper_result.fallbacks)
        forward_heads: list[str] = []
        if site.head_mask:
            binding = bind_arguments(helper.function, helper.as_method_call(call))
            bound = None if binding is None else binding.get(site.head_mask)
            roots = [n for n in p.walk_names(bound) if n in params] if bound is not None else []
            if len(roots) != 1:
                gathered.refusal = Refusal(
                    Code.HELPER_CALL,
                    class_name,
                    site.line,
                    f"the head mask reaches `{method}` from an expression it cannot trace",
                )
                break
            forward_heads.append(roots[0])
            gathered.head_masks.append(roots[0])
        gathered.helper_calls.append(HelperCall(helper, call, tuple(forward_heads)))
