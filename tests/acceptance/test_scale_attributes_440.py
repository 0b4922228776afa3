"""Scales `__init__` builds (tests/unit/test_scale_attributes.py), ported and run inside transformers 4.40.2: the
port's SDPA outputs equal the eager ones, and a port whose scale is halved fails parity (the weights are sharpened,
so the scores are far from uniform and a wrong scale shows)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.tf440

# a vision tower's attention written as timm and LAVIS write it, in a small model of the transformers kind;
# `{init}` builds `self.scale` from `dim`, `num_heads` and `qk_scale`
SOURCE = '''
import torch
from torch import nn

from ...configuration_utils import PretrainedConfig
from ...modeling_outputs import BaseModelOutput
from ...modeling_utils import PreTrainedModel


class TinyScaledConfig(PretrainedConfig):
    model_type = "tiny_scaled"

    def __init__(self, vocab_size=99, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, qk_scale=None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.qk_scale = qk_scale
        super().__init__(**kwargs)


class TinyScaledAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_scale=None, attn_drop=0.0):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
{init}
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, attention_mask=None):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        if attention_mask is not None:
            attn = attn + attention_mask
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class TinyScaledLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyScaledAttention(
            config.hidden_size, num_heads=config.num_attention_heads, qkv_bias=True, qk_scale=config.qk_scale
        )
        self.norm = nn.LayerNorm(config.hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        return self.norm(hidden_states + self.attention(hidden_states, attention_mask))


class TinyScaledPreTrainedModel(PreTrainedModel):
    config_class = TinyScaledConfig
    base_model_prefix = "scaled"


class TinyScaledModel(TinyScaledPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyScaledLayer(config) for _ in range(config.num_hidden_layers)])
        self.post_init()

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        extended_attention_mask = self.get_extended_attention_mask(attention_mask, input_ids.shape)
        hidden_states = self.embed(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, extended_attention_mask)
        return BaseModelOutput(last_hidden_state=hidden_states)
'''

NUMBER = "scale=self.scale"  # the scale SDPA is given
QUERY = "sdpa_query = q * self.scale"  # the query scaled instead
INITS = {
    "or": ("self.scale = qk_scale or head_dim ** -0.5", NUMBER),
    "test": ("self.scale = qk_scale if qk_scale is not None else head_dim ** -0.5", NUMBER),
    "branches": ("if qk_scale is None:\n    self.scale = head_dim ** -0.5\nelse:\n    self.scale = float(qk_scale)", NUMBER),
    "buffer": ('self.register_buffer("scale", torch.tensor(head_dim ** -0.5), persistent=False)', NUMBER),
    "learnt": ("self.scale = nn.Parameter(torch.tensor(head_dim ** -0.5))", QUERY),
}
# `qk_scale` given (a number other than head_dim ** -0.5), and left None
OVERRIDES = {"given": {"qk_scale": 0.7}, "default": {}}


def _source(init: str) -> str:
    return SOURCE.format(init="\n".join(" " * 8 + line for line in init.splitlines()))


def _checks(original_source: str, ported_source: str, overrides: dict, padding: str, directory: Path) -> list:  # type: ignore[type-arg]
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_source_in_package

    package = "transformers.models.gpt2"  # any package two levels below transformers resolves `...` imports
    original = load_source_in_package(original_source, package, directory, "modeling_tiny_scaled")
    ported = load_source_in_package(ported_source, package, directory, "modeling_tiny_scaled_port")
    config = original.TinyScaledConfig(**overrides)
    side = "right" if padding == "padded" else "none"
    return parity.check_forward(original.TinyScaledModel, ported.TinyScaledModel, config, side, kind="encoder")


def _port(init: str) -> tuple[str, str]:
    from sdpa_port import Status, Style, port_source

    source = _source(init)
    result = port_source(source, filename="modeling_tiny_scaled.py", style=Style.CLASS)
    assert result.status is Status.PORTED, result.reasons
    return source, result.source


@pytest.mark.parametrize("padding", ["padded", "none"])
@pytest.mark.parametrize("overrides", OVERRIDES.values(), ids=OVERRIDES.keys())
@pytest.mark.parametrize("kind", INITS)
def test_a_scale_built_in_init_ports_exactly(kind: str, overrides: dict, padding: str, tmp_path: Path) -> None:
    init, written = INITS[kind]
    source, ported = _port(init)
    assert ported.count(written) == 1, ported
    checks = _checks(source, ported, overrides, padding, tmp_path)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("overrides", OVERRIDES.values(), ids=OVERRIDES.keys())
@pytest.mark.parametrize("kind", INITS)
def test_a_halved_scale_fails_parity(kind: str, overrides: dict, tmp_path: Path) -> None:
    init, written = INITS[kind]
    source, ported = _port(init)
    checks = _checks(source, ported.replace(written, f"{written} * 0.5"), overrides, "padded", tmp_path)
    assert any(c.name.endswith("sdpa == eager") and not c.passed for c in checks), [str(c) for c in checks]
