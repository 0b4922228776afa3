"""The inline style's one pass: each planned class gets its SDPA forward in place, the eager one kept beside it.

`plan/inline_style.py` decides every edit (`InlinePlan`); this module applies them.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import block_body, is_docstring, is_pass
from sdpa_port.analyse.names import ImportMap
from sdpa_port.analyse.optional_facts import is_device_test
from sdpa_port.plan.inline_style import InlineClassPlan, InlinePlan
from sdpa_port.rewrite import imports
from sdpa_port.render import render_module
from sdpa_port.rewrite.class_style import FallbackArguments


def apply_inline_style(module: cst.Module, plan: InlinePlan, imported: ImportMap) -> tuple[cst.Module, list[str]]:
    notes: list[str] = []
    by_name = {item.analysis.class_name: item for item in plan.classes}
    body: list[cst.CSTNode] = []
    for statement in module.body:
        item = by_name.get(statement.name.value) if isinstance(statement, cst.ClassDef) else None
        if item is None:
            body.append(statement)
            continue
        assert isinstance(statement, cst.ClassDef)
        body.append(_in_place(statement, item))
        kept = f"; the eager forward kept as {item.eager_name}" if item.eager_name else ""
        notes.append(f"{item.analysis.class_name}.forward computes with SDPA in place{kept}")
    # the SDPA code names `torch` itself, which `from torch import nn` alone does not bind
    return imports.add_imports(module.with_changes(body=body), imported, [("torch", None)]), notes


def _in_place(node: cst.ClassDef, item: InlineClassPlan) -> cst.ClassDef:
    statements: list[cst.BaseStatement | cst.BaseSmallStatement] = []
    for statement in node.body.body:
        if not (isinstance(statement, cst.FunctionDef) and statement.name.value == "forward"):
            statements.append(statement)
            continue
        statements.append(_sdpa_forward(statement, item))
        if item.eager_name is not None:
            eager = statement.with_changes(
                name=cst.Name(item.eager_name), leading_lines=[cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(""))]
            )
            statements.append(eager)
    return node.with_changes(body=node.body.with_changes(body=statements))


def _sdpa_forward(eager: cst.FunctionDef, item: InlineClassPlan) -> cst.FunctionDef:
    """The SDPA forward where the eager one stood: its docstring, the fallback to the kept eager forward, the rest."""
    rendered = render_module(
        "inline_style/forward.py.jinja",
        fallback_test=item.fallback_test,
        eager=item.eager_name,
        reason=_why_eager(item),
    )
    template = rendered.body[0]
    assert isinstance(template, cst.FunctionDef)
    eager_method = m.Attribute(value=m.Name("self"), attr=m.Name(item.eager_name or ""))
    caller = FallbackArguments(item.forward.params, eager_method)
    prelude = [s.visit(caller) for s in block_body(template.body) if not is_pass(s)]
    statements = list(item.forward.body.body)
    docstring = statements[:1] if statements and is_docstring(statements[0]) else []
    body = [*docstring, *prelude, *statements[len(docstring) :]]
    return item.forward.with_changes(
        leading_lines=eager.leading_lines,
        body=item.forward.body.with_changes(body=body),
    )


def _why_eager(item: InlineClassPlan) -> str:
    """The comment on the fallback: what SDPA does not give, and the original's own branch for XLA devices."""
    device = any(is_device_test(test) for test in item.side.falsy)
    if device and len(item.side.falsy) == 1 and not item.side.none:
        return "inputs on an XLA device take the original's own branch for them: the eager forward"
    if device:
        return (
            "scaled_dot_product_attention gives the attention output alone, and inputs on an XLA device take the "
            "original's own branch: these run the eager forward"
        )
    return "scaled_dot_product_attention gives the attention output alone: other requests run the eager forward"


__all__ = ["apply_inline_style"]
