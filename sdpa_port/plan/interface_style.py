"""Interface style (transformers 5.x): dispatch each attention through `ALL_ATTENTION_FUNCTIONS`.

For every attention module the eager computation moves, unchanged, into a module-level eager function; forward
calls `ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, <eager function>)` with the scaling,
dropout and extra additive terms the other implementations need. Modules get `self.is_causal` and, where missing,
`self.config`; `_supports_sdpa = True` is set on the PreTrainedModel classes. Files already on the interface that only
lack the flag get it once their eager function is recognised as exact and their modules set `is_causal`.
"""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.recognise import ClassAnalysis, attention_classes
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.selection import attention_dicts
from sdpa_port.discover.release import Release
from sdpa_port.discover.screen import Screen
from sdpa_port.plan.causal_sites import KeptMasks, dispatched_mask
from sdpa_port.plan.causality import Causality, check_own_causality, dispatching_classes
from sdpa_port.plan.flash_proof import no_flash
from sdpa_port.plan.interface_checks import (
    check_dispatched_function,
    check_kept_builders,
    check_sdpa_allowed,
    imported_from_model,
)
from sdpa_port.plan.interface_module import plan_module
from sdpa_port.plan.interface_plan import InterfacePlan
from sdpa_port.plan.kept_eager import split_refused
from sdpa_port.plan.mask_readers import plan_eager_masks
from sdpa_port.plan.threading import plan_threading
from sdpa_port.refusals import Refuse
from sdpa_port.result import NO_ATTENTION, PortResult, Status, Style
from sdpa_port.rewrite.alibi_masks import alibi_builders
from sdpa_port.rewrite.export_positions import shifted_ranges
from sdpa_port.rewrite.interface_apply import apply_interface
from sdpa_port.rewrite.long_lines import lay_out_long_lines
from sdpa_port.rewrite.reused_terms import laid_out_once
from sdpa_port.rewrite.layout import fresh_name

FOLD_FUNCTION = "fold_additive_terms"


def port_interface_style(
    module: cst.Module, facts: ModuleFacts, lines: Lines, first: Screen, release: Release | None = None
) -> PortResult:
    """The interface port of a file `port_source` has screened (it answers files already supporting SDPA), for the
    transformers `release` it will run in (None: unknown, the form exact in every 5.x release)."""
    analyses = attention_classes(facts, lines, first.softmax_classes)
    names = tuple(a.class_name for a in analyses)
    split = split_refused(facts, analyses)
    if split.standing:
        return PortResult.refused(module.code, Style.INTERFACE, split.standing, names)
    analyses = split.ported
    dispatching = dispatching_classes(facts)
    if not analyses and not dispatching:
        return PortResult(Status.UNCHANGED, module.code, Style.INTERFACE, NO_ATTENTION)
    try:
        plan = plan_interface(module, facts, analyses, dispatching, release)
    except Refuse as error:
        return PortResult.refused(module.code, Style.INTERFACE, [error.placed(names[0] if names else "<module>")], names)
    plan.warnings[:0] = split.warnings()
    if not plan.edits:
        sources = ", ".join(sorted(set(plan.dispatching_elsewhere.values())))
        return PortResult(
            Status.UNCHANGED,
            module.code,
            Style.INTERFACE,
            f"already dispatches through ALL_ATTENTION_FUNCTIONS (eager functions from {sources})",
        )
    applied = laid_out_once(apply_interface(module, facts, plan), [site for a in analyses for site in a.sites])
    new_module = lay_out_long_lines(module, applied)
    new_source = new_module.code
    compile(new_source, "<sdpa-port>", "exec")
    ported = tuple(p.class_name for p in plan.modules) + tuple(plan.flag_only)
    return PortResult(
        Status.PORTED,
        new_source,
        Style.INTERFACE,
        f"{len(plan.modules)} attention class(es) moved onto the attention interface"
        + (f", {len(plan.flag_only)} already on it" if plan.flag_only else ""),
        warnings=tuple(plan.warnings),
        notes=tuple(plan.notes),
        attention_classes=ported,
        sites=tuple(site for a in analyses for site in a.sites),
        no_flash=plan.no_flash,
    )


# ------------------------------------------------------------------ planning


def plan_interface(
    module: cst.Module,
    facts: ModuleFacts,
    analyses: list[ClassAnalysis],
    dispatching: dict[str, str],
    release: Release | None = None,
) -> InterfacePlan:
    """What the interface port of the file does, planned in the steps below, in order; each may refuse the file."""
    plan = InterfacePlan()
    # additive terms go as `position_bias` where the release's sdpa applies it (5.17.0 on); elsewhere, and where the
    # release is unknown, they are folded into the float mask, exact for sdpa and eager in every release
    fold = release is None or not release.sdpa_position_bias
    fold_function = fresh_name(FOLD_FUNCTION, facts.top_level_names) if fold else None
    # the model updates continuous batching's paged cache itself (5.25.0): its cache updates take the kwargs
    paged_updates = release is not None and release.model_updates_paged_cache and release.paged_update_parameters == (
        "kwargs",
    )
    check_sdpa_allowed(facts)
    causality = Causality.of(facts)
    eager_names = _plan_modules(plan, facts, analyses, causality, fold_function, paged_updates)
    _plan_flag_only(plan, facts, causality, dispatching, eager_names)
    readers = [(p.class_name, p.reads_mask) for p in plan.modules if p.reads_mask is not None]
    plan.eager_masks = plan_eager_masks(module, facts, readers, causality.other_implementations) if readers else None
    plan.warnings.extend([plan.eager_masks.warning()] if plan.eager_masks is not None else [])
    plan.unpinned = list(causality.unpinned)
    plan.kept = list(causality.kept)
    for kept in plan.kept:
        check_kept_builders(module, kept)
        plan.warnings.extend(_kept_warnings(kept))
    eager_classes = {p.class_name for p in plan.modules}
    if plan.modules:
        _plan_file_edits(plan, facts, release, fold_function, eager_classes)
    for dict_name, entries in attention_dicts(facts).items():
        if entries["eager"] in eager_classes:
            plan.dicts[dict_name] = entries["eager"]
    plan.no_flash = no_flash(plan, facts, causality, release)
    return plan


def _plan_modules(
    plan: InterfacePlan,
    facts: ModuleFacts,
    analyses: list[ClassAnalysis],
    causality: Causality,
    fold_function: str | None,
    paged_updates: bool,
) -> dict[str, str]:
    """Each attention class planned onto the interface, by its eager function's name (returned, by class)."""
    eager_names: dict[str, str] = {}
    for analysis in analyses:
        eager_name = _eager_function_name(analysis.class_name, facts, len(analyses), eager_names)
        eager_names[analysis.class_name] = eager_name
        try:
            plan.modules.append(plan_module(facts, analysis, eager_name, causality, fold_function, paged_updates))
        except Refuse as error:
            line = analysis.sites[0].line if analysis.sites else 0
            raise Refuse.because(error.reason, error.where or analysis.class_name, error.line or line) from None
    return eager_names


def _plan_flag_only(
    plan: InterfacePlan,
    facts: ModuleFacts,
    causality: Causality,
    dispatching: dict[str, str],
    eager_names: dict[str, str],
) -> None:
    """The classes already dispatching to an eager function of the file, given their `is_causal` where they lack it."""
    for class_name, function_name in dispatching.items():
        if class_name in eager_names:
            continue
        source = imported_from_model(facts, function_name)
        if source is not None:
            # a modular file reusing another model's eager function: the generated modeling file carries it
            plan.dispatching_elsewhere[class_name] = source
            continue
        check_dispatched_function(facts, class_name, function_name)
        found = causality.flow.modules.method(class_name, "forward")
        mask_param = dispatched_mask(found[1]) if found is not None else None
        check_own_causality(causality, class_name, mask_param, ())
        plan.flag_only.append(class_name)
        if not facts.find_attribute_values(class_name, "is_causal"):
            causal_value, causal_sites = causality.decide(class_name, mask_param, ())
            if causal_sites is not None:
                plan.flag_only_sites[class_name] = causal_sites
            else:
                assert causal_value is not None
                plan.causal_for_flag_only[class_name] = causal_value


def _plan_file_edits(
    plan: InterfacePlan,
    facts: ModuleFacts,
    release: Release | None,
    fold_function: str | None,
    eager_classes: set[str],
) -> None:
    """The edits outside the moved classes (position ranges, ALiBi builders, fold function, kwargs threading), with
    what each leaves unclaimed."""
    plan.shifted_ranges, unshifted = shifted_ranges(facts)
    plan.warnings.extend(
        f"{owner} line {line}: a position range starts at a length that is a tensor with a static cache, and is "
        "not of an integer dtype, so it is left as it is: torch.export fails there"
        for owner, line in unshifted
    )
    plan.alibi = alibi_builders(facts)
    plan.warnings.extend(
        f"`{name}` (line {line}) builds ALiBi from a 2-D mask and was not recognised: continuous batching's 4-D "
        "masks fail there"
        for name, line in plan.alibi.unknown
    )
    plan.warnings.extend(
        f"{p.class_name}: the code beside the attention under `if {test}:` stays eager and takes the attention "
        "mask in eager's form, which only sdpa's boolean mask gives; `_supports_attention_backend` is not set"
        for p in plan.modules
        for test in p.eager_mask_tests
    )
    plan.warnings.extend(
        f"{p.class_name} hands its additive terms (ALiBi, relative positions) over as `position_bias`: sdpa, flex "
        "and eager apply them, kernels that ignore it (transformers' paged|eager for continuous batching, "
        "ExecuTorch's custom_sdpa, vLLM's) would silently drop them; `_supports_attention_backend` is not set"
        for p in plan.modules
        if p.position_bias
    )
    plan.warnings.extend(
        f"{p.class_name} folds its additive terms (ALiBi, relative positions) into the float mask it hands over, "
        f"since {_release_name(release)} sdpa reads no `position_bias`: sdpa and eager apply them; flash "
        "attention ignores a float mask, flex takes a BlockMask (and reads a float mask at one head), kernels that "
        "ignore the mask would drop them; only sdpa is claimed, `_supports_attention_backend` is not set"
        for p in plan.modules
        if p.folded
    )
    if any(p.fold_called for p in plan.modules):
        plan.fold_function = fold_function
    plan.threading = plan_threading(facts, eager_classes, eager_classes, release)
    plan.warnings.extend(
        f"{problem}; `_supports_attention_backend` is not set"
        for problem in plan.threading.problems
    )


def _release_name(release: Release | None) -> str:
    """The target release, as the warnings name it."""
    if release is None:
        return "in some 5.x releases (the target release is unknown)"
    return f"transformers {release.version}'s" if release.version else "the target release's"


def _kept_warnings(kept: KeptMasks) -> list[str]:
    """What a class whose causality the always-built masks carry cannot claim."""
    if kept.extended is not None:
        return [
            f"{kept.class_name} extends its mask over keys of its own: kernels that take a 2-D padding mask or "
            "read `is_causal` alone (flash attention, and other registered kernels) would not see them; "
            "`_supports_attention_backend` is not set"
        ]
    if kept.beside is None:  # beside: the module keeps its `is_causal`; the kept code has its warning
        return [
            f"{kept.class_name} takes its causality from the masks, which are always built: kernels that read "
            "`is_causal` alone (flash attention, and other registered kernels) would not apply it; "
            "`_supports_attention_backend` is not set"
        ]
    return []


def _eager_function_name(class_name: str, facts: ModuleFacts, count: int, used: dict[str, str]) -> str:
    """A top-level name for the class's eager function, free in the file and among those already given."""
    base = "eager_attention_forward"
    if count == 1 and base not in facts.top_level_names:
        return base
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in class_name).lstrip("_")
    name = f"{snake}_eager_attention_forward"
    while name in facts.top_level_names or name in used.values():
        name = "_" + name
    return name


__all__ = ["port_interface_style"]
