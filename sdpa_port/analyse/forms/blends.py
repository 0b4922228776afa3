"""Multiplicative masks: the scores kept where a 0/1 tensor is 1 and set very negative where it is 0.

GPT's TensorFlow-era `scores * b + v * (1 - b)` over a causal buffer's slice, and Megatron's `torch.mul(scores, b) -
c * (1.0 - b)` with the complement bound to a local first. Each is `torch.where(b.bool(), scores, v)` (a masking fill,
`forms/fills.py`) where `b` holds only 0 and 1 by its construction; with any other `b` (a mask passed in) the scores
are scaled entry by entry, refused S103.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import Fill, Poison, short
from sdpa_port.analyse.cstutil import assigned_between, code, parenthesized, precedence, primary
from sdpa_port.analyse.forms.common import Example, scored, sdpa
from sdpa_port.analyse.forms.fills import _CAUSAL, _causal_port, booleans, masking_fill, triangle_slice
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def blended(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    if not isinstance(node, cst.BinaryOperation):
        return None
    found = blend(tracer, node)
    if found is None:
        return None
    kept, condition, value = found
    base, ops = tracer.decompose(kept, line)
    if condition is None:
        raise Poison(
            Code.SCORES_COMBINED,
            f"the scores are multiplied by `{short(value)}`, which the file does not prove to hold only 0 and 1: "
            "`scores * m - c * (1 - m)` masks like a fill only then, and SDPA cannot scale scores entry by entry",
            {base.cid},
        )
    return base, [*ops, masking_fill(tracer, condition, value, True, line, base.cid, ops)]


def blend(
    tracer: TracerView, node: cst.BinaryOperation
) -> tuple[cst.BaseExpression, cst.BaseExpression | None, cst.BaseExpression] | None:
    """A masking blend `scores * b + v * (1 - b)`: the scores, the condition, the fill.

    Also `- c * (1 - b)`, `torch.mul(scores, b)`, and the complement through a local (`converted = c * (1.0 - b)`).
    With `b` a 0/1 tensor (a slice of a lower-triangular buffer of ones, GPT's; a local built of ones, triangles and
    booleans, Megatron's `torch.tril(torch.ones(...))`), it is exactly `torch.where(b.bool(), scores, v)` for finite
    scores. Before (Megatron's GPT-3):

        ltor = torch.tril(torch.ones((1, 1, s, s), device=x.device)).type(dtype)
        scores = torch.mul(scores, ltor) - 10000.0 * (1.0 - ltor)

    After: a fill of -10000.0 where `ltor.bool()` is false, the additive mask
    `torch.where(ltor.bool(), 0.0, -10000.0)`. A `b` the file does not prove 0/1 (a mask passed in) gives the weight
    as the condition's place: None, and the caller refuses (S103): other values scale the scores.
    """
    if not isinstance(node.operator, (cst.Add, cst.Subtract)):
        return None
    kept = _times(tracer, node.left)
    masked = _times(tracer, _local(tracer, node.right))
    if kept is None or masked is None:
        return None
    for scores, weight in (kept, kept[::-1]):
        if not tracer.chain_or_start(scores) or tracer.reads.chain_value_refs(weight):
            continue
        for value, complement in (masked, masked[::-1]):
            if tracer.reads.chain_value_refs(value) or not _one_minus(complement, weight):
                continue
            if isinstance(node.operator, cst.Subtract):
                value = cst.UnaryOperation(cst.Minus(), value if precedence(value) >= 12 else parenthesized(value))
            if triangle_slice(tracer, weight) is None and not zero_one(tracer, weight):
                return scores, None, weight
            condition = cst.Call(func=cst.Attribute(value=primary(weight), attr=cst.Name("bool")))
            return scores, condition, value
    return None


def zero_one(tracer: TracerView, node: cst.BaseExpression, depth: int = 0, resolving: frozenset[str] = frozenset()) -> bool:
    """A tensor every entry of which is 0 or 1 by its construction in the traced function.

    Ones and zeros (`torch.ones`, `ones_like`), a triangle of one (`torch.tril`, `triu`), a boolean, and their casts,
    views and broadcasts, followed through locals on every path. A parameter says nothing.
    """
    if depth > 8:
        return False
    if booleans(tracer).is_boolean(node):
        return True
    if isinstance(node, cst.Name):
        values = tracer.scope.local_values(node.value)
        if node.value in resolving:  # `m = m.view(...)`: inside it, `m` is one of the values before it
            values = tuple(v for v in values if node.value not in p.walk_names(v))
        deeper = resolving | {node.value}
        return bool(values) and all(zero_one(tracer, v, depth + 1, deeper) for v in values)
    found = p.method_call(node, p.CAST_METHODS | p.RESHAPE_METHODS | {"bool", "unsqueeze", "expand", "expand_as"})
    if found is not None:
        return zero_one(tracer, found[0], depth + 1, resolving)
    if not isinstance(node, cst.Call):
        return False
    qualified = tracer.scope.qualify(node.func)
    if qualified in ("torch.ones", "torch.zeros", "torch.ones_like", "torch.zeros_like"):
        return True
    if qualified in ("torch.tril", "torch.triu", "torch.reshape") and node.args:
        return zero_one(tracer, node.args[0].value, depth + 1, resolving)
    return False


def _local(tracer: TracerView, node: cst.BaseExpression) -> cst.BaseExpression:
    """A name's one value where the traced function binds it once (`converted = 1e4 * (1.0 - m)`), else `node`."""
    if isinstance(node, cst.Name):
        local = tracer.scope.local_value(node.value)
        if local is not None and not p.walk_names(local) & assigned_between(tracer.function, [local], [node]):
            return local  # read where it is used, its names still hold what they held where it was bound
    return node


def _times(tracer: TracerView, node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The two factors of a product `a * b` or `torch.mul(a, b)`."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return node.left, node.right
    if (
        isinstance(node, cst.Call)
        and tracer.scope.qualify(node.func) == "torch.mul"
        and len(node.args) == 2
        and all(a.keyword is None and not a.star for a in node.args)
    ):
        return node.args[0].value, node.args[1].value
    return None


def _one_minus(node: cst.BaseExpression, weight: cst.BaseExpression) -> bool:
    """The weight of `1 - weight` or `1.0 - weight`, when written the same way as `weight`."""
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Subtract)
        and p.number(node.left) == 1.0
        and code(node.right) == code(weight)
    )


_LOWER_ONES = "torch.tril(torch.ones((1, 1, query.size(-2), key.size(-2)), device=query.device)).type(query.dtype)"
_MEGATRON_BLEND = (
    "ltor = {ltor}\nconverted = 10000.0 * (1.0 - ltor)\nscores = torch.mul(scores, ltor) - converted\n"
    "probs = scores.softmax(-1)"
)

EXAMPLES = {
    # GPT's TensorFlow-era blend over the causal buffer: torch.where(causal, scores, -1e4)
    "blended": (
        Example(
            scored("scores = scores * causal + -1e4 * (1 - causal)\nprobs = scores.softmax(-1)", _CAUSAL),
            Fill,
            becomes=_causal_port("causal.bool()", "-1e4"),
        ),
        Example(
            scored("scores = scores * causal + 1.0 * (1 - causal)\nprobs = scores.softmax(-1)", _CAUSAL),
            refused=Code.FILL_VALUE,
        ),
        # Megatron's GPT-3: `torch.mul` by a lower triangle of ones built in the function, the complement through a
        # local; each row keeps its first key, so the -1e4 fill folds exactly
        Example(
            scored(_MEGATRON_BLEND.format(ltor=_LOWER_ONES), ""),
            Fill,
            becomes="return "
            + sdpa("attn_mask=torch.where(ltor.bool(), query.new_zeros(()), -10000.0).to(query.dtype)", "scale=1.0"),
        ),
        # a mask passed in: other values than 0 and 1 would scale the scores
        Example(scored(_MEGATRON_BLEND.format(ltor="attention_mask")), refused=Code.SCORES_COMBINED),
    ),
}
