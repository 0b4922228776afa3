"""What a call binds a helper's parameters to holds in the helper: None, or a module of `self` built in `__init__`.

The Annotated Transformer's `attention(query, key, value, mask=None, dropout=None)` applies its `dropout` parameter
under `if dropout is not None:`; each call is read with what it passes there (`analyse/helpers.py`, `BoundFacts`).
"""

from __future__ import annotations

import pytest

from sdpa_port import Status, port_source

SOURCE = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


def attention(query, key, value, mask=None, dropout=None):
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores + mask
    p_attn = F.softmax(scores, dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value)


class TinyAttention(nn.Module):
    def __init__(self, dim, heads=4, rate=0.1):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.drop = {built}
{more}
    def forward(self, x, mask=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = attention(q, k, v, mask{passed})
        return out.transpose(1, 2).reshape(b, n, c)
'''


def source(passed: str, built: str = "nn.Dropout(rate)", more: str = "") -> str:
    return SOURCE.format(passed=passed, built=built, more=more)


def port(text: str):  # type: ignore[no-untyped-def]
    return port_source(text, filename="modeling_tiny.py", style="inline")


def test_a_dropout_module_of_the_class_passed_gives_its_rate() -> None:
    result = port(source(", dropout=self.drop"))
    assert result.status is Status.PORTED, result.reasons
    assert "dropout_p=self.drop.p if self.training else 0.0" in result.source
    assert "p_attn" not in result.source.split("class TinyAttention")[1]


@pytest.mark.parametrize("passed", ["", ", None", ", dropout=None"])
def test_no_dropout_passed_gives_none(passed: str) -> None:
    result = port(source(passed))
    assert result.status is Status.PORTED, result.reasons
    assert "dropout_p" not in result.source


def test_a_module_of_none_or_a_dropout_reads_its_rate_where_it_is_one() -> None:
    result = port(source(", dropout=self.drop", built="nn.Dropout(rate) if rate > 0 else None"))
    assert result.status is Status.PORTED, result.reasons
    assert "dropout_p=(self.drop.p if self.drop is not None else 0.0) if self.training else 0.0" in result.source


@pytest.mark.parametrize(
    "passed, built, more",
    [
        # a function, not a module of the class: its rate and when it runs are not followed
        (", dropout=F.dropout", "nn.Dropout(rate)", ""),
        # a module of the class that is not a dropout
        (", dropout=self.drop", "nn.LayerNorm(dim)", ""),
        # the attribute bound again outside `__init__`
        (", dropout=self.drop", "nn.Dropout(rate)",
            "\n    def set_rate(self, rate):\n        self.drop = nn.Dropout(rate)\n"),
    ],
    ids=["function", "not-a-dropout", "bound-elsewhere"],
)
def test_anything_else_passed_is_refused(passed: str, built: str, more: str) -> None:
    result = port(source(passed, built=built, more=more))
    assert result.status is Status.REFUSED, result.source
    assert [r.code.code for r in result.refusals] == ["S101"], result.reasons
    assert "are passed to `dropout`" in result.reasons[0]


SPLIT = '''
import math

import torch
from torch import nn


class TinyAttention(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3)

    def _split_heads(self, x, is_key=False):
        x = x.reshape(x.size(0), x.size(1), self.heads, self.head_dim)
        x = x.permute(0, 2, 3, 1) if is_key else x.permute(0, 2, 1, 3)
        return x

    def _attn(self, query, key, value):
        scores = torch.matmul(query, key) / math.sqrt(query.size(-1))
        return torch.matmul(scores.softmax(dim=-1), value)

    def forward(self, x):
        q, k, v = torch.split(self.qkv(x), x.size(-1), dim=2)
        out = self._attn(self._split_heads(q), self._split_heads(k, is_key={flag}), self._split_heads(v))
        return out.transpose(1, 2).flatten(2)
'''


def test_a_key_a_split_helper_returns_through_a_local_on_a_flag_is_transposed() -> None:
    """`x = x.permute(0, 2, 3, 1) if is_key else ...; return x`, called with `is_key=True`: a key laid out (..., d, s),
    so `query @ key` takes it at any rank (`forms/keys.py`, `_open_returns`)."""
    result = port(SPLIT.format(flag="True"))
    assert result.status is Status.PORTED, result.reasons
    assert "key.transpose(-1, -2)" in result.source


def test_a_split_helper_on_a_flag_the_call_does_not_pass_literally_is_refused() -> None:
    result = port(SPLIT.format(flag="self.training"))
    assert result.status is Status.REFUSED, result.source
    assert [r.code.code for r in result.refusals] == ["S107"], result.reasons
