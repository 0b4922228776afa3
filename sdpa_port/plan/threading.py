"""Plan the threading of `**kwargs` (and `position_ids`) from the model classes down to the attention modules.

Which forwards lie on a path from a PreTrainedModel subclass to a moved attention module (calls of `self.x(...)`,
`self.x.y(...)`, and of loop variables over `self.layers`), which of their calls would clash with the kwargs, which
base models build no `position_ids` (they get llama's default) and why a file cannot claim to be an attention-backend
citizen: every problem names its line. Where the target release leaves continuous batching's paged cache to the
model (`Release.model_updates_paged_cache`, 5.25.0), the model must take it as its own `cache` and call on it only
what the paged cache has, as that release's models do.
"""

from __future__ import annotations

import ast
import dataclasses

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import all_assigned_names, assigned_names, block_body, nodes_of_type
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.discover.release import PAGED_CACHE_KEYWORD, Release
from sdpa_port.rewrite.paged_updates import is_cache_update, passes_kwargs
from sdpa_port.rewrite.thread_kwargs import (
    SubmoduleCall,
    Submodules,
    Threading,
    clash,
    describe_call,
    names_in,
    parameter_names,
    star_kwargs,
)


# the names transformers' models take their cache by (`past_key_values`, renamed `cache` in 5.25.0)
CACHE_PARAMETERS = ("past_key_values", PAGED_CACHE_KEYWORD)


def plan_threading(
    facts: ModuleFacts, attention: set[str], forwards_with_kwargs: set[str], release: Release | None = None
) -> Threading:
    """Which forwards pass `**kwargs` on, from the PreTrainedModel subclasses down to the `attention` classes.

    `forwards_with_kwargs`: attention classes whose (rewritten) forward takes `**kwargs`; `release`: the release the
    port targets (None: unknown).
    """
    members = _nested_members(facts)
    plan = Threading(reaching=set(attention))
    calls = _reaching_calls(facts, members, plan)
    for name in plan.reaching:
        found = facts.find_method(name, "forward")
        if found is not None:
            plan.parameters[name] = parameter_names(found[1])
    roots = {name for name in calls if facts.is_subclass(name, "PreTrainedModel")}
    on_paths = set(roots)
    for root in roots:
        on_paths |= _reachable(root, calls)
    plan.reached = on_paths & attention
    calls = {name: sites for name, sites in calls.items() if name in on_paths}
    _check_calls(facts, members, calls, plan, release)
    for name, sites in calls.items():
        _plan_positions(facts, name, sites, plan, release)
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


def _nested_members(facts: ModuleFacts) -> dict[str, dict[str, frozenset[str]]]:
    """Each class's module attributes with the classes they hold, one attribute further down included."""
    members = {name: _members(facts, name) for name in facts.classes}
    for own in members.values():  # `self.model.decoder(...)`: one attribute further down
        for attribute, classes in list(own.items()):
            for held in classes:
                for inner, inner_classes in members[held].items():
                    if "." not in inner:
                        own[f"{attribute}.{inner}"] = own.get(f"{attribute}.{inner}", frozenset()) | inner_classes
    return members


def _reaching_calls(
    facts: ModuleFacts, members: dict[str, dict[str, frozenset[str]]], plan: Threading
) -> dict[str, list[SubmoduleCall]]:
    """The calls of each forward reaching the attention classes, adding the classes making them to `plan.reaching`."""
    calls: dict[str, list[SubmoduleCall]] = {}
    every: dict[str, list[SubmoduleCall]] = {}  # each forward's submodule calls, read once
    changed = True
    while changed:
        changed = False
        for name in facts.classes:
            found = facts.find_method(name, "forward")
            if name in plan.reaching or found is None:
                continue
            if name not in every:
                every[name] = _calls(found[1], members[name], _def_line(facts, found[0].name))
            sites = [c for c in every[name] if c.callees & plan.reaching]
            if sites:
                calls[name] = sites
                plan.reaching.add(name)
                changed = True
    return calls


def _check_calls(
    facts: ModuleFacts,
    members: dict[str, dict[str, frozenset[str]]],
    calls: dict[str, list[SubmoduleCall]],
    plan: Threading,
    release: Release | None,
) -> None:
    """Record the owners of the forwards on the paths, and the problems of their calls and paged-cache updates."""
    for name, sites in calls.items():
        found = facts.find_method(name, "forward")
        assert found is not None
        owner, forward = found[0].name, found[1]
        plan.owners[owner] = members[name]
        if release is not None and release.model_updates_paged_cache:
            plan.problems.extend(_unpassed_updates(owner, forward, _def_line(facts, owner), release))
        for call in sites:
            problem = clash(call, parameter_names(forward), star_kwargs(forward))
            if problem:
                plan.problems.append(f"{owner}.forward line {call.line}: {problem}")


def _plan_positions(
    facts: ModuleFacts, name: str, sites: list[SubmoduleCall], plan: Threading, release: Release | None
) -> None:
    """For a base model calling its layers, record its cache and how its `position_ids` reach them, or why not."""
    found = facts.find_method(name, "forward")
    assert found is not None
    layers = any(not any(facts.is_subclass(c, "PreTrainedModel") for c in call.callees) for call in sites)
    if not (facts.is_subclass(name, "PreTrainedModel") and layers):
        return
    # llama's default reads the embeddings and the cache: forward must compute the embeddings when not given
    computed = all_assigned_names(block_body(found[1].body))
    cache = cache_name(found[1])
    cached = cache is not None
    if cache is not None:
        plan.caches[found[0].name] = cache
    if release is not None and release.model_updates_paged_cache:
        plan.problems.extend(
            _paged_cache_problems(found[0].name, found[1], cache, release, _def_line(facts, found[0].name))
        )
    if "position_ids" in plan.parameters[name]:
        if cached and not _builds(found[1], "position_ids"):
            plan.problems.append(
                f"{found[0].name}.forward hands position_ids on only when its caller gives them (it builds none)"
            )
        return
    if "inputs_embeds" in computed and cached and "position_ids" not in names_in(found[1]):
        plan.position_defaults.add(found[0].name)
        plan.parameters[name].add("position_ids")
        for line in _positions_from_cache_length(facts, found[0].name, cache or CACHE_PARAMETERS[0]):
            plan.problems.append(
                f"{found[0].name}.forward line {line}: positions come from the cache length, which continuous "
                "batching's packed prompts do not have (it hands position_ids over)"
            )
    elif cached:
        plan.problems.append(
            f"{found[0].name}.forward builds no position_ids for the attention modules (kernels find the cache "
            "position in them)"
        )


def _builds(function: cst.FunctionDef, name: str) -> bool:
    """`function` assigns `name` a value computed without it (`position_ids = cache_position.unsqueeze(0)`), not one
    only passing it through (`..., position_ids, ... = self._pad(position_ids=position_ids)` keeps a None)."""
    for node in nodes_of_type(function.body, cst.Assign):
        targets = {n for t in node.targets for n in assigned_names(t.target)}
        if name in targets and name not in names_in(node.value):
            return True
    return False


def _reachable(root: str, calls: dict[str, list["SubmoduleCall"]]) -> set[str]:
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
                for name in names_in(value):
                    if name in facts.classes:
                        classes.add(name)
                    elif name in facts.dicts:
                        classes |= {n for n in names_in(facts.dicts[name]) if n in facts.classes}
            if classes:
                out[attribute] = frozenset(classes)
    return out


def _calls(forward: cst.FunctionDef, members: dict[str, frozenset[str]], def_line: int = 0) -> list[SubmoduleCall]:
    """Calls of submodules in forward: `self.x(...)`, and `layer(...)` for a loop over `self.x`; their lines count
    from `def_line`, the line of forward's `def` in the file."""
    finder = _CallFinder(members)
    cst.MetadataWrapper(cst.Module(body=[forward]), unsafe_skip_copy=True).visit(finder)  # read only
    return [dataclasses.replace(call, line=call.line + def_line) for call in finder.calls]


def cache_name(forward: cst.FunctionDef) -> str | None:
    """The name forward's body reads its cache by (`past_key_values`, or the `cache` parameter of 5.25.0's models)."""
    read = names_in(forward.body)
    if CACHE_PARAMETERS[0] in read:
        return CACHE_PARAMETERS[0]
    return next((name for name in CACHE_PARAMETERS[1:] if name in read and name in parameter_names(forward)), None)


def _paged_cache_problems(
    owner: str, forward: cst.FunctionDef, cache: str | None, release: Release, def_line: int
) -> list[str]:
    """Why continuous batching's paged cache, which the release leaves to the model to update, would fail in this
    base model: it arrives as `cache` (PagedAttentionArgs), so a model taking its cache by another name never sees
    it, and a model taking it so may call on it only what the paged cache has. Calls under
    `if position_ids is None:` are not on its path (it always hands position_ids over), as in llama's forward."""
    version = f"transformers {release.version}" if release.version else "the target release"
    if cache is None:
        return []
    if cache != PAGED_CACHE_KEYWORD:
        return [
            f"{owner}.forward takes its cache as `{cache}`: continuous batching hands its paged cache over as "
            f"`{PAGED_CACHE_KEYWORD}`, which in {version} the model's attention must update itself"
        ]
    problems = []
    for call, line in dict.fromkeys(_calls_on(forward, cache, def_line)):
        if call not in release.paged_cache_methods:
            problems.append(
                f"{owner}.forward line {line} calls `{cache}.{call}()`, which continuous batching's paged cache "
                f"(handed over as `{cache}`) lacks in {version}"
            )
    return problems


def _unpassed_updates(owner: str, forward: cst.FunctionDef, def_line: int, release: Release) -> list[str]:
    """Cache updates of a forward between a model and its attention that continuous batching's paged cache cannot
    take: without the forward's kwargs (which the attention modules' own updates are given), or in a release whose
    paged update takes something else than the kwargs."""
    version = f"transformers {release.version}" if release.version else "the target release"
    finder = _Updates()
    cst.MetadataWrapper(cst.Module(body=[forward]), unsafe_skip_copy=True).visit(finder)  # read only
    return [
        f"{owner}.forward line {line - finder.def_line + def_line} updates the cache without its kwargs, which the "
        f"paged cache of {version} needs (`update(..., kwargs=kwargs)`)"
        for line, passed in finder.updates
        if not passed or release.paged_update_parameters != ("kwargs",)
    ]


class _Updates(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self) -> None:
        self.updates: list[tuple[int, bool]] = []  # (line, passes kwargs)
        self.def_line = 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "forward":
            self.def_line = self.get_metadata(cst.metadata.PositionProvider, node.name).start.line

    def visit_Call(self, node: cst.Call) -> None:
        if is_cache_update(node):
            self.updates.append((self.get_metadata(cst.metadata.PositionProvider, node).start.line, passes_kwargs(node)))


def _calls_on(forward: cst.FunctionDef, name: str, def_line: int) -> list[tuple[str, int]]:
    """`name.<method>(...)` calls in forward outside an `if position_ids is None:` body: (method, line), lines
    counted from `def_line`, the line of forward's `def` in the file."""
    finder = _MethodCalls(name)
    cst.MetadataWrapper(cst.Module(body=[forward]), unsafe_skip_copy=True).visit(finder)  # read only
    return [(method, line - finder.def_line + def_line) for method, line in finder.calls]


class _MethodCalls(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, int]] = []
        self.def_line = 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "forward":
            self.def_line = self.get_metadata(cst.metadata.PositionProvider, node.name).start.line

    def visit_If(self, node: cst.If) -> bool:
        if m.matches(node.test, m.Comparison(left=m.Name("position_ids"), comparisons=[m.ComparisonTarget(m.Is(), m.Name("None"))])):
            if node.orelse is not None:
                node.orelse.visit(self)
            node.test.visit(self)
            return False
        return True

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Attribute(value=m.Name(self.name))):
            assert isinstance(node.func, cst.Attribute)
            line = self.get_metadata(cst.metadata.PositionProvider, node).start.line
            self.calls.append((node.func.attr.value, line))


def _positions_from_cache_length(facts: ModuleFacts, owner: str, cache: str) -> list[int]:
    """Lines of forward's calls handing a past length on (`self.embed_positions(x, past_key_values_length=n)`,
    `cache_length=n` in 5.25.0's models)."""
    lines: list[int] = []
    for node in facts.tree.body if facts.tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == owner:
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef) and inner.name == "forward":
                    lines.extend(
                        call.lineno
                        for call in ast.walk(inner)
                        if isinstance(call, ast.Call)
                        and any(
                            k.arg and ("past" in k.arg and "length" in k.arg or k.arg == f"{cache}_length")
                            for k in call.keywords
                        )
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
        self.loops = Submodules(members)
        self.calls: list[SubmoduleCall] = []
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
            self.calls.append(describe_call(node, callees, line))
