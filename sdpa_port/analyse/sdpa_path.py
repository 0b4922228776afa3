"""The SDPA path of one function: its one attention chain, read once, as every rewrite reads it.

An `SdpaPath` is the contract between analysis and rewriting. Analysis traces the function the SDPA side runs
(forward specialised for that side, or a helper written out at its call) and selects its one attention chain; the
emitters in `rewrite/` walk `function` and ask `plans` what each statement is, and never trace again.

Before (eager, in `function`):

    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
    scores = scores + attention_mask
    probs = scores.softmax(-1)
    out = torch.matmul(probs, v)

What the path records: `plans` maps the first three statements to `ChainStmt`s (Start, Scale, AddTerm, Softmax) and
the fourth to an `OutputStmt`; `ops` lists those operations in order. The class-style emitter turns them into

    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=1 / math.sqrt(d))
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import libcst as cst

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.known import Known
from sdpa_port.analyse.least_fills import least_fills
from sdpa_port.analyse.masked_rows import masked_rows_reason
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.refusals import Code, Refuse


@dataclass(frozen=True)
class SdpaPath:
    """One function of the SDPA side and its one attention chain."""

    function: cst.FunctionDef  # the function as the SDPA side runs it; `plans` are keyed by its nodes
    plans: Mapping[cst.CSTNode, t.StmtPlan]  # small statements (and `if` tests): what the chain makes of them
    dropped_ifs: frozenset[cst.If]  # tests left with nothing to do once the chain is one call
    probs_after_output: frozenset[str]  # names holding the probabilities that are read after the product with V
    other_streams: frozenset[cst.CSTNode]  # statements of further products with V of the same probabilities
    params: tuple[str, ...]  # the function's parameters
    ops: tuple[tuple[t.Op, int, int], ...]  # the chain's operations in order, with their depth and line
    start: t.Start | None  # the query-key product (the first, where branches each compute one)
    branched: bool  # branches each compute their own product
    built: bool  # the operands SDPA is handed are built (joined blocks, one per branch), not read
    names_assigned_after_start: frozenset[str]
    operands: tuple[cst.BaseExpression, cst.BaseExpression]  # the query and key, over every branch
    # the statements whose fill is the least number of the scores' dtype, made into a 0-d tensor only to be the fill
    # (`least_fills.py`): the port writes the number in its place
    least_fills: frozenset[cst.CSTNode] = frozenset()

    @property
    def chain_ops(self) -> list[t.Op]:
        return [op for op, _, _ in self.ops]


def read_sdpa_path(
    facts: ModuleFacts,
    class_name: str,
    function: cst.FunctionDef,
    key_params: frozenset[str] = frozenset(),
    aligned: bool = False,
    known: Known = Known(),
    ranks: tuple[tuple[str, int], ...] = (),
    enclosing: Mapping[str, t.Value] = MappingProxyType({}),
    enclosing_params: tuple[str, ...] = (),
) -> SdpaPath:
    """Trace `function` (already specialised for the SDPA side) and select its single attention chain.

    `aligned`: the keys are the call's own positions (`keys_aligned_in`); `known`: tests whose other side the trace
    leaves out while the function keeps it; `ranks`: of the tensors a caller passes to a helper's parameters;
    `enclosing`, `enclosing_params`: what the function reads from the one defining it (`closures.py`). Raises
    `Refuse` where the function has no single chain SDPA can take."""
    discovery = t.Tracer(
        facts, class_name, function, key_params=key_params, known=known, param_ranks=ranks, enclosing=enclosing,
        enclosing_params=enclosing_params,
    ).run()
    attention = discovery.attention()
    if len(attention) != 1:
        raise Refuse(Code.REPEATED, f"expected one attention computation on the SDPA path, found {len(attention)}")
    candidate = attention[0]
    if candidate.poison is not None:
        raise Refuse.because(candidate.poison, line=candidate.poison_line)
    # traced again with the chain chosen, so that statements of the other candidates read as kept code
    selected = t.Tracer(
        facts,
        class_name,
        function,
        selected_start=candidate.start_node,
        selected_members=frozenset(candidate.members),
        key_params=key_params,
        known=known,
        param_ranks=ranks,
        enclosing=enclosing,
        enclosing_params=enclosing_params,
    ).run()
    chosen = [c for c in selected.candidates if c.start_node is candidate.start_node]
    if len(chosen) != 1 or chosen[0].stage != t.OUT or chosen[0].poison is not None:
        if chosen and chosen[0].poison:
            raise Refuse.because(chosen[0].poison, line=chosen[0].poison_line)
        raise Refuse(Code.UNRECOGNISED, "the attention chain changed on re-trace")
    unsafe = masked_rows_reason(chosen[0], aligned)
    if unsafe is not None:
        raise Refuse.because(unsafe[0], line=unsafe[1])
    return _path(function, selected, chosen[0], facts)


def _path(function: cst.FunctionDef, result: t.TraceResult, candidate: t.Candidate, facts: ModuleFacts) -> SdpaPath:
    return SdpaPath(
        function=function,
        plans=MappingProxyType(dict(result.plans)),
        dropped_ifs=frozenset(result.dropped_ifs),
        probs_after_output=frozenset(result.probs_names_after_output),
        other_streams=result.other_streams,
        params=result.params,
        ops=tuple(candidate.ops),
        start=candidate.start,
        branched=candidate.branched(),
        built=candidate.built(),
        names_assigned_after_start=frozenset(candidate.names_assigned_after_start),
        operands=candidate.operands(),
        least_fills=least_fills(function, result.plans, facts.imports),
    )


def check_eager_function(facts: ModuleFacts, function: cst.FunctionDef, name: str, class_name: str) -> None:
    """A file's own eager attention function (5.x) computes one attention the tool can read; else `Refuse`."""
    attention = t.Tracer(facts, None, function).run().attention()
    if len(attention) != 1:
        raise Refuse(Code.EAGER_FUNCTION, f"`{name}` is not recognised as one attention computation", class_name)
    poison = attention[0].poison
    if poison is not None:
        raise Refuse(poison.code, f"`{name}`: {poison.detail}", class_name, attention[0].poison_line)
