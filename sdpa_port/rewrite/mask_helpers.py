"""Build masks with the `_for_sdpa` helpers when SDPA is selected; the eager path keeps the plain ones.

Only calls of Transformers' own helpers are swapped (`analyse.mask_helpers`): a function or method of the same name
from elsewhere keeps its call, whose float mask SDPA takes as it is."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from sdpa_port.analyse.cstutil import expr
from sdpa_port.analyse.mask_helpers import CAUSAL, EXTENDED, PLAIN, SDPA_SUFFIX, MaskHelpers
from sdpa_port.analyse.patterns import arg
from sdpa_port.rewrite.targeted import ScopedTransformer, transform_named


@dataclass(frozen=True)
class MaskSwapPlan:
    causal: bool
    plain: bool
    extended: bool
    # classes whose methods may be rewritten (they have `self.config`)
    classes: frozenset[str]


@dataclass
class MaskSwapReport:
    swapped: list[str] = field(default_factory=list)  # "Class.method: helper"
    needed_imports: set[str] = field(default_factory=set)
    needed_utils: set[str] = field(default_factory=set)  # from the package's `utils`
    skipped: list[str] = field(default_factory=list)


def swap_mask_helpers(
    module: cst.Module, helpers: MaskHelpers, plan: MaskSwapPlan, callers: set[str]
) -> tuple[cst.Module, MaskSwapReport]:
    """`callers`: the classes that call a mask helper (found cheaply beforehand)."""
    report = MaskSwapReport()
    transformer = _Swap(helpers, plan, report)
    result = transform_named(module, callers & plan.classes, transformer)
    return result, report


def unguarded_helpers(
    module: cst.Module, helpers: MaskHelpers, classes: frozenset[str], callers: set[str], weights: bool, heads: bool
) -> set[str]:
    """The helpers called (in `classes`) where the swap's guard cannot keep full masks for layers falling back to
    eager: asked for the weights (`weights`) or given a head mask (`heads`) while the calling method has no such
    parameter to test."""
    finder = _HelperCalls(helpers, MaskSwapPlan(True, True, True, classes), MaskSwapReport())
    transform_named(module, callers & classes, finder)
    out: set[str] = set()
    for helper, params in finder.calls:
        if weights and "output_attentions" not in params:
            out.add(helper)
        if heads and not any(name.endswith("head_mask") for name in params):
            out.add(helper)
    return out


class _Swap(ScopedTransformer):
    def __init__(self, helpers: MaskHelpers, plan: MaskSwapPlan, report: MaskSwapReport) -> None:
        super().__init__()
        self.helpers = helpers
        self.plan = plan
        self.report = report
        self.guarded: set[int] = set()  # ids of helper statements already on the eager side of a swap

    def visit_If(self, node: cst.If) -> None:
        fallback = _eager_side(node)
        if fallback is not None:
            self.guarded.add(id(fallback))

    def helper_of(self, call: cst.Call) -> str | None:
        """The Transformers helper the call reaches (a name imported from transformers, or the inherited method)."""
        func = call.func
        if isinstance(func, cst.Name):
            return self.helpers.function(func.value)
        if (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == "self"
            and func.attr.value == EXTENDED
            and self.classes
            and self.classes[0] in self.helpers.extended
        ):
            return EXTENDED
        return None

    def helper_statement(
        self, statement: cst.SimpleStatementLine
    ) -> tuple[cst.Assign | cst.AnnAssign, cst.Call, str] | None:
        """`x = <helper>(...)` in a method of a planned class: the assignment, the call, the helper."""
        if len(statement.body) != 1 or not self.classes or not self.functions:
            return None
        if self.classes[0] not in self.plan.classes:
            return None
        small = statement.body[0]
        if not isinstance(small, (cst.Assign, cst.AnnAssign)) or not isinstance(small.value, cst.Call):
            return None
        helper = self.helper_of(small.value)
        return None if helper is None else (small, small.value, helper)

    def parameter_names(self) -> list[str]:
        """The parameters of the method being visited."""
        params = self.functions[-1].params
        return [p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]]

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        found = self.helper_statement(updated)
        if found is None or id(original) in self.guarded:
            return updated  # not a helper call, or one a swap already keeps for eager (a port, or a copy of one)
        small, call, helper = found
        where = f"{self.classes[0]}.{self.functions[-1].name.value}"
        if helper == CAUSAL and self.plan.causal:
            condition = self.fallback_condition()
            new_call = call.with_changes(func=cst.Name(CAUSAL + SDPA_SUFFIX))
        elif helper == PLAIN and self.plan.plain:
            condition = self.fallback_condition() + self.not_traced(arg(call, 0, "mask"))
            new_call = call.with_changes(func=cst.Name(PLAIN + SDPA_SUFFIX))
        elif helper == EXTENDED and self.plan.extended:
            mask = arg(call, 0, "attention_mask")
            if not isinstance(mask, cst.Name):
                self.report.skipped.append(f"{where}: {helper} on an expression")
                return updated
            dtype = arg(call, 3, "dtype") or expr("self.dtype")
            condition = (
                f"{self.fallback_condition()} and not self.config.is_decoder and {mask.value}.dim() == 2"
            ) + self.not_traced(mask)
            new_call = cst.Call(
                func=cst.Name(PLAIN + SDPA_SUFFIX),
                args=[
                    cst.Arg(mask, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(dtype, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(cst.Integer("1"), keyword=cst.Name("tgt_len"), equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
                    )),
                ],
            )
            helper = PLAIN
        else:
            return updated
        self.report.swapped.append(f"{where}: {helper}")
        self.report.needed_imports.add(helper + SDPA_SUFFIX)
        sdpa_statement = updated.with_changes(body=[small.with_changes(value=new_call)], leading_lines=[])
        eager_statement = updated.with_changes(leading_lines=[])
        return cst.If(
            test=expr(condition),
            body=cst.IndentedBlock(body=[sdpa_statement]),
            orelse=cst.Else(body=cst.IndentedBlock(body=[eager_statement])),
            leading_lines=updated.leading_lines,
        )

    def not_traced(self, mask: cst.BaseExpression | None) -> str:
        """`_prepare_4d_attention_mask_for_sdpa` asks `torch.all(mask == 1)` before it checks for tracing, which
        torch.fx cannot trace (transformers' `test_torch_fx`): a traced mask keeps the plain helper, whose float
        mask SDPA takes as well."""
        if not isinstance(mask, cst.Name):
            return ""
        self.report.needed_utils.add("is_torch_fx_proxy")
        return f" and not is_torch_fx_proxy({mask.value})"

    def fallback_condition(self) -> str:
        """SDPA masks may be None; keep full masks where the layers fall back to eager (asked for the weights, or
        given a head mask), whose computation may add the mask unguarded, as transformers' own ports do."""
        parts = ['self.config._attn_implementation == "sdpa"']
        names = self.parameter_names()
        if "output_attentions" in names:
            parts.append("not output_attentions")
        for name in names:
            if name.endswith("head_mask"):
                parts.append(f"{name} is None")
        return " and ".join(parts)


def _eager_side(node: cst.If) -> cst.SimpleStatementLine | None:
    """The `else` statement of a swap already made: `if ...: x = <helper>_for_sdpa(...)` / `else: x = ...`."""
    body, orelse = node.body, node.orelse
    if not (isinstance(body, cst.IndentedBlock) and len(body.body) == 1 and isinstance(orelse, cst.Else)):
        return None
    if not (isinstance(orelse.body, cst.IndentedBlock) and len(orelse.body.body) == 1):
        return None
    sdpa, eager = body.body[0], orelse.body.body[0]
    if not (isinstance(sdpa, cst.SimpleStatementLine) and isinstance(eager, cst.SimpleStatementLine)):
        return None
    if len(sdpa.body) != 1 or len(eager.body) != 1:
        return None
    first, second = sdpa.body[0], eager.body[0]
    if not (isinstance(first, (cst.Assign, cst.AnnAssign)) and isinstance(first.value, cst.Call)):
        return None
    func = first.value.func
    if not (isinstance(func, cst.Name) and func.value.endswith(SDPA_SUFFIX)):
        return None
    if not isinstance(second, type(first)) or not _targets(first).deep_equals(_targets(second)):
        return None
    return eager


def _targets(small: cst.Assign | cst.AnnAssign) -> cst.CSTNode:
    return small.targets[0].target if isinstance(small, cst.Assign) else small.target


class _HelperCalls(_Swap):
    """Records (helper, parameters of the calling method) for each call the swap would rewrite; changes nothing."""

    def __init__(self, helpers: MaskHelpers, plan: MaskSwapPlan, report: MaskSwapReport) -> None:
        super().__init__(helpers, plan, report)
        self.calls: list[tuple[str, frozenset[str]]] = []

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        found = self.helper_statement(updated)
        if found is not None:
            helper = found[2]
            self.calls.append((PLAIN if helper == EXTENDED else helper, frozenset(self.parameter_names())))
        return updated
