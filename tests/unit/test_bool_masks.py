"""Masks a model converts to booleans for a masking fill (MPT's form, `plan/bool_masks.py`): the port hands the
builder's mask over as built and the eager function adds it; without torch."""

from __future__ import annotations

import ast

import pytest
from causal_sources import HEADER, replaced, src

from sdpa_port import Status, port_source

SOURCE = HEADER + "\n\n" + src(
    """
    class TinyAttention(nn.Module):
        def __init__(self, config, layer_idx=None):
            super().__init__()
            self.config = config
            self.scale = config.head_dim**-0.5
            self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)

        def forward(self, hidden_states, position_bias, attention_mask=None, **kwargs):
            query, key, value = self.qkv(hidden_states)[:, None].chunk(3, dim=-1)
            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scale
            scores = scores + position_bias
            if attention_mask is not None:
                scores = scores.masked_fill(attention_mask, torch.finfo(query.dtype).min)
            probs = nn.functional.softmax(scores.float(), dim=-1).to(value.dtype)
            return torch.matmul(probs, value)[:, 0], probs


    class TinyBlock(nn.Module):
        def __init__(self, config, layer_idx):
            super().__init__()
            self.attn = TinyAttention(config, layer_idx)

        def forward(self, hidden_states, position_bias, attention_mask=None, **kwargs):
            output, _ = self.attn(hidden_states, position_bias=position_bias, attention_mask=attention_mask, **kwargs)
            return hidden_states + output


    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.blocks = nn.ModuleList([TinyBlock(config, i) for i in range(config.num_hidden_layers)])
            self.alibi = nn.Parameter(torch.zeros(1, 1, 64, 64))

        def forward(self, inputs_embeds, attention_mask=None, **kwargs):
            length = inputs_embeds.shape[1]
            causal_mask = create_causal_mask(
                config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
            ).to(torch.bool)
            hidden_states = inputs_embeds
            for block in self.blocks:
                hidden_states = block(hidden_states, self.alibi[..., :length, :length], attention_mask=causal_mask, **kwargs)
            return hidden_states
    """
)


def _function(source: str, name: str) -> str:
    return next(ast.unparse(n) for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)


def _method(source: str, class_name: str) -> str:
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return ast.unparse(next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "forward"))


def test_the_builders_mask_is_handed_over_as_built_and_added_by_eager() -> None:
    result = port_source(SOURCE, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    model = _method(result.source, "TinyModel")
    assert "create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)\n" in model + "\n"
    assert "torch.bool" not in model
    eager = _function(result.source, "eager_attention_forward")
    assert "scores = scores + attention_mask" in eager and "masked_fill" not in eager
    attention = _method(result.source, "TinyAttention")
    assert "masked_fill" not in attention.split("if kwargs.get('output_attentions', False)")[0]
    assert "self.is_causal = True" in result.source  # the builder is causal: SDPA's is_causal where it gives None
    assert any("handed over as built" in note for note in result.notes), result.notes


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        # a fill that does not absorb like the builder's finfo.min: adding would differ
        (
            "            scores = scores.masked_fill(attention_mask, torch.finfo(query.dtype).min)\n",
            "            scores = scores.masked_fill(attention_mask, -10000.0)\n",
            "not filled with `torch.finfo(...).min`",
        ),
        # the block reads the converted mask itself: it would see the builder's float mask
        (
            "        output, _ = self.attn(",
            "        hidden_states = hidden_states * attention_mask.any()\n        output, _ = self.attn(",
            "other than by handing it on",
        ),
        # the fill under a switch of the module: the implementations would get the mask whenever it is given
        (
            "        if attention_mask is not None:\n            scores = scores.masked_fill(",
            "        if attention_mask is not None and self.config.use_mask:\n            scores = scores.masked_fill(",
            "only under a condition",
        ),
        # the attention reads the mask beyond the fill
        (
            "        query, key, value = self.qkv(",
            "        hidden_states = hidden_states * attention_mask.any()\n        query, key, value = self.qkv(",
            "read other than by the fill",
        ),
    ],
)
def test_anything_beyond_the_conversion_and_the_fill_stays_refused(old: str, new: str, why: str) -> None:
    result = port_source(replaced(SOURCE, old, new), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result.detail
    assert result.refusals[0].code.code == "M203" and why in result.refusals[0].detail, result.refusals


def test_a_mask_that_is_not_converted_keeps_m203() -> None:
    source = replaced(SOURCE, "        ).to(torch.bool)\n", "        )\n")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and result.refusals[0].code.code == "M203", result.reasons
