"""Masking fills on 0/1 tensors of any dtype keep their comparison (`analyse/booleans.py`); without torch.

`torch.where` takes only boolean conditions: `masked_fill(mask == 0, f)` keeps the scores where `mask != 0`, which
is `mask` itself only for a boolean `mask`.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.booleans import BooleanReader, zero_one_threshold
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.module_facts import Binding
from sdpa_port.analyse.names import ImportMap

TEMPLATE = '''\
import math

import torch
from torch import nn

from transformers.modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
{init}

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        batch, length, _ = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(batch, length, 3, self.heads, self.head_size).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
{body}
        probs = scores.softmax(dim=-1)
        context = torch.matmul(probs, v).transpose(1, 2).reshape(batch, length, -1)
        return (context, probs) if output_attentions else (context,)


class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyAttention(config)

    def forward(self, hidden_states, attention_mask=None):
        return hidden_states + self.attention(hidden_states, attention_mask)[0]


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"


class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.layers = nn.ModuleList([TinyLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states, attention_mask=None):
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask)
        return hidden_states
'''

FLOAT_BUFFER = 'self.register_buffer("bias", torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64), persistent=False)'
BOOL_BUFFER = 'self.register_buffer("bias", torch.tril(torch.ones(64, 64, dtype=torch.bool))[None, None])'
UINT8_BUFFER = 'self.register_buffer("bias", torch.tril(torch.ones((64, 64), dtype=torch.uint8))[None, None])'
LOCAL_LONG = 'bias = torch.tril(torch.ones(64, 64, dtype=torch.long))\nself.register_buffer("bias", bias[None, None])'
CAUSAL = "causal = self.bias[:, :, :length, :length]\n"
FILL = "torch.finfo(scores.dtype).min"


def _file(init: str, body: str) -> str:
    return TEMPLATE.format(
        init=textwrap.indent(init, " " * 8) if init else "",
        body=textwrap.indent(textwrap.dedent(body).strip(), " " * 8),
    )


def _where_conditions(init: str, body: str) -> list[str]:
    """The first argument of every `torch.where` the SDPA class builds its mask with."""
    result = port_source(_file(init, body), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    sdpa = cst.parse_module(result.source[result.source.index("class TinySdpaAttention") :])
    out: list[str] = []

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if code(node.func) == "torch.where":
                out.append(code(node.args[0].value))

    sdpa.visit(Calls())
    return out


@pytest.mark.parametrize(
    "init,body,condition",
    [
        # a float triangle compared with 0: the kept side compares too
        (FLOAT_BUFFER, CAUSAL + f"scores = scores.masked_fill(causal == 0, {FILL})", "causal != 0"),
        # a boolean triangle is its own kept side
        (BOOL_BUFFER, CAUSAL + f"scores = scores.masked_fill(causal == 0, {FILL})", "causal"),
        (BOOL_BUFFER, CAUSAL + f"scores = scores.masked_fill(~causal, {FILL})", "causal"),
        (BOOL_BUFFER, CAUSAL + f"scores = scores.masked_fill(causal.logical_not(), {FILL})", "causal"),
        # a buffer built in a local of __init__, of integers
        (LOCAL_LONG, CAUSAL + f"scores = scores.masked_fill(causal.eq(0), {FILL})", "causal != 0"),
        # a 0/1 triangle below one half is where it is 0; above, where it keeps
        (UINT8_BUFFER, CAUSAL + f"scores = scores.masked_fill(causal < 0.5, {FILL})", "causal != 0"),
        (UINT8_BUFFER, CAUSAL + f"scores = torch.where(causal > 0.5, scores, {FILL})", "causal != 0"),
        # a padding mask parameter of unknown dtype
        ("", f"scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, {FILL})",
         "attention_mask[:, None, None, :] != 0"),
        ("", f"scores = scores.masked_fill(torch.eq(attention_mask, 0), {FILL})", "attention_mask != 0"),
        ("", f"scores = scores.masked_fill(torch.logical_not(attention_mask), {FILL})", "attention_mask != 0"),
        # a comparison that is not a negation stays as written, the fill on its true side
        ("", f"scores = scores.masked_fill(attention_mask < 0.5, {FILL})", "attention_mask < 0.5"),
        # a mask made boolean in forward is its own kept side
        ("", f"keep = attention_mask.bool()\nscores = scores.masked_fill(keep == 0, {FILL})", "keep"),
        ("", f"keep = attention_mask > 0\nscores = scores.masked_fill(keep.eq(0), {FILL})", "keep"),
        # ... but not once cast back to numbers
        ("", f"keep = attention_mask.bool().float()\nscores = scores.masked_fill(keep == 0, {FILL})", "keep != 0"),
    ],
)
def test_the_kept_side_is_boolean(init: str, body: str, condition: str) -> None:
    assert condition in _where_conditions(init, body)


class _Scope:
    """What the reader asks of a scope: qualified names, through the file's imports (`torch` only here)."""

    imports = ImportMap.of(cst.parse_module("import torch\n"))

    def qualify(self, node: cst.CSTNode) -> str | None:
        return self.imports.qualify(node)

    def self_attribute(self, name: str) -> cst.BaseExpression | None:
        return None

    def local_value(self, name: str) -> cst.BaseExpression | None:
        return None

    def local_is_scalar(self, name: str) -> bool:
        return False

    def local_is_optional_scalar(self, name: str) -> bool:
        return False

    def self_attribute_values(self, name: str) -> tuple[cst.BaseExpression, ...]:
        return ()

    def self_attribute_bindings(self, name: str) -> tuple[Binding, ...]:
        return ()

    def module_function(self, name: str) -> cst.FunctionDef | None:
        return None

    def class_init(self, name: str) -> cst.FunctionDef | None:
        return None

    def class_methods(self) -> tuple[cst.FunctionDef, ...]:
        return ()


LOCALS = {
    "flags": (cst.parse_expression("mask > 0"),),
    "either": (cst.parse_expression("mask > 0"), cst.parse_expression("mask.float()")),
}
BUFFERS = {
    "tri": (cst.parse_expression("torch.tril(bias)"), {"bias": [cst.parse_expression("torch.ones(4, 4, dtype=torch.bool)")]}),
    # `bias = f(bias)`: the update reads the value before it
    "band": (
        cst.parse_expression("bias"),
        {"bias": [cst.parse_expression("torch.ones(4, 4).bool()"), cst.parse_expression("torch.bitwise_xor(bias, torch.tril(bias, -2))")]},
    ),
    "floats": (cst.parse_expression("torch.tril(torch.ones(4, 4))"), {}),
}


@pytest.mark.parametrize(
    "text,boolean",
    [
        ("mask == 0", True),
        ("mask.bool()", True),
        ("mask.to(torch.bool)", True),
        ("mask.to(hidden.device)", False),
        ("flags[:, None].to(hidden.device)", True),
        ("flags.float()", False),
        ("~flags & (mask != 1)", True),
        ("flags | mask", False),
        ("torch.ones(3, dtype=torch.bool)", True),
        ("torch.full((3,), True)", True),
        ("torch.full((3,), 1.0)", False),
        ("torch.zeros_like(flags)", True),
        ("either", False),  # one path holds floats
        ("self.tri[:, :2]", True),
        ("self.band.view(1, 1, 4, 4)", True),
        ("self.floats", False),
        ("self.unknown", False),
        ("mask", False),
    ],
)
def test_proven_boolean(text: str, boolean: bool) -> None:
    reader = BooleanReader(_Scope(), lambda name: LOCALS.get(name, ()), BUFFERS.get)
    assert reader.is_boolean(cst.parse_expression(text)) is boolean


@pytest.mark.parametrize(
    "text,found",
    [
        ("m != 0", ("m", True)),
        ("m > 0.5", ("m", True)),
        ("m >= 1", ("m", True)),
        ("m == 1", ("m", True)),
        ("m == 0", ("m", False)),
        ("m < 0.5", ("m", False)),
        ("m <= 0", ("m", False)),
        ("m != 1", ("m", False)),
        ("m > 1", None),  # true at neither 0 nor 1
        ("m < 2", None),  # true at both
        ("m < n", None),
    ],
)
def test_zero_one_thresholds(text: str, found: tuple[str, bool] | None) -> None:
    result = zero_one_threshold(cst.parse_expression(text))
    assert (None if result is None else (code(result[0]), result[1])) == found


def test_a_loosely_binding_operand_is_parenthesised() -> None:
    assert code(BooleanReader(_Scope(), lambda name: (), lambda name: None).kept_where(cst.parse_expression("a if c else b"))) == "(a if c else b) != 0"
