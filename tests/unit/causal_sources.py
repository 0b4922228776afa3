"""Small modeling files for the tests of `is_causal` per construction: one attention class built by an encoder
layer, a decoder layer and the decoder's cross-attention (SEQ2SEQ), and one site receiving both kinds of mask
(RUNTIME_FLAG)."""

from __future__ import annotations

import textwrap


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


HEADER = src(
    """
    import torch
    from torch import nn

    from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
    from transformers.modeling_utils import PreTrainedModel
    """
)

ATTENTION = src(
    """
    class TinyAttention(nn.Module):
        def __init__(self, config, layer_idx=None):
            super().__init__()
            self.scaling = config.head_dim**-0.5
            self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)

        def forward(self, hidden_states, key_value_states=None, attention_mask=None, **kwargs):
            states = hidden_states if key_value_states is None else key_value_states
            query = self.q_proj(hidden_states)[:, None]
            key = self.k_proj(states)[:, None]
            value = self.v_proj(states)[:, None]
            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = scores.softmax(dim=-1)
            return torch.matmul(probs, value)[:, 0]
    """
)

# one attention class built by an encoder layer, a decoder layer, and the decoder's cross-attention
SEQ2SEQ = (
    HEADER
    + "\n\n"
    + ATTENTION
    + "\n\n"
    + src(
        """
    class TinyEncoderLayer(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.self_attn = TinyAttention(config)

        def forward(self, hidden_states, attention_mask):
            return self.self_attn(hidden_states, attention_mask=attention_mask)


    class TinyDecoderLayer(nn.Module):
        def __init__(self, config, layer_idx=None):
            super().__init__()
            self.self_attn = TinyAttention(config, layer_idx=layer_idx)
            self.encoder_attn = TinyAttention(config, layer_idx=layer_idx)

        def forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None):
            hidden_states = self.self_attn(hidden_states, attention_mask=attention_mask)
            if encoder_hidden_states is not None:
                hidden_states = self.encoder_attn(
                    hidden_states, key_value_states=encoder_hidden_states, attention_mask=encoder_attention_mask
                )
            return hidden_states


    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyEncoder(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.layers = nn.ModuleList([TinyEncoderLayer(config) for _ in range(config.num_hidden_layers)])

        def forward(self, inputs_embeds, attention_mask=None):
            if attention_mask is not None:
                attention_mask = create_bidirectional_mask(
                    config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
                )
            hidden_states = inputs_embeds
            for layer in self.layers:
                hidden_states = layer(hidden_states, attention_mask)
            return hidden_states


    class TinyDecoder(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.layers = nn.ModuleList([TinyDecoderLayer(config, i) for i in range(config.num_hidden_layers)])

        def forward(self, inputs_embeds, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None):
            attention_mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            if encoder_attention_mask is not None:
                encoder_attention_mask = create_bidirectional_mask(
                    config=self.config,
                    inputs_embeds=inputs_embeds,
                    attention_mask=encoder_attention_mask,
                    encoder_hidden_states=encoder_hidden_states,
                )
            hidden_states = inputs_embeds
            for index, layer in enumerate(self.layers):
                hidden_states = layer(
                    hidden_states,
                    attention_mask,
                    encoder_hidden_states=encoder_hidden_states,
                    encoder_attention_mask=encoder_attention_mask,
                )
            return hidden_states
    """
    )
)


def replaced(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


RUNTIME_FLAG = (
    HEADER
    + "\n\n"
    + ATTENTION
    + "\n\n"
    + src(
        """
    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.attention = TinyAttention(config)

        def forward(self, inputs_embeds, attention_mask=None, is_decoder=False):
            if is_decoder:
                mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            else:
                mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            return self.attention(inputs_embeds, attention_mask=mask)


    class TinyDecoderModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.attention = TinyAttention(config)

        def forward(self, inputs_embeds, attention_mask=None):
            mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            return self.attention(inputs_embeds, attention_mask=mask)
    """
    )
)
