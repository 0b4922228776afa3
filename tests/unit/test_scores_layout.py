"""Scores an einsum lays out otherwise than SDPA's (batch, heads, query, key), as Transformer-XL's
`ibnd,jbnd->ijbn` (query, key, batch, heads): the port permutes each term added to them and each mask filled into
them as the scores are; an operation that reads their dimensions by position as SDPA lays them out is refused S108
(torch-free; the laid-out fixture and Transformer-XL's acceptance test run the ports)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.chain import describe_layout
from sdpa_port.analyse.patterns import least_rank
from sdpa_port.refusals import Code
from helpers import flat

MODULE = """
import torch
from torch import nn


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.scale = config.head_dim**-0.5
        self.relative = nn.Parameter(torch.zeros(config.length, config.heads, config.head_dim))
        self.gate = nn.Linear(config.head_dim, 1)
        self.head_bias = nn.Parameter(torch.zeros(1, config.heads))
        self.table = nn.Parameter(torch.zeros(config.table_shape))
        self.heads_only = nn.Parameter(torch.zeros(config.heads))

    def shifted(self, x):
        return x.flip(0)

    def forward(self, query, key, value, attention_mask=None):
{body}

class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyAttention(config)

    def forward(self, states, attention_mask=None):
        return self.attention(states, states, states, attention_mask)
"""

SCORES = 'scores = torch.einsum("ibnd,jbnd->ijbn", (query, key))\n'
OUTPUT = 'return torch.einsum("ijbn,jbnd->ibnd", (probs, value))\n'


def port(body: str):  # type: ignore[no-untyped-def]
    return port_source(MODULE.format(body=textwrap.indent(body, " " * 8)), filename="modeling_tiny.py")


def test_terms_and_fills_are_permuted_as_the_scores_are() -> None:
    result = port(
        SCORES
        + 'position = torch.einsum("ibnd,jnd->ijbn", (query, self.relative))\n'
        + "scores = (scores + position) * self.scale\n"
        + "if attention_mask is not None:\n"
        + "    scores = scores.masked_fill(attention_mask[:, :, :, None], torch.finfo(scores.dtype).min)\n"
        + "probs = nn.functional.softmax(scores, dim=1)\n"
        + OUTPUT
    )
    assert result.status is Status.PORTED, result.reasons
    ported = result.source
    assert "sdpa_query = query.permute(2, 3, 0, 1)" not in ported  # the operands go by their own orders
    assert "sdpa_query = query.permute(1, 2, 0, 3)" in ported and "value.permute(1, 2, 0, 3)," in ported
    assert "sdpa_mask = position.permute(2, 3, 0, 1) * self.scale" in ported  # an einsum's rank is its spec's
    # an index showing four dimensions has four: the condition is permuted without a rank test
    assert "torch.where(attention_mask[:, :, :, None].permute(2, 3, 0, 1), " in flat(ported)
    assert "scale=self.scale," in ported and ").permute(2, 0, 1, 3)" in ported


def test_a_term_of_unknown_rank_gets_the_leading_dimensions_broadcasting_would_add() -> None:
    result = port(
        SCORES
        + 'position = self.shifted(torch.einsum("ibnd,jnd->ijbn", (query, self.relative)))\n'
        + "scores = scores + position\n"
        + "probs = scores.softmax(-3)\n"
        + OUTPUT
    )
    assert result.status is Status.PORTED, result.reasons
    assert "attn_mask=position[(None,) * (4 - position.dim())].permute(2, 3, 0, 1)," in result.source


@pytest.mark.parametrize(
    "steps,reads",
    [
        # the row's maximum of SDPA's layout is the maximum over the heads here
        ("scores = scores - scores.amax(-1, keepdim=True)\n", "subtracting the row's maximum"),
        # a factor constant along SDPA's last dimension (the keys) is one along the heads here
        ("scores = scores * self.gate(query).reshape(-1, 1)\n", "a factor per query"),
    ],
    ids=["shift", "per-query"],
)
def test_an_operation_reading_sdpas_dimensions_is_refused(steps: str, reads: str) -> None:
    result = port(SCORES + steps + "probs = scores.softmax(1)\n" + OUTPUT)
    assert result.status is Status.REFUSED
    assert [r.code for r in result.refusals] == [Code.LAYOUT], result.reasons
    assert "laid out (query, key, batch, heads)" in result.reasons[0] and reads in result.reasons[0], result.reasons


def test_a_product_with_v_reading_the_probabilities_as_sdpas_is_refused() -> None:
    result = port(SCORES + "probs = scores.softmax(1)\nreturn torch.matmul(probs, value)\n")
    assert [r.code for r in result.refusals] == [Code.LAYOUT], result.reasons
    assert "multiplied by V as if they were laid out (batch, heads, query, key)" in result.reasons[0]


def test_the_interface_style_refuses_them() -> None:
    body = SCORES + "probs = scores.softmax(1)\n" + OUTPUT
    result = port_source(MODULE.format(body=textwrap.indent(body, " " * 8)), style="interface", filename="modeling_tiny.py")
    assert result.status is Status.REFUSED
    assert Code.LAYOUT in [r.code for r in result.refusals], result.reasons


def test_describe_layout() -> None:
    assert describe_layout((2, 3, 0, 1)) == "(query, key, batch, heads)"
    assert describe_layout((0, 1, 3, 2)) == "(batch, heads, key, query)"
    assert describe_layout((0, 2, 1)) == "(heads, key, query)"


@pytest.mark.parametrize(
    "index,least",
    [("x[None, :, :, None]", 4), ("x[:, :, :, None]", 4), ("x[0, :, None]", 2), ("x[..., None]", None), ("x[i]", None), ("x", None)],
)
def test_least_rank(index: str, least: int | None) -> None:
    assert least_rank(cst.parse_expression(index)) == least


@pytest.mark.parametrize(
    "term,written",
    [
        # created with its sizes written out: two dimensions
        ("self.head_bias", "self.head_bias[None, None, ...].permute(2, 3, 0, 1)"),
        # created from one argument, which may hold a shape (a config field named like a number may not be one)
        ("self.table", "self.table[(None,) * (4 - self.table.dim())].permute(2, 3, 0, 1)"),
        ("self.heads_only", "self.heads_only[(None,) * (4 - self.heads_only.dim())].permute(2, 3, 0, 1)"),
    ],
)
def test_the_rank_of_a_parameter_is_read_from_its_creation(term: str, written: str) -> None:
    result = port(SCORES + f"scores = scores + {term}\nprobs = scores.softmax(1)\n" + OUTPUT)
    assert result.status is Status.PORTED, result.reasons
    assert f"attn_mask={written}," in result.source, result.source
