"""What the SDPA side of a ported class runs, read once for the rewrite: forward specialised, helpers written out.

The SDPA forward of a class-style port is the eager forward with the flags that send it back to eager known false
(`output_attentions`, a head mask), and each call of an attention helper replaced by the helper's statements. This
module reads that side: `read_sdpa_side` gives the specialised forward and, for forward itself or for each helper call
written out, the `SdpaPath` of its one attention chain. `rewrite/sdpa_forward.py` emits from it without tracing.

Before (forward calls a helper):

    attn_output, attn_weights = self._attn(query, key, value, attention_mask, head_mask)

Written out (what the SDPA side traces; the helper's parameters bound to the call's arguments):

    head_mask = None  # known: the SDPA side has returned to eager when a head mask is given
    scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)
    ...
    attn_output, attn_weights = torch.matmul(probs, value), probs
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterator, Mapping, Sequence

import libcst as cst

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.certain import certain_in
from sdpa_port.analyse.closures import Closure, defined_functions, own_names, read_closure
from sdpa_port.analyse.cross import keys_aligned
from sdpa_port.analyse.cstutil import all_assigned_names, assigned_names, assignment, block_body, if_chain, is_docstring
from sdpa_port.rewrite.edit import replace_names
from sdpa_port.analyse.known import Known
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.patterns import function_names, walk_names
from sdpa_port.analyse.helpers import Helper, bind_arguments, bound_facts, key_layout_params, passed_ranks
from sdpa_port.analyse.recognise import ClassAnalysis, site_operands
from sdpa_port.analyse.sdpa_path import SdpaPath, read_sdpa_path
from sdpa_port.rewrite.specialise import specialise
from sdpa_port.refusals import Code, Refuse


@dataclass(frozen=True)
class WrittenOut:
    """A helper call of forward as its statements: parameters bound, locals renamed apart from forward's."""

    method: str
    call: cst.Call  # the call, in forward
    prelude: tuple[cst.BaseStatement, ...]  # `parameter = argument` where the two differ
    function: cst.FunctionDef  # the helper as written out (specialised on the SDPA side), its docstring dropped
    bound: Mapping[str, cst.BaseExpression]  # the helper's parameters, renamed, to the call's arguments
    path: SdpaPath | None  # its attention chain on the SDPA side; None when written out as it is


@dataclass(frozen=True)
class SdpaSide:
    """The SDPA side of one attention class: what its forward runs, and where the chain is."""

    forward: cst.FunctionDef  # specialised: the flags that send the call back to eager are known false
    falsy: tuple[str, ...]  # those flags (the fallback's condition parts)
    none: tuple[str, ...]  # the parameters whose being given sends the call back to eager
    path: SdpaPath | None  # the chain in forward itself, where no helper computes it
    calls: Mapping[cst.SimpleStatementLine, WrittenOut]  # the helper calls written out, by their line in `forward`
    # the function forward defines that computes the attention (`closures.py`), and its chain; its `function` is the
    # definition in `forward`
    closure: tuple[Closure, SdpaPath] | None = None

    @property
    def paths(self) -> list[SdpaPath]:
        """Every chain the SDPA side emits: forward's, each written-out helper's, the closure's."""
        found = [self.path, *(written.path for written in self.calls.values())]
        if self.closure is not None:
            found.append(self.closure[1])
        return [path for path in found if path is not None]


def read_sdpa_side(facts: ModuleFacts, analysis: ClassAnalysis) -> SdpaSide:
    """The SDPA side of `analysis`'s class: forward specialised, its chain or each helper call's chain read."""
    found = facts.find_method(analysis.class_name, "forward")
    assert found is not None
    _, forward = found
    # output_attentions may be a flag of the analysis too (a step only a request for weights takes): once
    falsy = tuple(dict.fromkeys(((analysis.output_attentions,) if analysis.output_attentions else ()) + analysis.eager_only_flags))
    none = analysis.eager_only_params
    special = specialise(forward, Known(falsy=frozenset(falsy), none=frozenset(none)), certain_in(facts, analysis.class_name))
    if analysis.closure is not None:
        return SdpaSide(special, falsy, none, None, MappingProxyType({}), _closure_path(facts, analysis, special, falsy + none))
    aligned = keys_aligned_in(facts, analysis)
    if not analysis.helpers:
        path = read_sdpa_path(facts, analysis.class_name, special, aligned=aligned)
        return SdpaSide(special, falsy, none, path, MappingProxyType({}))
    calls = _written_out_calls(facts, analysis, special, sdpa=True, aligned=aligned)
    if not calls:
        raise Refuse(Code.HELPER_CALL, "the attention helper is not called on the SDPA path")
    return SdpaSide(special, falsy, none, None, MappingProxyType(calls))


def _closure_path(
    facts: ModuleFacts, analysis: ClassAnalysis, special: cst.FunctionDef, known: tuple[str, ...]
) -> tuple[Closure, SdpaPath]:
    """The closure of the specialised forward, read again there, and its chain. The facts `known` of forward's names
    hold in the closure only where it binds none of those names itself."""
    name = analysis.closure
    function = next((f for f in defined_functions(special) if f.name.value == name), None)
    if function is None:
        raise Refuse(Code.HELPER_CALL, f"`{name}` is not defined on the SDPA path")
    shadowed = sorted(own_names(function) & set(known))
    if shadowed:
        raise Refuse(
            Code.CLOSURE_READS,
            f"`{name}` binds `{shadowed[0]}` itself, which the SDPA forward reads as forward's (it falls back to eager "
            "on it)",
        )
    caller = t.Tracer(facts, analysis.class_name, special)
    caller.run()
    closure = read_closure(facts, special, function, caller, lambda node: 0)
    path = read_sdpa_path(
        facts, analysis.class_name, function, closure.key_params, ranks=closure.ranks, enclosing=closure.enclosing,
        enclosing_params=closure.inputs,
    )
    return closure, path


def written_out_as_is(
    facts: ModuleFacts, analysis: ClassAnalysis, forward: cst.FunctionDef
) -> Mapping[cst.SimpleStatementLine, WrittenOut]:
    """Each helper call of forward written out as the helper is (no side known, no chain read)."""
    calls = _written_out_calls(facts, analysis, forward, sdpa=False, aligned=False)
    if not calls:
        raise Refuse(Code.HELPER_CALL, "the attention helper is not called from forward")
    return MappingProxyType(calls)


def keys_aligned_in(facts: ModuleFacts, analysis: ClassAnalysis) -> bool:
    """Every site's keys are the call's own positions (`cross.keys_aligned`), followed into a helper's arguments."""
    found = facts.find_method(analysis.class_name, "forward")
    operands = site_operands(analysis)
    if found is None or not operands:
        return False
    return all(keys_aligned(found[1], o.key, o.query, o.helper) for o in operands)


def helper_call(
    helpers: Sequence[Helper], statement: cst.SimpleStatementLine
) -> tuple[Helper, cst.Call] | None:
    """The one call of an attention helper in a simple statement, None where it holds none."""
    finder = _HelperCalls(helpers)
    statement.visit(finder)
    if not finder.calls:
        return None
    if len(finder.calls) > 1 or len(statement.body) > 1:
        raise Refuse(Code.HELPER_CALL, "an attention helper is called twice in one statement")
    return finder.calls[0]


def simple_lines(statements: Sequence[cst.BaseStatement]) -> Iterator[cst.SimpleStatementLine]:
    """The simple lines a statement walk (`rewrite/walk.py`) reaches: in every branch, `with` and loop body."""
    for statement in statements:
        if isinstance(statement, cst.SimpleStatementLine):
            yield statement
        elif isinstance(statement, cst.If):
            for branch in if_chain(statement):
                yield from simple_lines(block_body(branch.body))
        elif isinstance(statement, (cst.With, cst.For, cst.While)):
            yield from simple_lines(block_body(statement.body))


def _written_out_calls(
    facts: ModuleFacts, analysis: ClassAnalysis, forward: cst.FunctionDef, sdpa: bool, aligned: bool
) -> dict[cst.SimpleStatementLine, WrittenOut]:
    helpers = [h.helper for h in analysis.helpers]
    writer = _Writer(facts, analysis, forward, sdpa, aligned)
    out: dict[cst.SimpleStatementLine, WrittenOut] = {}
    for statement in simple_lines(block_body(forward.body)):
        found = helper_call(helpers, statement)
        if found is not None:
            out[statement] = writer.write_out(statement, *found)
    return out


class _Writer:
    """Writes out helper calls of one forward."""

    def __init__(self, facts: ModuleFacts, analysis: ClassAnalysis, forward: cst.FunctionDef, sdpa: bool, aligned: bool) -> None:
        self.facts = facts
        self.analysis = analysis
        self.forward = forward
        self.sdpa = sdpa
        self.aligned = aligned
        self.forward_names = function_names(forward)
        self._caller: t.Tracer | None = None

    def caller(self) -> t.Tracer:
        """forward's trace, to read the arguments it passes (the layout of a key, the rank of a tensor)."""
        if self._caller is None:
            self._caller = t.Tracer(self.facts, self.analysis.class_name, self.forward)
            self._caller.run()
        return self._caller

    def write_out(self, statement: cst.SimpleStatementLine, target: Helper, original: cst.Call) -> WrittenOut:
        method = target.name
        call = target.as_method_call(original)
        bound = bind_arguments(target.function, call)
        if bound is None:
            raise Refuse(Code.HELPER_CALL, f"cannot match the arguments of the call to `{method}`")
        eager_only_params = [
            name for name, value in bound.items() if walk_names(value) & set(self.analysis.eager_only_params)
        ]
        # the SDPA forward has already returned when a flag asking for eager is set: the parameters bound to one are
        # false in the helper too
        flags = {self.analysis.output_attentions, *self.analysis.eager_only_flags} - {None}
        falsy = frozenset(name for name, value in bound.items() if isinstance(value, cst.Name) and value.value in flags)
        # flags of the module itself (`self.scale_mask_softmax`) hold in the helper, handed the same module
        falsy |= frozenset(flag for flag in flags if flag is not None and "self" in walk_names(cst.parse_expression(flag)))
        # parameters the call binds to None hold it in the helper; those bound to a module of `self`, that module
        passed = bound_facts(bound, self.facts, self.analysis.class_name)
        known = Known(none=frozenset(eager_only_params) | passed.none, falsy=falsy)
        certainty = certain_in(self.facts, self.analysis.class_name)
        special = specialise(target.function, known, certainty) if self.sdpa else target.function
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
        path = None
        if self.sdpa:
            keys = key_layout_params(bound, self.caller())
            ranks = passed_ranks(bound, self.caller(), self.forward)
            path = read_sdpa_path(
                self.facts, self.analysis.class_name, special, keys, self.aligned, ranks=ranks,
                enclosing=bound_facts(bound, self.facts, self.analysis.class_name).enclosing(),
            )
        return WrittenOut(method, original, tuple(prelude), special, MappingProxyType(bound), path)

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
    def __init__(self, helpers: Sequence[Helper]) -> None:
        self.helpers = helpers
        self.calls: list[tuple[Helper, cst.Call]] = []

    def visit_Call(self, node: cst.Call) -> None:
        for helper in self.helpers:
            if helper.calls(node):
                self.calls.append((helper, node))
                return
