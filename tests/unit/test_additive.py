"""Which helpers only add to the scores they are given (analyse/additive.py): valid and invalid examples."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port.analyse.additive import Additive, additive_in


def helper(text: str) -> cst.FunctionDef:
    node = cst.parse_module(textwrap.dedent(text)).body[0]
    assert isinstance(node, cst.FunctionDef)
    return node


ADDITIVE = [
    (  # decomposed relative positions: regrouped, two terms added, viewed back
        """
        def add_rel(attn, q, rel_h, rel_w, size):
            '''Docstring.'''
            h, w = size
            b, _, d = q.shape
            r_q = q.reshape(b, h, w, d)
            rh = torch.einsum("bhwc,hkc->bhwk", r_q, rel_h)
            rw = torch.einsum("bhwc,wkc->bhwk", r_q, rel_w)
            attn = attn.view(b, h, w, h, w) + rh[:, :, :, :, None] + rw[:, :, :, None, :]
            return attn.view(b, h * w, h * w)
        """,
        Additive(3, True),
    ),
    (  # reads of the scores' shape, and a view back to their own shape
        """
        def add_head_bias(scores, bias):
            shape = scores.shape
            heads = bias.shape[0]
            scores = scores.view(-1, heads, scores.size(-2), shape[-1]) + bias[None, :, None, None]
            return scores.view(shape)
        """,
        Additive(None, False),
    ),
    (  # a term subtracted, the scores on the right of an addition, a contiguous copy
        """
        def shift(scores, a, b):
            scores = a + scores
            return (scores - b).contiguous()
        """,
        Additive(None, False),
    ),
    (  # decomposed relative positions added to a slice in place (MViT, ViTDet): past a class token
        """
        def add_rel(attn, q, rel_h, rel_w, q_shape, k_shape, has_cls):
            sp = 1 if has_cls else 0
            q_h, q_w = q_shape
            k_h, k_w = k_shape
            B, n_head, q_N, dim = q.shape
            dist = torch.arange(q_h)[:, None] - torch.arange(k_h)[None, :]
            dist += k_h - 1
            attn[:, :, sp:, sp:] = (
                attn[:, :, sp:, sp:].view(B, -1, q_h, q_w, k_h, k_w)
                + rel_h[:, :, :, :, :, None] + rel_w[:, :, :, :, None, :]).view(B, -1, q_h * q_w, k_h * k_w)

            return attn
        """,
        Additive(None, False, in_place=True),
    ),
    (  # terms added in place, to the whole and to a slice
        """
        def shift(s, a, b):
            s += a
            s[..., 1:] -= b[..., 1:]
            return s
        """,
        Additive(None, False, in_place=True),
    ),
]

NOT_ADDITIVE = [
    ("def f(s, x):\n    return s * x\n", "scaled"),
    ("def f(s, x):\n    return s + s\n", "the scores twice"),
    ("def f(s, x):\n    s *= x\n    return s\n", "scaled in place"),
    ("def f(s, x):\n    s[:, 1:] = s[:, 1:] * x\n    return s\n", "a slice scaled"),
    ("def f(s, x):\n    s[:, 1:] = s[:, :-1] + x\n    return s\n", "another slice added"),
    ("def f(s, x):\n    s[:, 1:] = s[:, 1:] + s[:, :1]\n    return s\n", "a slice's term reads the scores"),
    ("def f(s, x, i):\n    s[i] = s[i] + x\n    return s\n", "an index that may be a tensor"),
    ("def f(s, x):\n    s[: s.sum()] += x\n    return s\n", "a slice bound read from the scores"),
    ("def f(s, x, g):\n    s[: g()] = s[: g()] + x\n    return s\n", "a slice bound that calls"),
    ("def f(s, x):\n    t = s.contiguous()\n    t[:, 1:] += x\n    return s\n", "a view changed in place"),
    ("def f(s, x):\n    t = s + 0\n    s += x\n    return t\n", "changed while another name holds it"),
    ("def f(s, x):\n    s = s.view(-1)\n    s[1:] += x\n    return s\n", "rebound, then changed"),
    ("def f(s, x):\n    s[:, 1:] = x\n    return s\n", "a slice replaced"),
    ("def f(s, x):\n    if x is not None:\n        s = s + x\n    return s\n", "under a condition"),
    ("def f(s, x):\n    y = s + x\n    return x\n", "returns something else"),
    ("def f(s, x):\n    return x - s\n", "the scores negated"),
    ("def f(s, x):\n    return s.view(s.sum(), -1) + x\n", "a view sized by the scores' values"),
    ("def f(s, x):\n    return s.masked_fill(x, 0.0)\n", "a fill"),
    ("def f(s, x):\n    s = x\n    return s + 1\n", "the scores rebound first"),
    ("def f(s, x):\n    print(s)\n    return s + x\n", "read by another statement"),
]


@pytest.mark.parametrize("text,expected", ADDITIVE)
def test_additive_helpers(text: str, expected: Additive) -> None:
    function = helper(text)
    parameter = function.params.params[0].name.value
    assert additive_in(function, parameter) == expected


@pytest.mark.parametrize("text,why", NOT_ADDITIVE, ids=[why for _, why in NOT_ADDITIVE])
def test_helpers_that_do_more_than_add(text: str, why: str) -> None:
    assert additive_in(helper(text), "s") is None
