"""Class style (transformers 4.36-4.47, remote code): an `XxxSdpaAttention` subclass per attention module.

The plan is decided from read-only facts, then applied as an ordered list of passes:
insert SDPA classes -> register them -> swap mask helpers -> set `_supports_sdpa` -> add imports.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.calls import always_asks_for_weights
from sdpa_port.analyse.cross import key_only_parameters
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.mask_helpers import CAUSAL, CAUSAL_SDPA, EXTENDED, PLAIN, PLAIN_SDPA, MaskHelpers
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.none_safety import mask_parameters, safe_for_none
from sdpa_port.analyse.recognise import ClassAnalysis, attention_classes, site_operands
from sdpa_port.analyse.site import TermKind
from sdpa_port.analyse.selection import attention_dicts, configured_classes, supports_sdpa
from sdpa_port.plan.causal_contract import marks_follow_masks
from sdpa_port.plan.gate import authors_refusal, override_refusals, selection_refusals, unreached_side_refusal
from sdpa_port.plan.kept_eager import split_refused
from sdpa_port.plan.one_call import one_call
from sdpa_port.refusals import Code, Refuse, Refusal
from sdpa_port.result import NO_ATTENTION, PortResult, Status, Style
from sdpa_port.rewrite import mask_helpers, register
from sdpa_port.rewrite.sdpa_state import MaskContract
from sdpa_port.analyse.sdpa_side import SdpaSide, read_sdpa_side
from sdpa_port.analyse.shapes import plain_methods
from sdpa_port.rewrite.flat_heads import keep_heads
from sdpa_port.rewrite.sdpa_forward import build_sdpa_forward

CAUSAL_CONTRACT = "self.is_causal"


@dataclass(frozen=True)
class Registration:
    dict_name: str
    create: bool  # the dict does not exist yet
    # classes built where no config is in scope that receive the implementation's name (`register.IMPLEMENTATION`)
    threaded: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SdpaClassPlan:
    analysis: ClassAnalysis
    name: str
    registration: Registration
    forward: cst.FunctionDef
    side: SdpaSide  # what the SDPA forward runs: the flags and arguments that send it back to eager


@dataclass
class ClassStylePlan:
    classes: list[SdpaClassPlan] = field(default_factory=list)
    masks: mask_helpers.MaskSwapPlan | None = None
    helpers: MaskHelpers | None = None  # Transformers' own mask helpers as the file reaches them
    flag_classes: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)


def sdpa_class_name(class_name: str, facts: ModuleFacts) -> str:
    prefix = ""
    for root in facts.pretrained_roots:
        if root.endswith("PreTrainedModel"):
            prefix = root[: -len("PreTrainedModel")]
            break
    if prefix and class_name.startswith(prefix):
        name = prefix + "Sdpa" + class_name[len(prefix):]
    elif prefix:
        name = prefix + "Sdpa" + class_name
    elif class_name.endswith("Attention"):
        name = class_name[: -len("Attention")] + "SdpaAttention"
    else:
        name = class_name + "Sdpa"
    while name in facts.top_level_names:
        name = "_" + name
    return name


def dict_name_for(class_name: str, facts: ModuleFacts) -> str:
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", class_name).upper()
    name = f"{snake}_CLASSES"
    while name in facts.top_level_names:
        name = "_" + name
    return name


def plan_class_style(
    module: cst.Module, facts: ModuleFacts, lines: Lines, only: frozenset[str] | None = None
) -> ClassStylePlan | PortResult:
    """Decide every edit, or return the result that says why nothing is edited."""
    if supports_sdpa(facts):
        return PortResult(Status.UNCHANGED, module.code, Style.CLASS, "already supports SDPA")
    analyses = attention_classes(facts, lines, only)
    if not analyses:
        return PortResult(Status.UNCHANGED, module.code, Style.CLASS, NO_ATTENTION)
    names = tuple(a.class_name for a in analyses)
    split = split_refused(facts, analyses)
    if split.standing:
        return PortResult.refused(module.code, Style.CLASS, split.standing, names)
    analyses = split.ported
    names = tuple(a.class_name for a in analyses)
    gate = [r for r in (authors_refusal(facts),) if r is not None] + selection_refusals(facts, frozenset(names))
    gate += override_refusals(facts, frozenset(names))
    if gate:
        return PortResult.refused(module.code, Style.CLASS, gate, names)
    plan = ClassStylePlan()
    plan.warnings.extend(split.warnings())
    dicts = attention_dicts(facts)
    dict_of = {entries["eager"]: name for name, entries in dicts.items()}
    helpers = MaskHelpers.of(facts)
    plan.helpers = helpers
    swaps = _helpers_used(helpers.used(facts))
    contracts = _mask_contracts(facts, helpers, analyses, swaps)
    reasons, registrations, elsewhere = _registrations(module, facts, analyses, dict_of, plan)
    if reasons:
        return PortResult.refused(module.code, Style.CLASS, reasons, names)
    built = _build_forwards(facts, registrations, contracts)
    if isinstance(built, list) and contracts and not _none_safe(facts, built, contracts):
        # an SDPA forward, or the eager forward it falls back to, reads its mask where None would break it: keep
        # the eager mask helpers (full masks)
        plan.warnings.append("mask helpers are kept: an attention module reads its mask without a None check")
        contracts, swaps = {}, MaskSwaps()
        built = _build_forwards(facts, registrations, contracts)
    if not isinstance(built, list):
        return PortResult.refused(module.code, Style.CLASS, [built], names)
    unmarked = _unmarked_twin_callers(helpers.used(facts), analyses, contracts)
    if unmarked:
        return PortResult.refused(module.code, Style.CLASS, unmarked, names)
    plan.classes = built
    plan.warnings.extend(_float32_warnings(built))
    unported = _unported(module, plan, elsewhere, names)
    if unported is not None:
        return unported
    _plan_masks(module, facts, helpers, swaps, contracts, plan)
    plan.flag_classes = facts.pretrained_roots
    return plan


def _registrations(
    module: cst.Module,
    facts: ModuleFacts,
    analyses: list[ClassAnalysis],
    dict_of: dict[str, str],
    plan: ClassStylePlan,
) -> tuple[list[Refusal], list[tuple[ClassAnalysis, str, Registration]], list[str]]:
    """How each attention class's SDPA class is registered, or why it cannot be, and those no class here builds."""
    attention_names = frozenset(a.class_name for a in analyses)
    reasons: list[Refusal] = []
    registrations: list[tuple[ClassAnalysis, str, Registration]] = []
    elsewhere: list[str] = []  # attention classes no class of this file builds
    for analysis in analyses:
        name = sdpa_class_name(analysis.class_name, facts)
        inert = always_asked_for_weights(facts, analysis) or unreached_side_refusal(facts, analysis)
        if inert is not None:
            reasons.append(inert)
            continue
        if analysis.class_name in dict_of:
            registrations.append((analysis, name, Registration(dict_of[analysis.class_name], create=False)))
            continue
        owners = facts.classes_calling({analysis.class_name})
        sites = register.construction_sites(module, analysis.class_name, attention_names, owners, configured_classes(facts))
        if not sites:
            plan.warnings.append(f"{analysis.class_name} is not constructed in this file; it is left eager")
            elsewhere.append(analysis.class_name)
            continue
        threaded = _threading(module, facts, analysis.class_name, attention_names, sites)
        if isinstance(threaded, str):
            reasons.append(Refusal(Code.NO_CONFIG, analysis.class_name, 0, threaded))
            continue
        registration = Registration(dict_name_for(analysis.class_name, facts), create=True, threaded=threaded)
        registrations.append((analysis, name, registration))
    return reasons, registrations, elsewhere


def _unported(
    module: cst.Module, plan: ClassStylePlan, elsewhere: list[str], names: tuple[str, ...]
) -> PortResult | None:
    """The result when no SDPA class is planned (attention built elsewhere, or never built), else None."""
    if not plan.classes and elsewhere:
        # eager attention that is not ported must be said: built by another file (a remote-code `attention.py`
        # imported by `blocks.py`), its SDPA class would have to be selected there
        reasons = [
            Refusal(
                Code.BUILT_ELSEWHERE,
                name,
                0,
                "no class of this file builds it, so an SDPA class could not be selected where it is built (another "
                "file, which keeps building the eager class)",
            )
            for name in elsewhere
        ]
        return PortResult.refused(module.code, Style.CLASS, reasons, names)
    if not plan.classes:
        return PortResult(
            Status.UNCHANGED, module.code, Style.CLASS, "no attention module is constructed in this file",
            warnings=tuple(plan.warnings), attention_classes=names,
        )
    return None


def _plan_masks(
    module: cst.Module,
    facts: ModuleFacts,
    helpers: MaskHelpers,
    swaps: MaskSwaps,
    contracts: dict[str, MaskContract],
    plan: ClassStylePlan,
) -> None:
    """Decide which mask helpers the port swaps for their SDPA variants, warning of those it keeps."""
    causal = swaps.causal and all(c.causal_when_none is not None for c in contracts.values())
    model_classes = frozenset(n for n in facts.classes if facts.is_subclass(n, "PreTrainedModel"))
    unguarded = mask_helpers.unguarded_helpers(
        module,
        helpers,
        model_classes,
        set(helpers.used(facts)),
        weights=any(
            item.analysis.output_attentions is not None and _passes(facts, item.analysis.output_attentions)
            for item in plan.classes
        ),
        heads=any(n.endswith("head_mask") for item in plan.classes for n in item.analysis.eager_only_params)
        and _passes(facts, "head_mask"),
    )
    if unguarded:
        # a layer falling back to eager there would get the SDPA helper's None: keep that helper's full masks
        plan.warnings.append(
            "mask helpers kept where the calling method cannot tell that the layers fall back to eager: "
            + ", ".join(sorted(unguarded))
        )
    causal = causal and CAUSAL not in unguarded
    plain = PLAIN not in unguarded
    plan.masks = mask_helpers.MaskSwapPlan(
        causal=causal,
        plain=swaps.plain and bool(contracts) and plain,
        extended=swaps.extended and bool(contracts) and plain,
        classes=model_classes,
    )
    if swaps.causal and not causal:
        plan.warnings.append(
            "the causal mask helper is kept: not every attention module can take a missing mask as causal (it must "
            "mark its causal instances with `is_causal`, exactly those the causal helper's masks reach, have the mask "
            "as its only masking term, and tell self-attention from cross-attention calls)"
        )


MAX_THREADING = 4  # classes between the attention module and a config


def _threading(
    module: cst.Module,
    facts: ModuleFacts,
    class_name: str,
    attention_names: frozenset[str],
    sites: list[register.Construction],
) -> frozenset[str] | str:
    """The classes that must bring the implementation's name down to where `class_name` is built without a config
    in scope (each takes `attn_implementation="eager"` in its `__init__`), or why it cannot be brought.

    A class qualifies when it builds the module in its `__init__`, and every construction of it in the file does
    too, with a config in scope or in another class that qualifies; a class the file never builds is built by
    code the tool cannot see, which would keep the eager default."""
    threaded: set[str] = set()
    pending = [site for site in sites if not site.has_config]
    while pending:
        site = pending.pop()
        if not site.in_init or facts.is_subclass(site.owner, "PreTrainedModel"):
            return (
                f"built in {site.owner} outside its `__init__` without a `config` in scope, so the implementation "
                "cannot be selected"
            )
        if site.owner in threaded:
            continue
        init = facts.find_method(site.owner, "__init__")
        if init is None or register.IMPLEMENTATION in {p.name.value for p in _all_params(init[1].params)}:
            return f"built in {site.owner}, whose `__init__` cannot take the implementation's name"
        threaded.add(site.owner)
        if len(threaded) > MAX_THREADING:
            return f"built more than {MAX_THREADING} constructions away from a `config`, so the implementation cannot be selected"
        owners = facts.classes_calling({site.owner}) - {site.owner}
        built = register.construction_sites(module, site.owner, attention_names, owners, configured_classes(facts))
        if not built:
            return f"built in {site.owner} without a `config` in scope, and this file never builds {site.owner}"
        pending.extend(b for b in built if not b.has_config)
    return frozenset(threaded)


def _all_params(params: cst.Parameters) -> list[cst.Param]:
    star = [params.star_arg] if isinstance(params.star_arg, cst.Param) else []
    kwargs = [params.star_kwarg] if params.star_kwarg is not None else []
    return [*params.posonly_params, *params.params, *star, *params.kwonly_params, *kwargs]


def always_asked_for_weights(facts: ModuleFacts, analysis: ClassAnalysis) -> Refusal | None:
    """The SDPA class falls back to eager when asked for the weights; if every call asks, the port is inert."""
    parameter = analysis.output_attentions
    found = facts.find_method(analysis.class_name, "forward")
    if parameter is None or found is None:
        return None
    positional = [p.name.value for p in (*found[1].params.posonly_params, *found[1].params.params)]
    position = positional.index(parameter) - 1 if parameter in positional[1:] else None
    if not always_asks_for_weights(facts, analysis.class_name, parameter, position):
        return None
    return Refusal(
        Code.ALWAYS_WEIGHTS,
        analysis.class_name,
        0,
        f"every call of the modules built from it asks for the weights (`{parameter}` is True there: passed as True, "
        "left at a default of True, or passed on from a caller's parameter that always is), so its SDPA class would "
        "always fall back to the eager computation",
    )


@dataclass(frozen=True)
class MaskSwaps:
    """The mask helpers the file calls, each of which has a `_for_sdpa` variant that may return None."""

    causal: bool = False
    plain: bool = False
    extended: bool = False

    def __bool__(self) -> bool:
        return self.causal or self.plain or self.extended


def _helpers_used(used: dict[str, frozenset[str]]) -> MaskSwaps:
    """Which of Transformers' own helpers the file calls (`used`: class -> helpers), a twin the file already calls
    counting as its helper (its None reaches the layers as the swapped helper's would); a function or method of the
    same name from elsewhere is no helper with a `_for_sdpa` twin, and none of their contracts holds for it."""
    called = frozenset().union(*used.values()) if used else frozenset()
    return MaskSwaps(
        causal=bool(called & {CAUSAL, CAUSAL_SDPA}),
        plain=bool(called & {PLAIN, PLAIN_SDPA}),
        extended=EXTENDED in called,
    )


def _mask_contracts(
    facts: ModuleFacts, helpers: MaskHelpers, analyses: list[ClassAnalysis], swaps: MaskSwaps
) -> dict[str, MaskContract]:
    """What each attention class's SDPA forward must accept if the model switches to the `_for_sdpa` helpers."""
    if not swaps:
        return {}
    causal: dict[str, str | None] = {a.class_name: _causal_when_none(facts, helpers, a) for a in analyses}
    every_causal = swaps.causal and all(value is not None for value in causal.values())
    contracts: dict[str, MaskContract] = {}
    for analysis in analyses:
        found = facts.find_method(analysis.class_name, "forward")
        assert found is not None
        params = frozenset(mask_parameters(found[1]))
        contracts[analysis.class_name] = MaskContract(params, causal[analysis.class_name] if every_causal else None)
    return contracts


def _unmarked_twin_callers(
    used: dict[str, frozenset[str]], analyses: list[ClassAnalysis], contracts: dict[str, MaskContract]
) -> list[Refusal]:
    """A file already calling `_prepare_4d_causal_attention_mask_for_sdpa` (PLBart's model code is Bart's) hands its
    layers None for causal masks whatever the port does: an SDPA class that cannot read None as causal would
    attend to every key."""
    callers = sorted(name for name, helpers in used.items() if CAUSAL_SDPA in helpers)
    if not callers:
        return []
    return [
        Refusal(
            Code.CAUSAL_BY_USE,
            analysis.class_name,
            0,
            f"`{callers[0]}` calls `{CAUSAL_SDPA}`, whose None means a causal mask, but {analysis.class_name} is not "
            "marked causal exactly where those masks reach it, so its SDPA class would read None as no mask",
        )
        for analysis in analyses
        if contracts.get(analysis.class_name, MaskContract()).causal_when_none is None
    ]


def _causal_when_none(facts: ModuleFacts, helpers: MaskHelpers, analysis: ClassAnalysis) -> str | None:
    """The condition under which a None mask means "causal" for this class, or None when it cannot be told.

    The class must mark its causal instances with `self.is_causal`, add the mask as the chain's only masking term
    (SDPA cannot combine `is_causal` with another mask), tell self- from cross-attention calls, and be marked causal
    exactly where the causal helper's masks reach it (`causal_contract`).
    """
    if not _marks_causal_layers(facts, analysis.class_name):
        return None
    if not analysis.sites or any(
        len(site.terms) != 1 or site.terms[0].kind is not TermKind.MASK or not site.terms[0].always for site in analysis.sites
    ):
        return None
    forward = facts.find_method(analysis.class_name, "forward")
    assert forward is not None
    operands = site_operands(analysis)
    if operands is None:
        return None
    first = operands[0]
    cross = key_only_parameters(forward[1], first.key, first.query, first.helper)
    mask = _mask_parameter(forward[1], analysis.sites[0].terms[0].expression, cross)
    if mask is None or not marks_follow_masks(facts, helpers, analysis.class_name, mask, cross):
        return None
    return CAUSAL_CONTRACT + "".join(f" and {p} is None" for p in cross)


def _mask_parameter(forward: cst.FunctionDef, term: str, cross: tuple[str, ...]) -> str | None:
    """The parameter of forward holding the chain's mask in self-attention calls: the term itself, or the one mask
    parameter that serves no cross-attention."""
    params = [p for p in mask_parameters(forward) if p not in cross]
    if term in params:
        return term
    own = [p for p in params if not p.startswith("encoder")]
    return own[0] if len(own) == 1 else None


FLOAT32_SDPA = (
    "{name}: SDPA runs in float32 for half-precision models, as eager does (query and key are upcast before the "
    "product). On a GPU this keeps bf16/fp16 models off the flash and memory-efficient kernels. The upcast stays "
    "because the mask is built from the upcast query's dtype: torch.finfo(torch.float32).min overflows to -inf in "
    "bf16, and a fully masked padding row would then give NaN"
)


def _float32_warnings(built: list[SdpaClassPlan]) -> list[str]:
    """One warning per SDPA class that runs SDPA in float32 because eager upcasts its operands."""
    warnings = []
    for item in built:
        if any(isinstance(op, t.Start) and op.operands_upcast for path in item.side.paths for op in path.chain_ops):
            warnings.append(FLOAT32_SDPA.format(name=item.name))
    return warnings


def _build_forwards(
    facts: ModuleFacts,
    registrations: list[tuple[ClassAnalysis, str, Registration]],
    contracts: dict[str, MaskContract],
) -> list[SdpaClassPlan] | Refusal:
    out: list[SdpaClassPlan] = []
    for analysis, name, registration in registrations:
        contract = contracts.get(analysis.class_name, MaskContract())
        try:
            side = one_call(facts, analysis.class_name, read_sdpa_side(facts, analysis))
            forward = keep_heads(build_sdpa_forward(facts, side, contract), plain_methods(facts, analysis.class_name))
        except Refuse as error:
            line = analysis.sites[0].line if analysis.sites else 0
            return error.placed(analysis.class_name, line)
        out.append(SdpaClassPlan(analysis, name, registration, forward, side))
    return out


def _none_safe(facts: ModuleFacts, built: list[SdpaClassPlan], contracts: dict[str, MaskContract]) -> bool:
    """Every generated SDPA forward copes with a None mask wherever it reads one, and so does the eager forward it
    falls back to under a condition the models' mask helpers do not see (`super().forward(...)` is then handed the
    SDPA helper's mask; for `output_attentions` and head masks the swapped helpers build full masks themselves). Such
    a fallback never takes a None that means "causal": eager would read it as no mask."""
    for item in built:
        contract = contracts.get(item.analysis.class_name)
        if contract is None:
            continue
        nullable = set(contract.nullable)
        if not safe_for_none(item.forward, nullable):
            return False
        unseen = item.analysis.eager_only_flags + tuple(
            name for name in item.analysis.eager_only_params if not name.endswith("head_mask")
        )
        if unseen and contract.causal_when_none is not None:
            # a None mask means "causal" to the SDPA forward; to the eager one it means no mask at all
            return False
        if unseen and not _eager_none_safe(facts, item.analysis, nullable):
            return False
    return True


def _eager_none_safe(facts: ModuleFacts, analysis: ClassAnalysis, nullable: set[str]) -> bool:
    """The eager forward, and each helper it hands the mask to, copes with a None mask."""
    found = facts.find_method(analysis.class_name, "forward")
    if found is None or not safe_for_none(found[1], nullable):
        return False
    for call in analysis.helpers:
        bound = call.bound()
        if bound is None:
            return False
        names = {name for name, value in bound.items() if isinstance(value, cst.Name) and value.value in nullable}
        if names and not safe_for_none(call.helper.function, names):
            return False
    return True


def _passes(facts: ModuleFacts, suffix: str) -> bool:
    """Some call in the file hands on an argument of that name (`output_attentions=...`, `layer_head_mask`): the
    layers may then be asked for what only eager gives. A file that never passes one leaves the defaults."""
    if facts.tree is None:
        return True
    for node in ast.walk(facts.tree):
        if isinstance(node, ast.Call):
            if any(k.arg is not None and k.arg.endswith(suffix) for k in node.keywords):
                return True
            if any(isinstance(a, ast.Name) and a.id.endswith(suffix) for a in node.args):
                return True
    return False


def _marks_causal_layers(facts: ModuleFacts, class_name: str) -> bool:
    """Whether `self.is_causal` tells the causal instances apart, as `_for_sdpa` causal masks require.

    Either the class is always causal (`self.is_causal = True`), or the file builds it with `is_causal=True`
    somewhere. A class whose flag stays at a False default while it receives causal masks (BioGPT) fails.
    """
    values = facts.find_attribute_values(class_name, "is_causal")
    if not values:
        return False
    if all(isinstance(v, cst.Name) and v.value == "True" for v in values):
        return True
    if facts.tree is None:
        return False
    dicts = {name for name, entries in attention_dicts(facts).items() if entries.get("eager") == class_name}
    for node in ast.walk(facts.tree):
        func = node.func if isinstance(node, ast.Call) else None
        builds = (isinstance(func, ast.Name) and func.id == class_name) or (
            isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in dicts
        )
        if builds:
            assert isinstance(node, ast.Call)
            for keyword in node.keywords:
                if keyword.arg == "is_causal" and isinstance(keyword.value, ast.Constant) and keyword.value.value is True:
                    return True
    return False


__all__ = ["plan_class_style", "ClassStylePlan", "SdpaClassPlan", "always_asked_for_weights", "code"]
