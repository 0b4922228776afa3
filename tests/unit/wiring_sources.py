"""Small class-style modeling files written for the tests of how a port is wired (issue 35), each a case the tool
once ported wrongly:

- QFORMER: a BERT-derived model of another library whose model class defines its own `get_extended_attention_mask`
  with another signature (`is_decoder` passed by the caller), which must keep its call;
- PER_CALL: a decoder whose forward picks Transformers' causal or plain mask helper by an `is_decoder` argument,
  its attention marked `self.is_causal = True`: a None mask then means causal for some calls only;
- OVERRIDDEN: a layer that sets `config._attn_implementation` before it looks its attention class up, so a model
  built with "sdpa" never builds the SDPA class.

`replaced` makes the variants the tests compare against.
"""

from __future__ import annotations

import textwrap


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def replaced(source: str, old: str, new: str) -> str:
    assert old in source, old
    return source.replace(old, new)


HEADER = src(
    """
    import math

    import torch
    from torch import nn

    from transformers.configuration_utils import PretrainedConfig
    from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask, _prepare_4d_causal_attention_mask
    from transformers.modeling_outputs import BaseModelOutput
    from transformers.modeling_utils import PreTrainedModel


    class TinyConfig(PretrainedConfig):
        model_type = "tiny"

        def __init__(self, vocab_size=64, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, pad_token_id=0, **kwargs):
            self.vocab_size = vocab_size
            self.hidden_size = hidden_size
            self.num_attention_heads = num_attention_heads
            self.num_hidden_layers = num_hidden_layers
            super().__init__(pad_token_id=pad_token_id, **kwargs)


    class TinyAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_heads = config.num_attention_heads
            self.head_dim = config.hidden_size // config.num_attention_heads
            self.is_causal = True
            self.query = nn.Linear(config.hidden_size, config.hidden_size)
            self.key = nn.Linear(config.hidden_size, config.hidden_size)
            self.value = nn.Linear(config.hidden_size, config.hidden_size)

        def split(self, states):
            return states.view(states.size(0), -1, self.num_heads, self.head_dim).transpose(1, 2)

        def forward(self, hidden_states, attention_mask=None):
            query = self.split(self.query(hidden_states))
            key = self.split(self.key(hidden_states))
            value = self.split(self.value(hidden_states))
            scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = nn.functional.softmax(scores, dim=-1)
            context = torch.matmul(probs, value)
            return context.transpose(1, 2).reshape(hidden_states.shape)


    TINY_ATTENTION_CLASSES = {"eager": TinyAttention}


    class TinyLayer(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.attention = TINY_ATTENTION_CLASSES[config._attn_implementation](config)
            self.norm = nn.LayerNorm(config.hidden_size)
            self.mlp = nn.Linear(config.hidden_size, config.hidden_size)

        def forward(self, hidden_states, attention_mask=None):
            hidden_states = self.norm(hidden_states + self.attention(hidden_states, attention_mask))
            return hidden_states + self.mlp(hidden_states)


    class TinyPreTrainedModel(PreTrainedModel):
        config_class = TinyConfig
        base_model_prefix = "model"
    """
)

MODEL = src(
    """
    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList([TinyLayer(config) for _ in range(config.num_hidden_layers)])
            self.post_init()
    """
)

QFORMER = (
    HEADER
    + "\n\n"
    + MODEL
    + textwrap.indent(
        src(
            '''
            def get_extended_attention_mask(self, attention_mask, input_shape, device, is_decoder, has_query=False):
                """The model's own helper (another library's signature): causal where the caller asks for a decoder."""
                extended = attention_mask[:, None, None, :]
                if is_decoder:
                    positions = torch.arange(input_shape[1], device=device)
                    causal = (positions[None, :] <= positions[:, None]).to(attention_mask.dtype)
                    extended = causal[None, None, :, :] * extended
                extended = extended.to(dtype=self.dtype)
                return (1.0 - extended) * -10000.0

            def forward(self, input_ids, attention_mask=None, is_decoder=False, output_attentions=False):
                if attention_mask is None:
                    attention_mask = torch.ones_like(input_ids)
                hidden_states = self.embeddings(input_ids)
                extended = self.get_extended_attention_mask(attention_mask, input_ids.shape, input_ids.device, is_decoder)
                for layer in self.layers:
                    hidden_states = layer(hidden_states, extended)
                return BaseModelOutput(last_hidden_state=hidden_states)
            '''
        ),
        "    ",
    )
)

PER_CALL = (
    HEADER
    + "\n\n"
    + MODEL
    + textwrap.indent(
        src(
            """
            def forward(self, input_ids, attention_mask=None, is_decoder=True, output_attentions=False):
                hidden_states = self.embeddings(input_ids)
                shape = input_ids.shape
                if is_decoder:
                    mask = _prepare_4d_causal_attention_mask(attention_mask, shape, hidden_states, 0)
                else:
                    mask = None
                    if attention_mask is not None:
                        mask = _prepare_4d_attention_mask(attention_mask, hidden_states.dtype, tgt_len=shape[1])
                for layer in self.layers:
                    hidden_states = layer(hidden_states, mask)
                return BaseModelOutput(last_hidden_state=hidden_states)
            """
        ),
        "    ",
    )
)

# PER_CALL's decoder with causality fixed in the file: the `is_causal` fast path stays
ALWAYS_CAUSAL = replaced(
    PER_CALL,
    """        if is_decoder:
            mask = _prepare_4d_causal_attention_mask(attention_mask, shape, hidden_states, 0)
        else:
            mask = None
            if attention_mask is not None:
                mask = _prepare_4d_attention_mask(attention_mask, hidden_states.dtype, tgt_len=shape[1])
""",
    """        mask = _prepare_4d_causal_attention_mask(attention_mask, shape, hidden_states, 0)
""",
)

OVERRIDDEN = replaced(
    ALWAYS_CAUSAL,
    """        super().__init__()
        self.attention = TINY_ATTENTION_CLASSES""",
    """        super().__init__()
        config._attn_implementation = "eager"
        self.attention = TINY_ATTENTION_CLASSES""",
)
