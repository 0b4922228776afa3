"""Build the SDPA version of an attention module's forward: specialise, re-trace, emit, inline helpers."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import libcst as cst

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cross import keys_aligned
from sdpa_port.analyse.masked_rows import masked_rows_reason
from sdpa_port.analyse.cstutil import (
    all_assigned_names,
    assigned_names,
    assignment,
    block_body,
    is_docstring,
    replace_names,
    replace_nodes,
)
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.patterns import walk_names
from sdpa_port.analyse.recognise import (
    ClassAnalysis,
    Helper,
    bind_arguments,
    key_layout_params,
    passed_ranks,
    site_operands,
)
from sdpa_port.rewrite.cleanup import remove_dead
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.sdpa_body import EmitOptions, MaskContract, SdpaEmitter, SideNames, function_names
from sdpa_port.rewrite.specialise import Known, specialise
from sdpa_port.rewrite.walk import StatementWalker


@dataclass(frozen=True)
class ForwardPlan:
    """What the SDPA forward needs beyond the body: the fallback's condition parts."""

    falsy: tuple[str, ...]
    none: tuple[str, ...]


def trace_sdpa_path(
    facts: ModuleFacts,
    class_name: str,
    function: cst.FunctionDef,
    key_params: frozenset[str] = frozenset(),
    aligned: bool = False,
    known: Known = Known(),
    ranks: tuple[tuple[str, int], ...] = (),
) -> tuple[t.TraceResult, t.Candidate]:
    """Trace a specialised function and select its single attention chain (`aligned`: see `keys_aligned_in`;
    `known`: tests whose other side the trace leaves out, while the function keeps it; `ranks`: of the tensors the
    caller passes to a helper's parameters, see `passed_ranks`)."""
    discovery = t.Tracer(facts, class_name, function, key_params=key_params, known=known, param_ranks=ranks).run()
    attention = discovery.attention()
    if len(attention) != 1:
        raise Refuse(Code.REPEATED, f"expected one attention computation on the SDPA path, found {len(attention)}")
    candidate = attention[0]
    if candidate.poison is not None:
        raise Refuse.because(candidate.poison, line=candidate.poison_line)
    selected = t.Tracer(
        facts,
        class_name,
        function,
        selected_start=candidate.start_node,
        selected_members=frozenset(candidate.members),
        key_params=key_params,
        known=known,
        param_ranks=ranks,
    ).run()
    chosen = [c for c in selected.candidates if c.start_node is candidate.start_node]
    if len(chosen) != 1 or chosen[0].stage != t.OUT or chosen[0].poison is not None:
        if chosen and chosen[0].poison:
            raise Refuse.because(chosen[0].poison, line=chosen[0].poison_line)
        raise Refuse(Code.UNRECOGNISED, "the attention chain changed on re-trace")
    unsafe = masked_rows_reason(chosen[0], aligned)
    if unsafe is not None:
        raise Refuse.because(unsafe[0], line=unsafe[1])
    return selected, chosen[0]


def keys_aligned_in(facts: ModuleFacts, analysis: ClassAnalysis) -> bool:
    """Every site's keys are the call's own positions (`cross.keys_aligned`), followed into a helper's arguments."""
    found = facts.find_method(analysis.class_name, "forward")
    operands = site_operands(analysis)
    if found is None or not operands:
        return False
    return all(keys_aligned(found[1], o.key, o.query, o.helper) for o in operands)


def build_sdpa_forward(
    facts: ModuleFacts, analysis: ClassAnalysis, contract: MaskContract
) -> tuple[cst.FunctionDef, ForwardPlan]:
    found = facts.find_method(analysis.class_name, "forward")
    assert found is not None
    _, forward = found
    # output_attentions may be a flag of the analysis too (a step only a request for weights takes): once
    falsy = tuple(dict.fromkeys(((analysis.output_attentions,) if analysis.output_attentions else ()) + analysis.eager_only_flags))
    none = analysis.eager_only_params
    known = Known(falsy=frozenset(falsy), none=frozenset(none))
    special = specialise(forward, known)
    taken = function_names(special)
    for helper in analysis.helpers:
        taken |= function_names(helper.helper.function)
    options = EmitOptions(SideNames.avoiding(taken), contract)
    if not analysis.helpers:
        result, candidate = trace_sdpa_path(facts, analysis.class_name, special, aligned=keys_aligned_in(facts, analysis))
        emitter = SdpaEmitter(result, candidate, options)
        body = emitter.emit(block_body(special.body))
        removable = emitter.removed_reads
    else:
        inliner = Inliner(facts, analysis, options, special)
        body = inliner.block(block_body(special.body))
        if not inliner.inlined:
            raise Refuse(Code.HELPER_CALL, "the attention helper is not called on the SDPA path")
        removable = inliner.removed_reads
    body = remove_dead(body, removable, facts.imports)
    new = special.with_changes(body=special.body.with_changes(body=body))
    return new, ForwardPlan(falsy, none)


def inline_helpers(facts: ModuleFacts, analysis: ClassAnalysis, forward: cst.FunctionDef) -> cst.FunctionDef:
    """forward with each call of an attention helper replaced by the helper's body, as written."""
    inliner = Inliner(facts, analysis, None, forward)
    body = inliner.block(block_body(forward.body))
    if not inliner.inlined:
        raise Refuse(Code.HELPER_CALL, "the attention helper is not called from forward")
    return forward.with_changes(body=forward.body.with_changes(body=remove_dead(body, set(), facts.imports)))


class Inliner(StatementWalker):
    """Replace calls of the attention helpers in forward by their bodies (SDPA-rewritten when given options)."""

    def __init__(
        self,
        facts: ModuleFacts,
        analysis: ClassAnalysis,
        options: EmitOptions | None,
        forward: cst.FunctionDef,
    ) -> None:
        """With `options` None the helper body is inlined as written (no SDPA rewrite, no specialisation)."""
        self.facts = facts
        self.analysis = analysis
        self.options = options
        self.forward = forward
        self.helpers = [h.helper for h in analysis.helpers]
        self.forward_names = function_names(forward)
        self.inlined = 0
        self.removed_reads: set[str] = set()
        self._caller: t.Tracer | None = None
        self._aligned: bool | None = None

    def caller(self) -> t.Tracer:
        """forward's trace, to read the arguments it passes (the layout of a key)."""
        if self._caller is None:
            self._caller = t.Tracer(self.facts, self.analysis.class_name, self.forward)
            self._caller.run()
        return self._caller

    def helper_call(self, statement: cst.SimpleStatementLine) -> tuple[Helper, cst.Call] | None:
        finder = _HelperCalls(self.helpers)
        statement.visit(finder)
        if not finder.calls:
            return None
        if len(finder.calls) > 1 or len(statement.body) > 1:
            raise Refuse(Code.HELPER_CALL, "an attention helper is called twice in one statement")
        return finder.calls[0]

    def line(self, statement: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        found = self.helper_call(statement)
        return [statement] if found is None else self.inline(statement, *found)

    def inline(self, statement: cst.SimpleStatementLine, target: Helper, original: cst.Call) -> list[cst.BaseStatement]:
        method = target.name
        helper = target.function
        call = target.as_method_call(original)
        bound = bind_arguments(helper, call)
        if bound is None:
            raise Refuse(Code.HELPER_CALL, f"cannot match the arguments of the call to `{method}`")
        eager_only_params = [
            name for name, value in bound.items() if walk_names(value) & set(self.analysis.eager_only_params)
        ]
        # the SDPA forward has already returned when a flag asking for eager is set: the parameters bound to one are
        # false in the helper too
        flags = {self.analysis.output_attentions, *self.analysis.eager_only_flags} - {None}
        falsy = frozenset(name for name, value in bound.items() if isinstance(value, cst.Name) and value.value in flags)
        known = Known(none=frozenset(eager_only_params), falsy=falsy)
        special = specialise(helper, known) if self.options else helper
        special, renamed = self.rename_collisions(special, bound, statement)
        params = [p for p in [*special.params.posonly_params, *special.params.params] if p.name.value != "self"]
        params += list(special.params.kwonly_params)
        # a renamed parameter no longer takes its keyword: the call binds as it did, under the new names
        bound = {renamed.get(name, name): value for name, value in bound.items()}
        for name, value in bound.items():
            others = walk_names(value)
            if any(other != name and other in bound for other in others):
                raise Refuse(Code.HELPER_CALL, f"the arguments of `{method}` are passed crosswise")
        prelude: list[cst.BaseStatement] = []
        for param in params:
            name = param.name.value
            value = bound[name]
            if isinstance(value, cst.Name) and value.value == name:
                continue
            prelude.append(assignment(name, value))
        special_body = block_body(special.body)
        if special_body and is_docstring(special_body[0]):
            # the helper's docstring describes the helper, not the lines that now stand in for its call
            special = special.with_changes(body=special.body.with_changes(body=list(special_body[1:])))
        if self.options is not None:
            keys = key_layout_params(bound, self.caller())
            if self._aligned is None:  # a fact of the class, the same for every inlined call
                self._aligned = keys_aligned_in(self.facts, self.analysis)
            ranks = passed_ranks(bound, self.caller(), self.forward)
            result, candidate = trace_sdpa_path(
                self.facts, self.analysis.class_name, special, keys, self._aligned, ranks=ranks
            )
            emitter = SdpaEmitter(result, candidate, self.with_aliases(self.options, bound))
            body = emitter.emit(block_body(special.body))
            self.removed_reads |= emitter.removed_reads | set(bound)
        else:
            body = list(block_body(special.body))
        if not body or not _is_final_return(body[-1]):
            raise Refuse(Code.HELPER_CALL, f"`{method}` does not end with its only return statement")
        returns = [node for node in _returns(body[:-1])]
        if returns:
            raise Refuse(Code.HELPER_CALL, f"`{method}` returns early")
        final = body[-1]
        assert isinstance(final, cst.SimpleStatementLine)
        returned = final.body[0]
        assert isinstance(returned, cst.Return)
        value = returned.value if returned.value is not None else cst.Name("None")
        replaced = replace_nodes(statement, {original: value})
        self.inlined += 1
        out: list[cst.BaseStatement] = [*prelude, *body[:-1]]
        if out and hasattr(out[0], "leading_lines"):
            # the comments above the call now sit above the inlined computation
            out[0] = out[0].with_changes(leading_lines=statement.leading_lines)
            replaced = replaced.with_changes(leading_lines=[])
        return [*out, replaced]

    @staticmethod
    def with_aliases(options: EmitOptions, bound: dict[str, cst.BaseExpression]) -> EmitOptions:
        """Helper parameters that receive a nullable mask parameter are nullable too."""
        nullable = options.contract.nullable
        aliases = {name for name, value in bound.items() if isinstance(value, cst.Name) and value.value in nullable}
        if not aliases - nullable:
            return options
        return replace(options, contract=replace(options.contract, nullable=nullable | aliases))

    def rename_collisions(
        self, helper: cst.FunctionDef, bound: dict[str, cst.BaseExpression], statement: cst.SimpleStatementLine
    ) -> tuple[cst.FunctionDef, dict[str, str]]:
        """Helper locals that clash with forward's names get a trailing underscore; the new names of its
        parameters are returned with it."""
        targets = set()
        for small in statement.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    targets.update(assigned_names(target.target))
        locals_ = all_assigned_names(block_body(helper.body)) | set(bound)
        same = {name for name, value in bound.items() if isinstance(value, cst.Name) and value.value == name}
        clashes = (locals_ & self.forward_names) - same - targets
        if not clashes:
            return helper, {}
        taken = self.forward_names | locals_
        mapping: dict[str, cst.BaseExpression] = {}
        for name in sorted(clashes):
            new = name + "_"
            while new in taken:
                new += "_"
            taken.add(new)
            mapping[name] = cst.Name(new)
        body = replace_names(helper.body, mapping)
        params = helper.params
        renamed = params.with_changes(
            params=[p.with_changes(name=mapping[p.name.value]) if p.name.value in mapping else p for p in params.params],
            kwonly_params=[
                p.with_changes(name=mapping[p.name.value]) if p.name.value in mapping else p for p in params.kwonly_params
            ],
        )
        names = {old: new.value for old, new in mapping.items() if isinstance(new, cst.Name) and old in bound}
        return helper.with_changes(body=body, params=renamed), names


class _HelperCalls(cst.CSTVisitor):
    def __init__(self, helpers: list[Helper]) -> None:
        self.helpers = helpers
        self.calls: list[tuple[Helper, cst.Call]] = []

    def visit_Call(self, node: cst.Call) -> None:
        for helper in self.helpers:
            if helper.calls(node):
                self.calls.append((helper, node))
                return


def _is_final_return(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Return)
    )


def _returns(statements: Sequence[cst.BaseStatement]) -> list[cst.Return]:
    finder = _ReturnFinder()
    for statement in statements:
        statement.visit(finder)
    return finder.found


class _ReturnFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[cst.Return] = []

    def visit_Return(self, node: cst.Return) -> None:
        self.found.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

