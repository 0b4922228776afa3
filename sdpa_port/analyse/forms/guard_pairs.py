"""Two `if`s of one block with the same test: a zeroing of the probabilities under the second runs only where the
fill under the first did (`fills.zero_rows`).

Before (the mask reassigned in the first body, the same in both; the second test holds only where the first did):

    if mask is not None:
        mask = mask.unsqueeze(1)
        scores.masked_fill_(mask.bool(), float("-inf"))
    probs = scores.softmax(-1)
    if mask is not None:
        probs.masked_fill_(mask.bool(), 0.0)

After: the fill is the SDPA mask, and the output rows whose every key it masks are zeroed, as for a zeroing in the
fill's own branch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import all_assigned_names, nodes_of_type

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView


def guarded_alike(
    tracer: TracerView, masked: tuple[tuple[int, int], ...], zeroed: tuple[tuple[int, int], ...]
) -> bool:
    """The zeroing runs only where the fill ran: the fill is in the body of an `if` with no other arm, and the zeroing
    in the body of a later `if` of the same block with the same test, made of `name is not None` joined by `and`,
    whose names no statement between the two binds.

    Where the first test is false its body did not run, so its names hold what they held: the second test is false
    too. Before (the mask reassigned in the first body, the same in both):

        if mask is not None:
            mask = mask.unsqueeze(1)
            scores.masked_fill_(mask.bool(), float("-inf"))
        probs = scores.softmax(-1)
        if mask is not None:
            probs.masked_fill_(mask.bool(), 0.0)
    """
    depth = len(masked) - 1
    if depth < 0 or len(zeroed) <= depth or zeroed[:depth] != masked[:depth]:
        return False
    (first_id, first_arm), (second_id, second_arm) = masked[depth], zeroed[depth]
    if first_arm != 0 or second_arm != 0 or first_id == second_id:
        return False
    ifs = {id(node): node for node in nodes_of_type(tracer.function.body, cst.If)}
    first, second = ifs.get(first_id), ifs.get(second_id)
    if first is None or second is None or first.orelse is not None or not first.test.deep_equals(second.test):
        return False
    names = none_tested(first.test)
    if not names:
        return False
    for block in nodes_of_type(tracer.function.body, cst.IndentedBlock):
        body = list(block.body)
        if any(s is first for s in body) and any(s is second for s in body):
            start = next(i for i, s in enumerate(body) if s is first)
            end = next(i for i, s in enumerate(body) if s is second)
            return start < end and not (all_assigned_names(body[start + 1 : end]) & names)
    return False


def none_tested(test: cst.BaseExpression) -> set[str]:
    """The names of a test made of `name is not None` joined by `and`; none for any other test."""
    if isinstance(test, cst.BooleanOperation):
        if not isinstance(test.operator, cst.And):
            return set()
        left, right = none_tested(test.left), none_tested(test.right)
        return left | right if left and right else set()
    if m.matches(test, m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(m.IsNot(), m.Name("None"))])):
        assert isinstance(test, cst.Comparison) and isinstance(test.left, cst.Name)
        return {test.left.value}
    return set()


# examples (`fills.EXAMPLES`): the scores filled under one test, the probabilities zeroed under the same
TWO_GUARDS = (
    "scores = torch.matmul(query, key.transpose(-1, -2))\n"
    "if attention_mask is not None:\n"
    "    attention_mask = attention_mask.bool()\n"
    "    scores = scores.masked_fill(attention_mask, float('-inf'))\n"
    "probs = scores.softmax(-1)\n"
    "{between}"
    "if attention_mask is not None:\n"
    "    probs = probs.masked_fill(attention_mask, 0.0)\n"
    "output = torch.matmul(probs, value)\nreturn output"
)
# the same with the mask the scores are filled with bound to another name than the tested one
MASKED_GUARDS = TWO_GUARDS.replace(
    "    attention_mask = attention_mask.bool()", "    masked = attention_mask.bool()"
).replace("(attention_mask, ", "(masked, ")
