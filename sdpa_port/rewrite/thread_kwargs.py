"""Thread the models' `**kwargs` through every layer into the attention modules, and `position_ids` along.

Models on the attention interface hand whatever their callers pass (continuous batching's paged cache and its read
and write indices, `is_causal`, `position_ids`, flash attention's sequence lengths) down to the attention function:
every forward between a model's and an attention module's takes `**kwargs` and passes them on. A call that cannot
take them without a clash (a keyword the kwargs may carry, another `**` mapping) is left as it is and reported, and
the threading is then incomplete.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from typing import TypeVar

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import all_assigned_names, block_body
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.render import render_statements
from sdpa_port.rewrite.targeted import transform_named

_Item = TypeVar("_Item", cst.Param, cst.Arg)
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


def fresh_name(name: str, taken: set[str] | frozenset[str]) -> str:
    while name in taken:
        name = "_" + name
    return name


def with_star_kwargs(function: cst.FunctionDef, name: str) -> cst.FunctionDef:
    """`def f(a, b)` -> `def f(a, b, **name)`, keeping the parameters' layout."""
    params = function.params
    star = cst.Param(name=cst.Name(name), star="**")
    if params.kwonly_params:
        kwonly, (star,) = separated([*params.kwonly_params], [star])
        return function.with_changes(params=params.with_changes(kwonly_params=kwonly, star_kwarg=star))
    if isinstance(params.star_arg, cst.Param):
        laid, (star,) = separated([*params.params, params.star_arg], [star])
        return function.with_changes(params=params.with_changes(params=laid[:-1], star_arg=laid[-1], star_kwarg=star))
    plain, (star,) = separated([*params.params], [star])
    return function.with_changes(params=params.with_changes(params=plain, star_kwarg=star))


def with_position_ids(forward: cst.FunctionDef, before: cst.BaseStatement) -> cst.FunctionDef:
    """A `position_ids=None` parameter, and llama's default for it built before the statement `before`."""
    taken = _names(forward)
    past = fresh_name("past_seen_tokens", taken)
    defaults = render_statements("interface_style/position_ids.py.jinja", past=past)
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


def separated(items: list[_Item], added: list[_Item]) -> tuple[list[_Item], list[_Item]]:
    """`items` and `added` laid out as one list continuing `items`: the separators between items go between the
    added ones too, and a trailing comma (or none) stays at the end."""
    space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    last: cst.Comma | cst.MaybeSentinel = cst.MaybeSentinel.DEFAULT
    between: cst.Comma = space
    if items:
        if isinstance(items[-1].comma, cst.Comma):
            last = items[-1].comma
        previous = items[-2].comma if len(items) > 1 else None
        between = previous if isinstance(previous, cst.Comma) else space
    new = [_comma(a, between) for a in added]
    new[-1] = _comma(new[-1], last)
    kept = list(items)
    if kept:
        kept[-1] = _comma(kept[-1], between)
    return kept, new


def _comma(item: _Item, comma: cst.Comma | cst.MaybeSentinel) -> _Item:
    changed: _Item = item.with_changes(comma=comma)
    return changed


# ------------------------------------------------------------------ planning


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

    @property
    def complete(self) -> bool:
        return not self.problems


def plan_threading(facts: ModuleFacts, attention: set[str], forwards_with_kwargs: set[str]) -> Threading:
    """Which forwards pass `**kwargs` on, from the PreTrainedModel subclasses down to the `attention` classes.

    `forwards_with_kwargs`: attention classes whose (rewritten) forward takes `**kwargs`.
    """
    members = {name: _members(facts, name) for name in facts.classes}
    for own in members.values():  # `self.model.decoder(...)`: one attribute further down
        for attribute, classes in list(own.items()):
            for held in classes:
                for inner, inner_classes in members[held].items():
                    if "." not in inner:
                        own[f"{attribute}.{inner}"] = own.get(f"{attribute}.{inner}", frozenset()) | inner_classes
    plan = Threading(reaching=set(attention))
    calls: dict[str, list[_Call]] = {}
    changed = True
    while changed:
        changed = False
        for name in facts.classes:
            found = facts.find_method(name, "forward")
            if name in plan.reaching or found is None:
                continue
            sites = [
                c for c in _calls(found[1], members[name], _def_line(facts, found[0].name)) if c.callees & plan.reaching
            ]
            if sites:
                calls[name] = sites
                plan.reaching.add(name)
                changed = True
    for name in plan.reaching:
        found = facts.find_method(name, "forward")
        if found is not None:
            plan.parameters[name] = _parameter_names(found[1])
    roots = {name for name in calls if facts.is_subclass(name, "PreTrainedModel")}
    on_paths = set(roots)
    for root in roots:
        on_paths |= _reachable(root, calls)
    plan.reached = on_paths & attention
    calls = {name: sites for name, sites in calls.items() if name in on_paths}
    for name, sites in calls.items():
        found = facts.find_method(name, "forward")
        assert found is not None
        owner, forward = found[0].name, found[1]
        plan.owners[owner] = members[name]
        for call in sites:
            problem = _clash(call, _parameter_names(forward), _star_kwargs(forward))
            if problem:
                plan.problems.append(f"{owner}.forward line {call.line}: {problem}")
    for name, sites in calls.items():
        found = facts.find_method(name, "forward")
        assert found is not None
        layers = any(not any(facts.is_subclass(c, "PreTrainedModel") for c in call.callees) for call in sites)
        if not (facts.is_subclass(name, "PreTrainedModel") and layers):
            continue
        # llama's default reads the embeddings and the cache: forward must compute the embeddings when not given
        computed = all_assigned_names(block_body(found[1].body))
        cached = "past_key_values" in _names(found[1].body)
        if "position_ids" in plan.parameters[name]:
            if cached and "position_ids" not in computed:
                plan.problems.append(
                    f"{found[0].name}.forward hands position_ids on only when its caller gives them (it builds none)"
                )
            continue
        if "inputs_embeds" in computed and cached and "position_ids" not in _names(found[1]):
            plan.position_defaults.add(found[0].name)
            plan.parameters[name].add("position_ids")
            for line in _positions_from_cache_length(facts, found[0].name):
                plan.problems.append(
                    f"{found[0].name}.forward line {line}: positions come from the cache length, which continuous "
                    "batching's packed prompts do not have (it hands position_ids over)"
                )
        elif cached:
            plan.problems.append(
                f"{found[0].name}.forward builds no position_ids for the attention modules (kernels find the cache "
                "position in them)"
            )
    for name in sorted(facts.classes):
        holds = set().union(*members[name].values()) if members[name] else set()
        if facts.is_subclass(name, "PreTrainedModel") and holds & plan.reaching and name not in calls:
            found = facts.find_method(name, "forward")
            if found is not None:
                plan.problems.append(f"{found[0].name}.forward calls its layers in a way not followed here")
    for name in sorted(attention - plan.reached):
        plan.problems.append(f"no model forward in this file is shown to call `{name}`")
    for name in sorted(attention - forwards_with_kwargs):
        plan.problems.append(f"`{name}.forward` takes no **kwargs")
    return plan


def _clash(call: "_Call", named: set[str], star: str | None) -> str | None:
    clash = sorted(k for k in call.keywords if k in CARRIED and k not in named)
    if clash:
        return f"passes `{', '.join(clash)}=` itself, which the kwargs may carry"
    if call.star_kwargs not in (None, star or "kwargs"):
        return "already passes another `**` mapping"
    return None


def _reachable(root: str, calls: dict[str, list["_Call"]]) -> set[str]:
    seen: set[str] = set()
    stack = [root]
    while stack:
        current = stack.pop()
        for call in calls.get(current, []):
            for callee in call.callees - seen:
                seen.add(callee)
                stack.append(callee)
    return seen


def _members(facts: ModuleFacts, class_name: str) -> dict[str, frozenset[str]]:
    """attribute -> in-file classes it may hold (`self.attn = Attn(...)`, a ModuleList of them, a dict lookup)."""
    out: dict[str, frozenset[str]] = {}
    for info in reversed(facts.mro(class_name)):
        for attribute, values in info.attributes.items():
            classes: set[str] = set()
            for value in values:
                for name in _names(value):
                    if name in facts.classes:
                        classes.add(name)
                    elif name in facts.dicts:
                        classes |= {n for n in _names(facts.dicts[name]) if n in facts.classes}
            if classes:
                out[attribute] = frozenset(classes)
    return out


def _names(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()

    class Names(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.add(name.value)

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            attribute.value.visit(self)
            return False  # `config.x`: the attribute's own name is no class

    node.visit(Names())
    return found


@dataclass(frozen=True)
class _Call:
    line: int
    callees: frozenset[str]
    keywords: frozenset[str]
    star_kwargs: str | None  # the name of a `**name` argument, "" for another expression


class _Loops:
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


def _describe(call: cst.Call, callees: frozenset[str], line: int) -> _Call:
    keywords = frozenset(a.keyword.value for a in call.args if a.keyword is not None)
    stars = [a for a in call.args if a.star == "**"]
    star = None
    if stars:
        star = stars[0].value.value if isinstance(stars[0].value, cst.Name) else ""
    return _Call(line, callees, keywords, star)


def _calls(forward: cst.FunctionDef, members: dict[str, frozenset[str]], def_line: int = 0) -> list[_Call]:
    """Calls of submodules in forward: `self.x(...)`, and `layer(...)` for a loop over `self.x`; their lines count
    from `def_line`, the line of forward's `def` in the file."""
    finder = _CallFinder(members)
    cst.MetadataWrapper(cst.Module(body=[forward])).visit(finder)
    return [replace(call, line=call.line + def_line) for call in finder.calls]


def _positions_from_cache_length(facts: ModuleFacts, owner: str) -> list[int]:
    """Lines of forward's calls handing a past length on (`self.embed_positions(x, past_key_values_length=n)`)."""
    lines: list[int] = []
    for node in facts.tree.body if facts.tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == owner:
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef) and inner.name == "forward":
                    lines.extend(
                        call.lineno
                        for call in ast.walk(inner)
                        if isinstance(call, ast.Call)
                        and any(k.arg and "past" in k.arg and "length" in k.arg for k in call.keywords)
                    )
    return lines


def _def_line(facts: ModuleFacts, owner: str) -> int:
    """The line of `def forward` of a top-level class, from the file's ast."""
    for node in facts.tree.body if facts.tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == owner:
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef) and inner.name == "forward":
                    return inner.lineno
    return 0


class _CallFinder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, members: dict[str, frozenset[str]]) -> None:
        self.loops = _Loops(members)
        self.calls: list[_Call] = []
        self.def_line = 1  # the line of `def` in the wrapped function (lines are counted from there)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "forward":
            self.def_line = self.get_metadata(cst.metadata.PositionProvider, node.name).start.line

    def visit_For(self, node: cst.For) -> None:
        self.loops.enter(node)

    def leave_For(self, original_node: cst.For) -> None:
        self.loops.leave()

    def visit_Call(self, node: cst.Call) -> None:
        callees = self.loops.callees(node)
        if callees is not None:
            line = self.get_metadata(cst.metadata.PositionProvider, node).start.line - self.def_line
            self.calls.append(_describe(node, callees, line))


def _self_attribute(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Attribute) and m.matches(node.value, m.Name("self")):
        return node.attr.value
    return None


def _parameter_names(function: cst.FunctionDef) -> set[str]:
    params = function.params
    return {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}


def _star_kwargs(function: cst.FunctionDef) -> str | None:
    star = function.params.star_kwarg
    return star.name.value if isinstance(star, cst.Param) else None


# ------------------------------------------------------------------ applying


def thread_kwargs(module: cst.Module, plan: Threading) -> tuple[cst.Module, list[str]]:
    """Apply the plan; returns the new module and a note per edited forward."""
    notes: list[str] = []
    for owner, members in sorted(plan.owners.items()):
        transformer = _ThreadForward(members, plan, owner in plan.position_defaults)
        module = transform_named(module, {owner}, transformer)
        if transformer.threaded:
            passed = " and position_ids" if transformer.positions else ""
            notes.append(f"{owner}.forward passes **kwargs{passed} on ({transformer.threaded} call(s))")
        if owner in plan.position_defaults:
            notes.append(f"{owner}.forward takes position_ids (by default the positions after the cache, as llama's)")
    return module, notes


class _ThreadForward(cst.CSTTransformer):
    """In a class's `forward`: calls of submodules leading to attention get `**kwargs` (and `position_ids=`)."""

    def __init__(self, members: dict[str, frozenset[str]], plan: Threading, default_positions: bool) -> None:
        self.loops = _Loops(members)
        self.plan = plan
        self.default_positions = default_positions
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
            updated = with_position_ids(updated, self.first_call)
        if self.threaded and _star_kwargs(updated) is None:
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
        named = _parameter_names(forward) | ({"position_ids"} if self.default_positions else set())
        star = _star_kwargs(forward)
        call = _describe(original, callees, 0)
        if _clash(call, named, star) is not None:
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
            added.append(_keyword("position_ids", cst.Name("position_ids")))
            self.positions += 1
        if call.star_kwargs is None:
            added.append(cst.Arg(value=cst.Name(star or "kwargs"), star="**"))
        if not added:
            self.threaded += 1
            return updated
        self.threaded += 1
        return updated.with_changes(args=_append(args, added))


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def _append(args: list[cst.Arg], added: list[cst.Arg]) -> list[cst.Arg]:
    """Insert arguments before a `**` one (or at the end), keeping the call's layout."""
    index = next((i for i, a in enumerate(args) if a.star == "**"), len(args))
    before, after = args[:index], args[index:]
    if after:
        space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        comma = before[-1].comma if before and isinstance(before[-1].comma, cst.Comma) else space
        return [*before, *(a.with_changes(comma=comma) for a in added), *after]
    before, new = separated(before, added)
    return [*before, *new]
