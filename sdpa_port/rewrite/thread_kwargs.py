"""Thread the models' `**kwargs` through every layer into the attention modules, and `position_ids` along.

Models on the attention interface hand whatever their callers pass (continuous batching's paged cache and its read
and write indices, `is_causal`, `position_ids`, flash attention's sequence lengths) down to the attention function:
every forward between a model's and an attention module's takes `**kwargs` and passes them on. A call that cannot
take them without a clash (a keyword the kwargs may carry, another `**` mapping) is left as it is; the plan
(`sdpa_port/plan/threading.py`) reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import block_body
from sdpa_port.render import render_statements
from sdpa_port.rewrite.layout import append_arguments, fresh_name, keyword_argument, separated, with_star_kwargs
from sdpa_port.rewrite.targeted import transform_named

_Statement = TypeVar("_Statement", cst.SimpleStatementLine, cst.For, cst.If, cst.With)

# keys transformers' callers put into a model's kwargs (TransformersKwargs, continuous batching's PagedAttentionArgs)
CARRIED = frozenset(
    {
        "num_items_in_batch",
        "output_hidden_states",
        "output_attentions",
        "output_router_logits",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "position_ids",
        "is_causal",
        "seq_idx",
        "cache",
        "read_index",
        "write_index",
        "logits_indices",
        "logits_processor_args",
        "block_table",
    }
)


@dataclass
class Threading:
    # owner class (defining the forward) -> its submodule attributes and the classes they may hold
    owners: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    reaching: set[str] = field(default_factory=set)  # classes whose forward leads to an attention module
    parameters: dict[str, set[str]] = field(default_factory=dict)  # class -> named parameters of its forward
    problems: list[str] = field(default_factory=list)
    reached: set[str] = field(default_factory=set)  # attention classes some model forward reaches
    # base models (their forward calls the layers) without `position_ids`: they get the parameter and llama's default
    position_defaults: set[str] = field(default_factory=set)
    # base models -> the name their forward reads the cache by (`past_key_values`; `cache` in 5.25.0's models)
    caches: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.problems


def clash(call: "SubmoduleCall", named: set[str], star: str | None) -> str | None:
    clash = sorted(k for k in call.keywords if k in CARRIED and k not in named)
    if clash:
        return f"passes `{', '.join(clash)}=` itself, which the kwargs may carry"
    if call.star_kwargs not in (None, star or "kwargs"):
        return "already passes another `**` mapping"
    return None


@dataclass(frozen=True)
class SubmoduleCall:
    line: int
    callees: frozenset[str]
    keywords: frozenset[str]
    star_kwargs: str | None  # the name of a `**name` argument, "" for another expression


class Submodules:
    """Loop variables bound to the items of a submodule list (`for layer in self.layers[:n]`, `enumerate(self.h)`)."""

    def __init__(self, members: dict[str, frozenset[str]]) -> None:
        self.members = members
        self.loops: list[dict[str, frozenset[str]]] = []

    def enter(self, node: cst.For) -> None:
        bound: dict[str, frozenset[str]] = {}
        iterated = node.iter
        target: cst.BaseExpression = node.target
        if isinstance(iterated, cst.Call) and m.matches(iterated.func, m.Name("enumerate")) and iterated.args:
            iterated = iterated.args[0].value
            if isinstance(target, cst.Tuple) and len(target.elements) == 2:
                target = target.elements[1].value
        if isinstance(iterated, cst.Subscript):
            iterated = iterated.value
        attribute = _self_attribute(iterated)
        if attribute is not None and attribute in self.members and isinstance(target, cst.Name):
            bound[target.value] = self.members[attribute]
        self.loops.append(bound)

    def leave(self) -> None:
        self.loops.pop()

    def callees(self, call: cst.Call) -> frozenset[str] | None:
        attribute = _self_attribute(call.func)
        if attribute is None and isinstance(call.func, cst.Attribute):
            outer = _self_attribute(call.func.value)
            attribute = f"{outer}.{call.func.attr.value}" if outer is not None else None
        if attribute is not None and attribute in self.members:
            return self.members[attribute]
        if isinstance(call.func, cst.Name):
            for bound in reversed(self.loops):
                if call.func.value in bound:
                    return bound[call.func.value]
        return None


def describe_call(call: cst.Call, callees: frozenset[str], line: int) -> SubmoduleCall:
    keywords = frozenset(a.keyword.value for a in call.args if a.keyword is not None)
    stars = [a for a in call.args if a.star == "**"]
    star = None
    if stars:
        star = stars[0].value.value if isinstance(stars[0].value, cst.Name) else ""
    return SubmoduleCall(line, callees, keywords, star)


def _self_attribute(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Attribute) and m.matches(node.value, m.Name("self")):
        return node.attr.value
    return None


def parameter_names(function: cst.FunctionDef) -> set[str]:
    params = function.params
    return {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}


def star_kwargs(function: cst.FunctionDef) -> str | None:
    star = function.params.star_kwarg
    return star.name.value if isinstance(star, cst.Param) else None


# ------------------------------------------------------------------ applying


def with_position_ids(
    forward: cst.FunctionDef, before: cst.BaseStatement, cache: str = "past_key_values"
) -> cst.FunctionDef:
    """A `position_ids=None` parameter, and llama's default for it built before the statement `before` (reading the
    length of the cache forward takes as `cache`)."""
    taken = names_in(forward)
    past = fresh_name("past_seen_tokens", taken)
    defaults = render_statements("interface_style/position_ids.py.jinja", past=past, cache=cache)
    body: list[cst.BaseStatement] = []
    for statement in block_body(forward.body):
        if statement is before:
            body.extend(defaults)
        body.append(statement)
    parameter = cst.Param(
        name=cst.Name("position_ids"),
        annotation=cst.Annotation(cst.parse_expression("torch.LongTensor | None")),
        default=cst.Name("None"),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(" "), whitespace_after=cst.SimpleWhitespace(" ")),
    )
    params, (parameter,) = separated([*forward.params.params], [parameter])
    return forward.with_changes(
        params=forward.params.with_changes(params=[*params, parameter]),
        body=forward.body.with_changes(body=body),
    )


def thread_kwargs(module: cst.Module, plan: Threading) -> tuple[cst.Module, list[str]]:
    """Apply the plan; returns the new module and a note per edited forward."""
    notes: list[str] = []
    for owner, members in sorted(plan.owners.items()):
        transformer = _ThreadForward(members, plan, owner in plan.position_defaults, plan.caches.get(owner))
        module = transform_named(module, {owner}, transformer)
        if transformer.threaded:
            passed = " and position_ids" if transformer.positions else ""
            notes.append(f"{owner}.forward passes **kwargs{passed} on ({transformer.threaded} call(s))")
        if owner in plan.position_defaults:
            notes.append(f"{owner}.forward takes position_ids (by default the positions after the cache, as llama's)")
    return module, notes


class _ThreadForward(cst.CSTTransformer):
    """In a class's `forward`: calls of submodules leading to attention get `**kwargs` (and `position_ids=`)."""

    def __init__(
        self, members: dict[str, frozenset[str]], plan: Threading, default_positions: bool, cache: str | None = None
    ) -> None:
        self.loops = Submodules(members)
        self.plan = plan
        self.default_positions = default_positions
        self.cache = cache or "past_key_values"
        self.functions: list[cst.FunctionDef] = []
        self.threaded = 0
        self.positions = 0
        self.calls_seen = 0
        self.first_call: cst.BaseStatement | None = None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.functions.pop()
        if self.functions or updated.name.value != "forward":
            return updated
        if self.default_positions and self.first_call is not None:
            updated = with_position_ids(updated, self.first_call, self.cache)
        if self.threaded and star_kwargs(updated) is None:
            updated = with_star_kwargs(updated, "kwargs")
        return updated

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        return self._mark(original, updated)

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        self.loops.leave()
        return self._mark(original, updated)

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        return self._mark(original, updated)

    def leave_With(self, original: cst.With, updated: cst.With) -> cst.With:
        return self._mark(original, updated)

    def _mark(self, original: _Statement, updated: _Statement) -> _Statement:
        """Remember the top-level statement of forward holding the first threaded call (the defaults go before)."""
        if self.calls_seen and self.first_call is None and self._top_level(original):
            self.first_call = updated
        return updated

    def _top_level(self, statement: cst.CSTNode) -> bool:
        return bool(self.functions) and any(s is statement for s in block_body(self.functions[0].body))

    def visit_For(self, node: cst.For) -> None:
        self.loops.enter(node)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if len(self.functions) != 1 or self.functions[0].name.value != "forward":
            return updated
        callees = self.loops.callees(original)
        if callees is None or not callees & self.plan.reaching:
            return updated
        self.calls_seen += 1
        forward = self.functions[0]
        named = parameter_names(forward) | ({"position_ids"} if self.default_positions else set())
        star = star_kwargs(forward)
        call = describe_call(original, callees, 0)
        if clash(call, named, star) is not None:
            return updated
        args = list(updated.args)
        added: list[cst.Arg] = []
        callee_parameters = [self.plan.parameters[c] for c in callees & self.plan.reaching if c in self.plan.parameters]
        if (
            "position_ids" in named
            and "position_ids" not in call.keywords
            and callee_parameters
            and all("position_ids" not in names for names in callee_parameters)
        ):
            added.append(keyword_argument("position_ids", cst.Name("position_ids")))
            self.positions += 1
        if call.star_kwargs is None:
            added.append(cst.Arg(value=cst.Name(star or "kwargs"), star="**"))
        if not added:
            self.threaded += 1
            return updated
        self.threaded += 1
        return updated.with_changes(args=append_arguments(args, added))


def names_in(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()

    class Names(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.add(name.value)

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            attribute.value.visit(self)
            return False  # `config.x`: the attribute's own name is no class

    node.visit(Names())
    return found
