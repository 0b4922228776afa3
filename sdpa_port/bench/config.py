"""The mid-sized configuration a benchmark builds, as keyword arguments of the model's config class.

The attribute names come from what transformers configs call their sizes; the values from `Size` and the longest
sequence measured. Pure: takes a default config instance, returns a dict.
"""

from __future__ import annotations

import re
from typing import Any

from sdpa_port.bench.spec import Size

_ROLES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("layers", re.compile(r"^(num_hidden_layers|num_layers|n_layers?|(encoder|decoder)_layers|num_decoder_layers)$")),
    ("heads", re.compile(r"^(num_attention_heads|n_heads?|num_heads|(encoder|decoder)_attention_heads|num_key_value_heads)$")),
    ("hidden", re.compile(r"^(hidden_size|d_model|n_embd|embed_dim|word_embed_proj_dim|embedding_size|dim)$")),
    ("ffn", re.compile(r"^(intermediate_size|(encoder|decoder)_ffn_dim|ffn_dim|d_ff|n_inner|hidden_dim|inner_dim)$")),
    ("positions", re.compile(r"^(max_position_embeddings|n_positions|n_ctx|max_seq_len|max_sequence_length)$")),
    ("vocab", re.compile(r"^vocab_size$")),
)
# Room above the longest measured length: decode steps and the position offset some models add (OPT, BART: 2).
POSITION_MARGIN = 64


def role_of(name: str) -> str | None:
    for role, pattern in _ROLES:
        if pattern.match(name):
            return role
    return None


def bench_config_kwargs(default_config: Any, size: Size, longest: int) -> dict[str, Any]:
    """Keyword arguments that turn the config class's defaults into the benchmark's mid-sized model."""
    values = {
        "layers": size.layers,
        "heads": size.heads,
        "hidden": size.hidden,
        "ffn": size.ffn,
        "positions": longest + POSITION_MARGIN,
        "vocab": size.vocab,
    }
    kwargs: dict[str, Any] = {}
    for name, current in sorted(default_config.to_dict().items()):
        if isinstance(current, bool) or not isinstance(current, int):
            continue  # None (derived, e.g. GPT-2's n_inner) stays derived
        role = role_of(name)
        if role is not None:
            kwargs[name] = values[role]
    if "d_kv" in kwargs or "d_kv" in default_config.to_dict():
        kwargs["d_kv"] = size.hidden // size.heads
    if "head_dim" in default_config.to_dict() and default_config.to_dict()["head_dim"] is not None:
        kwargs["head_dim"] = size.hidden // size.heads
    # special tokens must lie inside the smaller vocabulary
    for name, value in (("pad_token_id", 1), ("bos_token_id", 0), ("eos_token_id", 2), ("decoder_start_token_id", 2)):
        current = default_config.to_dict().get(name)
        if isinstance(current, int) and current >= size.vocab:
            kwargs[name] = value
    return kwargs
