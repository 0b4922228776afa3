"""Forms remote code writes, ported in class style and run inside transformers 4.40.2 with parity to eager.

A small decoder written here, not taken from any package: both products through modules of the file that only
multiply, the key laid out (batch, heads, dim, length) by the permute that splits its heads, a causal fill whose value
a cached helper method returns (GPTBigCode's form), and the padding mask added cast to the scores' type.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.tf440

SOURCE = '''
import math

import torch
from torch import nn

from ...configuration_utils import PretrainedConfig
from ...modeling_outputs import BaseModelOutput
from ...modeling_utils import PreTrainedModel


class TinyRemoteConfig(PretrainedConfig):
    model_type = "tiny_remote"

    def __init__(self, vocab_size=99, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, max_length=64, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.max_length = max_length
        super().__init__(**kwargs)


class MatMul(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


class TinyRemoteAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        n = config.max_length
        self.register_buffer("bias", torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n), persistent=False)
        self.matmul_qk = MatMul()
        self.matmul_av = MatMul()
        self.mask_value = None

    def _get_mask_value(self, device, dtype):
        if self.mask_value is None or self.mask_value.dtype != dtype or self.mask_value.device != device:
            self.mask_value = torch.full([], torch.finfo(dtype).min, dtype=dtype, device=device)
        return self.mask_value

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        batch, length, _ = hidden_states.shape
        q = self.query(hidden_states).view(batch, length, self.heads, self.head_size).permute(0, 2, 1, 3)
        k = self.key(hidden_states).view(batch, length, self.heads, self.head_size).permute(0, 2, 3, 1)
        v = self.value(hidden_states).view(batch, length, self.heads, self.head_size).permute(0, 2, 1, 3)
        scores = self.matmul_qk(q, k) / math.sqrt(self.head_size)
        query_length, key_length = q.size(-2), k.size(-1)
        causal = self.bias[:, :, key_length - query_length : key_length, :key_length]
        mask_value = self._get_mask_value(scores.device, scores.dtype)
        scores = torch.where(causal, scores, mask_value)
        if attention_mask is not None:
            scores = scores + attention_mask.type_as(scores)
        probs = scores.softmax(dim=-1)
        context = self.matmul_av(probs, v)
        context = context.permute(0, 2, 1, 3).reshape(batch, length, -1)
        return (context, probs) if output_attentions else (context,)


class TinyRemoteLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyRemoteAttention(config)
        self.norm = nn.LayerNorm(config.hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        return self.norm(hidden_states + self.attention(hidden_states, attention_mask)[0])


class TinyRemotePreTrainedModel(PreTrainedModel):
    config_class = TinyRemoteConfig
    base_model_prefix = "decoder"


class TinyRemoteModel(TinyRemotePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyRemoteLayer(config) for _ in range(config.num_hidden_layers)])
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


def _loaded(tmp_path: Path):  # type: ignore[no-untyped-def]
    from sdpa_port import Status, Style, port_source
    from sdpa_port.verify.loader import load_in_package

    result = port_source(SOURCE, filename="modeling_tiny_remote.py", style=Style.CLASS)
    assert result.status is Status.PORTED, result.reasons
    package = "transformers.models.gpt2"  # any package two levels below transformers resolves `...` imports
    paths = {}
    for tag, text in (("eager", SOURCE), ("port", result.source)):
        paths[tag] = tmp_path / f"modeling_tiny_remote_{tag}.py"
        paths[tag].write_text(text)
    original = load_in_package(paths["eager"], package, alias=f"tiny_remote_eager_{tmp_path.name}")
    ported = load_in_package(paths["port"], package, alias=f"tiny_remote_port_{tmp_path.name}")
    return original, ported, result.source


@pytest.mark.parametrize("padding", ["padded", "none"])
def test_remote_forms_port_with_parity(tmp_path: Path, padding: str) -> None:
    from sdpa_port.verify import parity

    original, ported, source = _loaded(tmp_path)
    # the forms were read, not left eager: the SDPA call takes the key transposed back and the cast mask
    assert "k.transpose(-1, -2)" in source and "attention_mask.type_as(" in source
    config = original.TinyRemoteModel.config_class()
    side = "left" if padding == "padded" else "none"
    checks = parity.check_forward(original.TinyRemoteModel, ported.TinyRemoteModel, config, side, kind="decoder")
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)
