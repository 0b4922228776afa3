"""A caller's tensor added to the scores reaches SDPA in the query's dtype where its dtype is not proven
(`rewrite/term_dtype.py`); a term cast to the scores, or read from no parameter, reaches it as it is."""

from __future__ import annotations

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.result import Style
from sdpa_port.rewrite.term_dtype import bound_from
from helpers import flat

ATTENTION = '''
import math

import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.bias = nn.Parameter(torch.zeros(heads, 1, 1))

    def forward(self, x, {params}):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        {prelude}
        attn = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        {added}
        attn = attn.softmax(dim=-1)
        out = torch.matmul(attn, v)
        return out.transpose(1, 2).reshape(b, n, c)
'''


def ported(params: str, added: str, prelude: str = "pass") -> str:
    source = ATTENTION.format(params=params, added=added, prelude=prelude)
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert result.status is Status.PORTED and result.style is Style.INLINE, result.reasons
    return flat(result.source)


def test_optional_term_is_converted_where_it_is_not_none():
    out = ported("mask=None", "if mask is not None:\n            attn = attn + mask")
    assert "if mask is not None:\n            sdpa_mask = mask.to(q.dtype)" in out
    assert "attn_mask=sdpa_mask" in out


def test_term_always_added_is_converted():
    out = ported("mask", "attn = attn + mask")
    assert "attn_mask=mask.to(q.dtype)" in out


def test_term_bound_from_a_parameter_is_converted():
    out = ported("key_mask", "attn = attn + bias", prelude="bias = key_mask[:, None, None, :]")
    assert "attn_mask=bias.to(q.dtype)" in out


def test_term_beside_a_module_bias_is_converted_alone():
    out = ported("mask", "attn = attn + self.bias + mask")
    assert "attn_mask=self.bias + mask.to(q.dtype)" in out


@pytest.mark.parametrize(
    ("cast", "handed"), [("mask.type_as(attn)", "mask.type_as(q)"), ("mask.to(attn.dtype)", "mask.to(q.dtype)")]
)
def test_term_cast_to_the_scores_is_handed_as_it_is(cast, handed):
    out = ported("mask", f"attn = attn + {cast}")
    assert f"attn_mask={handed}," in out


def test_term_of_the_module_itself_is_handed_as_it_is():
    # the module's own parameter follows the model's dtype; `n` is a size read from a parameter, no tensor
    out = ported("mask=None", "attn = attn + self.bias[:, :n, :n]")
    assert "attn_mask=self.bias[:, :n, :n]" in out
    assert ".to(" not in out


@pytest.mark.parametrize(
    ("statement", "bound"),
    [
        ("m = mask[:, None]", {"m"}),
        ("m, n = mask.unbind(0)", {"m", "n"}),
        ("m += mask", {"m"}),
        ("b, n, c = mask.shape", set()),
        ("n = mask.size(-1)", set()),
        ("m = other", set()),
        ("m[0] = mask", set()),
    ],
)
def test_names_bound_from_an_unproven_name(statement, bound):
    small = cst.parse_statement(statement)
    assert isinstance(small, cst.SimpleStatementLine)
    assert bound_from(small.body[0], {"mask"}) == bound


NUMBER_AS_TENSOR = "torch.atleast_2d(torch.as_tensor({term}, dtype=q.dtype, device=q.device))"


@pytest.mark.parametrize(
    ("prelude", "added", "term"),
    [
        # a number on one side of a conditional: bound to a name, or added as it stands
        ("bias = 0.0 if mask is None else mask", "attn = attn + bias", "bias"),
        ("pass", "attn = attn + (0.0 if mask is None else mask)", "0.0 if mask is None else mask"),
        ("bias = mask if mask is not None else 0", "attn = attn + bias", "bias"),
        ("bias = mask or 0.0", "attn = attn + bias", "bias"),
        # a module's own term that is a number when the module has none
        ("bias = 0.0 if self.bias is None else self.bias", "attn = attn + bias", "bias"),
    ],
)
def test_a_term_that_may_be_a_number_reaches_sdpa_as_a_tensor(prelude, added, term):
    """SDPA takes no number as its mask (nor a tensor of no dimensions): `attn_mask=bias` raised where eager added
    0.0 to every score."""
    out = ported("mask=None", added, prelude=prelude)
    assert f"attn_mask={NUMBER_AS_TENSOR.format(term=term)}" in out


def test_a_number_term_joining_a_tensor_mask_goes_as_it_is():
    """Added after a term that is always a tensor, a number only shifts that tensor: no conversion is written (the
    relative terms of XLNet and Funnel join their masks so)."""
    out = ported(
        "mask=None",
        "attn = attn + self.bias\n        attn = attn + extra",
        prelude="extra = 0.0 if self.bias is None else self.bias",
    )
    assert "attn_mask=self.bias + extra," in out
    assert "as_tensor" not in out


def test_a_callers_number_term_joining_a_tensor_mask_is_converted():
    """A caller's term that may be a number is converted even beside a tensor: `.to` of it would fail, and as a
    tensor it joins in the query's dtype as the caller's tensors do."""
    out = ported("mask=None", "attn = attn + self.bias + bias", prelude="bias = 0.0 if mask is None else mask")
    assert f"attn_mask=self.bias + {NUMBER_AS_TENSOR.format(term='bias')}," in out
