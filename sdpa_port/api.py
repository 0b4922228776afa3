"""The pure API under the CLI: source text in, PortResult out. No file system, no torch."""

from __future__ import annotations

import ast
import re
from dataclasses import replace

import libcst as cst

from sdpa_port.analyse.diagnose import where_reading_stops
from sdpa_port.analyse.lines import Lines, top_level_starts
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.site import AttentionSite
from sdpa_port.analyse.score_helpers import with_score_helpers
from sdpa_port.discover.eager_sites import EagerSite, find_eager_attention, undispatched_sites
from sdpa_port.discover.bindings import Bindings
from sdpa_port.discover.live import live_tree
from sdpa_port.discover.modular import note_modular_origin
from sdpa_port.discover.release import Release
from sdpa_port.discover.screen import Screen, screen
from sdpa_port.plan.class_style import ClassStylePlan, plan_class_style
from sdpa_port.rewrite.class_style import apply_class_style
from sdpa_port.plan.inline_style import plan_inline_style
from sdpa_port.plan.kept_eager import SDPA_ONLY_WHERE
from sdpa_port.rewrite.inline_style import apply_inline_style
from sdpa_port.rewrite.long_lines import lay_out_long_lines
from sdpa_port.rewrite.reused_terms import laid_out_once
from sdpa_port.refusals import Code, Refuse, Refusal
from sdpa_port.result import NO_ATTENTION, SUPPORTS_SDPA, PortResult, Status, Style
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
    # only the sides of branches that can run count (`discover/live.py`): a file without a softmax or an SDPA call
    # has none that could change what it computes
    bindings = Bindings.of(tree) if "softmax" in source.lower() or "scaled_dot_product_attention" in source else None
    live = live_tree(tree, bindings) if bindings is not None else tree
    first = screen(live, bindings)
    if not first.modeling:
        return PortResult(Status.UNCHANGED, source, None, NOT_MODELING)
    chosen = (Style.INTERFACE if first.interface_machinery else Style.CLASS) if style is Style.AUTO else style
    if first.supports_sdpa:
        return PortResult(Status.UNCHANGED, source, chosen, SUPPORTS_SDPA, warnings=_kept_eager(undispatched_sites(live)))
    if not first.softmax_classes and not first.uses_attention_interface:
        return _unrecognised(tree, live, first, PortResult(Status.UNCHANGED, source, chosen, NO_ATTENTION))
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        return PortResult(Status.ERROR, source, None, "syntax error", reasons=(f"{where}{error.raw_line}: {error.message}",))
    try:
        facts = ModuleFacts.of(module, tree)
        lines = Lines(module, top_level_starts(tree))
        if chosen is Style.CLASS:
            result = _port_class_style(module, facts, lines, first)
            if style is Style.AUTO and _unwired(result, tree):
                inline = _port_inline_style(module, facts, lines, first, result.refusals)
                if inline.status is Status.REFUSED and inline.refusals:
                    # the inline style needs no wiring: what refuses it comes first, then why the class style could
                    # not wire the module
                    inline = replace(
                        inline, reasons=inline.reasons + result.reasons, refusals=inline.refusals + result.refusals
                    )
                keep = inline.status in (Status.PORTED, Status.REFUSED) or inline.detail == SUPPORTS_SDPA
                result = inline if keep else result
        elif chosen is Style.INLINE:
            result = _port_inline_style(module, facts, lines, first, ())
        else:
            from sdpa_port.plan.interface_style import port_interface_style

            result = port_interface_style(module, facts, lines, first, release)
        result = _beside_sdpa(live, first, _unrecognised(tree, live, first, result))
        return _provenance(source, tree, _unported(source, tree, live, first, result), filename)
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


KEPT_EAGER = "eager attention the file keeps beside its SDPA support (not ported): "


def _kept_eager(sites: list[EagerSite]) -> tuple[str, ...]:
    """The warning naming each function or method whose eager attention stays beside SDPA, with its line."""
    return (KEPT_EAGER + ", ".join(f"{site.where} (line {site.line})" for site in sites),) if sites else ()


def _beside_sdpa_sites(live: ast.Module, first: Screen) -> tuple[list[EagerSite], list[EagerSite]]:
    """The eager sites of the file as it runs: those the classes computing with SDPA by default keep for their other
    paths (in their methods, or in functions of the file only they call), and the others."""
    sites = find_eager_attention(live)
    if not first.sdpa_classes or not sites:
        return [], sites
    callers = _users(live, calls_only=True)
    kept: list[EagerSite] = []
    others: list[EagerSite] = []
    for site in sites:
        if "." in site.where:
            beside = site.where.partition(".")[0] in first.sdpa_classes
        else:
            beside = bool(callers.get(site.where)) and callers[site.where] <= first.sdpa_classes
        (kept if beside else others).append(site)
    return kept, others


def _beside_sdpa(live: ast.Module, first: Screen, result: PortResult) -> PortResult:
    """A port or refusal of a file whose other classes compute with SDPA by default names the eager code those
    keep; a file said to support SDPA without saying what it keeps names all of it.

    A refusal that no port blocks (no class cannot stay eager beside a ported one) leaves nothing to port beside the
    classes already on SDPA: the file supports SDPA, each refused class named as staying eager with its reason. A port
    that left a class eager is then unchanged when ported again."""
    if result.detail == SUPPORTS_SDPA and not result.warnings:
        return replace(result, warnings=_kept_eager(undispatched_sites(live)))
    if result.status is Status.REFUSED and first.sdpa_classes and all(_stays(r) for r in result.refusals):
        staying = tuple(f"{r.where} stays eager: {r}" for r in result.refusals)
        kept = _kept_eager(_beside_sdpa_sites(live, first)[0])
        warnings = (*result.warnings, *staying, *kept)
        unchanged = replace(result, status=Status.UNCHANGED, detail=SUPPORTS_SDPA, reasons=(), refusals=())
        return replace(unchanged, warnings=warnings)
    if result.status not in (Status.PORTED, Status.REFUSED) or not first.sdpa_classes:
        return result
    return replace(result, warnings=(*result.warnings, *_kept_eager(_beside_sdpa_sites(live, first)[0])))


def _stays(refusal: Refusal) -> bool:
    """A refusal of the class's computation alone (no exact SDPA call expresses it), which no port blocks: the class
    stays eager as it is. A refusal of wiring, masks, the authors' own flag or a form not read (a miss) is kept."""
    computation = refusal.code.code[0] == "S" or refusal.code in (Code.FILL_VALUE, Code.MASKED_ROWS)
    return computation and not refusal.beside


def _unrecognised(tree: ast.Module, live: ast.Module, first: Screen, result: PortResult) -> PortResult:
    """"Nothing to port" for a file that holds eager attention where it can run is a miss: refuse it, naming each
    site and where the recogniser's reading of it stops. The eager attention that classes computing with SDPA by
    default keep for other paths is no miss: the file already supports SDPA."""
    if result.status is not Status.UNCHANGED or result.detail != NO_ATTENTION:
        return result
    kept, sites = _beside_sdpa_sites(live, first)
    if not sites:
        if first.sdpa_classes:
            return replace(result, detail=SUPPORTS_SDPA, warnings=_kept_eager(kept))
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


def _users(live: ast.Module, calls_only: bool) -> dict[str, set[str]]:
    """For each name, the top-level classes and functions of the file that call it, or, unless `calls_only`, that
    read it at all."""
    out: dict[str, set[str]] = {}
    for node in live.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if calls_only and isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name):
                    out.setdefault(inner.func.id, set()).add(node.name)
                elif not calls_only and isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load):
                    out.setdefault(inner.id, set()).add(node.name)
    return out


def _unported(source: str, tree: ast.Module, live: ast.Module, first: Screen, result: PortResult) -> PortResult:
    """A port that leaves other eager attention of the file as it is says so: each site the form-free detector finds
    outside the classes ported (and the functions only they call), not already named in a warning, is named with
    where the recogniser's reading of it stops; so is each attention a function holding a ported one holds beside it.
    Nothing of a file is passed over in silence."""
    if result.status is not Status.PORTED:
        return result
    _, sites = _beside_sdpa_sites(live, first)
    ported = set(result.attention_classes)
    users = _users(live, calls_only=False)  # named counts too: `attention_interface = eager_attention_forward`
    said = " ".join(result.warnings)
    missed = []
    holding = set()  # the functions holding the ported computations
    for site in sites:
        owner = site.where.partition(".")[0]
        if owner in ported or users.get(owner, set()) & ported:
            holding.add(site.where)
        elif not re.search(rf"\b{owner}\b", said):
            missed.append(site)
    beside_lines: dict[str, list[int]] = {}
    for site in _beside_ported_sites(live, result, holding):
        if f"{site.where.partition('.')[0]}{SDPA_ONLY_WHERE}" not in said:  # that warning names the eager side
            beside_lines.setdefault(site.where, []).append(site.line)
    beside = [
        f"{where} ({'lines' if len(found) > 1 else 'line'} {', '.join(map(str, found))}) stays eager: eager attention "
        "beside the one ported there, which the port leaves as it is"
        for where, found in beside_lines.items()
    ]
    if not missed and not beside:
        return result
    warnings = []
    if missed:  # the recogniser is asked where its reading stops: the facts are read only then
        module = cst.parse_module(source)
        facts, lines = ModuleFacts.of(module, tree), Lines(module, top_level_starts(tree))
        for site in missed:
            stops = where_reading_stops(facts, lines, site.where)
            warnings.append(
                f"{site.where} (line {site.line}) stays eager: eager attention in a form the tool does not recognise"
                + (f"; {stops}" if stops else "")
            )
    return replace(result, warnings=(*result.warnings, *warnings, *beside))


def _beside_ported_sites(live: ast.Module, result: PortResult, holding: set[str]) -> list[EagerSite]:
    """The eager attentions that the methods holding a ported computation hold beside it: each softmax whose
    probabilities reach a product, lying outside every ported site's lines (from its product with the key to its
    product with the value). A method computing a windowed attention and a global one, ported for the first, keeps
    the second eager; the report names it. A ported site whose lines do not span its computation in order (its
    scores read from a helper written out at its call, or from a function of the module), or whose probabilities
    also multiply other values, leaves its class unjudged."""
    spans = [(site.line, site.output_line) for site in result.sites if 0 < site.line <= site.output_line]
    # a method no code of the file reads (`self._upcast_and_reordered_attn` kept from GPT-2 but never called) runs
    # nowhere: nothing of it is left eager on any path
    read = {node.attr for node in ast.walk(live) if isinstance(node, ast.Attribute)} | {"forward", "__call__"}
    # a site whose lines do not span its computation in order, or whose probabilities also multiply other values
    # (LiLT's text values beside its layout values: a second softmax of the same scores, ported as a second call)
    unjudged = {
        name
        for site in result.sites
        if not 0 < site.line <= site.output_line or site.more_values
        for name in _holders(site)
    }
    return [
        site
        for site in find_eager_attention(live, every=True)
        if "." in site.where  # a module function the ported classes call is their eager implementation, kept
        and site.where.partition(".")[2] in read
        and site.where in holding
        and not {site.where, site.where.partition(".")[0]} & unjudged
        and not any(start <= site.line <= end for start, end in spans)
    ]


def _holders(site: AttentionSite) -> set[str]:
    """The names under which the detector may name the function holding a ported site: its classes, or the module
    function it is read from."""
    return {site.method} if site.owner == "<module>" else {site.class_name, site.owner}


def _provenance(source: str, tree: ast.Module, result: PortResult, filename: str | None) -> PortResult:
    """After a successful port: stale `# Copied from` markers, and where a generated file's change belongs."""
    if result.status is not Status.PORTED:
        return result
    return note_modular_origin(source, reconcile_copied_from(source, result, filename, tree), filename)


# class-style refusals about wiring alone (how the module is built), which the inline style does not need
UNWIRED = frozenset({Code.NO_CONFIG, Code.BUILT_ELSEWHERE})


def _unwired(result: PortResult, tree: ast.Module) -> bool:
    """The class style refused on wiring alone: how the modules are built, or, outside the Transformers tree, refused
    classes that cannot stay eager beside the ported ones (the masks the class style changes reach them), which the
    inline style, changing no mask, leaves eager."""
    if result.status is not Status.REFUSED or not result.refusals:
        return False
    beside = not _in_transformers_tree(tree)
    return all(r.code in UNWIRED or (beside and r.beside) for r in result.refusals)


def _in_transformers_tree(tree: ast.Module) -> bool:
    """The file imports from two packages up (`from ...modeling_utils import PreTrainedModel`), as a model file
    inside the Transformers tree does: its port follows `_attn_implementation` through the class style, never in
    place whatever the setting."""
    return any(isinstance(node, ast.ImportFrom) and node.level >= 2 for node in tree.body)


def _port_inline_style(
    module: cst.Module, facts: ModuleFacts, lines: Lines, first: Screen, why: tuple[Refusal, ...]
) -> PortResult:
    facts, inlined = with_score_helpers(facts, lines)
    planned = plan_inline_style(module, facts, lines, first.softmax_classes, why, first.sdpa_callers)
    if isinstance(planned, PortResult):
        return planned
    new_module, notes = apply_inline_style(module, planned, facts.imports)
    new_module = laid_out_once(new_module, [site for item in planned.classes for site in item.analysis.sites])
    new_module = lay_out_long_lines(module, new_module)
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
    new_module = laid_out_once(new_module, [site for item in planned.classes for site in item.analysis.sites])
    new_module = lay_out_long_lines(module, new_module)
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
