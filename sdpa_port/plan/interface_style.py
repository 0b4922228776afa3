"""Interface style (transformers 5.x): dispatch each attention through `ALL_ATTENTION_FUNCTIONS`.

For every attention module the eager computation moves, unchanged, into a module-level eager function; forward
calls `ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, <eager function>)` with the scaling,
dropout and extra additive terms the other implementations need. Modules get `self.is_causal` and, where missing,
`self.config`; `_supports_sdpa = True` is set on the PreTrainedModel classes. Files already on the interface that only
lack the flag get it once their eager function is recognised as exact and their modules set `is_causal`.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from functools import partial
from typing import Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cross import key_only_parameters, self_attention_test
from sdpa_port.analyse.cstutil import all_assigned_names, block_body, code, is_pass
from sdpa_port.analyse.known import Known
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.mask_changes import extended_mask, forward_of, zeros_block
from sdpa_port.analyse.masked_rows import row_safe
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.patterns import cast_operand, function_names, walk_names
from sdpa_port.analyse.recognise import ClassAnalysis, attention_classes, one_side_helpers
from sdpa_port.discover.release import Release
from sdpa_port.discover.screen import Screen
from sdpa_port.analyse.selection import attention_dicts
from sdpa_port.plan.causal_sites import (
    CausalSites,
    eager_form_builders,
    KeptMasks,
    dispatched_mask,
)
from sdpa_port.render import render_module
from sdpa_port.plan.interface_checks import (
    bind_handed_values,
    check_alternatives,
    check_dispatched_function,
    check_kept_builders,
    check_mask_setting,
    check_one_computation,
    check_sdpa_allowed,
    imported_from_model,
    mask_parameter,
    operand_upcasts,
    weights_bookkeeping,
    weights_requested,
)
from sdpa_port.plan.causality import (
    Causality,
    causality_in_chain,
    check_causal_attribute,
    check_own_causality,
    claims_reaching,
    dispatching_classes,
    unread_pinned,
)
from sdpa_port.plan.interface_plan import InterfacePlan, ModulePlan
from sdpa_port.rewrite.interface_apply import apply_interface
from sdpa_port.refusals import Code, Refuse
from sdpa_port.result import NO_ATTENTION, PortResult, Status, Style
from sdpa_port.rewrite import register
from sdpa_port.rewrite.extended_masks import convert_block
from sdpa_port.rewrite.cleanup import remove_dead
from sdpa_port.rewrite.paged_updates import pass_kwargs_to_updates
from sdpa_port.rewrite.interface_body import InterfaceEmitter
from sdpa_port.rewrite.interface_eager import eager_body
from sdpa_port.rewrite.interface_options import EagerMask, EagerPart, InterfaceOptions, parameter_name
from sdpa_port.rewrite.sdpa_state import SideNames
from sdpa_port.analyse.sdpa_path import SdpaPath, read_sdpa_path
from sdpa_port.analyse.sdpa_side import keys_aligned_in
from sdpa_port.rewrite.sdpa_forward import inline_helpers
from sdpa_port.plan.bool_masks import Converted, converted_fill
from sdpa_port.rewrite.unconverted_masks import AddInsteadOfFill
from sdpa_port.plan.kept_eager import split_refused
from sdpa_port.plan.gate import unreached_side_refusal
from sdpa_port.plan.threading import plan_threading
from sdpa_port.plan.mask_readers import plan_eager_masks, ported_mask_read
from sdpa_port.rewrite.layout import fresh_name, with_star_kwargs
from sdpa_port.plan.key_statements import key_statements
from sdpa_port.rewrite.export_positions import shifted_ranges
from sdpa_port.rewrite.alibi_masks import alibi_builders

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
    new_module = apply_interface(module, facts, plan)
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
    )


# ------------------------------------------------------------------ planning


def plan_interface(
    module: cst.Module,
    facts: ModuleFacts,
    analyses: list[ClassAnalysis],
    dispatching: dict[str, str],
    release: Release | None = None,
) -> InterfacePlan:
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
    eager_names: dict[str, str] = {}
    for analysis in analyses:
        eager_name = _eager_function_name(analysis.class_name, facts, len(analyses), eager_names)
        eager_names[analysis.class_name] = eager_name
        try:
            plan.modules.append(_plan_module(facts, analysis, eager_name, causality, fold_function, paged_updates))
        except Refuse as error:
            line = analysis.sites[0].line if analysis.sites else 0
            raise Refuse.because(error.reason, error.where or analysis.class_name, error.line or line) from None
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
    for dict_name, entries in attention_dicts(facts).items():
        if entries["eager"] in eager_classes:
            plan.dicts[dict_name] = entries["eager"]
    return plan


def _release_name(release: Release | None) -> str:
    if release is None:
        return "in some 5.x releases (the target release is unknown)"
    return f"transformers {release.version}'s" if release.version else "the target release's"


def _plan_module(
    facts: ModuleFacts,
    analysis: ClassAnalysis,
    eager_name: str,
    causality: Causality,
    fold_function: str | None = None,
    paged_updates: bool = False,
) -> ModulePlan:
    found = facts.find_method(analysis.class_name, "forward")
    assert found is not None
    forward = found[1]
    if len(analysis.sites) > 1:
        # helpers on the two sides of a test of the module's settings: the one called where the setting is off
        # dispatches, the other runs as written
        analysis = one_side_helpers(facts, analysis) or analysis
    # a test of the module's settings whose other side computes the output some other way (an approximation, another
    # helper) keeps that side as written: only the side with the attention dispatches
    alternatives = Known(falsy=frozenset(analysis.alternatives))
    unreached = unreached_side_refusal(facts, analysis)
    if unreached is not None:
        raise Refuse(unreached.code, unreached.detail)
    check_one_computation(analysis, alternatives)
    if analysis.helpers:
        forward = inline_helpers(facts, analysis, forward)
    aligned = keys_aligned_in(facts, analysis)
    path = read_sdpa_path(facts, analysis.class_name, forward, aligned=aligned, known=alternatives)
    check_alternatives(forward, path, alternatives)
    start = path.start
    assert start is not None
    params = path.params
    mask_param = mask_parameter(path, params)
    unconverted: set[int] = set()  # lines of `create_*_mask(...).to(torch.bool)` whose conversion is dropped
    mask_setting: tuple[cst.BaseExpression, int] | None = None  # the setting under which the mask is added, and where
    for op, _, line in path.ops:
        if isinstance(op, t.Fill) and mask_param is not None and not row_safe(op, aligned):
            # transformers' sdpa combines a boolean attention mask with position_bias by replacement
            # (`where(mask, bias, min)`), not by addition: even an absorbing fill then differs in a row that
            # loses every key
            raise Refuse(
                Code.MASKED_ROWS,
                f"masked scores are replaced where `{code(op.condition)}` says so, which may mask every key of a real "
                "token's row; the implementations combine the attention mask with the other terms by replacement, so "
                "such a row would differ",
                line=line,
            )
        if isinstance(op, t.Fill) and any("mask" in n for n in walk_names(op.condition) & set(params)):
            filled = op.condition.value if isinstance(op.condition, cst.Name) and op.condition.value in params else None
            converted = _converted(causality, analysis.class_name, filled, op, forward)
            if isinstance(converted, Converted) and mask_param in (None, filled):
                unconverted |= converted.lines
                mask_param = filled  # handed to the implementations as built
                continue
            raise Refuse(
                Code.MASK_PER_IMPLEMENTATION,
                "the attention mask is applied with a masking fill; transformers builds it differently for each "
                "implementation, so it cannot be handed over as is" + (f" ({converted})" if converted else ""),
                line=line,
            )
        if isinstance(op, t.AddTerm) and mask_param is not None and cast_operand(op.term) == mask_param and not op.with_chain:
            if op.setting is None or mask_setting is not None:
                raise Refuse(
                    Code.CONDITIONAL,
                    "the attention mask is added only under a condition other than one test of the module's "
                    "settings, but the implementations receive it whenever it is given",
                    line=line,
                )
            mask_setting = (op.setting, line)
    own_forward = forward_of(facts.tree, [info.name for info in facts.mro(analysis.class_name)]) if facts.tree else None
    extended = extended_mask(own_forward, mask_param) if own_forward is not None and mask_param else None
    queries, keys = path.operands
    cross = key_only_parameters(forward, keys, queries)
    if mask_setting is not None:
        check_mask_setting(causality, analysis.class_name, mask_param, cross, *mask_setting)
    extension: tuple[str, KeptMasks] | None = None
    if extended is not None:
        assert own_forward is not None and mask_param is not None
        block = zeros_block(own_forward, mask_param)
        kept = causality.extended(analysis.class_name, mask_param, cross, extended) if block else None
        if block is not None and kept is not None:
            extension = (block, kept)
        elif block is None:
            why = "it is not a block of zeros bound in forward, added along the keys (one that only keeps keys)"
        elif causality.other_implementations:
            why = "flash attention, already claimed, would take the causality from `is_causal` alone"
        else:
            why = "the masks reaching the module are not all followed to transformers' builders"
    if extended is not None and extension is None:
        raise Refuse(
            Code.MASK_EXTENDED,
            f"`{mask_param}` is concatenated with a tensor of the module's own before it reaches the scores; "
            "transformers builds the mask per implementation (boolean or None for sdpa), so the result is right "
            f"for eager alone: {why}",
            line=extended,
        )
    moved = operand_upcasts(forward, start) | weights_bookkeeping(path) | key_statements(path)
    has_causal = bool(facts.find_attribute_values(analysis.class_name, "is_causal"))
    causal_value: str | None = None
    causal_sites: CausalSites | None = None
    replaces_pinned = False
    not_causal = False  # the dispatch passes is_causal=False: `self.is_causal` no longer reaches the implementations
    if has_causal:
        try:
            check_own_causality(causality, analysis.class_name, mask_param, cross)
            check_causal_attribute(facts, analysis.class_name, causality, mask_param is not None)
        except Refuse as error:
            pinned = unread_pinned(facts, analysis.class_name, causality)
            if error.reason.code in (Code.CAUSAL_BY_USE, Code.CAUSAL_CONTRADICTED) and pinned is not None:
                # the literal has never changed a result: the masks decide, as for a class without the attribute
                causal_value, causal_sites = causality.decide(analysis.class_name, mask_param, cross)
                replaces_pinned = True
            elif (
                error.reason.code in (Code.CAUSAL_PINNED, Code.CAUSAL_CONTRADICTED)
                and mask_param is not None
                and causality_in_chain(facts, causality, analysis.class_name, mask_param, cross, path)
            ):
                not_causal = True
            else:
                raise
    else:
        causal_value, causal_sites = causality.decide(analysis.class_name, mask_param, cross)
    causal_test = self_attention_test(cross) if cross and not causality.from_callers and not not_causal else None
    kwargs = forward.params.star_kwarg.name.value if isinstance(forward.params.star_kwarg, cst.Param) else None
    requested = weights_requested(params, kwargs)
    taken = function_names(forward)
    # the caller's keyword arguments (paged cache, its indices, is_causal, position_ids) go on to the implementation
    added_kwargs = None if kwargs is not None else fresh_name("kwargs", taken)
    kwargs = kwargs or added_kwargs
    options = InterfaceOptions(
        names=SideNames.avoiding(taken),
        eager_name=eager_name,
        mask_param=mask_param,
        causal_test=causal_test,
        forward_kwargs=kwargs,
        moved=moved,
        module_names=facts.top_level_names,
        taken=frozenset(taken),
        weights_requested=requested,
        position_ids="position_ids" in params,
        handed_fill=bool(unconverted),
        eager_mask=partial(_eager_mask_form, causality, analysis.class_name, forward, mask_param, cross),
        not_causal=not_causal,
        mask_setting=code(mask_setting[0]) if mask_setting is not None else None,
        fold_function=fold_function,
    )
    statements, part, emitter, body = _emit(path, options)
    if emitter.folded and claims_reaching(facts, causality, analysis.class_name):
        raise Refuse(
            Code.TERMS_IN_MASK,
            "the additive terms are folded into the float mask (the target release's sdpa reads no `position_bias`, "
            "or the release is unknown), but the file claims flash, flex or attention-backend kernels, which take "
            "another mask or none",
        )
    if emitter.folded and mask_param is not None:
        # the mask handed over carries the terms: the eager function takes its own (as built) by keyword
        statements, part, emitter, body = _emit(path, replace(options, mask_by_keyword=True))
    if not emitter.dispatched:
        raise Refuse(Code.NOT_EXTRACTABLE, "the product with V was not reached on the dispatch path")
    if emitter.eager_mask_tests and emitter.eager_mask.build_always:
        # code kept eager reads the mask: every causal builder reaching the module builds it under sdpa too
        causality.kept.append(
            KeptMasks(analysis.class_name, emitter.eager_mask.build_always, (), beside=emitter.eager_mask_tests[0])
        )
    body = remove_dead(body, emitter.removed_reads, facts.imports)
    body = bind_handed_values(path, part.free, body)
    new_forward = forward.with_changes(body=forward.body.with_changes(body=body))
    if extension is not None:
        assert mask_param is not None
        new_forward, count = convert_block(new_forward, mask_param, extension[0])
        if not count:
            raise Refuse(Code.MASK_EXTENDED, f"the extension of `{mask_param}` did not stay in forward", line=extended or 0)
        causality.kept.append(extension[1])
    if added_kwargs is not None:
        new_forward = with_star_kwargs(new_forward, added_kwargs)
    updates = 0
    if paged_updates:
        assert kwargs is not None
        new_forward, updates = pass_kwargs_to_updates(new_forward, kwargs)
    eager = _eager_function(facts, eager_name, statements, part.free, analysis)
    if unconverted:
        assert mask_param is not None
        # the eager function reads the mask as handed over, or by keyword (renamed where the signature has the name)
        adding = AddInsteadOfFill(parameter_name(mask_param) if emitter.interface.mask_by_keyword else mask_param)
        added = eager.visit(adding)
        assert isinstance(added, cst.FunctionDef) and adding.count, "planning found the fill in the eager path"
        eager = added
    store_config = not facts.find_attribute_values(analysis.class_name, "config")
    init = facts.find_method(analysis.class_name, "__init__")
    init_params = {p.name.value for p in init[1].params.params} if init is not None else set()
    add_parameter = store_config and "config" not in init_params
    if add_parameter:
        owners = facts.classes_calling({analysis.class_name}) - {analysis.class_name}
        sites = register.construction_sites(facts.module, analysis.class_name, frozenset({analysis.class_name}), owners)
        missing = sorted({site.owner for site in sites if not site.has_config})
        if missing:
            raise Refuse(
                Code.NO_CONFIG,
                f"built in {', '.join(missing)} without a `config` in scope, so the implementation cannot be selected",
            )
    return ModulePlan(
        analysis.class_name,
        new_forward,
        eager,
        store_config,
        add_parameter,
        causal_value,
        position_bias=emitter.position_bias,
        folded=emitter.folded,
        fold_called=emitter.fold_called,
        updates_with_kwargs=updates,
        causal_sites=causal_sites,
        replaces_pinned=replaces_pinned,
        unconverted=frozenset(unconverted),
        inlined=tuple(h.helper.name for h in analysis.helpers if h.helper.is_method and h.helper.owner == analysis.class_name),
        eager_mask_tests=tuple(emitter.eager_mask_tests),
        reads_mask=ported_mask_read(emitter.eager_mask_tests, new_forward, forward),
    )


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


def _emit(
    path: SdpaPath, options: InterfaceOptions
) -> tuple[list[cst.BaseStatement], EagerPart, InterfaceEmitter, list[cst.BaseStatement]]:
    """The eager function's statements and forward's new body, with the emitter that wrote it."""
    statements, part = eager_body(path, options)
    emitter = InterfaceEmitter(path, options)
    emitter.eager = part
    if path.start is not None and path.start.rank == 3 and emitter.layout.heads is None:
        raise Refuse(
            Code.LAYOUT,
            "the flat (batch * heads) layout is never viewed per head, so it cannot be handed to the interface as "
            "(batch, heads, length, dim)",
        )
    return statements, part, emitter, emitter.emit(block_body(path.function.body))


def _eager_mask_form(
    causality: Causality,
    class_name: str,
    forward: cst.FunctionDef,
    mask_param: str | None,
    cross: Sequence[str],
) -> EagerMask:
    """Whether code that stays eager beside the dispatch (the other side of `if self.num_landmarks == self.seq_len:`)
    can take the attention mask in eager's form: from the boolean mask sdpa gets, where every mask reaching the
    module is `create_bidirectional_mask`'s or a `create_causal_mask` the port always builds (`KeptMasks`), and no
    implementation but eager and sdpa is claimed."""
    if mask_param is None:
        return EagerMask(None, "the module takes no mask")
    if causality.other_implementations:
        return EagerMask(None, "the file already claims another implementation, whose mask has no eager form")
    if mask_param in all_assigned_names(block_body(forward.body)):
        return EagerMask(None, f"forward assigns `{mask_param}`")
    # the causal builders reaching the module, made to build always since the kept code reads the mask
    builders = eager_form_builders(causality.flow, class_name, mask_param, cross)
    if isinstance(builders, str):
        return EagerMask(None, f"eager's form does not follow from every mask reaching it: {builders}")
    always_built = frozenset(line for kept in causality.kept if kept.class_name == class_name for line in kept.builders)
    inputs = [p.name.value for p in forward.params.params if p.name.value not in ("self", mask_param)]
    if not inputs:
        return EagerMask(None, "forward takes no input whose dtype the mask would take")
    return EagerMask(f"{inputs[0]}.dtype", "", builders - always_built)


def _converted(
    causality: Causality, class_name: str, mask_param: str | None, fill: t.Fill, forward: cst.FunctionDef
) -> Converted | str | None:
    """`converted_fill` on the forward traced (its helpers inlined), which holds every read of the mask."""
    if mask_param is None:
        return None
    traced = ast.parse(cst.Module(body=[forward.with_changes(leading_lines=[])]).code).body[0]
    assert isinstance(traced, ast.FunctionDef)
    return converted_fill(causality.flow, class_name, mask_param, fill, traced)


def _eager_function_name(class_name: str, facts: ModuleFacts, count: int, used: dict[str, str]) -> str:
    base = "eager_attention_forward"
    if count == 1 and base not in facts.top_level_names:
        return base
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in class_name).lstrip("_")
    name = f"{snake}_eager_attention_forward"
    while name in facts.top_level_names or name in used.values():
        name = "_" + name
    return name


def _eager_function(
    facts: ModuleFacts, name: str, statements: list[cst.BaseStatement], free: list[str], analysis: ClassAnalysis
) -> cst.FunctionDef:
    module_type = "nn.Module" if "nn" in facts.imports.aliases else "torch.nn.Module"
    sources = sorted({f"{site.owner}.{site.method}" for site in analysis.sites})
    rendered = render_module(
        "interface_style/eager_function.py.jinja",
        name=name,
        module_type=module_type,
        free=[parameter_name(f) for f in free],
        source="`, `".join(sources),
    )
    function = rendered.body[0]
    assert isinstance(function, cst.FunctionDef)
    docstring = [s for s in function.body.body if not is_pass(s)]
    return function.with_changes(body=function.body.with_changes(body=[*docstring, *statements]))


__all__ = ["port_interface_style"]
