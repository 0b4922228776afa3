"""Single-query attention (one query per head, no length axis): which einsums read so, what the inline port writes,
and the look-alikes refused (torch-free; `fixtures/inline_style/modeling_tiny_single_query.py` and its acceptance
test check the ports numerically)."""

from __future__ import annotations

import textwrap

import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.patterns.single_query import single_query_output, single_query_scores
from sdpa_port.result import Style


@pytest.mark.parametrize(
    "spec,left,right",
    [
        ("bdh,bdlh->bdl", None, None),  # PoNet's letters
        ("bhd,bnhd->bhn", None, (0, 2, 1, 3)),  # the key laid out (batch, length, heads, dim)
        ("hbd,bhkd->hbk", None, (1, 0, 2, 3)),  # heads first: the key permuted to the query's leads
        ("bd,bld->bl", None, None),  # no heads axis: (batch, dim) against (batch, length, dim)
        ("bdh,bhld->bhl", (0, 2, 1), None),  # the query laid out (batch, dim, heads)
    ],
)
def test_single_query_scores(spec: str, left: object, right: object) -> None:
    roles = single_query_scores(spec)
    assert roles is not None
    assert (roles.left, roles.right, roles.rank) == (left, right, len(spec.split("->")[1]))


@pytest.mark.parametrize(
    "spec",
    [
        "bhqd,bhkd->bhqk",  # the query has a length axis: ordinary scores
        "bhd,bhld->blh",  # the key's length not last
        "bhd,bhld->bhd",  # nothing contracted
        "bhd,bhld->bl",  # a lead summed away
        "bhe,bhld->bhl",  # the query's width is not the key's
        "bhd,bld->bhl",  # the key has no heads axis
        "bhd,bhld->bhld",
        "bhd...,bhld->bhl",
    ],
)
def test_not_single_query_scores(spec: str) -> None:
    assert single_query_scores(spec) is None


@pytest.mark.parametrize(
    "spec,probabilities_left,value,result",
    [
        ("bdlh,bdl->bdh", False, None, None),  # PoNet's: the value on the left
        ("bhl,bhld->bhd", True, None, None),
        ("bhn,bnhd->bdh", True, (0, 2, 1, 3), (0, 2, 1)),
        ("bl,bld->bd", True, None, None),
    ],
)
def test_single_query_output(spec: str, probabilities_left: bool, value: object, result: object) -> None:
    rank = len(spec.split("->")[1])
    roles = single_query_output(spec, rank)
    assert roles is not None
    assert (roles.probabilities_left, roles.value, roles.result) == (probabilities_left, value, result)


@pytest.mark.parametrize(
    "spec",
    [
        "bhl,bhld->bhl",  # the keys not summed over
        "blhd,bhl->bld",  # summed over the heads
        "bhl,blhd->bld",
        "bhl,bhd->bhd",  # the value has no length axis
        "bhl,bhld->bhld",
    ],
)
def test_not_single_query_output(spec: str) -> None:
    assert single_query_output(spec, 3) is None


POOLING = '''
import math

import torch
from torch import nn


class Pooling(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q = q.mean(dim=-2)
        att = torch.einsum("bhd,bhld->bhl", q, k) / math.sqrt(k.shape[-1])
{steps}
        return {product}.reshape(b, c)
'''
MASK = "        if mask is not None:\n            att = att + mask.squeeze(1)\n"
SOFTMAX = "        probs = att.softmax(dim=-1)\n"
OUTPUT = 'torch.einsum("bhld,bhl->bhd", v, probs)'


def port(steps: str = MASK + SOFTMAX, product: str = OUTPUT):  # type: ignore[no-untyped-def]
    return port_source(POOLING.format(steps=steps.rstrip("\n"), product=product), style="inline", filename="m.py")


def test_the_query_is_given_a_length_axis_and_the_output_loses_it() -> None:
    result = port()
    assert result.status is Status.PORTED and result.style is Style.INLINE, result.reasons
    source = textwrap.dedent(result.source)
    assert "sdpa_query = q.unsqueeze(-2)" in source
    assert "sdpa_mask = mask.squeeze(1).unsqueeze(-2).to(sdpa_query.dtype)" in source
    assert "scale=1.0 / math.sqrt(k.shape[-1])," in source
    assert ").squeeze(-2).reshape(b, c)" in source
    assert "einsum" not in source


@pytest.mark.parametrize(
    "steps,product,detail",
    [
        # the scores' sizes read: SDPA's have one axis more
        (MASK + "        keys = att.size(-1)\n" + SOFTMAX + "        probs = probs * keys\n", OUTPUT, "`.size()`"),
        # a view of the scores
        (MASK + "        att = att.view(b, self.heads, n)\n" + SOFTMAX, OUTPUT, "viewed"),
        # a softmax over the heads
        (MASK + "        probs = att.softmax(dim=1)\n", OUTPUT, "single-query scores"),
        # a product with V that is no single-query einsum
        (MASK + SOFTMAX, "(probs.unsqueeze(-2) @ v).squeeze(-2)", "`.unsqueeze()` is applied to the probabilities"),
        (MASK + SOFTMAX, 'torch.einsum("bhl,blhd->bld", probs, v.transpose(1, 2))', "not an einsum summing"),
    ],
)
def test_look_alikes_are_refused(steps: str, product: str, detail: str) -> None:
    result = port(steps, product)
    assert result.status is Status.REFUSED, result.source
    assert detail in " ".join(result.reasons), result.reasons


def test_the_interface_style_refuses_a_query_without_a_length_axis() -> None:
    result = port_source(POOLING.format(steps=(MASK + SOFTMAX).rstrip("\n"), product=OUTPUT), style="interface",
                         filename="modeling_m.py")
    assert result.status is Status.REFUSED
    assert "the einsum's query has no length axis" in " ".join(result.reasons), result.reasons
