"""A refused attention class stays eager while the file's others port, only where nothing built per implementation
reaches it (`plan/kept_eager.py`, `MaskFlow(derive=True)`), in both styles; without torch."""

from __future__ import annotations

import pytest
from causal_sources import HEADER, replaced, src

from sdpa_port import Status, port_source

DENSE = src(
    """
    class TinyAttention(nn.Module):
        def __init__(self, config, layer_idx=None):
            super().__init__()
            self.config = config
            self.scaling = config.head_dim**-0.5
            self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)

        def forward(self, hidden_states, attention_mask=None, **kwargs):
            query = self.q_proj(hidden_states)[:, None]
            key = self.k_proj(hidden_states)[:, None]
            value = self.v_proj(hidden_states)[:, None]
            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = scores.softmax(dim=-1)
            return torch.matmul(probs, value)[:, 0]
    """
)

# no exact SDPA call can express it: the scores are transposed (S101)
SPARSE = src(
    """
    class TinySparseAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)

        def forward(self, hidden_states, band_mask=None, from_mask=None):
            query = self.q_proj(hidden_states)[:, None]
            key = self.k_proj(hidden_states)[:, None]
            value = self.v_proj(hidden_states)[:, None]
            scores = torch.matmul(query, key.transpose(-1, -2))
            scores = scores.transpose(-1, -2) + (1.0 - band_mask) * -10000.0
            probs = scores.softmax(dim=-1)
            return torch.matmul(probs, value)[:, 0] * from_mask
    """
)

MODEL = src(
    """
    class TinyLayer(nn.Module):
        def __init__(self, config, layer_idx):
            super().__init__()
            self.attention_type = config.attention_type
            if config.attention_type == "full":
                self.attention = TinyAttention(config, layer_idx)
            else:
                self.attention = TinySparseAttention(config)

        def forward(self, hidden_states, attention_mask=None, band_mask=None, from_mask=None):
            if self.attention_type == "full":
                return self.attention(hidden_states, attention_mask=attention_mask)
            return self.attention(hidden_states, band_mask=band_mask, from_mask=from_mask)


    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList([TinyLayer(config, i) for i in range(config.num_hidden_layers)])

        @staticmethod
        def band_masks(attention_mask, dtype):
            band_mask = attention_mask[:, None, :, None] * attention_mask[:, None, None, :]
            return band_mask.to(dtype), attention_mask[:, :, None].to(dtype)

        def forward(self, input_ids, attention_mask=None):
            inputs_embeds = self.embed(input_ids)
            if attention_mask is None:
                attention_mask = torch.ones(input_ids.shape, device=input_ids.device)
            band_mask = from_mask = None
            if self.config.attention_type == "full":
                attention_mask = create_bidirectional_mask(
                    config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
                )
            else:
                band_mask, from_mask = self.band_masks(attention_mask, inputs_embeds.dtype)
            hidden_states = inputs_embeds
            for layer in self.layers:
                hidden_states = layer(hidden_states, attention_mask, band_mask=band_mask, from_mask=from_mask)
            return hidden_states
    """
)

SOURCE = "\n\n".join([HEADER, DENSE, SPARSE, MODEL])
BAND_MASKS = "            band_mask, from_mask = self.band_masks(attention_mask, inputs_embeds.dtype)\n"


def test_a_refused_class_no_implementation_mask_reaches_stays_eager() -> None:
    result = port_source(SOURCE, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert result.attention_classes == ("TinyAttention",)
    assert any("TinySparseAttention stays eager" in w and "[S101]" in w for w in result.warnings), result.warnings
    # the refused class is left exactly as written
    assert SPARSE.strip() in result.source
    assert "ALL_ATTENTION_FUNCTIONS" in result.source


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        # the builder's mask (None or boolean under sdpa) would reach the eager sparse computation
        (BAND_MASKS, "            band_mask, from_mask = self.band_masks(create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask), inputs_embeds.dtype)\n", "create_bidirectional_mask"),
        # handed on through a value computed from it
        (BAND_MASKS, "            band_mask = from_mask = (create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask) * 1.0).to(inputs_embeds.dtype)\n", "create_bidirectional_mask"),
        # the layer passes the full attention's mask to both classes
        ("        return self.attention(hidden_states, band_mask=band_mask, from_mask=from_mask)\n", "        return self.attention(hidden_states, band_mask=attention_mask, from_mask=from_mask)\n", "create_bidirectional_mask"),
        # the sparse class decides by the implementation itself
        ("    def forward(self, hidden_states, band_mask=None, from_mask=None):\n", "    def implementation(self):\n        return self.config._attn_implementation\n\n    def forward(self, hidden_states, band_mask=None, from_mask=None):\n", "reads the attention implementation"),
        # the module's own state, set outside `__init__`, may hold anything
        ("            hidden_states = layer(hidden_states, attention_mask, band_mask=band_mask, from_mask=from_mask)\n", "            self.from_masks = attention_mask\n            hidden_states = layer(hidden_states, attention_mask, band_mask=band_mask, from_mask=self.from_masks)\n", "may hold"),
    ],
)
def test_a_refused_class_that_could_see_a_mask_built_per_implementation_refuses_the_file(old: str, new: str, why: str) -> None:
    result = port_source(replaced(SOURCE, old, new), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result.detail
    assert [r.code.code for r in result.refusals] == ["S101"]
    assert "cannot stay eager" in result.refusals[0].detail and why in result.refusals[0].detail, result.refusals


def test_a_module_built_into_a_local_and_stored_is_built_at_that_site() -> None:
    """`attention = Cls(...)` in each branch, then `self.attention = attention`: the site `TinyLayer.attention`,
    whose calls are followed (built elsewhere, it would not be)."""
    old = src(
        """
            if config.attention_type == "full":
                self.attention = TinyAttention(config, layer_idx)
            else:
                self.attention = TinySparseAttention(config)
        """
    )
    new = src(
        """
            if config.attention_type == "full":
                attention = TinyAttention(config, layer_idx)
            else:
                attention = TinySparseAttention(config)
                attention.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.attention = attention
        """
    )
    indented = "".join("        " + line if line else line for line in old.splitlines(True))
    replacement = "".join("        " + line if line else line for line in new.splitlines(True))
    assert port_source(replaced(SOURCE, indented, replacement), filename="modeling_tiny.py").status is Status.PORTED
    # read in any other way, the local may escape: not followed
    escaped = replacement.replace("        self.attention = attention\n", "        self.attention = attention\n        print(attention)\n")
    result = port_source(replaced(SOURCE, indented, escaped), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and "cannot stay eager" in result.refusals[0].detail


def test_with_no_other_attention_the_refusal_is_unchanged() -> None:
    source = SOURCE.replace(DENSE, "")
    source = replaced(source, "            self.attention = TinyAttention(config, layer_idx)\n", "            self.attention = nn.Identity()\n")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED
    assert [r.code.code for r in result.refusals] == ["S101"] and "cannot stay eager" not in result.refusals[0].detail


CLASS_STYLE = src(
    """
    import torch
    from torch import nn

    from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask
    from transformers.modeling_utils import PreTrainedModel
    """
)


BUILT = (
    "            attention_mask = create_bidirectional_mask(\n"
    "                config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask\n"
    "            )\n"
)


def class_style(source: str) -> str:
    """The same file in 4.x form: the mask from the helper a class-style port swaps for its SDPA variant."""
    source = replaced(source.replace(HEADER, CLASS_STYLE), BUILT, "            attention_mask = _prepare_4d_attention_mask(attention_mask, inputs_embeds.dtype)\n")
    return source


def test_class_style_follows_the_same_rule() -> None:
    result = port_source(class_style(SOURCE), filename="modeling_tiny.py", style="class")
    assert result.status is Status.PORTED, result.reasons
    assert any("TinySparseAttention stays eager" in w for w in result.warnings)
    assert SPARSE.strip() in result.source
    leaked = class_style(
        replaced(SOURCE, "        return self.attention(hidden_states, band_mask=band_mask, from_mask=from_mask)\n", "        return self.attention(hidden_states, band_mask=attention_mask, from_mask=from_mask)\n")
    )
    result = port_source(leaked, filename="modeling_tiny.py", style="class")
    assert result.status is Status.REFUSED
    assert "_prepare_4d_attention_mask" in result.refusals[0].detail, result.refusals


WRAPPER = src(
    """
    class TinyWrapper(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.model = TinyModel(config)

        def get_encoder(self):
            return self.model

        def forward(self, input_ids, attention_mask=None):
            return self.model(input_ids, attention_mask=attention_mask)
    """
)


def test_a_model_handed_away_is_called_with_model_inputs() -> None:
    """`get_encoder()` hands the sub-model to callers out of sight (generation): a model's forward is called with
    a model's inputs, so its masks stay the caller's; a layer handed away could be called with anything."""
    result = port_source(SOURCE + "\n\n" + WRAPPER, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    built = "        self.layers = nn.ModuleList([TinyLayer(config, i) for i in range(config.num_hidden_layers)])\n"
    layer = replaced(SOURCE, built, built + "        self.handed = self.layers\n")
    result = port_source(layer, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and "used in a way not followed" in result.refusals[0].detail, result.refusals


ATTENTION_PY = src(
    """
    import torch
    from torch import nn


    class BlockAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.scaling = config.head_dim**-0.5

        def forward(self, query, key, value, attention_mask=None):
            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
            if attention_mask is not None:
                scores = scores + attention_mask
            return torch.matmul(scores.softmax(dim=-1), value)
    """
)


def test_eager_attention_built_in_another_file_is_refused_not_unchanged() -> None:
    """A remote-code `attention.py` whose module `blocks.py` builds: eager attention the class style cannot port
    here is a refusal naming it (W407), never "unchanged" (issue 10's silent misses)."""
    result = port_source(ATTENTION_PY, filename="attention.py", style="class")
    assert result.status is Status.REFUSED, (result.status, result.detail)
    assert [(r.code.code, r.where) for r in result.refusals] == [("W407", "BlockAttention")]
    assert result.source == ATTENTION_PY


@pytest.mark.parametrize(
    "test,holds",
    [
        ("not self.is_cross_attention", "self.is_cross_attention"),
        ("self.num_landmarks != self.seq_len", "self.num_landmarks == self.seq_len"),
        ("self.mode == 'exact'", "self.mode != 'exact'"),
        ("self.flag", "not self.flag"),
    ],
)
def test_the_fallback_warning_names_the_side_that_takes_sdpa(test: str, holds: str) -> None:
    """An alternative is a test known false where SDPA runs: the warning names what holds there instead."""
    from sdpa_port.analyse.known import negation

    assert negation(test) == holds
