"""Trace a statement that changes a name in place: `name op= value`, or an in-place method of a chain.

On a chain, `+=`/`-=` add a term, `*=`/`/=` scale (or apply a head mask), `.masked_fill_`, `.add_`, `.mul_`,
`.div_` the same as their out-of-place forms; an out-of-place method called as a statement (its result discarded)
is no step; any other in-place change of the scores poisons the chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import AddTerm, ChainStmt, ChainVal, Op, Poison, ScalarVal
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.forms import fills, scales, terms
from sdpa_port.analyse.kept import keep_expression
from sdpa_port.analyse.outputs import find_output, output_statement, reads_only_weights, weights_passed_along
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView


def aug_assign(tracer: TracerView, small: cst.AugAssign, depth: int, line: int) -> None:
    """`name op= value`: a step of the chain `name` holds, or a plain update of any other name."""
    target = small.target
    if not isinstance(target, cst.Name):
        keep_expression(tracer, small, line, small)
        return
    current = tracer.env.get(target.value)
    if not isinstance(current, ChainVal):
        passed = (
            isinstance(small.operator, cst.AddAssign)
            and reads_only_weights(tracer, small.value)
            and weights_passed_along(tracer, small.value)
        )
        if passed:  # `outputs += (attention_probs,)`: the weights are returned, as `return out, probs` does
            keep_expression(tracer, small.value, line, small, allow_probs=True)
            tracer.env.pop(target.value, None)
            tracer.note_assignment([target.value])
            return
        if tracer.reads.chain_value_refs(small.value):
            tracer.poison_reads(small.value, line, Code.SCORES_READ, f"the scores are folded into `{target.value}`")
        keep_expression(tracer, small.value, line, small)
        scalar = (
            current is not None
            and tracer.value_is_scalar(current)
            and p.scalar(small.value, tracer.scope) is not None
            and isinstance(small.operator, (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign, cst.DivideAssign))
        )
        if scalar:
            tracer.env[target.value] = ScalarVal()
        else:
            tracer.env.pop(target.value, None)
        tracer.note_assignment([target.value])
        return
    operator = small.operator
    try:
        younger = tracer.chain_or_start(small.value)
        if isinstance(operator, cst.AddAssign) and younger and all(cid > current.cid for cid in younger):
            # `scores += relative_scores` (another product, e.g. the query times position embeddings): as for
            # `scores + relative_scores`, the younger chain is an additive term
            for cid in younger:
                tracer.chains.candidates[cid].absorbed = True
            ops: list[Op] = [AddTerm(small.value, current.rank)]
        elif isinstance(operator, (cst.AddAssign, cst.SubtractAssign)):
            negate = isinstance(operator, cst.SubtractAssign)
            ops = [terms.add_term(tracer, current, small.value, line, negate=negate)]
        elif isinstance(operator, (cst.MultiplyAssign, cst.DivideAssign)):
            ops = [scales.scale_or_head_mask(tracer, current, small.value, isinstance(operator, cst.DivideAssign), line)]
        else:
            raise Poison(Code.SCORES_COMBINED, f"the scores are updated with `{code(operator).strip()}`", {current.cid})
    except Poison as poison:
        tracer.poison_statement(poison, small.value, [target.value], line)
        return
    tracer.chains.record(current, ops, depth, line)
    tracer.plans[small] = ChainStmt(ops, [target.value], depth, line)
    tracer.env[target.value] = tracer.chains.advance(current, ops)


def expression_statement(tracer: TracerView, small: cst.Expr, depth: int, line: int) -> None:
    """Trace an expression statement: a product with V, or an in-place method on a chain.

    `outputs.append(probs @ v)` holds a product with V; `scores.masked_fill_(...)`, `.add_`, `.mul_` and `.div_` are
    operations of the chain.
    """
    value = small.value
    output = find_output(tracer, value)
    if output is not None:  # `outputs.append(probs @ value)`
        output_statement(tracer, small, value, output, [], depth, line)
        return
    found = p.method_call(value)
    if found is not None and isinstance(found[0], cst.Name):
        receiver = tracer.env.get(found[0].value)
        if isinstance(receiver, ChainVal):
            name = found[1]
            assert isinstance(value, cst.Call)
            try:
                if name == "masked_fill_":
                    ops: list[Op] = [
                        fills.masking_fill(tracer, p.arg(value, 0, "mask"), p.arg(value, 1, "value"), False, line, receiver.cid)
                    ]
                elif name == "add_":
                    ops = [terms.add_term(tracer, receiver, value.args[0].value, line)]
                elif name in ("div_", "mul_"):
                    ops = [scales.scale_or_head_mask(tracer, receiver, value.args[0].value, name == "div_", line)]
                elif discarded(name):
                    # `scores.masked_fill(mask, -1e9)` as a statement: the new tensor is thrown away and the scores
                    # are what they were. The statement is no step (the chain and its name stay as they were) and
                    # goes where the chain statements go: out of the SDPA code, into the eager code kept
                    tracer.plans[small] = ChainStmt([], [], depth, line, discarded=True)
                    return
                else:
                    what = f"`.{name}()` is applied to the {receiver.stage.value} in place"
                    raise Poison(Code.SCORES_TRANSFORMED, what, {receiver.cid})
            except Poison as poison:
                tracer.poison_statement(poison, value, [], line)
                return
            tracer.chains.record(receiver, ops, depth, line)
            tracer.plans[small] = ChainStmt(ops, [found[0].value], depth, line)
            after = tracer.chains.advance(receiver, ops)
            tracer.chains.made_by[after.step] = (small, receiver.step, receiver.cid)
            tracer.env[found[0].value] = after
            return
    keep_expression(tracer, value, line, small)


def discarded(method: str) -> bool:
    """Whether a tensor method called as a statement leaves its receiver as it was.

    A tensor method whose name does not end in one underscore returns a new tensor (`masked_fill`, `add`, `float`);
    as a statement its result is thrown away. Eager then computes with the receiver unchanged, and so does the port:

        scores.masked_fill(mask, -1e9)   # no effect: `masked_fill_` would fill in place
        probs = scores.softmax(dim=-1)

    The in-place forms (`masked_fill_`) and private names (`_fill`) are not of this kind.
    """
    return not method.endswith("_") and not method.startswith("_")


def changed_in_place(small: cst.BaseSmallStatement) -> set[str]:
    """The names whose value a statement changes without rebinding them.

    The receiver of an in-place method (`m.mul_(2)`, `m.masked_fill_(...)`) and the object an item or attribute is
    assigned into (`m[0] = 1`).
    """
    out: set[str] = set()
    if isinstance(small, cst.Expr):
        found = p.method_call(small.value)
        if found is not None and found[1].endswith("_") and not found[1].startswith("_"):
            out |= {n.value for n in [_root_name(found[0])] if n is not None}
    elif isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        for target in targets:
            if isinstance(target, (cst.Subscript, cst.Attribute)):
                out |= {n.value for n in [_root_name(target)] if n is not None}
    return out


def _root_name(node: cst.BaseExpression) -> cst.Name | None:
    while isinstance(node, (cst.Subscript, cst.Attribute)):
        node = node.value
    return node if isinstance(node, cst.Name) else None
