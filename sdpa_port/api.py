"""The pure API under the CLI: source text in, PortResult out. No file system, no torch."""

from __future__ import annotations

import ast

import libcst as cst

from sdpa_port.analyse.diagnose import where_reading_stops
from sdpa_port.analyse.lines import Lines, top_level_starts
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.score_helpers import with_score_helpers
from sdpa_port.discover.eager_sites import find_eager_attention, undispatched_sites
from sdpa_port.discover.modular import note_modular_origin
from sdpa_port.discover.release import Release
from sdpa_port.discover.screen import Screen, screen
from sdpa_port.plan.class_style import ClassStylePlan, plan_class_style
from sdpa_port.rewrite.class_style import apply_class_style
from sdpa_port.plan.inline_style import plan_inline_style
from sdpa_port.rewrite.inline_style import apply_inline_style
from sdpa_port.refusals import Code, Refuse, Refusal
from sdpa_port.result import NO_ATTENTION, PortResult, Status, Style
from sdpa_port.rewrite.copied_from import reconcile_copied_from
from sdpa_port.rewrite.weight_requests import relax_weight_requests


NOT_MODELING = "not a modeling file: it neither imports torch nor defines a module class"


def port_source(
    source: str, *, style: Style | str = Style.AUTO, filename: str | None = None, release: Release | None = None
) -> PortResult:
    """Port one modeling file's source to SDPA. Never raises for bad input: errors come back as results.

    `release`: the transformers release the port will run in (`sdpa_port.discover.release`), which decides what the
    interface style hands its implementations; None (unknown) takes the form exact in every 5.x release."""
    style = Style(style)
    where = f"{filename}:" if filename else "line "
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None) or "?"
        message = getattr(error, "msg", None) or str(error)
        return PortResult(Status.ERROR, source, None, "syntax error", reasons=(f"{where}{line}: {message}",))
    first = screen(tree)
    if not first.modeling:
        return PortResult(Status.UNCHANGED, source, None, NOT_MODELING)
    chosen = (Style.INTERFACE if first.interface_machinery else Style.CLASS) if style is Style.AUTO else style
    if first.supports_sdpa:
        kept = undispatched_sites(tree)
        warnings = (
            ("eager attention the file keeps beside its SDPA support (not ported): "
             + ", ".join(f"{site.where} (line {site.line})" for site in kept),)
            if kept
            else ()
        )
        return PortResult(Status.UNCHANGED, source, chosen, "already supports SDPA", warnings=warnings)
    if not first.softmax_classes and not first.uses_attention_interface:
        return _unrecognised(tree, PortResult(Status.UNCHANGED, source, chosen, NO_ATTENTION))
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        return PortResult(Status.ERROR, source, None, "syntax error", reasons=(f"{where}{error.raw_line}: {error.message}",))
    try:
        facts = ModuleFacts.of(module, tree)
        lines = Lines(module, top_level_starts(tree))
        if chosen is Style.CLASS:
            result = _port_class_style(module, facts, lines, first)
            if style is Style.AUTO and _unwired(result):
                why = "class style cannot wire it: " + "; ".join(result.reasons)
                inline = _port_inline_style(module, facts, lines, first, why)
                result = inline if inline.status is Status.PORTED or inline.detail == "already supports SDPA" else result
        elif chosen is Style.INLINE:
            result = _port_inline_style(module, facts, lines, first, "")
        else:
            from sdpa_port.plan.interface_style import port_interface_style

            result = port_interface_style(module, facts, lines, first, release)
        return _provenance(source, tree, _unrecognised(tree, result), filename)
    except SyntaxError as error:
        message = f"{filename or 'input'}: internal error: the port does not compile ({error.msg}, line {error.lineno})"
        return PortResult(Status.ERROR, source, chosen, "internal error", reasons=(message,))
    except Refuse as error:  # planners turn refusals into results; one that escapes them is still a refusal
        return PortResult.refused(source, chosen, [error.placed("<module>")])
    except RecursionError:
        message = f"{filename or 'input'}: internal error: recursion limit reached"
        return PortResult(Status.ERROR, source, chosen, "internal error", reasons=(message,))
    except Exception as error:  # noqa: BLE001 - the pure API never raises; a bug becomes an error result naming it
        message = f"{filename or 'input'}: internal error: {type(error).__name__}: {error}"
        return PortResult(Status.ERROR, source, chosen, "internal error", reasons=(message,))


def _unrecognised(tree: ast.Module, result: PortResult) -> PortResult:
    """"Nothing to port" for a file that holds eager attention is a miss: refuse it, naming each site and where the
    recogniser's reading of it stops."""
    if result.status is not Status.UNCHANGED or result.detail != NO_ATTENTION:
        return result
    sites = find_eager_attention(tree)
    if not sites:
        return result
    module = cst.parse_module(result.source)
    facts, lines = ModuleFacts.of(module, tree), Lines(module, top_level_starts(tree))
    detail = (
        "eager attention (a softmax over a product of two tensors, multiplied by a third) in a form the tool does not "
        "recognise"
    )
    refusals = []
    for site in sites:
        stops = where_reading_stops(facts, lines, site.where)
        refusals.append(Refusal(Code.UNRECOGNISED, site.where, site.line, f"{detail}; {stops}" if stops else detail))
    return PortResult.refused(result.source, result.style, refusals)


def _provenance(source: str, tree: ast.Module, result: PortResult, filename: str | None) -> PortResult:
    """After a successful port: stale `# Copied from` markers, and where a generated file's change belongs."""
    if result.status is not Status.PORTED:
        return result
    return note_modular_origin(source, reconcile_copied_from(source, result, filename, tree), filename)


# class-style refusals about wiring alone (how the module is built), which the inline style does not need
UNWIRED = frozenset({Code.NO_CONFIG, Code.BUILT_ELSEWHERE})


def _unwired(result: PortResult) -> bool:
    return result.status is Status.REFUSED and bool(result.refusals) and {r.code for r in result.refusals} <= UNWIRED


def _port_inline_style(module: cst.Module, facts: ModuleFacts, lines: Lines, first: Screen, why: str) -> PortResult:
    facts, inlined = with_score_helpers(facts, lines)
    planned = plan_inline_style(module, facts, lines, first.softmax_classes, why)
    if isinstance(planned, PortResult):
        return planned
    new_module, notes = apply_inline_style(module, planned)
    ported = {item.analysis.class_name for item in planned.classes}
    notes += [
        f"{owner}.{helper}: read as its statements written out at its call in forward" for owner, helper in inlined if owner in ported
    ]
    new_source = new_module.code
    compile(new_source, "<sdpa-port>", "exec")
    return PortResult(
        Status.PORTED,
        new_source,
        Style.INLINE,
        f"ported {len(planned.classes)} attention class(es) in place",
        warnings=tuple(planned.warnings),
        notes=tuple(notes),
        attention_classes=tuple(sorted(ported)),
        sites=tuple(site for item in planned.classes for site in item.analysis.sites),
    )


def _port_class_style(module: cst.Module, facts: ModuleFacts, lines: Lines, first: Screen) -> PortResult:
    module, relaxed = relax_weight_requests(module, facts, first.softmax_classes)
    if relaxed:  # calls rewritten in place, on their own lines: the facts are read again, the lines stay
        tree = ast.parse(module.code)
        facts, lines = ModuleFacts.of(module, tree), Lines(module, top_level_starts(tree))
    # a helper method computing part of the scores is read, and copied into the SDPA forward, as its statements
    facts, inlined = with_score_helpers(facts, lines)
    planned = plan_class_style(module, facts, lines, first.softmax_classes)
    if isinstance(planned, PortResult):
        return planned
    assert isinstance(planned, ClassStylePlan)
    new_module, notes = apply_class_style(module, facts, planned)
    notes = [*relaxed, *notes]
    new_source = new_module.code
    ported = {item.analysis.class_name for item in planned.classes}
    notes += [
        f"{owner}.{helper}: read as its statements written out at its call in forward; the SDPA forward computes "
        "the scores it returns so where it runs that side"
        for owner, helper in inlined
        if owner in ported
    ]
    compile(new_source, "<sdpa-port>", "exec")
    sites = tuple(site for item in planned.classes for site in item.analysis.sites)
    return PortResult(
        Status.PORTED,
        new_source,
        Style.CLASS,
        f"ported {len(planned.classes)} attention class(es)",
        warnings=tuple(planned.warnings),
        notes=tuple(notes),
        attention_classes=tuple(item.analysis.class_name for item in planned.classes),
        sites=sites,
    )
