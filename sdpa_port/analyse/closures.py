"""A function forward defines to compute the attention (a closure), read where it stands.

Remote code often computes the attention in a function defined inside `forward`, called once, several times (per
chunk, for self- and cross-attention) or through `torch.utils.checkpoint.checkpoint(attend, q, k, v)`. The port
keeps the function, its place and its calls; its body is rewritten as a module-level attention function's is, its
chain one SDPA call. Before:

    def forward(self, x, mask=None):
        scale = self.head_dim**-0.5

        def attend(q, k, v):
            scores = q @ k.transpose(-2, -1) * scale
            if mask is not None:
                scores = scores + mask
            probs = scores.softmax(dim=-1)
            return probs @ v

        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        return attend(q, k, v)

After, the same forward with `attend` computing

        def attend(q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

The function is traced as one of its own. The names it reads from forward (`scale`, `mask`, `self`), as libcst's
`ScopeProvider` resolves them, start out holding what forward's trace knows of them where the function is defined;
its parameters have the ranks every call passes. That reading is what each call runs only when nothing the function
reads from forward can change between its definition and a call; `read_closure` refuses (W411) where it can:

- the function declares `nonlocal` or `global` names, is decorated, or is defined in a loop;
- a name it reads from forward is bound again, or changed in place, after its definition;
- it is bound twice, calls itself, or is handed to anything but a call of its own or `checkpoint`;
- it takes `self` itself, or a call's arguments do not bind to its parameters.

`recognise.py` reads the chain of such a function; `sdpa_side.py` and `rewrite/sdpa_forward.py` port it in place.
`nested_sites` gives what the form-free detector finds in functions defined inside others, so that eager attention
there which the analysis did not read is refused, never passed over.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from types import MappingProxyType
from typing import Collection, Mapping

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider, ScopeProvider

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cstutil import all_assigned_names, nodes_of_type, walk_names
from sdpa_port.analyse.helpers import bind_arguments, key_layout_params, passed_ranks
from sdpa_port.analyse.in_place import changed_in_place
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.tracing import LineOf
from sdpa_port.discover.eager_sites import EagerSite, find_eager_attention
from sdpa_port.refusals import Code, Refuse

CHECKPOINT = "torch.utils.checkpoint.checkpoint"
# keywords `checkpoint` takes itself; the others reach the function
CHECKPOINT_OWN = frozenset({"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug"})


@dataclass(frozen=True)
class Closure:
    """A function forward defines, as its own trace reads it: what it reads from forward, how it is called."""

    function: cst.FunctionDef  # as forward defines it
    calls: tuple[cst.Call, ...]  # each call, as a call of the function itself (a checkpoint's arguments given to it)
    enclosing: Mapping[str, t.Value]  # what forward's trace knows of the names it may read, where it is defined
    inputs: tuple[str, ...]  # the parameters of forward it reads, which forward binds nowhere else
    key_params: frozenset[str]  # its parameters every call passes a key laid out (..., dim, length)
    ranks: tuple[tuple[str, int], ...]  # the ranks every call passes its parameters

    @property
    def name(self) -> str:
        return self.function.name.value

    def tracer(self, facts: ModuleFacts, class_name: str, line_of: LineOf | None = None) -> t.Tracer:
        return t.Tracer(
            facts, class_name, self.function, line_of, key_params=self.key_params, param_ranks=self.ranks,
            enclosing=self.enclosing, enclosing_params=self.inputs,
        )


def nested_sites(facts: ModuleFacts) -> dict[str, list[EagerSite]]:
    """The eager attention the form-free detector (`discover/eager_sites.py`) finds in functions defined inside the
    file's functions and methods, by the class it belongs to: the class whose method defines the function, or each
    class calling the module-level function that does."""
    if facts.tree is None:
        return {}
    out: dict[str, list[EagerSite]] = {}
    for site in find_eager_attention(facts.tree, nested=True):
        first = site.where.partition(".")[0]
        owners = [first] if first in facts.classes else _callers(facts.tree, first)
        for owner in owners:
            out.setdefault(owner, []).append(site)
    return out


def _callers(tree: ast.Module, function: str) -> list[str]:
    """The top-level classes of the file whose body calls `function` by its name."""
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == function for n in ast.walk(node))
    ]


def defined_functions(function: cst.FunctionDef) -> list[cst.FunctionDef]:
    """The functions `function` defines among its statements (in branches, loops, `with` and `try` blocks), not
    those defined inside them."""
    return nodes_of_type(function.body, cst.FunctionDef)


def own_names(function: cst.FunctionDef) -> set[str]:
    """The names a function binds itself: its parameters and what its body assigns."""
    params = function.params
    names = {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}
    names |= {p.name.value for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)}
    return names | all_assigned_names([function.body])


def computes_attention(facts: ModuleFacts, class_name: str, function: cst.FunctionDef, line_of: LineOf) -> bool:
    """A first look: the function's own trace, knowing nothing of forward, finds an attention chain in it."""
    return bool(t.Tracer(facts, class_name, function, line_of).run().attention())


def read_closure(
    facts: ModuleFacts, forward: cst.FunctionDef, function: cst.FunctionDef, caller: t.Tracer, line_of: LineOf
) -> Closure:
    """`function`, defined in `forward`, read for a trace of its own; `caller` has traced `forward`. Raises `Refuse`
    (W411) where what it reads from forward may differ between its definition and a call."""
    name = function.name.value
    _check_definition(function, forward)
    wrapper = MetadataWrapper(cst.Module(body=[forward]), unsafe_skip_copy=True)  # read only
    outer = wrapper.resolve(ScopeProvider)[function]
    assert outer is not None
    positions = wrapper.resolve(PositionProvider)
    inside = _ids(function)
    own = own_names(function)
    reads, later = _reads(forward, function, outer, positions, inside, own)
    for read in sorted(reads & set(later)):
        how = "changed in place" if isinstance(later[read], cst.BaseSmallStatement) else "bound again"
        line = line_of(later[read])
        raise Refuse(
            Code.CLOSURE_READS,
            f"`{read}`, which `{name}` reads from forward, is {how} at line {line}, after `{name}` is defined: "
            "a call reads it as it is then",
            line=line,
        )
    calls = _calls(facts, forward, function, outer, inside)
    key_params, ranks = _passed(function, calls, caller, forward)
    enclosing = _known(caller.defined.get(function, {}), own | set(later))
    inputs = tuple(sorted(read for read in reads if _only_parameter(outer.assignments[read])))
    return Closure(function, calls, MappingProxyType(enclosing), inputs, key_params, ranks)


def _only_parameter(bindings: Collection[cst.metadata.BaseAssignment]) -> bool:
    return len(bindings) == 1 and all(
        isinstance(binding, cst.metadata.Assignment) and isinstance(binding.node, cst.Param) for binding in bindings
    )


def _reads(
    forward: cst.FunctionDef,
    function: cst.FunctionDef,
    outer: cst.metadata.Scope,
    positions: Mapping[cst.CSTNode, CodeRange],
    inside: set[int],
    own: set[str],
) -> tuple[set[str], dict[str, cst.CSTNode]]:
    """The names `function` reads from forward (`outer`, its scope), and forward's names bound or changed in place
    after the definition, each with the first such statement."""
    defined = positions[function].start
    reads: set[str] = set()
    later: dict[str, cst.CSTNode] = {}
    for assignment in outer.assignments:
        if not isinstance(assignment, cst.metadata.Assignment) or id(assignment.node) in inside:
            continue
        if _after(positions[assignment.node].start, defined):
            later.setdefault(assignment.name, assignment.node)
        if any(id(access.node) in inside for access in assignment.references):
            reads.add(assignment.name)
    for line in nodes_of_type(forward.body, cst.SimpleStatementLine):  # not those of the functions it defines
        for small in line.body:
            if _after(positions[small].start, defined):
                for changed in changed_in_place(small):
                    later.setdefault(changed, small)
    # a name the function binds is its own wherever it reads it (libcst also links forward's bindings to a read that
    # comes before the function's own binding in the text, as a read in a branch may)
    return reads - own - {function.name.value}, later


def _ids(node: cst.CSTNode) -> set[int]:
    """The identities of `node` and of every node inside it."""
    found: set[int] = set()

    class _Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            found.add(id(node))
            return True

    node.visit(_Collect())
    return found


def _check_definition(function: cst.FunctionDef, forward: cst.FunctionDef) -> None:
    """The function reads forward's names and nothing else of it: it writes none, is not wrapped, is defined once per
    call of forward, and `self` in it is forward's."""
    name = function.name.value
    declared = nodes_of_type(function, cst.Nonlocal, into_scopes=True) + nodes_of_type(function, cst.Global, into_scopes=True)
    if declared:
        keyword = "nonlocal" if isinstance(declared[0], cst.Nonlocal) else "global"
        names = ", ".join(f"`{item.name.value}`" for item in declared[0].names)
        raise Refuse(Code.CLOSURE_READS, f"`{name}` declares {names} {keyword}: it binds names outside it")
    if function.decorators:
        raise Refuse(Code.CLOSURE_READS, f"`{name}` is decorated: the decorator may change how it runs")
    loops = nodes_of_type(forward.body, cst.For) + nodes_of_type(forward.body, cst.While)
    if any(function in nodes_of_type(loop, cst.FunctionDef) for loop in loops):
        raise Refuse(Code.CLOSURE_READS, f"`{name}` is defined in a loop: each pass defines it again")
    params = function.params
    if any(p.name.value == "self" for p in [*params.posonly_params, *params.params, *params.kwonly_params]):
        raise Refuse(Code.CLOSURE_READS, f"`{name}` takes `self` as a parameter: it may be handed another module")


def _after(position: CodePosition, defined: CodePosition) -> bool:
    return (position.line, position.column) > (defined.line, defined.column)


def _calls(
    facts: ModuleFacts, forward: cst.FunctionDef, function: cst.FunctionDef, outer: cst.metadata.Scope, inside: set[int]
) -> tuple[cst.Call, ...]:
    """Each call of the function in forward, as a direct call: `attend(q, k, v)`, or `checkpoint(attend, q, k, v)`
    with the arguments `checkpoint` hands on."""
    name = function.name.value
    bindings = outer.assignments[name]
    if len(bindings) != 1:
        raise Refuse(Code.CLOSURE_READS, f"`{name}` is bound {len(bindings)} times in forward: which one runs depends on the path")
    direct: dict[int, cst.Call] = {}
    handed: dict[int, cst.Call] = {}
    for call in nodes_of_type(forward.body, cst.Call, into_scopes=True):
        direct[id(call.func)] = call
        if call.args and facts.imports.qualify(call.func) == CHECKPOINT and call.args[0].keyword is None:
            kept = [a for a in call.args[1:] if a.keyword is None or a.keyword.value not in CHECKPOINT_OWN]
            handed[id(call.args[0].value)] = cst.Call(func=cst.Name(name), args=kept)
    calls: list[cst.Call] = []
    for access in next(iter(bindings)).references:
        node = access.node
        if id(node) in inside:
            raise Refuse(Code.CLOSURE_READS, f"`{name}` calls itself")
        found = direct.get(id(node)) or handed.get(id(node))
        if found is None:
            raise Refuse(
                Code.CLOSURE_READS,
                f"`{name}` is handed on otherwise than to a call of its own or to `checkpoint`: what it is called with "
                "cannot be read",
            )
        calls.append(found)
    return tuple(calls)


def _passed(
    function: cst.FunctionDef, calls: tuple[cst.Call, ...], caller: t.Tracer, forward: cst.FunctionDef
) -> tuple[frozenset[str], tuple[tuple[str, int], ...]]:
    """The parameters every call passes a key laid out (..., dim, length), and the ranks every call passes."""
    keys: frozenset[str] | None = None
    ranks: set[tuple[str, int]] | None = None
    for call in calls:
        bound = bind_arguments(function, call)
        if bound is None:
            raise Refuse(Code.CLOSURE_READS, f"the arguments of a call of `{function.name.value}` do not bind to its parameters")
        these = key_layout_params(bound, caller)
        keys = these if keys is None else keys & these
        passed = set(passed_ranks(bound, caller, forward))
        ranks = passed if ranks is None else ranks & passed
    return keys or frozenset(), tuple(sorted(ranks or ()))


def _known(snapshot: Mapping[str, t.Value], hidden: set[str]) -> dict[str, t.Value]:
    """What forward's trace knew, at the definition, of the names the function may read: not of the names it binds
    itself or forward binds again later (`hidden`), nor values written in them, nor the chains of forward."""
    out: dict[str, t.Value] = {}
    for name, value in snapshot.items():
        if name in hidden:
            continue
        match value:
            case t.ChainVal():
                continue
            case t.ExprVal(node=node):
                if walk_names(node) & hidden:
                    continue
            case t.AnyExpr(nodes=nodes):
                if any(walk_names(node) & hidden for node in nodes):
                    continue
            case t.ScalarVal(size_of=size_of):
                if size_of is not None and walk_names(size_of[0]) & hidden:
                    value = t.ScalarVal()
        out[name] = value
    return out


__all__ = ["Closure", "computes_attention", "defined_functions", "nested_sites", "own_names", "read_closure", "CHECKPOINT"]
