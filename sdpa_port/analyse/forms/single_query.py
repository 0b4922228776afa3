"""Single-query attention: one query per head, with no length axis, against keys that have one (attention pooling).

Before (PoNet's pooling, the query the mean over the tokens):

    q = query.mean(dim=-2)                                    # (batch, heads, dim)
    att = torch.einsum("bhd,bhld->bhl", q, key) / math.sqrt(key.shape[-1])
    att = att + attention_mask.squeeze(1)                     # (batch, 1, key)
    out = torch.einsum("bhld,bhl->bhd", value, att.softmax(dim=-1))

After: SDPA takes the query with a length axis of 1, each term with that axis too, and its output has it removed:

    sdpa_query = q.unsqueeze(-2)
    sdpa_mask = attention_mask.squeeze(1).unsqueeze(-2)
    out = torch.nn.functional.scaled_dot_product_attention(sdpa_query, key, value, attn_mask=sdpa_mask,
                                                           scale=1 / math.sqrt(key.shape[-1])).squeeze(-2)

The einsum's subscripts prove the shapes (`patterns/single_query.py`): the scores have one axis less than the key,
the key's length last. A softmax over that axis is the one SDPA runs; over another (the heads) is refused, and so is
a product with V that does not sum over it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import SCORES, ChainVal, Start
from sdpa_port.analyse.cstutil import primary
from sdpa_port.analyse.forms.common import Example, sdpa, strip_casts
from sdpa_port.analyse.forms.products import bound_to_float32, query_scale
from sdpa_port.analyse.patterns.single_query import single_query_scores
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def unsqueezed(node: cst.BaseExpression) -> cst.Call:
    """`node.unsqueeze(-2)`: a length axis of 1 before the last."""
    minus_two = cst.UnaryOperation(cst.Minus(), cst.Integer("2"))
    return cst.Call(func=cst.Attribute(value=primary(node), attr=cst.Name("unsqueeze")), args=[cst.Arg(minus_two)])


def starts_single_query(product: p.Product) -> bool:
    """An einsum whose subscripts read as single-query scores."""
    return product.form is p.ProductForm.EINSUM and single_query_scores(product.spec or "") is not None


def single_query_product(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    """`einsum("bhd,bhld->bhl", q, k)`: a chain starts whose query SDPA gets as `q.unsqueeze(-2)`.

    Operands cast inside the einsum are not read (what it computes in is not known here)."""
    product = tracer.scope.product(node)
    if product is None or not starts_single_query(product):
        return None
    left, right = product.left, product.right
    if tracer.reads.chain_refs(left) or tracer.reads.chain_refs(right) or not tracer.may_start(node):
        return None
    if any(strip_casts(operand, tracer.scope)[0] is not operand for operand in (left, right)):
        return None
    roles = single_query_scores(product.spec or "")
    assert roles is not None
    start = Start(
        product,
        unsqueezed(p.permuted(left, roles.left)),
        p.permuted(right, roles.right),
        roles.rank,
        False,
        query_scale(tracer, left),
        bound_to_float32(tracer, left) or bound_to_float32(tracer, right),
        (roles.left, roles.right),
        (left, right),
        single=True,
    )
    read = sorted(p.walk_names(left) | p.walk_names(right))
    cid = tracer.chains.new_chain(start, node, line, tuple((name, tracer.assignments.get(name, 0)) for name in read))
    return ChainVal(cid, SCORES, roles.rank), [start]


_POOLED = "q = query.mean(dim=-2)\nscores = torch.einsum('bhd,bhld->bhl', q, key)\n"
_POOLED_CALL = "sdpa_query = q.unsqueeze(-2)\nreturn " + sdpa("scale=1.0", operands="sdpa_query, key, value")

EXAMPLES = {
    "single_query_product": (
        Example(
            _POOLED + "probs = scores.softmax(dim=-1)\nreturn torch.einsum('bhld,bhl->bhd', value, probs)",
            Start,
            becomes=_POOLED_CALL + ".squeeze(-2)",
        ),
        # the probabilities on the left, the value laid out (batch, length, heads, dim), the output (batch, dim, heads)
        Example(
            _POOLED + "probs = scores.softmax(dim=2)\nreturn torch.einsum('bhl,blhd->bdh', probs, value)",
            Start,
            becomes="sdpa_query = q.unsqueeze(-2)\nreturn "
            + sdpa("scale=1.0", operands="sdpa_query, key, value.transpose(1, 2)")
            + ".squeeze(-2).transpose(1, 2)",
        ),
        # a term added to scores without a query axis is given one
        Example(
            _POOLED + "scores = scores + attention_mask.squeeze(1)\nprobs = scores.softmax(dim=-1)\n"
            "return torch.einsum('bhld,bhl->bhd', value, probs)",
            Start,
            becomes="sdpa_query = q.unsqueeze(-2)\n...\nreturn "
            + sdpa("attn_mask=attention_mask.squeeze(1).unsqueeze(-2)", "scale=1.0", operands="sdpa_query, key, value")
            + ".squeeze(-2)",
        ),
        # a softmax over the heads, not the keys
        Example(
            _POOLED + "probs = scores.softmax(dim=1)\nreturn torch.einsum('bhld,bhl->bhd', value, probs)",
            refused=Code.SOFTMAX_DIM,
        ),
        # a product with V summing over the heads: not the keys the softmax ran over
        Example(
            _POOLED + "probs = scores.softmax(dim=-1)\nreturn torch.einsum('blhd,bhl->bld', value, probs)",
            refused=Code.LAYOUT,
        ),
        # the scores laid out (batch, key, heads): the key's length is not last (no single-query reading; F601)
        Example(
            "q = query.mean(dim=-2)\nscores = torch.einsum('bhd,bhld->blh', q, key)\nprobs = scores.softmax(dim=1)\n"
            "return torch.einsum('bhld,blh->bhd', value, probs)",
            refused=Code.UNRECOGNISED,
        ),
    ),
}
