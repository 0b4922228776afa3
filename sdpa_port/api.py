"""The pure API under the CLI: source text in, PortResult out. No file system, no torch."""

from __future__ import annotations

import libcst as cst

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.recognise import contains_softmax, line_function
from sdpa_port.discover.style import detect_style
from sdpa_port.plan.class_style import ClassStylePlan, apply_class_style, plan_class_style
from sdpa_port.result import PortResult, Status, Style


def port_source(source: str, *, style: Style | str = Style.AUTO, filename: str | None = None) -> PortResult:
    """Port one modeling file's source to SDPA. Never raises for bad input: errors come back as results."""
    style = Style(style)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        where = f"{filename}:" if filename else "line "
        return PortResult(Status.ERROR, source, None, "syntax error", reasons=(f"{where}{error.raw_line}: {error.message}",))
    facts = ModuleFacts.of(module)
    chosen = detect_style(facts) if style is Style.AUTO else style
    if not contains_softmax(facts):
        return PortResult(Status.UNCHANGED, source, chosen, "no eager attention found")
    line_of = line_function(module)
    if chosen is Style.CLASS:
        return _port_class_style(module, facts, line_of)
    from sdpa_port.plan.interface_style import port_interface_style

    return port_interface_style(module, facts, line_of)


def _port_class_style(module: cst.Module, facts: ModuleFacts, line_of) -> PortResult:  # type: ignore[no-untyped-def]
    planned = plan_class_style(module, facts, line_of)
    if isinstance(planned, PortResult):
        return planned
    assert isinstance(planned, ClassStylePlan)
    new_module, notes = apply_class_style(module, facts, planned)
    new_source = new_module.code
    _check_compiles(new_source)
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


def _check_compiles(source: str) -> None:
    compile(source, "<sdpa-port>", "exec")
