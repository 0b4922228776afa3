"""Plan-level decisions that guard exactness: which mask helpers may switch, which modules are causal."""

from __future__ import annotations

import textwrap

from sdpa_port import Status, Style, port_source

DECODER = '''
import torch
from torch import nn

from ...modeling_attn_mask_utils import _prepare_4d_causal_attention_mask
from ...modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, is_causal=False):
        super().__init__()
        self.is_causal = is_causal
        self.scaling = (embed_dim // num_heads) ** -0.5

    def forward(self, query, key, value, attention_mask=None, output_attentions=False):
        scores = torch.matmul(query * self.scaling, key.transpose(-1, -2))
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = scores.softmax(-1)
        return torch.matmul(probs, value), probs


TINY_ATTENTION_CLASSES = {"eager": TinyAttention}


class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = TINY_ATTENTION_CLASSES[config._attn_implementation](config.hidden_size, 4{causal})


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"


class TinyModel(TinyPreTrainedModel):
    def forward(self, input_ids, attention_mask=None, head_mask=None, output_attentions=False):
        mask = _prepare_4d_causal_attention_mask(attention_mask, input_ids.shape, input_ids, 0)
        return mask
'''


def test_causal_helper_switches_only_when_causal_layers_are_marked() -> None:
    marked = port_source(DECODER.replace("{causal}", ", is_causal=True"))
    assert marked.status is Status.PORTED
    assert "_prepare_4d_causal_attention_mask_for_sdpa(" in marked.source
    assert "sdpa_is_causal = attention_mask is None and self.is_causal" in marked.source


def test_causal_helper_kept_when_the_flag_stays_false() -> None:
    """BioGPT's shape: causal masks reach a module whose `is_causal` keeps its False default."""
    unmarked = port_source(DECODER.replace("{causal}", ""))
    assert unmarked.status is Status.PORTED
    assert "_prepare_4d_causal_attention_mask_for_sdpa" not in unmarked.source
    assert "self.is_causal" not in unmarked.source.split("class TinySdpaAttention")[1].split("TINY_ATTENTION")[0]
    assert any("causal mask helper is kept" in w for w in unmarked.warnings)


def test_eager_only_switches_fall_back_in_both_styles() -> None:
    """A switch off by default whose branch hands the weights to a hook: the class-style port falls back to eager
    while it is on; the interface style, which has no per-call fallback, refuses (W403)."""
    hooked = DECODER.replace("{causal}", "").replace(
        "        self.scaling = (embed_dim", "        self.save_attention = False\n        self.scaling = (embed_dim"
    ).replace(
        "        probs = scores.softmax(-1)\n",
        "        probs = scores.softmax(-1)\n        if self.save_attention:\n            self.save_map(probs)\n",
    )
    ported = port_source(hooked, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    sdpa_class = ported.source.split("class TinySdpaAttention")[1].split("TINY_ATTENTION")[0]
    fallback = sdpa_class.split("return super().forward")[0]
    assert "self.save_attention" in fallback
    refused = port_source(hooked, style=Style.INTERFACE)
    assert refused.status is Status.REFUSED and "W403" in " ".join(refused.reasons)


def test_a_per_head_factor_multiplies_the_query() -> None:
    """Scores times a parameter of shape (heads, 1, 1) become SDPA on the query times it, with scale=1.0; a factor
    added after the mask would scale the mask too, so that order is refused rather than guessed."""
    per_head = DECODER.replace("{causal}", "").replace(
        "        self.scaling = (embed_dim // num_heads) ** -0.5\n",
        "        self.logit_scale = nn.Parameter(torch.ones((num_heads, 1, 1)))\n",
    )
    scaled = per_head.replace(
        "scores = torch.matmul(query * self.scaling, key.transpose(-1, -2))",
        "scores = torch.matmul(query, key.transpose(-1, -2)) * self.logit_scale.exp()",
    )
    ported = port_source(scaled, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert "sdpa_query = query * self.logit_scale.exp()" in ported.source
    assert "scale=1.0" in ported.source
    late = per_head.replace(
        "scores = torch.matmul(query * self.scaling, key.transpose(-1, -2))",
        "scores = torch.matmul(query, key.transpose(-1, -2))",
    ).replace("        probs = scores.softmax(-1)\n", "        probs = (scores * self.logit_scale).softmax(-1)\n")
    refused = port_source(late, style=Style.CLASS)
    assert refused.status is Status.REFUSED and "S102" in " ".join(refused.reasons)
