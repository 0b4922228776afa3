"""Reads of the scores' or probabilities' dtype beside the chain: kept, pointed at the query SDPA is handed.

Before:

    probs = probs.softmax(-1)
    kind = probs.type()
    out = probs @ v

After (SDPA returns no probabilities; their dtype is the query's):

    kind = q.type()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, ...)
"""

from __future__ import annotations

import pytest

from sdpa_port import Status, port_source

ATTENTION = '''
import math

import torch
from torch import nn


class TinyAttention(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1)
        {read}
        out = (probs @ v).transpose(1, 2).reshape(b, n, c)
        return out
'''


@pytest.mark.parametrize(
    "read,kept",
    [
        # the name of the dtype, a string (MGLM keeps it in a name nothing reads)
        ("kind = probs.type()", "kind = q.type()"),
        ("kind = scores.type()", "kind = q.type()"),
        ("kind = probs.dtype", "kind = q.dtype"),
    ],
)
def test_dtype_reads_are_kept_on_the_query(read: str, kept: str) -> None:
    result = port_source(ATTENTION.format(read=read), filename="modeling_tiny.py", style="inline")
    assert result.status is Status.PORTED, result.reasons
    assert kept in result.source
    assert "scaled_dot_product_attention(" in result.source


@pytest.mark.parametrize(
    "read,code",
    [
        # `.type(dtype)` casts: the probabilities changed into a name the product never reads
        ("other = probs.type(torch.float16)", "S104"),
        # a size of the probabilities is not read off the operands here
        ("width = probs.size(-1)", "S101"),
    ],
)
def test_other_reads_of_the_probabilities_still_refuse(read: str, code: str) -> None:
    result = port_source(ATTENTION.format(read=read), filename="modeling_tiny.py", style="inline")
    assert result.status is Status.REFUSED, result.source
    assert any(f"[{code}]" in reason for reason in result.reasons), result.reasons
