"""Inline style (remote code): the eager computation replaced where it stands, in its own class.

For exact attention that Transformers' wiring cannot reach: a module built with no `config` in scope, or built in
another file, where no SDPA class could be selected. The class keeps its name and its place; its `forward` becomes
the SDPA forward the class style would write, and the eager forward stays beside it, renamed, only where SDPA cannot
return what a call asks for (attention weights, head masks). No implementation setting is read: the module computes
with SDPA whatever `config._attn_implementation` says, and the port says so.

Before, where `Block` builds `Attention(dim, heads)` from constructor arguments:

    class Attention(nn.Module):
        def forward(self, x, output_attentions=False):
            ...
            probs = (q @ k.transpose(-2, -1) * self.scale).softmax(-1)
            return probs @ v, probs if output_attentions else None

After:

    class Attention(nn.Module):
        def forward(self, x, output_attentions=False):
            if output_attentions:
                return self._eager_forward(x, output_attentions=output_attentions)
            ...
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale), None

        def _eager_forward(self, x, output_attentions=False):
            <the eager forward, unchanged>
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.discarded import discarded_by_every_call, weight_positions
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.optional_facts import is_device_test
from sdpa_port.analyse.recognise import ClassAnalysis, attention_classes
from sdpa_port.analyse.sdpa_side import SdpaSide, read_sdpa_side
from sdpa_port.analyse.selection import supports_sdpa
from sdpa_port.plan.class_style import always_asked_for_weights
from sdpa_port.plan.gate import authors_refusal, unreached_side_refusal
from sdpa_port.refusals import Code, Refuse, Refusal
from sdpa_port.result import NO_ATTENTION, PortResult, Status, Style
from sdpa_port.rewrite.sdpa_forward import build_sdpa_forward
from sdpa_port.rewrite.sdpa_state import MaskContract

EAGER_METHOD = "_eager_forward"

# said of every in-place port: the module no longer follows the implementation setting
UNSELECTED = (
    "{name} computes its attention with SDPA in place, whatever `config._attn_implementation` says (the {why}); "
    "calls asking for what only eager gives ({fallback}) run the eager forward kept as `{eager}`"
)
UNSELECTED_NO_FALLBACK = (
    "{name} computes its attention with SDPA in place, whatever `config._attn_implementation` says (the {why}); "
    "no call can ask for what only eager gives, so no eager forward is kept"
)

# said of a port whose forward returned the probabilities with no parameter asking for them
DISCARDED = "; it returns None for the probabilities: every caller in this file discards them"


@dataclass(frozen=True)
class InlineClassPlan:
    """One class ported in place: its new forward, and the name the eager forward keeps (None: not kept)."""

    analysis: ClassAnalysis
    forward: cst.FunctionDef  # the SDPA forward, without its fallback
    side: SdpaSide
    eager_name: str | None
    discards: bool = False  # returns None for the probabilities, which every caller in this file discards

    @property
    def fallback_test(self) -> str:
        return " or ".join([*self.side.falsy, *(f"{name} is not None" for name in self.side.none)])


@dataclass
class InlinePlan:
    classes: list[InlineClassPlan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def plan_inline_style(
    module: cst.Module,
    facts: ModuleFacts,
    lines: Lines,
    only: frozenset[str] | None = None,
    why: tuple[Refusal, ...] = (),
    sdpa_callers: frozenset[str] = frozenset(),
) -> InlinePlan | PortResult:
    """Decide every in-place edit, or return the result that says why nothing is edited.

    `why`: the class style's refusals, on wiring alone (each class's warning says its own), empty when inline was
    asked for.
    `sdpa_callers`: the classes whose forward calls SDPA where it can run (`Screen.sdpa_callers`)."""
    if supports_sdpa(facts):
        return PortResult(Status.UNCHANGED, module.code, Style.INLINE, "already supports SDPA")
    analyses = [a for a in attention_classes(facts, lines, only) if a.sites or a.refusal is not None]
    if not analyses:
        return PortResult(Status.UNCHANGED, module.code, Style.INLINE, NO_ATTENTION)
    names = tuple(a.class_name for a in analyses)
    if all(a.class_name in sdpa_callers for a in analyses):
        # each forward already computes with SDPA where it can run (an in-place port, or the authors' own, maybe
        # under a setting off by default), keeping eager beside it
        return PortResult(Status.UNCHANGED, module.code, Style.INLINE, "already supports SDPA")
    authors = authors_refusal(facts)
    if authors is not None:
        return PortResult.refused(module.code, Style.INLINE, [authors], names)
    # a class that inherits its forward from another is ported through that class, or not at all
    owners = [a for a in analyses if "forward" in facts.classes[a.class_name].methods]
    ported = [a for a in owners if a.refusal is None]
    refused = [a.refusal for a in analyses if a.refusal is not None]
    if not ported:
        return PortResult.refused(module.code, Style.INLINE, refused, names)
    plan = InlinePlan()
    reasons: list[Refusal] = []
    for analysis in ported:
        planned = _plan_class(facts, analysis, analyses)
        if isinstance(planned, Refusal):
            reasons.append(planned)
        else:
            plan.classes.append(planned)
    if reasons:
        return PortResult.refused(module.code, Style.INLINE, reasons, names)
    kept = [r for r in refused if r.where not in {item.analysis.class_name for item in plan.classes}]
    plan.warnings.extend(f"{refusal.where} stays eager: {refusal}" for refusal in kept)
    plan.warnings.extend(_unselected(item, _why_unwired(item.analysis.class_name, why)) for item in plan.classes)
    return plan


def _plan_class(
    facts: ModuleFacts, analysis: ClassAnalysis, analyses: list[ClassAnalysis]
) -> InlineClassPlan | Refusal:
    inert = always_asked_for_weights(facts, analysis) or unreached_side_refusal(facts, analysis)
    if inert is not None:
        return inert
    discards = analysis.output_attentions is None and any(site.returns_weights for site in analysis.sites)
    try:
        side = read_sdpa_side(facts, analysis)
        forward = build_sdpa_forward(facts, side, callers_contract(side.forward))
    except Refuse as error:
        if discards:
            return _weights_returned(analysis, "")
        return error.placed(analysis.class_name, analysis.sites[0].line if analysis.sites else 0)
    if discards:
        # no parameter asks for the weights: SDPA may return None for them only where no caller reads them
        why = _weights_read(facts, analysis.class_name, side)
        if why is not None:
            return _weights_returned(analysis, why)
    heir = _heir_refusal(facts, analysis.class_name, forward, analyses)
    if heir is not None:
        return heir
    eager_name = None
    if side.falsy or side.none:
        eager_name = EAGER_METHOD
        taken = _names_of(facts, analysis.class_name)
        while eager_name in taken:
            eager_name = "_" + eager_name
    return InlineClassPlan(analysis, forward, side, eager_name, discards)


def _weights_returned(analysis: ClassAnalysis, why: str) -> Refusal:
    return Refusal(
        Code.VALUE_SIDE,
        analysis.class_name,
        analysis.sites[0].line,
        "the probabilities are returned, and no parameter of the call asks for them (such as `output_attentions`), "
        "so the SDPA forward could not fall back to eager where a caller reads them" + (f": {why}" if why else ""),
    )


def _weights_read(facts: ModuleFacts, class_name: str, side: SdpaSide) -> str | None:
    """Why a caller may read the probabilities the forward returns (`analyse/discarded.py`); None: none can."""
    if side.path is None or side.calls or side.closure is not None:
        return "a helper computes them, whose returns are not followed"
    found = weight_positions(side.path)
    if isinstance(found, str):
        return found
    return discarded_by_every_call(facts, class_name, *found)


def _names_of(facts: ModuleFacts, class_name: str) -> set[str]:
    """Every method and attribute name a class and its in-file bases and subclasses use."""
    names: set[str] = set()
    for info in facts.classes.values():
        if info.name == class_name or class_name in {b.name for b in facts.mro(info.name)}:
            for base in facts.mro(info.name):
                names |= set(base.methods) | set(base.class_vars) | set(base.attributes)
    return names


def _heir_refusal(
    facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, analyses: list[ClassAnalysis]
) -> Refusal | None:
    """A subclass in the file that inherits the new forward (or calls it through `super().forward`) must be one it
    is proven for: the subclass defines no other method, and its own port would write the same SDPA forward (an
    attribute it sets again, such as the scale, may change what that forward must be).

    A subclass whose own forward calls the base class's (DINOv2's `MemEffAttention`: a kernel path, and
    `return super().forward(x)` where the kernel is missing) runs the new forward on an instance the base class's
    constructor built: proven where it defines no other method and sets none of the base class's attributes again.
    """
    by_name = {a.class_name: a for a in analyses}
    for name, info in facts.classes.items():
        if name == class_name or class_name not in {b.name for b in facts.mro(name)}:
            continue
        own = info.methods.get("forward")
        if own is not None and not m.findall(own, m.Call(func=m.Attribute(attr=m.Name("forward")))):
            continue  # its own forward, which never runs the base class's: ported (or refused) on its own
        methods = sorted(set(info.methods) - {"__init__", "forward"})
        heir = by_name.get(name)
        why = None
        again = sorted(set(info.attributes) & set(facts.classes[class_name].attributes))
        if methods:
            why = f"defines {', '.join(methods)}"
        elif own is not None:
            why = f"calls the base class's forward from its own and sets {', '.join(again)} again" if again else None
        elif heir is not None and heir.refusal is not None:
            why = f"inherits the forward and is refused: {heir.refusal}"
        elif heir is not None and _sdpa_forward_code(facts, heir) != code(forward):
            why = "sets attributes whose values need another SDPA forward than the base class's"
        elif heir is None and again:
            why = f"sets {', '.join(again)} again"
        if why is not None:
            return Refusal(
                Code.INLINE_SUBCLASS,
                class_name,
                0,
                f"its subclass {name} {why}, and would run an SDPA forward proven for {class_name} alone",
            )
    return None


def callers_contract(forward: cst.FunctionDef) -> MaskContract:
    """What an in-place forward may receive: its callers are not followed, so no parameter's dtype is proven, and
    a term read from one is handed to SDPA in the query's dtype (`rewrite/term_dtype.py`)."""
    params = forward.params
    named = [*params.posonly_params, *params.params, *params.kwonly_params]
    stars = [star for star in (params.star_arg, params.star_kwarg) if isinstance(star, cst.Param)]
    # the first is the module itself, whose buffers and parameters follow the model's dtype
    names = {param.name.value for param in [*named[1:], *stars]}
    return MaskContract(unproven=frozenset(names))


def _sdpa_forward_code(facts: ModuleFacts, analysis: ClassAnalysis) -> str | None:
    try:
        side = read_sdpa_side(facts, analysis)
        return code(build_sdpa_forward(facts, side, callers_contract(side.forward)))
    except Refuse:
        return None


def _why_unwired(name: str, refusals: tuple[Refusal, ...]) -> str:
    """Why the class style could not wire the class `name`: its refusals of that class, else of the file."""
    if not refusals:
        return "inline style was asked for"
    own = [f"{r.detail} [{r.code.code}]" for r in refusals if r.where == name]
    if own:
        return f"class style cannot wire it: {'; '.join(own)}"
    return f"class style cannot wire this file: {'; '.join(str(r) for r in refusals)}"


def _unselected(item: InlineClassPlan, why: str) -> str:
    name = item.analysis.class_name
    discards = DISCARDED if item.discards else ""
    if item.eager_name is None:
        return UNSELECTED_NO_FALLBACK.format(name=name, why=why) + discards
    parts = ["inputs on an XLA device" if is_device_test(flag) else f"`{flag}`" for flag in item.side.falsy]
    parts += [f"`{param}`" for param in item.side.none]
    return UNSELECTED.format(name=name, why=why, fallback=", ".join(parts), eager=item.eager_name) + discards


__all__ = ["InlineClassPlan", "InlinePlan", "plan_inline_style", "EAGER_METHOD"]
