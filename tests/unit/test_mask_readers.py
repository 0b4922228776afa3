"""Modules that read their mask themselves (T5 adds it to its position bias before the attention): every mask the
file builds takes eager's form under every implementation, or the file is refused (M206)."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.built_masks import built_masks
from sdpa_port.plan.mask_readers import kept_mask_read

from helpers import POSITION_BIAS
from test_release import BEFORE_POSITION_BIAS

# T5's shape: the mask joins the module's own position bias, and the sum is added to the scores
READER = textwrap.dedent(
    '''
    import torch
    from torch import nn

    from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
    from transformers.modeling_utils import PreTrainedModel


    class TinyAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.bias = nn.Parameter(torch.zeros(1, 1, 8, 8))

        def forward(self, hidden_states, mask=None, **kwargs):
            query = key = value = hidden_states[:, None]
            position_bias = self.bias[:, :, : query.shape[2], : key.shape[2]]
            if mask is not None:
                position_bias = position_bias + mask
            scores = torch.matmul(query, key.transpose(-1, -2))
            scores += position_bias
            probs = scores.softmax(dim=-1)
            return torch.matmul(probs, value)


    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.attention = TinyAttention(config)

        def forward(self, inputs_embeds, attention_mask=None):
            if self.config.is_decoder:
                mask = create_causal_mask(
                    config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, past_key_values=None
                )
            else:
                mask = create_bidirectional_mask(self.config, inputs_embeds, attention_mask)
            return self.attention(inputs_embeds, mask)
    '''
).lstrip()


def _statements_after(source: str, builder: str) -> list[str]:
    """The statement right after each `x = builder(...)` of the source."""
    out = []
    for node in ast.walk(ast.parse(source)):
        for field in ("body", "orelse"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for index, statement in enumerate(body[:-1]):
                value = getattr(statement, "value", None)
                if isinstance(value, ast.Call) and ast.unparse(value.func) == builder:
                    out.append(ast.unparse(body[index + 1]))
    return out


@pytest.mark.parametrize("release", [BEFORE_POSITION_BIAS, POSITION_BIAS], ids=["folded", "position_bias"])
def test_every_built_mask_takes_eager_s_form(release) -> None:  # type: ignore[no-untyped-def]
    result = port_source(READER, style="interface", release=release)
    assert result.status is Status.PORTED, result.reasons
    assert "def eager_attention_mask(" in result.source
    assert _statements_after(result.source, "create_causal_mask") == [
        "mask = eager_attention_mask(mask, inputs_embeds, getattr(self.config, 'is_causal', True))"
    ]
    assert _statements_after(result.source, "create_bidirectional_mask") == [
        "mask = eager_attention_mask(mask, inputs_embeds, False)"
    ]
    assert any("reads `mask` itself" in warning for warning in result.warnings), result.warnings
    assert "_supports_attention_backend" not in result.source


OTHER_MODEL = """

class OtherModel(TinyPreTrainedModel):
    def forward(self, inputs_embeds, attention_mask=None):
        return create_bidirectional_mask(self.config, inputs_embeds, attention_mask)
"""


def test_only_the_builders_of_the_models_building_the_reader_are_converted() -> None:
    result = port_source(READER + OTHER_MODEL, style="interface", release=POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    assert result.source.count("eager_attention_mask(mask, inputs_embeds") == 2
    assert "return create_bidirectional_mask(self.config, inputs_embeds, attention_mask)" in result.source


def test_a_reader_no_builder_of_the_file_reaches_is_ported_as_before() -> None:
    """The model building the attention hands it a mask of its own; the file's builder serves another model."""
    head, model = READER.split("class TinyModel(TinyPreTrainedModel):")
    own = model[: model.index("        if self.config.is_decoder:")] + "        return self.attention(inputs_embeds, attention_mask)\n"
    source = head + "class TinyModel(TinyPreTrainedModel):" + own + OTHER_MODEL
    result = port_source(source, style="interface", release=POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    assert "eager_attention_mask" not in result.source


VISION = """

class VisionAttention(TinyAttention):
    def forward(self, hidden_states, mask=None, **kwargs):
        query = key = value = hidden_states[:, None]
        position_bias = self.bias[:, :, : query.shape[2], : key.shape[2]] + mask[:, None, None, :]
        scores = torch.matmul(query, key.transpose(-1, -2))
        scores += position_bias
        probs = scores.softmax(dim=-1)
        return torch.matmul(probs, value)


class VisionModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.attention = VisionAttention(config)

    def forward(self, inputs_embeds, attention_mask):
        return self.attention(inputs_embeds, 1.0 - attention_mask)
"""


def test_a_reader_of_its_model_s_own_mask_beside_one_of_built_masks() -> None:
    """Pix2Struct's vision attention reads the 2-D mask its model makes, unguarded; its text attention reads the
    builders' masks: only the latter's builders are converted, and the vision side stays as it was."""
    result = port_source(READER + VISION, style="interface", release=POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    assert result.source.count("eager_attention_mask(mask, inputs_embeds") == 2
    assert any("TinyAttention reads `mask` itself" in w and "VisionAttention" not in w for w in result.warnings)


def test_a_module_handing_its_mask_over_converts_nothing() -> None:
    source = READER.replace(
        "        if mask is not None:\n            position_bias = position_bias + mask\n", ""
    ).replace("scores += position_bias\n", "scores += position_bias\n        if mask is not None:\n            scores = scores + mask\n")
    result = port_source(source, style="interface", release=POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    assert "eager_attention_mask" not in result.source


@pytest.mark.parametrize(
    "change, why",
    [
        (('    base_model_prefix = "model"\n', '    base_model_prefix = "model"\n    _supports_flex_attn = True\n'), "flex"),
        (("return self.attention(inputs_embeds, mask)", "return self.attention(inputs_embeds, create_causal_mask(self.config, inputs_embeds, attention_mask, None))"), "not bound"),
        (("mask = create_bidirectional_mask(", "mask, = create_bidirectional_mask("), "not bound to one name"),
        (("mask = create_bidirectional_mask(self.config, inputs_embeds, attention_mask)", "mask = create_bidirectional_mask(self.config, inputs_embeds.float(), attention_mask)"), "plain names"),
    ],
    ids=["flex-claimed", "unbound-call", "unpacked", "computed-inputs"],
)
def test_masks_that_cannot_take_eager_s_form_are_refused(change: tuple[str, str], why: str) -> None:
    source = READER.replace(*change)
    assert source != READER
    result = port_source(source, style="interface", release=POSITION_BIAS)
    assert result.status is Status.REFUSED
    assert {r.code.code for r in result.refusals} == {"M206"}, result.reasons
    assert any(why in reason for reason in result.reasons), result.reasons


def _forward(body: str) -> cst.FunctionDef:
    source = "def forward(self, x, mask=None, head_mask=None, encoder_mask=None, cross=False):\n"
    forward = cst.parse_statement(source + textwrap.indent(textwrap.dedent(body), "    "))
    assert isinstance(forward, cst.FunctionDef)
    return forward


@pytest.mark.parametrize(
    "body, read",
    [
        ("bias = x if mask is None else x + mask\nreturn attention_interface(self, x, x, x, None, bias)", "mask"),
        ("part = mask[:, :, :4]\nbias = x\nbias += part\nreturn attention_interface(self, x, x, x, None, bias)", "mask"),
        ("bias = x.masked_fill(~encoder_mask, 0)\nreturn attention_interface(self, x, x, x, None, bias)", "encoder_mask"),
        # handing a mask over, renaming it, testing it and reading its shape compute nothing with its values
        ("return attention_interface(self, x, x, x, mask + 1, head_mask=head_mask)", None),
        ("chosen = encoder_mask if cross else mask\nreturn attention_interface(self, x, x, x, chosen)", None),
        ("n = x.shape[0] // mask.shape[0]\nif mask is not None:\n    x = x * n\nreturn attention_interface(self, x, x, x, mask)", None),
        ("x = x + head_mask\nreturn attention_interface(self, x, x, x, None)", None),
    ],
    ids=["added", "renamed-then-added", "filled", "dispatched", "chosen", "shape", "head-mask"],
)
def test_the_values_computed_beside_the_dispatch_are_what_counts(body: str, read: str | None) -> None:
    found = kept_mask_read(_forward(body))
    assert (found.name if found is not None else None) == read


@pytest.mark.parametrize(
    "body, guarded",
    [
        ("if mask is not None:\n    x = x + mask\nreturn attention_interface(self, x, x, x, None)", True),
        ("if cross and mask is not None:\n    part = mask[:, :4]\n    x = x + part\nreturn attention_interface(self, x, x, x, None)", True),
        ("part = mask\nif part is not None:\n    x = x + part\nreturn attention_interface(self, x, x, x, None)", True),
        ("if mask is None:\n    pass\nelse:\n    x = x + mask\nreturn attention_interface(self, x, x, x, None)", False),
        ("if cross is not None:\n    x = x + mask\nreturn attention_interface(self, x, x, x, None)", False),
        # T5's: the bias the mask joined under the test is computed with later, unguarded
        ("if mask is not None:\n    bias = x + mask\n    out = (bias,)\nout = out + (x,)\nreturn attention_interface(self, x, x, x, None)", True),
    ],
    ids=["tested", "tested-in-and", "tested-renamed", "else-branch", "other-name", "sum-used-later"],
)
def test_a_read_is_guarded_under_a_test_that_the_mask_is_not_none(body: str, guarded: bool) -> None:
    found = kept_mask_read(_forward(body))
    assert found is not None and found.guarded is guarded


def test_a_read_that_may_meet_none_is_refused() -> None:
    source = READER.replace("        if mask is not None:\n            position_bias = position_bias + mask\n", "        position_bias = position_bias + mask\n")
    assert source != READER
    result = port_source(source, style="interface", release=POSITION_BIAS)
    assert {r.code.code for r in result.refusals} == {"M206"}, result.reasons
    assert any("without testing that it is not None" in reason for reason in result.reasons), result.reasons


def test_names_the_port_introduced_are_not_followed() -> None:
    """The port's own `dispatch_mask`, which it converts for eager's weights, is the emitter's business."""
    chosen = "dispatch_mask = mask\nif cross:\n    dispatch_mask = ~dispatch_mask\nreturn attention_interface(self, x, x, x, dispatch_mask)"
    assert kept_mask_read(_forward(chosen), frozenset({"dispatch_mask"})) is None
    found = kept_mask_read(_forward(chosen))
    assert found is not None and found.name == "mask" and not found.guarded


def test_a_mask_both_handed_over_and_read_takes_eager_s_form() -> None:
    """T5's reading beside a plain handing over: the bias the module computes must not see sdpa's booleans."""
    source = READER.replace("scores += position_bias\n", "scores += position_bias\n        if mask is not None:\n            scores = scores + mask\n")
    assert source != READER
    result = port_source(source, style="interface", release=POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    assert _statements_after(result.source, "create_bidirectional_mask") == ["mask = eager_attention_mask(mask, inputs_embeds, False)"]


def test_a_builder_reading_a_slice_of_the_states_is_converted() -> None:
    """Canine's `inputs_embeds=states[:, 0:1, :]` (a query of one) reads again without effects."""
    source = READER.replace(
        "create_bidirectional_mask(self.config, inputs_embeds, attention_mask)",
        "create_bidirectional_mask(self.config, inputs_embeds[:, 0:1, :], attention_mask)",
    )
    assert source != READER
    result = port_source(source, style="interface", release=POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    assert "mask = eager_attention_mask(mask, inputs_embeds[:, 0:1, :], False)" in result.source


def test_builders_are_found_by_form() -> None:
    found = built_masks(cst.parse_module(READER))
    assert [(b.target, b.causal, b.inputs, b.config) for b in found.found] == [
        ("mask", True, "inputs_embeds", "self.config"),
        ("mask", False, "inputs_embeds", "self.config"),
    ]
    assert found.unconvertible == ()
