"""The recogniser skips branches the file decides for certain (`analyse/certain.py`), and so does the SDPA side.

A side of an `if` that can never run (`if False:`, a module constant assigned once to a literal, an attribute
assigned once in the whole file, to a literal, in the constructor of the class or of an in-file base) is not read:
a step SDPA cannot take there (a fused softmax module, a kernel of its own) no longer stops the port, and the port
drops that side. In a module-level function handed the module (`attention_fn(self, ...)`), `self` is the calling
class's instance. Each look-alike leaves the branch possible, and the port is refused as before.
"""

from __future__ import annotations

import pytest

from sdpa_port import Status, port_source

SOURCE = '''
import math

import torch
from torch import nn

USE_FUSED = False
{module}

class FusedSoftmax(nn.Module):
    def forward(self, scores, mask):
        return torch.softmax(scores.tanh(), dim=-1)


def attention_fn(self, q, k, v, mask):
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
    if {test}:
        probs = self.fused_softmax(scores, mask)
    else:
        if mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1)
    return torch.matmul(probs, v)


class TinyAttention(nn.Module):
    def __init__(self, dim, heads{params}):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.fused_softmax = {value}

    def forward(self, x, mask=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = {call}
        return self.proj(out.transpose(1, 2).reshape(b, n, c))
{more}

class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.attn = TinyAttention(dim, heads)

    def forward(self, x):
        return x + self.attn(x)
'''

FUNCTION = "attention_fn(self, q, k, v, mask)"
# the same computation as a method of the class
METHOD = "self.attend(q, k, v, mask)"


def _source(test: str = "self.fused_softmax", value: str = "None", call: str = FUNCTION, module: str = "", more: str = "", params: str = "") -> str:
    return SOURCE.format(test=test, value=value, call=call, module=module, more=more, params=params)


def _port(source: str):  # type: ignore[no-untyped-def]
    return port_source(source, style="inline", filename="modeling_tiny.py")


# each with the condition under which the port falls back to eager: an attribute may still be set from outside the
# file (a hook turned on by other code), a literal or a module constant may not
PORTED = {
    "attribute left None": (_source(), "self.fused_softmax"),
    "attribute left True, negated": (_source(test="not self.fused_softmax", value="True"), "not self.fused_softmax"),
    "attribute compared with None": (_source(test="self.fused_softmax is not None"), "self.fused_softmax is not None"),
    # the live side first: the test holds, and the port falls back where it does not
    "attribute tested for None": (
        _source(test="self.fused_softmax is None").replace(
            "        probs = self.fused_softmax(scores, mask)\n    else:\n        if mask is not None:\n"
            "            scores = scores + mask\n        probs = scores.softmax(dim=-1)\n",
            "        if mask is not None:\n            scores = scores + mask\n        probs = scores.softmax(dim=-1)\n"
            "    else:\n        probs = self.fused_softmax(scores, mask)\n",
        ),
        "not self.fused_softmax is None",
    ),
    "module constant": (_source(test="USE_FUSED"), None),
    "literal": (_source(test="False"), None),
}


@pytest.mark.parametrize("label", list(PORTED))
def test_a_branch_that_cannot_run_is_not_read(label: str) -> None:
    source, fallback = PORTED[label]
    result = _port(source)
    assert result.status is Status.PORTED, result.reasons
    forward = result.source[result.source.index("    def forward(self, x, mask=None):"):]
    sdpa_forward = forward.split("    def _eager_forward")[0]
    assert "scaled_dot_product_attention" in sdpa_forward
    # the port runs the live side alone: the dead side, which read the scores, is gone from the SDPA forward
    assert "self.fused_softmax(" not in sdpa_forward
    if fallback is None:
        assert "_eager_forward" not in result.source
    else:
        assert sdpa_forward.split("\n")[1] == f"        if {fallback}:", sdpa_forward


def test_a_branch_that_cannot_run_in_a_method_is_not_read() -> None:
    source = _source(call=METHOD)
    function = source[source.index("def attention_fn"):source.index("class TinyAttention")].strip()
    method = "\n".join("    " + line if line else line for line in function.replace("attention_fn", "attend").splitlines())
    source = source.replace(function, "").replace("    def forward(self, x, mask=None):", method + "\n\n    def forward(self, x, mask=None):")
    assert "def attend(self" in source and "def attention_fn" not in source
    result = _port(source)
    assert result.status is Status.PORTED, result.reasons
    # the helper written out into forward leaves its dead side behind (the method itself stays, as written)
    forward = result.source[result.source.index("    def forward(self, x, mask=None):"):].split("    def _eager")[0]
    assert "scaled_dot_product_attention" in forward and "self.fused_softmax(" not in forward
    assert "        if self.fused_softmax:\n            # scaled_dot_product_attention" in forward


REFUSED = {
    # the attribute bound twice: in another method (a switch turned on after construction)
    "assigned in another method": _source(
        more="\n    def enable_fused(self):\n        self.fused_softmax = FusedSoftmax()\n"
    ),
    # bound in a subclass's constructor: instances of the subclass run the fused branch
    "assigned in a subclass": _source(
        more=(
            "\n\nclass FusedAttention(TinyAttention):\n    def __init__(self, dim, heads):\n"
            "        super().__init__(dim, heads)\n        self.fused_softmax = FusedSoftmax()\n"
        )
    ),
    # assigned twice in the constructor
    "assigned twice": _source(value="None\n        self.fused_softmax = FusedSoftmax() if dim > 64 else None"),
    # a value that is not a literal: a module, or what the caller passes
    "assigned a module": _source(value="FusedSoftmax()"),
    "assigned a parameter": _source(value="fused_softmax", params=", fused_softmax=None"),
    # set by name, from outside the class's constructor
    "set by setattr": _source(more="\n\ndef enable(module):\n    setattr(module, 'fused_softmax', FusedSoftmax())\n"),
    # a module constant bound again
    "module constant rebound": _source(
        test="USE_FUSED", module="\n\ndef use_fused():\n    global USE_FUSED\n    USE_FUSED = True\n"
    ),
    "module constant assigned twice": _source(test="USE_FUSED", module="USE_FUSED = torch.cuda.is_available()\n"),
    # a test of the call's own arguments
    "a parameter": _source(test="mask is None"),
    # a test reading the module in another form than `self.x`, `not self.x` or one comparison with a literal: not
    # read, since the port's fallback could not name it
    "module constant or attribute": _source(test="USE_FUSED or self.fused_softmax"),
    "attribute compared with an attribute": _source(test="self.fused_softmax == self.heads"),
}


@pytest.mark.parametrize("label", list(REFUSED))
def test_a_branch_that_may_run_still_stops_the_recogniser(label: str) -> None:
    result = _port(REFUSED[label])
    assert result.status is Status.REFUSED, (label, result.status)
    assert any("self.fused_softmax" in reason for reason in result.reasons), result.reasons


def test_a_module_function_not_handed_the_module_reads_no_attribute() -> None:
    """`self` of a module function called without the module is not the class's instance: nothing is certain."""
    source = _source().replace("def attention_fn(self, q, k, v, mask):", "def attention_fn(owner, q, k, v, mask):")
    source = source.replace("math.sqrt(self.head_dim)", "math.sqrt(owner.head_dim)")
    source = source.replace("    if self.fused_softmax:\n        probs = self.fused_softmax(", "    if owner.fused_softmax:\n        probs = owner.fused_softmax(")
    source = source.replace(FUNCTION, "attention_fn(self.proj, q, k, v, mask)")
    result = _port(source)
    assert result.status is not Status.PORTED, result.source


WIRED = '''
import math

import torch
from torch import nn

from ...modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.heads
        self.qkv = nn.Linear(config.hidden_size, config.hidden_size * 3)
        self.fused_softmax = None

    def forward(self, x, attention_mask=None, output_attentions=False):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if self.fused_softmax is not None:
            probs = self.fused_softmax(scores, attention_mask)
        else:
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = scores.softmax(dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, n, c)
        return (out, probs) if output_attentions else (out,)


class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyAttention(config)

    def forward(self, x):
        return x + self.attention(x)[0]


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"


class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.layers = nn.ModuleList([TinyLayer(config) for _ in range(2)])
'''


def test_the_class_style_sdpa_forward_drops_the_side_that_cannot_run() -> None:
    result = port_source(WIRED, filename="modeling_tiny.py")
    assert result.status is Status.PORTED and result.style == "class", result.reasons
    sdpa_class = result.source[result.source.index("class TinySdpaAttention"):]
    sdpa_forward = sdpa_class[: sdpa_class.index("\nclass ")]
    assert "scaled_dot_product_attention" in sdpa_forward and "self.fused_softmax(" not in sdpa_forward
    # the eager class is untouched
    assert "probs = self.fused_softmax(scores, attention_mask)" in result.source
    # other code may still set the attribute: the SDPA class falls back to eager where it is set
    assert "if output_attentions or self.fused_softmax is not None:" in sdpa_forward
    # set again in another method, the branch may run: the SDPA class falls back to eager when the module is set,
    # as for any optional module (`optional_facts.py`)
    switched = WIRED.replace(
        "    def forward(self, x, attention_mask=None, output_attentions=False):",
        "    def fuse(self, module):\n        self.fused_softmax = module\n\n"
        "    def forward(self, x, attention_mask=None, output_attentions=False):",
    )
    result = port_source(switched, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "if output_attentions or self.fused_softmax is not None:" in result.source
