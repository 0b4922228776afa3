"""Values the eager function reads from forward, computed in the eager function itself where forward's text allows.

The eager function keeps the standard signature of the attention interface, `(module, query, key, value,
attention_mask, scaling, dropout, **kwargs)`, where every value its statements read from forward can be had from
those: a size of an operand handed over, a value forward computes from the module's attributes and the operands, a
flag forward takes with a default.

Before (XGLM: the eager statements read `bsz` and `tgt_len`, which forward bound from `hidden_states.size()`):

    def eager_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *, bsz,
                                tgt_len, **kwargs):
    ...
    attention_interface(self, query_states.unflatten(0, (bsz, self.num_heads)), ..., bsz=bsz, tgt_len=tgt_len)

After (the query forward hands over is `(bsz, self.num_heads, tgt_len, self.head_dim)` by the text of its views):

    def eager_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        bsz, _, tgt_len, _ = query.shape
    ...
    attention_interface(self, query_states.unflatten(0, (bsz, self.num_heads)), ...)

The rules, each on a name forward binds once (or a parameter it never binds again), before the chain starts:
- a size: the name is one size of an operand handed over, as the operand's views write it (`analyse/shapes.py`);
- a value computed again: every statement binding it is at the top of forward and reads only the module's attributes
  (forward sets none), the file's names, the operands handed over as plain names (not bound again before the chain),
  and names this module has already given the eager function: those statements are copied, `self` read as `module`;
- a flag: a parameter of forward with a literal default, never bound again: read from `kwargs` with that default
  (forward still passes it, through `**kwargs`).
Any other value stays a keyword-only parameter (an additive term forward computes, for instance).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import (
    assigned_values,
    block_body,
    code,
    nodes_in,
    nodes_of_type,
    walk_names,
)
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.analyse.shapes import Context, Methods, shape_of, stable_names
from sdpa_port.rewrite.edit import replace_names
from sdpa_port.rewrite.interface_eager import reads_and_writes
from sdpa_port.rewrite.interface_options import BUILTINS, RESERVED

OPERANDS = ("query", "key", "value")
IMPURE = ("rand", "dropout", "manual_seed", "bernoulli", "multinomial")  # torch functions differing between calls
TENSOR_READS = frozenset({"size", "dim", "to", "type", "new_zeros", "new_ones", "new_full", "new_tensor"})
NUMBER_BUILTINS = frozenset({"float", "int", "min", "max", "abs", "len", "round", "bool"})
LITERALS = (cst.Integer, cst.Float, cst.SimpleString)


@dataclass
class EagerValues:
    """What the eager function computes itself (`statements`, binding `derived`) and reads from `kwargs`."""

    statements: list[cst.BaseStatement] = field(default_factory=list)
    derived: list[str] = field(default_factory=list)
    from_kwargs: list[str] = field(default_factory=list)


def eager_values(
    path: SdpaPath,
    free: Sequence[str],
    handed: tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression] | None,
    methods: Methods,
    module_names: frozenset[str],
) -> EagerValues:
    """The values of `free` (read by the eager statements, passed from forward) the eager function can have from its
    own parameters; `handed` the query, key and value the dispatch passes (None where it cannot be told)."""
    found = EagerValues()
    forward = path.function
    body = list(block_body(forward.body))
    at = _chain_index(body, path)
    if handed is None or at is None:
        return found
    before = body[:at]
    params = _parameters(forward)
    stable = stable_names(body, set(params))
    # the operands are read where the chain starts: none of their names may be bound from there on
    operand_names = set().union(*(walk_names(e) for e in handed))
    if operand_names & (set(assigned_values([body[at]])) | set(path.names_assigned_after_start)):
        return found
    candidates = [name for name in free if name not in RESERVED]
    _sizes(found, [name for name in candidates if name in stable], handed, before, methods)
    _computed(found, candidates, handed, body, at, stable, module_names)
    for name in candidates:
        if name not in found.derived and name in params and name in stable:
            default = params[name]
            if default is not None and _literal(default):
                found.from_kwargs.append(name)
                found.statements.append(
                    cst.parse_statement(f'{name} = kwargs.get("{name}", {code(default)})')
                )
    return found


def _chain_index(body: Sequence[cst.BaseStatement], path: SdpaPath) -> int | None:
    """The top-level statement of forward holding the chain's first statement."""
    chain = {node for node, plan in path.plans.items() if isinstance(plan, (t.ChainStmt, t.OutputStmt))}
    for index, statement in enumerate(body):
        if nodes_in(statement, chain):
            return index
    return None


def _parameters(function: cst.FunctionDef) -> dict[str, cst.BaseExpression | None]:
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    return {p.name.value: p.default for p in every}


def _literal(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Name):
        return node.value in ("True", "False", "None")
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return isinstance(node.expression, (cst.Integer, cst.Float))
    return isinstance(node, LITERALS)


def _sizes(
    found: EagerValues,
    candidates: Sequence[str],
    handed: Sequence[cst.BaseExpression],
    before: Sequence[cst.BaseStatement],
    methods: Methods,
) -> None:
    """`bsz, _, tgt_len, _ = query.shape` for the names that are sizes of an operand handed over."""
    for parameter, operand in zip(OPERANDS, handed):
        shape = shape_of(operand, Context(before), methods)
        if shape is None:
            continue
        targets = [size if size in candidates and size not in found.derived else None for size in shape]
        # a name that is two sizes is bound to the first
        targets = [n if n is None or n not in targets[:i] else None for i, n in enumerate(targets)]
        names = [n for n in targets if n is not None]
        if not names:
            continue
        found.derived.extend(names)
        if len(names) == 1:
            index = targets.index(names[0])
            statement = f"{names[0]} = {parameter}.shape[{index}]"
        else:
            statement = f"{', '.join(n or '_' for n in targets)} = {parameter}.shape"
        found.statements.append(cst.parse_statement(statement))


def _computed(
    found: EagerValues,
    candidates: Sequence[str],
    handed: Sequence[cst.BaseExpression],
    body: Sequence[cst.BaseStatement],
    at: int,
    stable: set[str],
    module_names: frozenset[str],
) -> None:
    """The statements forward computes the names with, copied in forward's order where they read nothing the eager
    function lacks: every statement binding a name sits at the top of forward before the chain (`at`), and the names
    it reads are computed alike (copied too) or readable in the eager function."""
    as_parameter = {e.value: cst.Name(p) for p, e in zip(OPERANDS, handed) if isinstance(e, cst.Name)}
    readable = set(module_names) | set(BUILTINS) | set(found.derived) | set(as_parameter)
    if "self" in stable:
        as_parameter["self"] = cst.Name("module")
        readable.add("self")
    bindings: dict[str, list[int]] = {}
    for index, statement in enumerate(body):
        for name in assigned_values([statement]):
            bindings.setdefault(name, []).append(index)
    chosen: set[int] = set()

    def computable(name: str, seen: frozenset[str]) -> set[int] | None:
        """The positions of the statements computing `name`, with those of the names they read; None where not."""
        positions = set(bindings.get(name, ()))
        if not positions or name in seen or max(positions) >= at:
            return None
        if any(not isinstance(body[i], cst.SimpleStatementLine) for i in positions):
            return None
        needed = set(positions)
        for index in positions:
            for other in assigned_values([body[index]]):
                if set(bindings[other]) - positions:
                    return None  # the statement binds a name that forward binds elsewhere too
            # the operands read as the parameters must hold then what the chain reads
            if (set(as_parameter) - {"self"}) & set(assigned_values(body[index + 1 : at])):
                return None
            if not computes_only(body[index]):
                return None
            for read in _reads(body[index]) - readable:
                if not any(i < index for i in bindings.get(read, ())):
                    return None  # a value forward was given, or that it binds only later
                if set(bindings[read]) <= positions:
                    continue
                more = computable(read, seen | {name})
                if more is None:
                    return None
                needed |= more
        return needed

    for name in candidates:
        if name in found.derived:
            continue
        positions = computable(name, frozenset())
        if positions is None:
            continue
        new = sorted(positions - chosen)
        chosen |= positions
        for index in new:
            found.statements.append(replace_names(body[index], as_parameter))
            bound = [n for n in assigned_values([body[index]]) if n in candidates and n not in found.derived]
            found.derived.extend(bound)


def _reads(statement: cst.BaseStatement) -> set[str]:
    """The names a statement reads (`interface_eager.reads_and_writes`: a target's subscripts and attributes read)."""
    return {name for name, written in reads_and_writes(statement) if not written}


def computes_only(statement: cst.BaseStatement) -> bool:
    """A statement whose calls only compute: torch's functions (nothing random), a tensor's size, dtype casts and
    new tensors, builtins of numbers; no call of the module's methods or submodules, which may change state."""
    for call in nodes_of_type(statement, cst.Call):
        name = code(call.func)
        root = name.split(".")[0]
        private = any(part.startswith("_") for part in name.split("."))
        if root == "torch" and not private and not any(word in name for word in IMPURE):
            continue
        if root != "self" and isinstance(call.func, cst.Attribute) and call.func.attr.value in TENSOR_READS:
            continue
        if name in NUMBER_BUILTINS:
            continue
        return False
    return True


def chain_values(path: SdpaPath, free: Sequence[str]) -> frozenset[cst.CSTNode]:
    """The statements between the chain's start and its product with V that compute values the eager statements
    read (a causal slice of a buffer, a fill value), and those computing what they read: kept in the eager function
    too, where they stand. Only assignments whose calls only compute (`computes_only`); the caller keeps them only where they
    leave the eager function no value it lacked before."""
    order: list[cst.BaseSmallStatement] = []

    class Smalls(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            order.extend(node.body)

    path.function.body.visit(Smalls())
    plans = path.plans
    starts = [i for i, small in enumerate(order) if _starts(plans.get(small))]
    outputs = [i for i, small in enumerate(order) if isinstance(plans.get(small), t.OutputStmt)]
    if len(starts) != 1 or not outputs:
        return frozenset()
    wanted = set(free)
    kept: set[cst.CSTNode] = set()
    for small in reversed(order[starts[0] + 1 : outputs[0]]):
        if isinstance(plans.get(small), (t.ChainStmt, t.OutputStmt)) or not isinstance(small, cst.Assign):
            continue
        line = cst.SimpleStatementLine(body=[small])
        bound = set(assigned_values([line]))
        if bound & wanted and computes_only(line):
            kept.add(small)
            wanted |= _reads(line)
    return frozenset(kept)


def _starts(plan: t.StmtPlan | None) -> bool:
    return isinstance(plan, t.ChainStmt) and any(isinstance(op, t.Start) for op in plan.ops)


__all__ = ["EagerValues", "chain_values", "computes_only", "eager_values"]
