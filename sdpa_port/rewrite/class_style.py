"""The class style's passes, in order: insert each SDPA class, register it, swap mask helpers, set flags, import.

`plan/class_style.py` decides every edit (`ClassStylePlan`); this module applies them.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import block_body, code, is_docstring, is_pass, one_per_line
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.optional_facts import is_device_test
from sdpa_port.analyse.recognise import ClassAnalysis
from sdpa_port.analyse.selection import configured_classes
from sdpa_port.plan.class_style import ClassStylePlan, SdpaClassPlan
from sdpa_port.render import render_module
from sdpa_port.rewrite import flags, imports, insert_classes, mask_helpers, register, sub_models
from sdpa_port.rewrite.inherited_comments import without_inherited_comments
from sdpa_port.rewrite.squeeze import squeeze


def apply_class_style(module: cst.Module, facts: ModuleFacts, plan: ClassStylePlan) -> tuple[cst.Module, list[str]]:
    notes: list[str] = []
    needed: list[tuple[str, str | None]] = []
    use_logger = facts.has_module_logger()
    for item in plan.classes:
        eager = _eager_forward(module, item.analysis.class_name)
        module = insert_classes.insert_after(module, item.analysis.class_name, [sdpa_class(item, use_logger, eager)])
        notes.append(f"added {item.name}({item.analysis.class_name})")
        if not use_logger and (item.side.falsy or item.side.none):
            needed.append(("warnings", None))
    for item in plan.classes:
        registration = item.registration
        if registration.create:
            module = register.create_dict(
                module, item.name, registration.dict_name, [("eager", item.analysis.class_name), ("sdpa", item.name)]
            )
            skip = frozenset({item.analysis.class_name, item.name})
            owners = facts.classes_calling({item.analysis.class_name})
            configured = configured_classes(facts)
            module, count = register.select_from_dict(
                module, item.analysis.class_name, registration.dict_name, skip, owners, configured, registration.threaded
            )
            notes.append(f"created {registration.dict_name}; {count} construction(s) select from it")
            if registration.threaded:
                callers = facts.classes_calling(registration.threaded)
                module = register.thread_implementation(module, registration.threaded, callers, configured)
                notes.append(f"the implementation's name passed down through {', '.join(sorted(registration.threaded))}")
        else:
            module = register.add_dict_entry(module, registration.dict_name, "sdpa", item.name)
            notes.append(f'registered "sdpa": {item.name} in {registration.dict_name}')
    if plan.masks is not None and plan.helpers is not None:
        callers = set(plan.helpers.used(facts))
        module, report = mask_helpers.swap_mask_helpers(module, plan.helpers, plan.masks, callers)
        for swap in report.swapped:
            notes.append(f"mask helper for SDPA in {swap}")
        needed.extend(("modeling_attn_mask_utils", name) for name in sorted(report.needed_imports))
        needed.extend(("utils", name) for name in sorted(report.needed_utils))
    for name in plan.flag_classes:
        module = flags.set_class_flag(module, [name], "_supports_sdpa")
        notes.append(f"{name}._supports_sdpa = True")
    models = frozenset(n for n in facts.classes if facts.is_subclass(n, "PreTrainedModel"))
    module, passed = sub_models.pass_implementation(module, models, models)
    notes.extend(passed)
    # the SDPA code names `torch` itself: a file importing only `from torch import nn` or `import torch.nn as nn`
    # would raise NameError
    needed.append(("torch", None))
    module = imports.add_imports(module, facts.imports, needed)
    return module, notes


def _eager_forward(module: cst.Module, class_name: str) -> cst.FunctionDef | None:
    """The eager class's own `forward` as the file writes it (the facts may read it with helpers written out)."""
    for node in module.body:
        if isinstance(node, cst.ClassDef) and node.name.value == class_name:
            for statement in block_body(node.body):
                if isinstance(statement, cst.FunctionDef) and statement.name.value == "forward":
                    return statement
    return None


DOCSTRING_WIDTH = 109  # Transformers' line length, 119, less the class body's indent and two sets of quotes


def sdpa_class(item: SdpaClassPlan, use_logger: bool, eager: cst.FunctionDef | None = None) -> cst.ClassDef:
    """The SDPA class of `item`; comments on statements it shares with `eager` (the parent's forward) stay there."""
    forward = item.forward if eager is None else without_inherited_comments(item.forward, eager)
    parts = [*item.side.falsy, *(f"{name} is not None" for name in item.side.none)]
    texts = [
        "inputs on an XLA device" if is_device_test(name) else f"`{name}`" if "." in name else f"`{name}=True`"
        for name in item.side.falsy
    ]
    texts += [f"`{name}`" for name in item.side.none]
    parent = item.analysis.class_name
    source = _source(item.analysis)
    fallback = f"; eager with {' or '.join(texts)}." if texts else "."
    doc = f"`{parent}` on SDPA, ported by sdpa-port{fallback}"
    # the methods ported are named where the docstring stays one line (the parent's forward goes without saying)
    named = f"`{parent}` on SDPA, ported by sdpa-port from `{source}`{fallback}"
    if source != f"{parent}.forward" and len(named) <= DOCSTRING_WIDTH:
        doc = named
    rendered = render_module(
        "class_style/sdpa_class.py.jinja",
        name=item.name,
        parent=parent,
        doc_lines=textwrap.wrap(doc, DOCSTRING_WIDTH, break_long_words=False, break_on_hyphens=False),
        fallback_test=" or ".join(parts),
        fallback_text=" or ".join(texts) if texts else "",
        use_logger=use_logger,
    )
    node = rendered.body[0]
    assert isinstance(node, cst.ClassDef)
    body = list(node.body.body)
    template_forward = body[-1]
    assert isinstance(template_forward, cst.FunctionDef)
    prelude = [_with_fallback_arguments(s, forward.params) for s in block_body(template_forward.body) if not is_pass(s)]
    # the eager forward's docstring stays with the eager forward: the class docstring says what this one does
    statements = [s for s in block_body(squeeze(forward).body) if not is_docstring(s)]
    new_forward = template_forward.with_changes(
        params=forward.params,
        whitespace_before_params=forward.whitespace_before_params,
        returns=forward.returns,
        decorators=forward.decorators,
        asynchronous=forward.asynchronous,
        body=template_forward.body.with_changes(body=[*prelude, *statements]),
    )
    body[-1] = new_forward
    return node.with_changes(body=node.body.with_changes(body=body))



def _source(analysis: ClassAnalysis) -> str:
    methods = sorted({f"{site.owner}.{site.method}" for site in analysis.sites})
    return "`, `".join(methods)



SUPER_FORWARD = m.Attribute(value=m.Call(func=m.Name("super")), attr=m.Name("forward"))


class FallbackArguments(cst.CSTTransformer):
    """The fallback call in a template (`super().forward()`, or the call `func` matches) gains the arguments that pass
    every parameter on."""

    def __init__(self, params: cst.Parameters, func: m.BaseMatcherNode = SUPER_FORWARD) -> None:
        self.params = params
        self.func = func

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not m.matches(updated.func, self.func):
            return updated
        call = updated.with_changes(args=arguments_for(self.params))
        # the one-line form fits when the statement stays within the line length
        return call if len(code(call)) <= FALLBACK_ONE_LINE else one_per_line(call)


FALLBACK_ONE_LINE = 86  # `return super().forward(...)` indented three levels stays within 119 columns


def _with_fallback_arguments(statement: cst.BaseStatement, params: cst.Parameters) -> cst.BaseStatement:
    result = statement.visit(FallbackArguments(params))
    assert isinstance(result, cst.BaseStatement)
    return result


def arguments_for(params: cst.Parameters) -> list[cst.Arg]:
    """Every parameter passed on as it was received: the first positionally, the rest by keyword."""
    out: list[cst.Arg] = []
    positional = [p for p in [*params.posonly_params, *params.params] if p.name.value != "self"]
    for index, param in enumerate(positional):
        name = cst.Name(param.name.value)
        by_position = index == 0 or param in params.posonly_params
        out.append(cst.Arg(name) if by_position else _keyword(param.name.value))
    if isinstance(params.star_arg, cst.Param):
        out.append(cst.Arg(cst.Name(params.star_arg.name.value), star="*"))
    out.extend(_keyword(param.name.value) for param in params.kwonly_params)
    if params.star_kwarg is not None:
        out.append(cst.Arg(cst.Name(params.star_kwarg.name.value), star="**"))
    return [arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for arg in out[:-1]] + out[-1:]


def _keyword(name: str) -> cst.Arg:
    return cst.Arg(
        cst.Name(name),
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
