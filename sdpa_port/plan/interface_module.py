"""One attention class moved onto the interface: its dispatching forward, its eager function, what `__init__` needs.

`plan_module` plans the class in named steps, in the order they must run (each may refuse it, and some record on
the file's `Causality` the masks to build always).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from functools import partial
from typing import Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cross import key_only_parameters, self_attention_test
from sdpa_port.analyse.cstutil import all_assigned_names, block_body, code, is_pass
from sdpa_port.analyse.known import Known
from sdpa_port.analyse.mask_changes import extended_mask, forward_of, zeros_block
from sdpa_port.analyse.masked_rows import row_safe
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.patterns import cast_operand, function_names, walk_names
from sdpa_port.analyse.recognise import ClassAnalysis, one_side_helpers
from sdpa_port.analyse.sdpa_path import SdpaPath, read_sdpa_path
from sdpa_port.analyse.sdpa_side import keys_aligned_in
from sdpa_port.analyse.shapes import Methods, plain_methods
from sdpa_port.plan.bool_masks import Converted, converted_fill
from sdpa_port.plan.causal_sites import CausalSites, KeptMasks, eager_form_builders
from sdpa_port.plan.causality import (
    Causality,
    causality_in_chain,
    check_causal_attribute,
    check_own_causality,
    claims_reaching,
    unread_pinned,
)
from sdpa_port.plan.gate import unreached_side_refusal
from sdpa_port.plan.interface_checks import (
    bind_handed_values,
    check_alternatives,
    check_mask_setting,
    check_one_computation,
    check_upcasts_agree,
    mask_parameter,
    operand_upcasts,
    weights_bookkeeping,
    weights_requested,
)
from sdpa_port.plan.interface_plan import ModulePlan
from sdpa_port.plan.eager_values import chain_values, eager_values
from sdpa_port.plan.key_statements import key_statements
from sdpa_port.plan.mask_readers import ported_mask_read
from sdpa_port.refusals import Code, Refuse
from sdpa_port.render import render_module
from sdpa_port.rewrite import register
from sdpa_port.rewrite.cleanup import remove_dead
from sdpa_port.rewrite.restored_layout import fold_restored_layouts
from sdpa_port.rewrite.extended_masks import convert_block
from sdpa_port.rewrite.interface_body import InterfaceEmitter
from sdpa_port.rewrite.interface_eager import eager_body
from sdpa_port.rewrite.interface_options import EagerMask, EagerPart, InterfaceOptions, parameter_name
from sdpa_port.rewrite.layout import fresh_name, with_star_kwargs
from sdpa_port.rewrite.paged_updates import pass_kwargs_to_updates
from sdpa_port.rewrite.sdpa_forward import inline_helpers
from sdpa_port.rewrite.sdpa_state import SideNames
from sdpa_port.rewrite.unconverted_masks import AddInsteadOfFill


@dataclass(frozen=True)
class _Mask:
    """How forward applies the attention mask, read from the operations of its path."""

    param: str | None  # the forward parameter handed to the implementations as the mask
    unconverted: frozenset[int]  # lines of `create_*_mask(...).to(torch.bool)` whose conversion is dropped
    setting: tuple[cst.BaseExpression, int] | None  # the setting under which the mask is added, and where


@dataclass(frozen=True)
class _Causal:
    """How the class's `is_causal` is set once it is on the interface."""

    value: str | None  # expression to assign in __init__, None when the class already sets it
    sites: CausalSites | None  # __init__ takes `is_causal`, these sites pass True
    replaces_pinned: bool = False  # the class's own `self.is_causal = <literal>` in __init__ gives way to the above
    # the dispatch passes is_causal=False: `self.is_causal` no longer reaches the implementations
    not_causal: bool = False


def plan_module(
    facts: ModuleFacts,
    analysis: ClassAnalysis,
    eager_name: str,
    causality: Causality,
    fold_function: str | None = None,
    paged_updates: bool = False,
) -> ModulePlan:
    """The plan of one attention class, made in the steps below, in order; each may refuse the class."""
    analysis, forward, alternatives = _prepared(facts, analysis)
    aligned = keys_aligned_in(facts, analysis)
    path = read_sdpa_path(facts, analysis.class_name, forward, aligned=aligned, known=alternatives)
    check_alternatives(forward, path, alternatives)
    check_upcasts_agree(path, analysis.class_name)
    start = path.start
    assert start is not None
    mask = _mask_use(causality, analysis.class_name, forward, path, aligned)
    own_forward, extended = _own_extension(facts, analysis.class_name, mask.param)
    queries, keys = path.operands
    cross = key_only_parameters(forward, keys, queries)
    if mask.setting is not None:
        check_mask_setting(causality, analysis.class_name, mask.param, cross, *mask.setting)
    extension = _extension(causality, analysis.class_name, mask.param, cross, own_forward, extended)
    moved = operand_upcasts(forward, start) | weights_bookkeeping(path) | key_statements(path)
    causal = _module_causality(facts, causality, analysis.class_name, mask.param, cross, path)
    options, added_kwargs = _options(
        facts, causality, analysis.class_name, forward, path, eager_name, mask, cross, moved, causal, fold_function
    )
    statements, part, emitter, body = _emitted(facts, causality, analysis.class_name, path, options)
    body = remove_dead(body, emitter.removed_reads, facts.imports)
    body = fold_restored_layouts(body, emitter.outputs)
    body = bind_handed_values(path, part.free, body)
    new_forward = forward.with_changes(body=forward.body.with_changes(body=body))
    new_forward = _extended_in_forward(new_forward, causality, mask.param, extension, extended)
    if added_kwargs is not None:
        new_forward = with_star_kwargs(new_forward, added_kwargs)
    updates = 0
    if paged_updates:
        assert options.forward_kwargs is not None
        new_forward, updates = pass_kwargs_to_updates(new_forward, options.forward_kwargs)
    eager = _with_added_fill(_eager_function(facts, eager_name, statements, part.free, part.from_kwargs, analysis), mask, emitter)
    store_config, add_parameter = _config_needs(facts, analysis.class_name)
    return ModulePlan(
        analysis.class_name,
        new_forward,
        eager,
        store_config,
        add_parameter,
        causal.value,
        position_bias=emitter.position_bias,
        folded=emitter.folded,
        fold_called=emitter.fold_called,
        updates_with_kwargs=updates,
        causal_sites=causal.sites,
        replaces_pinned=causal.replaces_pinned,
        unconverted=mask.unconverted,
        inlined=tuple(h.helper.name for h in analysis.helpers if h.helper.is_method and h.helper.owner == analysis.class_name),
        eager_mask_tests=tuple(emitter.eager_mask_tests),
        reads_mask=ported_mask_read(emitter.eager_mask_tests, new_forward, forward),
        mask_param=mask.param,
        cross=cross,
    )


def _prepared(facts: ModuleFacts, analysis: ClassAnalysis) -> tuple[ClassAnalysis, cst.FunctionDef, Known]:
    """The class's analysis (one side's helper where a setting chooses), its forward with helpers inlined, and the
    settings whose other side stays as written."""
    found = facts.find_method(analysis.class_name, "forward")
    assert found is not None
    forward = found[1]
    if analysis.closure is not None:
        raise Refuse(
            Code.NOT_EXTRACTABLE,
            f"the computation sits in `{analysis.closure}`, a function forward defines and calls: the interface "
            "dispatches one call from forward, where the function's reads of forward's names would not reach",
        )
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
    return analysis, forward, alternatives


def _mask_use(
    causality: Causality, class_name: str, forward: cst.FunctionDef, path: SdpaPath, aligned: bool
) -> _Mask:
    """The mask parameter, the conversions to drop where a fill applies it, and the setting it is added under."""
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
            converted = _converted(causality, class_name, filled, op, forward)
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
    return _Mask(mask_param, frozenset(unconverted), mask_setting)


def _own_extension(
    facts: ModuleFacts, class_name: str, mask_param: str | None
) -> tuple[ast.FunctionDef | None, int | None]:
    """The forward the class runs as written, and the line where it extends its mask over keys of its own, if any."""
    own_forward = forward_of(facts.tree, [info.name for info in facts.mro(class_name)]) if facts.tree else None
    extended = extended_mask(own_forward, mask_param) if own_forward is not None and mask_param else None
    return own_forward, extended


def _extension(
    causality: Causality,
    class_name: str,
    mask_param: str | None,
    cross: tuple[str, ...],
    own_forward: ast.FunctionDef | None,
    extended: int | None,
) -> tuple[str, KeptMasks] | None:
    """The block of zeros a mask extension adds and the causal masks to build always for it; refused where the
    extension cannot be converted."""
    extension: tuple[str, KeptMasks] | None = None
    if extended is not None:
        assert own_forward is not None and mask_param is not None
        block = zeros_block(own_forward, mask_param)
        kept = causality.extended(class_name, mask_param, cross, extended) if block else None
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
    return extension


def _module_causality(
    facts: ModuleFacts,
    causality: Causality,
    class_name: str,
    mask_param: str | None,
    cross: tuple[str, ...],
    path: SdpaPath,
) -> _Causal:
    """How the class's `is_causal` is set: decided from the masks, kept as the class sets it, or passed as False."""
    if not facts.find_attribute_values(class_name, "is_causal"):
        return _Causal(*causality.decide(class_name, mask_param, cross))
    try:
        check_own_causality(causality, class_name, mask_param, cross)
        check_causal_attribute(facts, class_name, causality, mask_param is not None)
    except Refuse as error:
        pinned = unread_pinned(facts, class_name, causality)
        if error.reason.code in (Code.CAUSAL_BY_USE, Code.CAUSAL_CONTRADICTED) and pinned is not None:
            # the literal has never changed a result: the masks decide, as for a class without the attribute
            return _Causal(*causality.decide(class_name, mask_param, cross), replaces_pinned=True)
        if (
            error.reason.code in (Code.CAUSAL_PINNED, Code.CAUSAL_CONTRADICTED)
            and mask_param is not None
            and causality_in_chain(facts, causality, class_name, mask_param, cross, path)
        ):
            return _Causal(None, None, not_causal=True)
        raise
    return _Causal(None, None)


def _options(
    facts: ModuleFacts,
    causality: Causality,
    class_name: str,
    forward: cst.FunctionDef,
    path: SdpaPath,
    eager_name: str,
    mask: _Mask,
    cross: tuple[str, ...],
    moved: frozenset[cst.CSTNode],
    causal: _Causal,
    fold_function: str | None,
) -> tuple[InterfaceOptions, str | None]:
    """What the interface rewrite is told of the class, and the `**kwargs` name forward is given where it has none."""
    params = path.params
    # the module serves cross-attention too: the dispatch tells self-attention calls by a test
    tested = bool(cross) and not causality.from_callers and not causal.not_causal
    causal_test = self_attention_test(cross) if tested else None
    kwargs = forward.params.star_kwarg.name.value if isinstance(forward.params.star_kwarg, cst.Param) else None
    requested = weights_requested(params, kwargs)
    taken = function_names(forward)
    # the caller's keyword arguments (paged cache, its indices, is_causal, position_ids) go on to the implementation
    added_kwargs = None if kwargs is not None else fresh_name("kwargs", taken)
    kwargs = kwargs or added_kwargs
    options = InterfaceOptions(
        names=SideNames.avoiding(taken),
        eager_name=eager_name,
        mask_param=mask.param,
        causal_test=causal_test,
        forward_kwargs=kwargs,
        moved=moved,
        module_names=facts.top_level_names,
        taken=frozenset(taken),
        weights_requested=requested,
        position_ids="position_ids" in params,
        handed_fill=bool(mask.unconverted),
        eager_mask=partial(_eager_mask_form, causality, class_name, forward, mask.param, cross),
        not_causal=causal.not_causal,
        mask_setting=code(mask.setting[0]) if mask.setting is not None else None,
        fold_function=fold_function,
    )
    return options, added_kwargs


def _emitted(
    facts: ModuleFacts, causality: Causality, class_name: str, path: SdpaPath, options: InterfaceOptions
) -> tuple[list[cst.BaseStatement], EagerPart, InterfaceEmitter, list[cst.BaseStatement]]:
    """The eager function's statements and forward's new body, emitted again where folded terms need the mask by
    keyword; refused where the terms cannot be folded or nothing dispatches."""
    statements, part, emitter, body = _emit(path, options, plain_methods(facts, class_name))
    if emitter.folded and claims_reaching(facts, causality, class_name):
        raise Refuse(
            Code.TERMS_IN_MASK,
            "the additive terms are folded into the float mask (the target release's sdpa reads no `position_bias`, "
            "or the release is unknown), but the file claims flash, flex or attention-backend kernels, which take "
            "another mask or none",
        )
    if emitter.folded and options.mask_param is not None:
        # the mask handed over carries the terms: the eager function takes its own (as built) by keyword
        keyword = replace(options, mask_by_keyword=True)
        statements, part, emitter, body = _emit(path, keyword, plain_methods(facts, class_name))
    if not emitter.dispatched:
        raise Refuse(Code.NOT_EXTRACTABLE, "the product with V was not reached on the dispatch path")
    if emitter.eager_mask_tests and emitter.eager_mask.build_always:
        # code kept eager reads the mask: every causal builder reaching the module builds it under sdpa too
        causality.kept.append(
            KeptMasks(class_name, emitter.eager_mask.build_always, (), beside=emitter.eager_mask_tests[0])
        )
    return statements, part, emitter, body


def _extended_in_forward(
    forward: cst.FunctionDef,
    causality: Causality,
    mask_param: str | None,
    extension: tuple[str, KeptMasks] | None,
    extended: int | None,
) -> cst.FunctionDef:
    """The new forward with its mask extension converted, the causal masks it needs recorded to build always."""
    if extension is None:
        return forward
    assert mask_param is not None
    forward, count = convert_block(forward, mask_param, extension[0])
    if not count:
        raise Refuse(Code.MASK_EXTENDED, f"the extension of `{mask_param}` did not stay in forward", line=extended or 0)
    causality.kept.append(extension[1])
    return forward


def _with_added_fill(eager: cst.FunctionDef, mask: _Mask, emitter: InterfaceEmitter) -> cst.FunctionDef:
    """The eager function adding the handed mask where forward filled from a converted one, if it did."""
    if not mask.unconverted:
        return eager
    assert mask.param is not None
    # the eager function reads the mask as handed over, or by keyword (renamed where the signature has the name)
    adding = AddInsteadOfFill(parameter_name(mask.param) if emitter.interface.mask_by_keyword else mask.param)
    added = eager.visit(adding)
    assert isinstance(added, cst.FunctionDef) and adding.count, "planning found the fill in the eager path"
    return added


def _config_needs(facts: ModuleFacts, class_name: str) -> tuple[bool, bool]:
    """Whether `__init__` must store `self.config`, and take a `config` its constructions pass (refused where one
    has none in scope)."""
    store_config = not facts.find_attribute_values(class_name, "config")
    init = facts.find_method(class_name, "__init__")
    init_params = {p.name.value for p in init[1].params.params} if init is not None else set()
    add_parameter = store_config and "config" not in init_params
    if add_parameter:
        owners = facts.classes_calling({class_name}) - {class_name}
        sites = register.construction_sites(facts.module, class_name, frozenset({class_name}), owners)
        missing = sorted({site.owner for site in sites if not site.has_config})
        if missing:
            raise Refuse(
                Code.NO_CONFIG,
                f"built in {', '.join(missing)} without a `config` in scope, so the implementation cannot be selected",
            )
    return store_config, add_parameter


def _emit(
    path: SdpaPath, options: InterfaceOptions, methods: Methods
) -> tuple[list[cst.BaseStatement], EagerPart, InterfaceEmitter, list[cst.BaseStatement]]:
    """The eager function's statements and forward's new body, with the emitter that wrote it."""
    statements, part = eager_body(path, options)
    copies = chain_values(path, part.free)
    if copies:
        # values computed beside the chain, kept in the eager function too where that leaves it no new value to take
        copied = eager_body(path, replace(options, moved=options.moved | copies))
        if set(copied[1].free) < set(part.free):
            statements, part = copied
    emitter = InterfaceEmitter(path, options)
    emitter.eager = part
    if path.start is not None and path.start.rank == 3 and emitter.layout.heads is None:
        raise Refuse(
            Code.LAYOUT,
            "the flat (batch * heads) layout is never viewed per head, so it cannot be handed to the interface as "
            "(batch, heads, length, dim)",
        )
    body = emitter.emit(block_body(path.function.body))
    values = eager_values(path, part.free, emitter.handed, methods, options.module_names)
    if not values.statements:
        return statements, part, emitter, body
    # the eager function computes those values itself: forward hands over the others (and the flags it reads)
    part = replace(part, free=[n for n in part.free if n not in values.derived], from_kwargs=values.from_kwargs)
    emitter = InterfaceEmitter(path, options)
    emitter.eager = part
    statements = [*values.statements, *statements]
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


def _eager_function(
    facts: ModuleFacts,
    name: str,
    statements: list[cst.BaseStatement],
    free: list[str],
    from_kwargs: list[str],
    analysis: ClassAnalysis,
) -> cst.FunctionDef:
    """The module-level eager function, from its template, holding the eager computation's statements."""
    module_type = "nn.Module" if "nn" in facts.imports.aliases else "torch.nn.Module"
    sources = sorted({f"{site.owner}.{site.method}" for site in analysis.sites})
    rendered = render_module(
        "interface_style/eager_function.py.jinja",
        name=name,
        module_type=module_type,
        free=[parameter_name(f) for f in free if f not in from_kwargs],
        source="`, `".join(sources),
    )
    function = rendered.body[0]
    assert isinstance(function, cst.FunctionDef)
    docstring = [s for s in function.body.body if not is_pass(s)]
    return function.with_changes(body=function.body.with_changes(body=[*docstring, *statements]))


__all__ = ["plan_module"]
