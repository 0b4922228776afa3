"""The interface style's refusal checks, and the small reads of a class's attention path that plan its forward.

Each `check_*` returns nothing or raises `Refuse`; the path helpers read an `SdpaPath` (the mask parameter, the
statements that move with the eager computation, the values to bind before the dispatch).
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import block_body, code, nodes_of_type
from sdpa_port.analyse.flow import bound_before
from sdpa_port.analyse.known import Known, decide
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.patterns import cast_operand, walk_names
from sdpa_port.analyse.recognise import ClassAnalysis
from sdpa_port.analyse.sdpa_path import SdpaPath, check_eager_function
from sdpa_port.plan.causal_sites import KeptMasks, bidirectional_only
from sdpa_port.plan.causality import Causality
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.interface_edits import is_docstring
from sdpa_port.rewrite.kept_masks import SKIP, keep_causal_masks
from sdpa_port.rewrite.sdpa_body import whole_chain_branch


def check_sdpa_allowed(facts: ModuleFacts) -> None:
    """No model class of the file sets `_supports_sdpa = False` itself."""
    for root in facts.pretrained_roots:
        value = facts.classes[root].class_vars.get("_supports_sdpa")
        if isinstance(value, cst.Name) and value.value == "False":
            raise Refuse(Code.AUTHORS_OFF, "sets `_supports_sdpa = False` explicitly; the file's own authors ruled SDPA out", root)


def check_kept_builders(module: cst.Module, kept: KeptMasks) -> None:
    """Every causal builder reaching a class whose causality the always-built masks carry takes the keyword."""
    _, count = keep_causal_masks(module, kept.builders)
    if count != len(kept.builders):
        if kept.beside is not None:
            reason, why = Code.NOT_EXTRACTABLE, f"code kept eager beside the dispatch (under `if {kept.beside}:`) reads the mask, "
        elif kept.extended is not None:
            reason, why = Code.MASK_EXTENDED, f"the module extends its mask over keys of its own (line {kept.extended}), "
        else:
            reason, why = (
                Code.CAUSAL_BY_USE,
                "the file builds causal and bidirectional self-attention masks for the same module from call to "
                "call, ",
            )
        raise Refuse(
            reason,
            why
            + f"and a `create_causal_mask` call reaching it (line(s) {', '.join(map(str, sorted(kept.builders)))}) "
            f"cannot be given `{SKIP}=False` (an alias, or `*args`/`**kwargs` that may carry it), so its mask "
            "cannot be made to carry the causality",
            kept.class_name,
        )


def check_one_computation(analysis: ClassAnalysis, alternatives: Known) -> None:
    """The class computes its attention in one place, and nothing only the eager computation takes decides it."""
    if analysis.eager_only_params or set(analysis.eager_only_flags) - alternatives.falsy:
        names = ", ".join(f"`{name}`" for name in (*analysis.eager_only_params, *analysis.eager_only_flags))
        raise Refuse(
            Code.HEAD_MASK_INTERFACE,
            f"{names} leads to steps only the eager computation takes (a head mask, or a term SDPA cannot express); "
            "the attention interface cannot fall back to eager for it",
        )
    if len(analysis.sites) > 1:
        methods = ", ".join(f"`{site.method}` (line {site.line})" for site in analysis.sites)
        raise Refuse(
            Code.REPEATED,
            f"forward computes attention in more than one place ({methods}), and no test of the module's settings "
            "chooses between them; the attention interface dispatches one computation, and these cannot be shown "
            "to be the same one",
        )


def check_mask_setting(
    causality: Causality,
    class_name: str,
    mask_param: str | None,
    cross: Sequence[str],
    setting: cst.BaseExpression,
    line: int,
) -> None:
    """The mask added only where a setting holds (`if self.use_mask and mask is not None:`) goes to the
    implementations under that setting, None otherwise. Exact where every mask reaching the module is
    `create_bidirectional_mask`'s (or None): the module is then never causal, and None means no mask to every
    implementation, as eager without the addition. A causal builder's None would mean `is_causal` instead."""
    assert mask_param is not None
    why = bidirectional_only(causality.flow, class_name, mask_param, cross)
    if why is not None:
        raise Refuse(
            Code.CONDITIONAL,
            f"the attention mask is added only where `{code(setting)}` holds; handing the implementations None "
            f"otherwise is exact only where every mask reaching the module is bidirectional, and here {why}",
            line=line,
        )


def check_alternatives(forward: cst.FunctionDef, path: SdpaPath, alternatives: Known) -> None:
    """The trace left out the sides of `alternatives` that do not compute the attention, and forward keeps them as
    written: each comparison must be the test of an `if` one branch of which holds the whole computation, and that
    branch must be the side traced."""
    if not alternatives.falsy:
        return
    # the reads of a setting that can decide an `if` (its whole test, or the operand of `not`) -> that `if`
    deciding: dict[int, cst.If] = {}
    for node in nodes_of_type(forward.body, cst.If):
        deciding[id(node.test)] = node
        if isinstance(node.test, cst.UnaryOperation) and isinstance(node.test.operator, cst.Not):
            deciding[id(node.test.expression)] = node
    # every read of a setting the alternatives decide (a comparison, or a flag `self.x`) must decide an `if` one
    # branch of which holds the whole chain, the branch the trace took: read anywhere else, the code it decides is
    # neither traced nor kept as a whole
    reads: list[cst.BaseExpression] = [
        node for node in nodes_of_type(forward.body, cst.Comparison) if decide(node, alternatives) is not None
    ]
    reads += [node for node in nodes_of_type(forward.body, cst.Attribute) if decide(node, alternatives) is not None]
    reads += [
        node
        for node in nodes_of_type(forward.body, cst.UnaryOperation)
        if code(node) in alternatives.falsy and decide(node, alternatives) is not None
    ]
    for read in reads:
        chooser = deciding.get(id(read))
        decided = None if chooser is None else decide(chooser.test, alternatives)
        branch = None if chooser is None else whole_chain_branch(chooser, path.plans)
        if decided is None or branch is None or (branch is chooser) is not decided:
            raise Refuse(
                Code.HEAD_MASK_INTERFACE,
                f"`{code(read)}` chooses between the attention and another computation, but no branch of an "
                "`if` testing it holds the whole attention; the attention interface cannot fall back to eager for "
                "the other side",
            )


def imported_from_model(facts: ModuleFacts, function_name: str) -> str | None:
    """The modeling module an eager function is imported from (`..llama.modeling_llama`), if it is imported."""
    if function_name in facts.functions:
        return None
    qualified = facts.imports.aliases.get(function_name)
    if qualified is None:
        return None
    module = qualified.rsplit(".", 1)[0]
    return module if module.split(".")[-1].startswith(("modeling_", "modular_")) else None


def check_dispatched_function(facts: ModuleFacts, class_name: str, function_name: str) -> None:
    """The eager function a class already dispatches to is defined in the file, one attention the tool can read."""
    function = facts.functions.get(function_name)
    if function is None:
        raise Refuse(Code.EAGER_FUNCTION, f"its eager function `{function_name}` is not defined in this file", class_name)
    check_eager_function(facts, function, function_name, class_name)


def mask_parameter(path: SdpaPath, params: tuple[str, ...]) -> str | None:
    """The forward parameter added to the scores as the attention mask (`mask` or `mask.to(dtype)`).

    It goes to the implementation positionally: transformers' mask builders give eager a float mask and sdpa a
    boolean mask or None, so each implementation must receive the mask built for it.
    """
    for op in path.chain_ops:
        if isinstance(op, t.AddTerm):
            name = cast_operand(op.term)
            if name is not None and name in params and "mask" in name:
                return name
    return None


def weights_requested(params: Sequence[str], kwargs: str | None) -> str | None:
    """The expression telling whether a call asks for the attention weights, if the forward can be told so."""
    if "output_attentions" in params:
        return "output_attentions"
    return f'{kwargs}.get("output_attentions", False)' if kwargs is not None else None


def check_upcasts_agree(path: SdpaPath, class_name: str) -> None:
    """Products the branches of an `if` each make are all of float32 copies of the query and key, or none is.

    The class style runs SDPA in the dtype of the branch that ran (forms.md); the interface style moves the copies
    into the eager function with the first product's operands only.
    """
    starts = [op for op in path.chain_ops if isinstance(op, t.Start)]
    if len({start.operands_upcast for start in starts}) > 1:
        raise Refuse(
            Code.CONDITIONAL,
            "the branches compute the query-key product in different dtypes (float32 copies of the operands in "
            "some only), which the attention interface cannot hand over",
            class_name,
        )


def operand_upcasts(function: cst.FunctionDef, start: t.Start) -> frozenset[cst.CSTNode]:
    """`query = query.to(torch.float32)` before the product: part of the eager computation, it moves with it."""
    if not start.operands_upcast:
        return frozenset()
    operands = {n.value for n in (start.query, start.key) if isinstance(n, cst.Name)}
    finder = _SelfCasts(operands)
    function.body.visit(finder)
    return frozenset(finder.found)


def weights_bookkeeping(path: SdpaPath) -> frozenset[cst.CSTNode]:
    """`attn_weights_reshaped = None` beside the chain: the weights the eager function returns are set there too."""
    function = path.function
    names = path.probs_after_output
    found: set[cst.CSTNode] = set()

    class Find(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            plan = path.plans.get(node)
            if isinstance(plan, (t.ChainStmt, t.OutputStmt)):
                return
            targets = {n for target in node.targets for n in walk_names(target.target)}
            if targets and targets <= names and not walk_names(node.value) - {"None"}:
                found.add(node)

    function.body.visit(Find())
    return frozenset(found)


class _SelfCasts(cst.CSTVisitor):
    """Finds the assignments casting a named operand to itself (`query = query.to(torch.float32)`, `.float()`)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.found: set[cst.CSTNode] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            return
        name = node.targets[0].target.value
        value = node.value
        if (
            name in self.names
            and isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("to", "float")
            and m.matches(value.func.value, m.Name(name))
        ):
            self.found.add(node)


def bind_handed_values(path: SdpaPath, free: list[str], body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """Values forward hands to the eager function that only some paths assign (a term computed under a flag) are
    bound to None first: the eager function reads them on those paths only, and the dispatch must not fail on the
    others."""
    forward = path.function
    output = next((small for small, plan in _output_smalls(path)), None)
    params = {p.name.value for p in [*forward.params.params, *forward.params.kwonly_params, *forward.params.posonly_params]}
    bound = bound_before(block_body(forward.body), output) if output is not None else None
    if bound is None:
        return body
    missing = [name for name in free if name not in bound and name not in params and name != "self"]
    if not missing:
        return body
    start = 1 if body and is_docstring(body[0]) else 0
    bindings = [cst.parse_statement(f"{name} = None") for name in missing]
    return [*body[:start], *bindings, *body[start:]]


def _output_smalls(path: SdpaPath) -> list[tuple[cst.CSTNode, t.StmtPlan]]:
    """The statements of the path's function that the trace planned as the attention's output."""
    found: list[tuple[cst.CSTNode, t.StmtPlan]] = []

    class Find(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            plan = path.plans.get(node)
            if isinstance(plan, t.OutputStmt):
                found.append((node, plan))
            return True

    path.function.body.visit(Find())
    return found


__all__ = [
    "bind_handed_values",
    "check_alternatives",
    "check_dispatched_function",
    "check_kept_builders",
    "check_mask_setting",
    "check_one_computation",
    "check_sdpa_allowed",
    "check_upcasts_agree",
    "imported_from_model",
    "mask_parameter",
    "operand_upcasts",
    "weights_bookkeeping",
    "weights_requested",
]
