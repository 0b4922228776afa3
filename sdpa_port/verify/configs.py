"""Tiny random-init configurations synthesised from a model's config class."""

from __future__ import annotations

import re
from typing import Any

HIDDEN = 32
HEADS = 4
LAYERS = 2
FFN = 64
VOCAB = 99
POSITIONS = 64

_LAYER_NAMES = re.compile(r"^(num_(hidden_)?layers|n_layers?|num_decoder_layers|(encoder|decoder)_layers|num_hidden_layers)$")
_HEAD_NAMES = re.compile(r"^(num_attention_heads|n_heads?|num_heads|(encoder|decoder)_attention_heads|num_key_value_heads)$")
_HIDDEN_NAMES = re.compile(r"^(hidden_size|d_model|n_embd|embed_dim|word_embed_proj_dim|embedding_size|dim)$")
_FFN_NAMES = re.compile(r"^(intermediate_size|(encoder|decoder)_ffn_dim|ffn_dim|d_ff|n_inner|hidden_dim|inner_dim)$")
_POSITION_NAMES = re.compile(r"^(max_position_embeddings|n_positions|n_ctx|max_seq_len|max_sequence_length)$")
_TOKEN_NAMES = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id", "cls_token_id")


def shrink_values(config: Any) -> dict[str, Any]:
    """The attribute values that make `config` tiny, found by the attribute names transformers configs use."""
    present = set(config.to_dict()) | set(getattr(config, "attribute_map", {}) or {})
    return shrink_fields({name: getattr(config, name, None) for name in present})


def shrink_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Tiny values for the size fields among `fields` (name -> current or default value)."""
    values: dict[str, Any] = {}
    for name in sorted(fields):
        current = fields[name]
        if isinstance(current, bool) or (current is not None and not isinstance(current, int)):
            continue
        if _LAYER_NAMES.match(name):
            values[name] = LAYERS
        elif _HEAD_NAMES.match(name):
            values[name] = HEADS
        elif _HIDDEN_NAMES.match(name):
            values[name] = HIDDEN
        elif _FFN_NAMES.match(name):
            values[name] = FFN
        elif _POSITION_NAMES.match(name):
            values[name] = POSITIONS
        elif name == "vocab_size":
            values[name] = VOCAB
        elif name == "d_kv":
            values[name] = HIDDEN // HEADS
        elif name in ("rotary_dim",) and current is not None:
            values[name] = HIDDEN // HEADS // 2
        elif name == "type_vocab_size":
            values[name] = 2
    for index, name in enumerate(_TOKEN_NAMES):
        if name in fields and fields[name] is not None:
            values[name] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}.get(name, 2 + index)
    values.setdefault("pad_token_id", 0)  # every config accepts it; batched heads and padding need it
    return values


def tiny_config(config_class: type, overrides: dict[str, Any] | None = None) -> Any:
    config = config_class()
    for name, value in shrink_values(config).items():
        setattr(config, name, value)
    for name, value in (overrides or {}).items():
        setattr(config, name, value)
    return config
