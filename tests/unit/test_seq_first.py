"""Megatron's seq-first attention (ChatGLM, CodeGeeX): (s, b, h, d) operands flattened to (s, b * h, d), a product
of their transposes, scores viewed to (b, h, sq, sk) through a tuple of sizes written before the flattening
(torch-free; `fixtures/inline_style/modeling_tiny_seq_first.py` runs a port)."""

from __future__ import annotations

import textwrap

import pytest

from sdpa_port import Status, Style, port_source
from sdpa_port.refusals import Code

MODULE = """
import torch
from torch import nn


class TinyAttention(nn.Module):
    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.norm_factor = (hidden // heads) ** 0.5
        self.qkv = nn.Linear(hidden, 3 * hidden)

    def forward(self, query, key, value, attention_mask=None):
{body}
"""

FLATTEN = """
output_size = (query.size(1), query.size(2), query.size(0), key.size(0))
query = query.view(output_size[2], output_size[0] * output_size[1], -1)
key = key.view(output_size[3], output_size[0] * output_size[1], -1)
"""
SCORES = "scores = ({product}).view(*output_size)\n"
REST = """
scores = scores + attention_mask
probs = torch.softmax(scores, dim=-1)
output_size = (value.size(1), value.size(2), query.size(0), value.size(3))
value = value.view(value.size(0), output_size[0] * output_size[1], -1)
probs = probs.view(output_size[0] * output_size[1], output_size[2], -1)
context = torch.bmm(probs, value.transpose(0, 1))
return context.view(*output_size)
"""
BMM = "torch.bmm(query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2))"


def port(body: str):  # type: ignore[no-untyped-def]
    source = MODULE.format(body=textwrap.indent(textwrap.dedent(body).strip() + "\n", " " * 8))
    return port_source(source, filename="modeling_tiny.py", style=Style.INLINE)


def test_sizes_read_before_the_flattening_are_bound_where_the_scores_are_viewed() -> None:
    result = port(FLATTEN + SCORES.format(product=BMM) + REST)
    assert result.status is Status.PORTED, result.reasons
    # bound where the view reads them: `output_size` and `query` hold something else at the SDPA call
    assert "sdpa_batch, sdpa_heads = output_size[0], output_size[1]\n" in result.source
    assert "query.transpose(0, 1).unflatten(0, (sdpa_batch, sdpa_heads))" in result.source
    assert "value.transpose(0, 1).unflatten(0, (sdpa_batch, sdpa_heads))" in result.source
    assert result.source.index("sdpa_batch, sdpa_heads =") < result.source.index("value = value.view(")


@pytest.mark.parametrize(
    "product",
    [
        # a matmul of 3-D operands is bmm: its key's `transpose(1, 2)` swaps the last two dimensions
        "torch.matmul(query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2)) / self.norm_factor",
        "torch.baddbmm(torch.zeros(1, 1, 1), query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2), beta=0.0, "
        "alpha=1.0 / self.norm_factor)",
    ],
)
def test_the_seq_first_products_of_megatron_copies_are_read(product: str) -> None:
    result = port(FLATTEN + SCORES.format(product=product) + REST)
    assert result.status is Status.PORTED, result.reasons
    assert "scale=1.0 / self.norm_factor" in result.source.replace("1.0 * (1.0 / self.norm_factor)", "1.0 / self.norm_factor")


def test_a_matmul_of_operands_of_unknown_rank_is_not_read_as_a_product_with_the_key_transposed() -> None:
    # `key` is a parameter of unknown rank: `transpose(1, 2)` of it may swap any two dimensions
    result = port("scores = torch.matmul(query, key.transpose(1, 2))\nprobs = scores.softmax(-1)\nreturn probs @ value")
    assert result.status is not Status.PORTED


def test_sizes_bound_where_only_one_branch_views_the_scores_are_refused() -> None:
    # the view that reads the tuple runs under a setting: the SDPA call may find the sizes unbound
    body = FLATTEN + (
        "scores = " + BMM + "\n"
        "if self.training:\n    scores = scores.view(*output_size)\n"
        "else:\n    scores = scores.view(output_size[0], output_size[1], output_size[2], output_size[3])\n"
    ) + REST
    result = port(body)
    assert result.status is Status.REFUSED
    assert [r.code for r in result.refusals] == [Code.LAYOUT], result.reasons
    assert "not on every path" in result.reasons[0]


BLEND = """
ltor = {ltor}
converted = 10000.0 * (1.0 - ltor)
{between}scores = torch.mul(torch.matmul(query, key.transpose(-1, -2)), ltor) - converted
probs = torch.softmax(scores, dim=-1)
return torch.matmul(probs, value)
"""
LOWER = "torch.tril(torch.ones((1, query.size(-2), key.size(-2)), device=query.device)).view(1, 1, query.size(-2), key.size(-2))"


def test_a_multiplicative_mask_of_a_lower_triangle_of_ones_is_a_fill() -> None:
    result = port(BLEND.format(ltor=LOWER, between=""))
    assert result.status is Status.PORTED, result.reasons
    assert "attn_mask=torch.where(ltor.bool(), query.new_zeros(()), -10000.0).to(query.dtype)" in result.source


@pytest.mark.parametrize(
    "ltor,between,code",
    [
        # below the diagonal the first query keeps no key: eager's -1e4 fill gives it uniform weights
        (LOWER.replace("device=query.device))", "device=query.device), diagonal=-1)"), "", Code.MASKED_ROWS),
        # a view regrouping the triangle says nothing of its rows
        (LOWER.replace(".view(1, 1, query.size(-2), key.size(-2))", ".view(1, 1, key.size(-2), query.size(-2))"), "", Code.MASKED_ROWS),
        # a mask passed in may hold other values than 0 and 1, which scale the scores
        ("attention_mask", "", Code.SCORES_COMBINED),
        # the complement read before `ltor` was bound again: not `1 - ltor` of the factor, no blend at all
        (LOWER, "ltor = torch.ones_like(ltor)\n", Code.UNKNOWN_PRODUCT),
    ],
)
def test_multiplicative_masks_that_are_no_exact_fill_are_refused(ltor: str, between: str, code: Code) -> None:
    result = port(BLEND.format(ltor=ltor, between=between))
    assert result.status is Status.REFUSED
    assert [r.code for r in result.refusals] == [code], result.reasons
