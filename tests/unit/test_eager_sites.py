"""The form-free detector: a softmax over a product whose result multiplies a third tensor, however the softmax is
called. Before/after pairs: the site it must name, and look-alikes it must leave alone."""

from __future__ import annotations

import ast
import textwrap

import pytest

from sdpa_port import Status, port_source
from sdpa_port.discover.eager_sites import find_eager_attention

AUTOGRAD_SOFTMAX = '''
import torch
from torch import nn


class MaskedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, mask, dim):
        scores = scores.masked_fill(~mask.bool(), torch.finfo(scores.dtype).min)
        return torch.softmax(scores, dim)


class TinyAttention(nn.Module):
    def forward(self, query, key, value, mask):
        scores = torch.bmm(query, key.transpose(-1, -2))
        probs = MaskedSoftmax.apply(scores, mask, -1)
        return torch.bmm(probs, value)
'''

FUNCTION_WRAPPERS = '''
import torch
from torch import nn


def stable_softmax(x, dim):
    return nn.functional.softmax(x - x.amax(dim, keepdim=True), dim=dim)


def masked_softmax(x, mask):
    return stable_softmax(x + mask, -1)


class TinyAttention(nn.Module):
    def _normalise(self, scores, mask):
        return masked_softmax(scores, mask)

    def forward(self, query, key, value, mask):
        scores = query @ key.transpose(-1, -2)
        return self._normalise(scores, mask) @ value
'''

LOOK_ALIKES = '''
import torch
from torch import nn


def attention(query, key, value):
    return torch.softmax(query @ key.transpose(-1, -2), -1) @ value


class Router(nn.Module):
    def forward(self, hidden, experts):
        mixed = attention(hidden @ experts, hidden, hidden)  # an attention site of its own, not a softmax
        return mixed @ experts
'''


SCORE_HELPER = '''
import torch
from torch import nn


class TinyAttention(nn.Module):
    def _content(self, query, key):
        return torch.matmul(query, key.transpose(-1, -2))

    def _scores(self, query, key):
        return self._content(query, key)

    def forward(self, query, key, value):
        scores = self._scores(query, key)
        kept = scores
        scores /= 2.0
        probs = torch.softmax(scores, dim=-1)
        output = torch.matmul(probs, value)
        kept = torch.softmax(kept, dim=-1)
        return output + torch.matmul(kept, value.flip(-1))
'''

# products written as method calls, the probabilities the receiver (MPT's module function, called through an
# attribute the constructor sets: it was "no eager attention found", exit 0)
METHOD_PRODUCTS = '''
import torch
from torch import nn


def attention_fn(query, key, value, scale):
    weights = query.matmul(key.transpose(-1, -2)) * scale
    weights = torch.softmax(weights, dim=-1)
    return weights.matmul(value)


class TinyAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_fn = attention_fn

    def forward(self, query, key, value):
        return self.attn_fn(query, key, value, 0.125)
'''


def _sites(source: str) -> list[tuple[str, int]]:
    return [(site.where, site.line) for site in find_eager_attention(ast.parse(textwrap.dedent(source)))]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(AUTOGRAD_SOFTMAX, [("TinyAttention.forward", 16)], id="autograd-function-apply"),
        pytest.param(FUNCTION_WRAPPERS, [("TinyAttention.forward", 20)], id="wrapper-of-a-wrapper-through-a-method"),
        pytest.param(LOOK_ALIKES, [("attention", 7)], id="an-attention-function-is-no-softmax"),
        # scores a helper of a helper returns are scores (fuzz seed 213575: a chain from a helper's scores poisoned
        # before its product with V was "no eager attention found", exit 0)
        pytest.param(SCORE_HELPER, [("TinyAttention.forward", 17)], id="scores-from-a-helper-of-a-helper"),
        pytest.param(METHOD_PRODUCTS, [("attention_fn", 8)], id="method-call-products"),
    ],
)
def test_softmax_wrappers_are_softmaxes(source: str, expected: list[tuple[str, int]]) -> None:
    assert _sites(source) == expected


@pytest.mark.parametrize(
    ("source", "code"),
    [
        # recognised since (the wrapper is read as what it computes); the class style refuses it because no class here
        # builds it (`--style auto` ports it in place: test_inline_style)
        (AUTOGRAD_SOFTMAX, "W407"),
        (FUNCTION_WRAPPERS, "F601"),  # the recogniser does not read wrappers of wrappers
        (SCORE_HELPER, "S109"),  # the recogniser reads the helper's scores (two attentions here)
    ],
    ids=["autograd", "wrappers", "score-helper"],
)
def test_a_wrapped_softmax_is_refused_not_reported_as_no_attention(source: str, code: str) -> None:
    """The miss DeBERTa and SEW-D had: attention through a masked-softmax autograd Function was `nothing to port`."""
    result = port_source(textwrap.dedent(source), filename="modeling_tiny.py", style="class")
    assert result.status is Status.REFUSED, result
    assert [refusal.code.value[0] for refusal in result.refusals] == [code]


LAYOUT_UNREAD = '''
import torch
from torch import nn


class TinyAttention(nn.Module):
    def forward(self, query, key, value):
        scores = torch.einsum("...qd,...kd->...qk", query, key)
        probs = scores.softmax(dim=-1)
        return torch.einsum("...qk,...kd->...qd", probs, value)
'''

UNTRANSPOSED = '''
import torch
from torch import nn


class TinyAttention(nn.Module):
    def forward(self, query, key, value):
        scores = torch.matmul(query, key)
        probs = nn.functional.softmax(scores, dim=-1).type(query.dtype)
        return torch.matmul(probs, value)
'''


@pytest.mark.parametrize(
    ("source", "stops"),
    [
        # a softmax over an einsum the recogniser does not read as a query-key product
        (
            LAYOUT_UNREAD,
            "the recogniser stops at line 9: the attention scores come from `scores` "
            "(`torch.einsum(\"...qd,...kd->...qk\", query, key)`, line 8, an einsum the tool does not read as a "
            "query-key product), not from a recognised",
        ),
        (FUNCTION_WRAPPERS, "the recogniser stops at line 20: the scores are passed to `self._normalise` (S101)"),
        (UNTRANSPOSED, "the recogniser reads no query-key product there"),
    ],
    ids=["layout", "wrappers", "no-product"],
)
def test_the_refusal_names_where_the_reading_stops(source: str, stops: str) -> None:
    """F601 names the operation the recogniser gave up at (with its own code), not only that a form was missed."""
    result = port_source(textwrap.dedent(source), filename="modeling_tiny.py")
    assert [refusal.code.value[0] for refusal in result.refusals] == ["F601"], result.reasons
    assert stops in result.reasons[0], result.reasons


SOFTMAX_MODULE = '''
import math

import torch
from torch import nn


def attention_mask_func(scores, mask):
    return scores.masked_fill(mask, -10000.0)


class FusedScaleMaskSoftmax(nn.Module):
    def __init__(self, mask_func, scale=None):
        super().__init__()
        self.mask_func = mask_func
        self.scale = scale

    def forward(self, scores, mask):
        if self.scale is not None:
            scores = scores * self.scale
        return torch.nn.functional.softmax(self.mask_func(scores, mask), dim=-1)


class TinyAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.scale_mask_softmax = FusedScaleMaskSoftmax(attention_mask_func, 2.0)

    def forward(self, x, mask):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(c // self.heads)
        probs = self.scale_mask_softmax(scores, mask)
        return torch.matmul(probs, v).transpose(1, 2).reshape(b, n, c)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.attn = TinyAttention(dim, heads)
'''


def test_a_softmax_module_of_the_file_is_named_not_read() -> None:
    """Megatron's `FusedScaleMaskSoftmax`, a module of the file called as `self.scale_mask_softmax(scores, mask)`:
    the tool reads no module's computation, so the file is refused naming the module, not reported as having no
    attention."""
    sites = find_eager_attention(ast.parse(SOFTMAX_MODULE))
    assert [(site.where, site.line) for site in sites] == [("TinyAttention.forward", 35)]
    result = port_source(SOFTMAX_MODULE, filename="modeling_tiny.py", style="inline")
    assert result.status is Status.REFUSED
    assert result.reasons == (
        "TinyAttention.forward (line 35): eager attention (a softmax over a product of two tensors, multiplied by a "
        "third) in a form the tool does not recognise; the recogniser stops at line 35: the scores are passed to "
        "`self.scale_mask_softmax`, a `FusedScaleMaskSoftmax` module of this file whose computation the tool does not "
        "read (S101) [F601]",
    )
    # a module of the file that computes no softmax (a scale) holds no softmax: nothing to name
    scaling = SOFTMAX_MODULE.replace("torch.nn.functional.softmax(self.mask_func(scores, mask), dim=-1)", "scores * 2")
    assert find_eager_attention(ast.parse(scaling)) == []


MIXING_MODULE = '''
import torch
from torch import nn


class StreamMixer(nn.Module):
    def __init__(self, streams, width):
        super().__init__()
        self.weights = nn.Linear(streams * width, streams * streams)
        self.streams = streams

    def forward(self, states):
        b, n, s, c = states.shape
        comb = torch.softmax(self.weights(states.reshape(b, n, s * c)).view(b, n, s, s), dim=-1)
        collapsed = states.mean(dim=2)
        return comb, collapsed


class Layer(nn.Module):
    def __init__(self, streams, width):
        super().__init__()
        self.mix = StreamMixer(streams, width)
        self.proj = nn.Linear(width, width)

    def forward(self, states):
        scores = torch.matmul(states, states.transpose(-1, -2))
        comb, collapsed = self.mix(states + scores.mean())
        return torch.matmul(comb.transpose(-1, -2), states) + self.proj(collapsed).unsqueeze(2)
'''


def test_a_module_returning_several_outputs_is_no_softmax_module() -> None:
    """A module whose `forward` calls a softmax but returns several tensors (a hyper-connection's mixing weights and
    its collapsed states) is no softmax module: a product of one of its outputs is no attention."""
    assert find_eager_attention(ast.parse(MIXING_MODULE)) == []
    single = MIXING_MODULE.replace("return comb, collapsed", "return comb").replace(
        "comb, collapsed = self.mix(", "comb = collapsed = self.mix("
    )
    assert [site.where for site in find_eager_attention(ast.parse(single))] == ["Layer.forward"]


FOREIGN_SOFTMAX = '''
import torch
from megatron_util.model.fused_softmax import FusedScaleMaskSoftmax
from torch import nn


class TinyCoreAttention(nn.Module):
    def __init__(self, heads, layer_number):
        super().__init__()
        self.norm_factor = 8.0 ** 0.5
        self.norm_factor *= layer_number
        self.scale_mask_softmax = FusedScaleMaskSoftmax(True, False, None, True, None, True, layer_number)

    def forward(self, query, key, value, mask):
        scores = torch.baddbmm(torch.zeros(1, 1, 1), query, key.transpose(1, 2), beta=0.0, alpha=0.5)
        probs = self.scale_mask_softmax(scores, mask)
        return torch.bmm(probs, value)
'''


def test_a_softmax_module_of_another_package_is_named_not_read() -> None:
    """Megatron's `FusedScaleMaskSoftmax` imported from megatron_util: the file does not show what it computes, so
    the file is refused naming the module, its class and its package, not reported as having no attention."""
    assert [site.where for site in find_eager_attention(ast.parse(FOREIGN_SOFTMAX))] == ["TinyCoreAttention.forward"]
    result = port_source(FOREIGN_SOFTMAX, filename="modeling_tiny.py", style="inline")
    assert result.status is Status.REFUSED
    assert result.reasons == (
        "TinyCoreAttention.forward (line 16): eager attention (a softmax over a product of two tensors, multiplied by a "
        "third) in a form the tool does not recognise; the recogniser stops at line 16: the scores are passed to "
        "`self.scale_mask_softmax`, a `FusedScaleMaskSoftmax` module of `megatron_util.model.fused_softmax`, another "
        "package, whose computation this file does not show (S101) [F601]",
    )
    # where the reading stops earlier (a scale it cannot prove a number), the module is named after that reason
    scaled = FOREIGN_SOFTMAX.replace("alpha=0.5)", "alpha=1.0 / self.norm_factor)")
    (reason,) = port_source(scaled, filename="modeling_tiny.py", style="inline").reasons
    assert reason.endswith(
        "(S102); its softmax is `self.scale_mask_softmax`, a `FusedScaleMaskSoftmax` module of "
        "`megatron_util.model.fused_softmax`, another package, whose computation this file does not show [F601]"
    ), reason
    # a class of another package with no softmax in its name is no softmax: nothing to name
    kernel = FOREIGN_SOFTMAX.replace("FusedScaleMaskSoftmax", "FusedScaleMaskKernel")
    assert find_eager_attention(ast.parse(kernel)) == []
    # a file beside this one (I-BERT's `from .quant_modules import IntSoftmax`) is not another package
    sibling = FOREIGN_SOFTMAX.replace("from megatron_util.model.fused_softmax import", "from .fused_softmax import")
    sibling = sibling.replace("scale_mask_softmax", "softmax")  # found by the attribute's name, as I-BERT's is
    (reason,) = port_source(sibling, filename="modeling_tiny.py", style="inline").reasons
    assert "module of `.fused_softmax`, another file of this package, whose computation" in reason, reason
