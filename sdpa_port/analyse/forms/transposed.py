"""The probabilities transposed, for a value that multiplies them from the left.

Stable Diffusion's VAE `AttnBlock` keeps its value channels-first, `(batch, dim, length)`, and computes
`torch.bmm(value, probs.permute(0, 2, 1))`: that is `(probs @ value^T)^T`, SDPA handed the value transposed and its
output transposed back (`analyse/outputs.py`). The transpose swaps the probabilities' last two dimensions of a known
rank (`permute(0, 2, 1)` of 3-D ones, `transpose(-1, -2)`, `transpose(2, 3)` of 4-D ones), after the softmax; the
product with V, with the value on the left, must follow it directly. Other axes swapped, or the scores transposed
before the softmax, are left to the tracer, which refuses them (S101); the transposed probabilities multiplying a
value on their right are refused S108.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import PROBS, Poison, Transpose
from sdpa_port.analyse.forms.common import Example, sdpa
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def transposed(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    found = p.method_call(node, {"transpose", "permute"})
    if found is None or not isinstance(node, cst.Call) or not tracer.chain_or_start(found[0]):
        return None
    base, ops = tracer.decompose(found[0], line)
    current = tracer.chains.advance(base, ops)
    if current.stage != PROBS:
        return None  # the scores transposed: the softmax would read them by column; the tracer refuses it (S101)
    if current.rank is None:
        if p.transposed_last_two(node, None) is None:
            return None
        raise Poison(Code.LAYOUT, "the probabilities are transposed and their rank cannot be read", {base.cid})
    if p.transposed_last_two(node, current.rank) is None or not _all_dimensions(node, current.rank):
        return None  # another order: the tracer refuses it as a method applied to the chain (S101)
    return base, [*ops, Transpose()]


def _all_dimensions(call: cst.Call, rank: int) -> bool:
    """A permute names each of the `rank` dimensions (`permute(0, 2, 1)` of 4-D probabilities raises)."""
    assert isinstance(call.func, cst.Attribute)
    return call.func.attr.value != "permute" or len(call.args) == rank


_SHAPE = "b, h, s, d = query.shape\nquery = query.view(b, h, s, d)\n"
# the VAE's single-head attention over a channels-first map: query (b, hw, c), key and value (b, c, hw)
_CHANNELS_FIRST = (
    "b, c, h, w = query.shape\nq = query.reshape(b, c, h * w).permute(0, 2, 1)\nk = key.reshape(b, c, h * w)\n"
    "v = value.reshape(b, c, h * w)\nscores = torch.bmm(q, k) * (int(c) ** (-0.5))\n"
    "probs = torch.nn.functional.softmax(scores, dim=2)\n"
)
_CHANNELS_FIRST_PORT = (
    "b, c, h, w = query.shape\nq = query.reshape(b, c, h * w).permute(0, 2, 1)\nk = key.reshape(b, c, h * w)\n"
    "v = value.reshape(b, c, h * w)\nout = "
    + sdpa("scale=(int(c) ** (-0.5))", operands="q, k.transpose(-1, -2), v.transpose(1, 2)")
    + ".transpose(1, 2)"
)

EXAMPLES = {
    "transposed": (
        Example(
            _CHANNELS_FIRST + "probs = probs.permute(0, 2, 1)\nout = torch.bmm(v, probs)\nreturn out.reshape(b, c, h, w)",
            Transpose,
            becomes=_CHANNELS_FIRST_PORT,
        ),
        # 4-D: `torch.matmul(value, probs.transpose(-1, -2))` of values laid out (batch, heads, dim, length)
        Example(
            _SHAPE + "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(-1)\n"
            "return torch.matmul(value.transpose(-1, -2), probs.transpose(-1, -2))",
            Transpose,
            becomes=_SHAPE
            + "return "
            + sdpa("scale=1.0", operands="query, key, value.transpose(-1, -2).transpose(2, 3)")
            + ".transpose(2, 3)",
        ),
        # of a rank that cannot be read, the output cannot be transposed back
        Example(
            "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(-1)\n"
            "return torch.matmul(value.transpose(-1, -2), probs.transpose(-1, -2))",
            refused=Code.LAYOUT,
        ),
        # the value on the left of probabilities not transposed: `v @ probs` is no attention output
        Example(_CHANNELS_FIRST + "out = torch.bmm(v, probs)\nreturn out.reshape(b, c, h, w)", refused=Code.LAYOUT),
        # the transposed probabilities on the left of the value
        Example(
            _CHANNELS_FIRST + "probs = probs.permute(0, 2, 1)\nreturn torch.bmm(probs, v.permute(0, 2, 1))",
            refused=Code.LAYOUT,
        ),
        # another pair of axes swapped
        Example(
            _SHAPE + "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(-1)\n"
            "return torch.matmul(value.transpose(-1, -2), probs.transpose(1, 3))",
            refused=Code.SCORES_TRANSFORMED,
        ),
        # the scores transposed before the softmax: it then runs over the queries
        Example(
            _CHANNELS_FIRST.replace("probs = torch.nn.functional.softmax(scores, dim=2)\n", "")
            + "probs = torch.nn.functional.softmax(scores.permute(0, 2, 1), dim=2)\nreturn torch.bmm(v, probs)",
            refused=Code.SCORES_TRANSFORMED,
        ),
        # the softmax over the queries of (b, hw, hw) scores, transposed as if over the keys: the softmax over the
        # queries already gives transposed probabilities (`forms/softmax.py`), transposed back here, and `v @ P` is
        # no attention output
        Example(
            _CHANNELS_FIRST.replace("dim=2", "dim=1") + "return torch.bmm(v, probs.permute(0, 2, 1))",
            refused=Code.LAYOUT,
        ),
        # something between the transpose and the product
        Example(
            _CHANNELS_FIRST + "probs = self.dropout(probs.permute(0, 2, 1))\nreturn torch.bmm(v, probs)",
            refused=Code.LAYOUT,
        ),
    ),
}
