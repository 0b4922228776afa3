"""The mask flow (`analyse/mask_flow.py`): which masks reach each construction of a module, without torch."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest
from causal_sources import ATTENTION, HEADER, RUNTIME_FLAG, SEQ2SEQ, replaced, src

from sdpa_port.analyse.mask_flow import MaskFlow
from sdpa_port.analyse.mask_values import Kind
from sdpa_port.analyse.module_facts import ModuleFacts


def flow_of(source: str) -> MaskFlow:
    return MaskFlow(ModuleFacts.of(cst.parse_module(source), ast.parse(source)))


def verdicts(source: str, class_name: str = "TinyAttention", key_only: tuple[str, ...] = ("key_value_states",)):
    flow = flow_of(source)
    out = {}
    for site in flow.modules.sites_of([class_name]):
        masks = flow.site_masks(site, class_name, "attention_mask", key_only)
        out[site.name] = (masks.causal, masks.kinds)
    return out


# ---------------------------------------------------------------- the analysis


def test_each_site_is_decided_by_the_masks_that_reach_it() -> None:
    assert verdicts(SEQ2SEQ) == {
        # `if attention_mask is not None: attention_mask = create_bidirectional_mask(...)`: None or bidirectional
        "TinyEncoderLayer.self_attn": (False, frozenset({Kind.NONE, Kind.BIDIRECTIONAL})),
        "TinyDecoderLayer.self_attn": (True, frozenset({Kind.CAUSAL})),
        # keys from encoder states under `if encoder_hidden_states is not None`: cross-attention, never causal
        "TinyDecoderLayer.encoder_attn": (False, frozenset()),
    }


def test_cross_attention_that_may_get_no_encoder_states_counts_its_masks() -> None:
    """Without the enclosing test the call may be self-attention: its masks count (here None or bidirectional)."""
    source = replaced(SEQ2SEQ, "        if encoder_hidden_states is not None:\n", "        if True:\n")
    assert verdicts(source)["TinyDecoderLayer.encoder_attn"] == (False, frozenset({Kind.NONE, Kind.BIDIRECTIONAL}))


def test_a_site_receiving_both_kinds_is_undecided() -> None:
    found = verdicts(RUNTIME_FLAG)
    assert found["TinyModel.attention"] == (None, frozenset({Kind.CAUSAL, Kind.BIDIRECTIONAL}))
    assert found["TinyDecoderModel.attention"] == (True, frozenset({Kind.CAUSAL}))


LAYER_FORWARD = """
def forward(self, hidden_states, attention_mask=None):
    return self.attention(hidden_states, attention_mask=attention_mask)
"""


def layered(call: str, layer_forward: str = LAYER_FORWARD) -> str:
    """A model whose layers hold the attention: the model builds a causal mask and runs each layer with `call`."""
    forward = textwrap.indent(src(layer_forward), " " * 4)
    return (
        HEADER
        + "\n\n"
        + ATTENTION
        + "\n\n"
        + src(
            f"""
        class TinyLayer(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.attention = TinyAttention(config)

        {{forward}}

        class TinyPreTrainedModel(PreTrainedModel):
            base_model_prefix = "model"


        class TinyModel(TinyPreTrainedModel):
            def __init__(self, config):
                super().__init__(config)
                self.layers = nn.ModuleList([TinyLayer(config) for _ in range(2)])

            def forward(self, inputs_embeds, attention_mask=None, **kwargs):
                mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
                hidden_states = inputs_embeds
                for layer in self.layers:
                    hidden_states = {call}
                return hidden_states
        """
        ).replace("{forward}", forward)
    )


@pytest.mark.parametrize(
    "call,kind",
    [
        # positional, keyword, through `.forward`, through a gradient checkpoint, by index
        ("layer(hidden_states, mask)", Kind.CAUSAL),
        ("layer(hidden_states, attention_mask=mask)", Kind.CAUSAL),
        ("layer.forward(hidden_states, mask)", Kind.CAUSAL),
        ("torch.utils.checkpoint.checkpoint(layer, hidden_states, mask, use_reentrant=False)", Kind.CAUSAL),
        ("self.layers[0](hidden_states, mask)", Kind.CAUSAL),
        # not passed: the parameter's None default
        ("layer(hidden_states)", Kind.NONE),
        # `**kwargs` may hold it
        ("layer(hidden_states, **kwargs)", Kind.UNKNOWN),
        # a mask the file does not build
        ("layer(hidden_states, mask[:, :, -1:])", Kind.UNKNOWN),
    ],
)
def test_call_forms(call: str, kind: Kind) -> None:
    source = layered(call)
    assert verdicts(source)["TinyLayer.attention"][1] == frozenset({kind})


def test_masks_returned_by_a_method_and_unpacked() -> None:
    """BERT's `attention_mask, encoder_attention_mask = self._create_attention_masks(...)`."""
    source = (
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

            def forward(self, inputs_embeds, attention_mask=None):
                attention_mask, other = self._masks(inputs_embeds, attention_mask)
                return self.attention(inputs_embeds, attention_mask=attention_mask)

            def _masks(self, inputs_embeds, attention_mask):
                mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
                return mask, None
        """
        )
    )
    assert verdicts(source)["TinyModel.attention"] == (True, frozenset({Kind.CAUSAL}))


def test_a_module_handed_away_is_not_followed() -> None:
    source = replaced(
        RUNTIME_FLAG,
        "class TinyDecoderModel(TinyPreTrainedModel):\n",
        "class TinyDecoderModel(TinyPreTrainedModel):\n    def get_attention(self):\n        return self.attention\n\n",
    )
    causal, kinds = verdicts(source)["TinyDecoderModel.attention"]
    assert causal is None and Kind.UNKNOWN in kinds


def test_a_mask_parameter_of_a_top_level_model_comes_from_outside() -> None:
    source = replaced(
        RUNTIME_FLAG,
        "        mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)\n"
        "        return self.attention(inputs_embeds, attention_mask=mask)",
        "        return self.attention(inputs_embeds, attention_mask=attention_mask)",
    )
    flow = flow_of(source)
    site = next(s for s in flow.modules.sites_of(["TinyAttention"]) if s.owner == "TinyDecoderModel")
    masks = flow.site_masks(site, "TinyAttention", "attention_mask")
    assert masks.causal is None and "callers outside this file" in masks.why()


@pytest.mark.parametrize(
    "signature,before,kind",
    [
        # transformers' typed kwargs have no mask among their keys: the parameter keeps its None default
        ("**kwargs: Unpack[TransformersKwargs]", "", Kind.NONE),
        ("**kwargs: Unpack[FlashAttentionKwargs]", "", Kind.NONE),
        ("**kwargs", "", Kind.UNKNOWN),
        ("**kwargs: Unpack[SomeKwargs]", "", Kind.UNKNOWN),
        # a key the method adds voids the annotation
        ("**kwargs: Unpack[TransformersKwargs]", 'kwargs["attention_mask"] = mask', Kind.UNKNOWN),
        ("**kwargs: Unpack[TransformersKwargs]", "kwargs.update(attention_mask=mask)", Kind.UNKNOWN),
    ],
)
def test_typed_kwargs_hold_no_mask(signature: str, before: str, kind: Kind) -> None:
    """A layer handing its `**kwargs` on (BridgeTower's cross-modal layers): annotated as transformers' typed
    kwargs and never written to, they cannot bring a mask, so the attention's mask is the parameter's default."""
    layer_forward = f"""
def forward(self, hidden_states, {signature}):
    {before or "pass"}
    return self.attention(hidden_states, **kwargs)
"""
    source = layered("layer(hidden_states, **kwargs)", layer_forward)
    assert verdicts(source)["TinyLayer.attention"][1] == frozenset({kind})
