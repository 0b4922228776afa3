"""Deciding a model's inputs from its forward signature and config, and shrinking configs for them (no torch)."""

from __future__ import annotations

import sys

import pytest

from sdpa_port.verify.configs import LEVELS, Level, flag_fields, input_fields, level_kwargs
from sdpa_port.verify.inputs import (
    ConfigView,
    Param,
    Plan,
    Unsupported,
    conv_input_length,
    describe,
    plan_inputs,
    series_lengths,
)


def params(*names: str, required: tuple[str, ...] = ()) -> list[Param]:
    return [Param(n, n in required) for n in names]


def only(plans: list[Plan] | Unsupported) -> Plan:
    assert isinstance(plans, list), plans
    return plans[0]


def shapes(plan: Plan) -> dict[str, tuple[int, ...]]:
    return {t.name: t.shape for t in plan.tensors}


def test_the_input_planning_imports_no_torch() -> None:
    import subprocess

    code = "import sys, sdpa_port.verify.inputs, sdpa_port.verify.configs; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_describe_reads_names_and_required_arguments() -> None:
    def forward(self, pixel_values, input_ids=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        return pixel_values, input_ids

    assert describe(forward) == (Param("pixel_values", True), Param("input_ids", False))


def test_config_view_prefers_the_sub_config_of_the_input_kind() -> None:
    view = ConfigView.of(
        {
            "vocab_size": 10,
            "text_config": {"model_type": "t", "vocab_size": 99},
            "vision_config": {"model_type": "v", "image_size": 32, "num_channels": 1},
        }
    )
    assert view.get(("vocab_size",), "text") == 99
    assert view.get(("vocab_size",)) == 10
    assert view.get(("image_size",), "vision") == 32
    assert view.get(("image_size",)) == 32  # found in a sub-config when the top level lacks it


def test_token_model_gets_ids_and_a_padding_mask() -> None:
    plan = only(plan_inputs(params("input_ids", "attention_mask", "token_type_ids"), ConfigView.of({"vocab_size": 50})))
    assert shapes(plan) == {"input_ids": (2, 8), "attention_mask": (2, 8)}
    assert plan.kinds == ("text",)
    assert (plan.sequence, plan.mask, plan.padding_side) == ("input_ids", "attention_mask", "right")
    assert plan.spec("input_ids").high == 50
    decoder = only(plan_inputs(params("input_ids", "attention_mask"), ConfigView.of({}), decoder=True))
    assert decoder.padding_side == "left"


def test_image_at_the_configured_size_and_channels() -> None:
    plan = only(plan_inputs(params("pixel_values"), ConfigView.of({"image_size": 48, "num_channels": 1})))
    assert shapes(plan) == {"pixel_values": (2, 1, 48, 48)}
    assert plan.kinds == ("image",) and plan.mask is None
    rectangular = only(plan_inputs(params("pixel_values"), ConfigView.of({"image_size": [32, 48]})))
    assert shapes(rectangular)["pixel_values"] == (2, 3, 32, 48)


def test_video_when_the_config_counts_frames() -> None:
    view = ConfigView.of({"image_size": 32, "num_frames": 4, "tubelet_size": 2})
    plan = only(plan_inputs(params("pixel_values", "bool_masked_pos"), view))
    assert shapes(plan) == {"pixel_values": (2, 4, 3, 32, 32)}
    assert plan.kinds == ("video",)


def test_ids_and_pixels_from_their_sub_configs() -> None:
    view = ConfigView.of(
        {
            "text_config": {"model_type": "t", "vocab_size": 77},
            "vision_config": {"model_type": "v", "image_size": 40, "num_channels": 3},
        }
    )
    plan = only(plan_inputs(params("input_ids", "pixel_values", "attention_mask", "return_loss"), view))
    assert shapes(plan) == {"input_ids": (2, 8), "pixel_values": (2, 3, 40, 40), "attention_mask": (2, 8)}
    assert plan.kinds == ("text", "image")
    assert plan.spec("input_ids").high == 77


def test_raw_audio_is_long_enough_for_the_convolution_stack() -> None:
    view = ConfigView.of({"conv_kernel": [10, 3], "conv_stride": [5, 2]})
    plan = only(plan_inputs(params("input_values", "attention_mask", "mask_time_indices"), view))
    length = shapes(plan)["input_values"][1]
    frames = length
    for kernel, stride in zip([10, 3], [5, 2]):
        frames = (frames - kernel) // stride + 1
    assert frames == 16
    assert (plan.sequence, plan.mask) == ("input_values", "attention_mask")
    assert shapes(plan)["attention_mask"] == (2, length)


def test_conv_input_length_inverts_valid_convolutions() -> None:
    assert conv_input_length(1, [3], [1]) == 3
    assert conv_input_length(2, [10], [5]) == 15
    length = conv_input_length(7, [10, 3, 3], [5, 2, 2])
    for kernel, stride in zip([10, 3, 3], [5, 2, 2]):
        length = (length - kernel) // stride + 1
    assert length == 7


def test_squeezing_audio_models_get_a_multiple_of_their_squeeze_factor() -> None:
    view = ConfigView.of({"conv_kernel": [10, 3], "conv_stride": [5, 2], "squeeze_factor": 2})
    length = shapes(only(plan_inputs(params("input_values"), view)))["input_values"][1]
    frames = length
    for kernel, stride in zip([10, 3], [5, 2]):
        frames = (frames - kernel) // stride + 1
    assert frames % 2 == 0


def test_spectrogram_input_values_have_the_configured_length_and_bins() -> None:
    plan = only(plan_inputs(params("input_values"), ConfigView.of({"max_length": 64, "num_mel_bins": 32})))
    assert shapes(plan) == {"input_values": (2, 64, 32)}


def test_audio_without_sizes_is_unsupported_with_a_reason() -> None:
    plans = plan_inputs(params("input_values", required=("input_values",)), ConfigView.of({}))
    assert isinstance(plans, Unsupported) and "conv_kernel" in plans.reason


def test_mel_features_offer_both_layouts() -> None:
    view = ConfigView.of({"input_feat_per_channel": 20, "input_channels": 2})
    plans = plan_inputs(params("input_features", "attention_mask", "decoder_input_ids"), view)
    assert isinstance(plans, list)
    layouts = {shapes(p)["input_features"] for p in plans}
    assert {(2, 32, 40), (2, 40, 32)} <= layouts
    # an encoder-decoder speech model also gets decoder ids
    seq2seq = plan_inputs(params("input_features", "decoder_input_ids"), ConfigView.of({"num_mel_bins": 16, "is_encoder_decoder": True}))
    assert "decoder_input_ids" in shapes(only(seq2seq))


def test_a_spectrogram_resized_as_an_image_is_four_dimensional() -> None:
    """CLAP's audio encoder reads (batch, channels, frames, mel bins), resized to its `spec_size`."""
    image = plan_inputs(params("input_features"), ConfigView.of({"num_mel_bins": 64, "spec_size": 256}))
    assert isinstance(image, list) and shapes(image[0])["input_features"] == (2, 1, 32, 64)
    plain = plan_inputs(params("input_features"), ConfigView.of({"num_mel_bins": 64}))
    assert isinstance(plain, list) and all(len(shapes(p)["input_features"]) == 3 for p in plain)


def test_boxes_are_valid() -> None:
    plans = plan_inputs(params("input_ids", "bbox", "attention_mask"), ConfigView.of({"max_2d_position_embeddings": 1024}))
    assert isinstance(plans, list)
    boxes = plans[0].spec("bbox")
    assert boxes.shape == (2, 8, 4) and boxes.fill == "boxes" and boxes.high == 1000 and boxes.dtype == "long"
    assert plans[1].spec("bbox").dtype == "float"  # the alternative for models taking normalised float boxes
    assert plans[0].kinds == ("text", "boxes")


def test_region_features_take_their_widths_from_the_config() -> None:
    view = ConfigView.of({"visual_feat_dim": 12, "visual_pos_dim": 4, "vocab_size": 30})
    plan = only(plan_inputs(params("input_ids", "visual_feats", "visual_pos", "attention_mask"), view))
    assert shapes(plan)["visual_feats"] == (2, 5, 12) and shapes(plan)["visual_pos"] == (2, 5, 4)
    assert plan.spec("visual_pos").fill == "uniform"
    # region features alone do not drive a model
    assert isinstance(plan_inputs(params("visual_feats"), view), Unsupported)


def test_time_series_lengths_come_from_context_lags_and_prediction() -> None:
    view = ConfigView.of(
        {"context_length": 8, "prediction_length": 4, "lags_sequence": [1, 2, 7], "input_size": 1, "num_time_features": 2}
    )
    assert series_lengths(view) == (15, 4)
    names = ("past_values", "past_time_features", "past_observed_mask", "static_categorical_features", "future_values", "future_time_features")
    plan = only(plan_inputs(params(*names, required=names[:3]), view))
    assert shapes(plan) == {
        "past_values": (2, 15),
        "past_time_features": (2, 15, 2),
        "past_observed_mask": (2, 15),
        "future_values": (2, 4),
        "future_time_features": (2, 4, 2),
    }
    channels = only(plan_inputs(params("past_values"), ConfigView.of({"context_length": 32, "num_input_channels": 3})))
    assert shapes(channels) == {"past_values": (2, 32, 3)}


def test_static_features_only_when_the_config_uses_them() -> None:
    view = ConfigView.of({"context_length": 8, "prediction_length": 4, "num_static_categorical_features": 2, "cardinality": [3, 5]})
    plan = only(plan_inputs(params("past_values", "static_categorical_features", "static_real_features"), view))
    categorical = plan.spec("static_categorical_features")
    assert categorical.shape == (2, 2) and categorical.cardinality == (3, 5)
    assert plan.spec("static_real_features") is None


def test_entities_beside_the_tokens_when_the_config_has_an_entity_vocabulary() -> None:
    """LUKE's entity-aware attention runs only with entities: their ids and the token positions of their mentions."""
    names = ("input_ids", "attention_mask", "entity_ids", "entity_position_ids")
    plan = only(plan_inputs(params(*names), ConfigView.of({"vocab_size": 50, "entity_vocab_size": 7, "max_mention_length": 5})))
    assert shapes(plan) == {"input_ids": (2, 8), "entity_ids": (2, 3), "entity_position_ids": (2, 3, 5), "attention_mask": (2, 8)}
    entities, positions = plan.spec("entity_ids"), plan.spec("entity_position_ids")
    assert entities is not None and entities.high == 7 and entities.low >= 0
    assert positions is not None and positions.high == 8 and positions.low == 0  # positions of real tokens
    assert "entities" in plan.kinds
    without = only(plan_inputs(params(*names), ConfigView.of({"vocab_size": 50})))
    assert set(shapes(without)) == {"input_ids", "attention_mask"}


def test_flattened_patches_carry_row_and_column() -> None:
    plan = only(plan_inputs(params("flattened_patches", "attention_mask"), ConfigView.of({"vision_config": {"model_type": "v", "patch_embed_hidden_size": 48}})))
    assert shapes(plan)["flattened_patches"] == (2, 16, 50)
    assert plan.mask == "attention_mask" and plan.sequence == "flattened_patches"


@pytest.mark.parametrize(
    "names, required, words",
    [
        (("hidden_states", "attention_mask"), ("hidden_states",), "`hidden_states`"),
        (("args",), (), "no input"),
        (("inputs", "attention_mask"), ("inputs",), "`inputs`"),
    ],
)
def test_forwards_without_buildable_inputs_are_unsupported(names: tuple[str, ...], required: tuple[str, ...], words: str) -> None:
    plans = plan_inputs(params(*names, required=required), ConfigView.of({}))
    assert isinstance(plans, Unsupported) and words in plans.reason


# ------------------------------------------------------------------ configs


def test_a_batch_of_one_on_request() -> None:
    plan = only(plan_inputs(params("input_ids", "pixel_values", "attention_mask"), ConfigView.of({"image_size": 32}), batch=1))
    assert {shape[0] for shape in shapes(plan).values()} == {1}


def test_levels_go_from_tiny_to_default() -> None:
    assert LEVELS[0] == Level("tiny")
    assert not any((LEVELS[-1].scalars, LEVELS[-1].inputs, LEVELS[-1].spatial, LEVELS[-1].lists))


def test_flags_never_download_or_force_eager() -> None:
    fields = {"use_pretrained_backbone": True, "output_attentions": True, "use_timm_backbone": True, "backbone": "resnet50", "backbone_config": None}
    assert input_fields(fields, LEVELS[-1], timm_available=True) == {"use_pretrained_backbone": False, "output_attentions": False}
    without_timm = input_fields(fields, LEVELS[-1], timm_available=False)
    assert without_timm["use_timm_backbone"] is False and without_timm["backbone"] is None


def test_audio_convolution_stacks_keep_their_first_layers() -> None:
    fields = {"conv_dim": [512] * 7, "conv_kernel": [10, 3, 3, 3, 3, 2, 2], "conv_stride": [5, 2, 2, 2, 2, 2, 2], "num_feat_extract_layers": 7, "num_conv_pos_embeddings": 128}
    values = input_fields(fields, LEVELS[0])
    assert values["conv_dim"] == [32, 32] and values["conv_kernel"] == [10, 3] and values["conv_stride"] == [5, 2]
    assert values["num_feat_extract_layers"] == 2 and values["num_conv_pos_embeddings"] == 16


def test_images_shrink_to_a_few_patches_and_frames_to_two_tubelets() -> None:
    assert input_fields({"image_size": 224, "patch_size": 16}, LEVELS[0]) == {"image_size": 64}
    assert input_fields({"image_size": 224, "patch_size": 32}, LEVELS[0]) == {"image_size": 128}
    assert input_fields({"image_size": 224}, LEVELS[0]) == {"image_size": 64}
    assert input_fields({"image_size": 224, "patch_size": 16}, Level("x", spatial=False)) == {}
    assert input_fields({"num_frames": 16, "tubelet_size": 2}, LEVELS[0]) == {"num_frames": 4}
    assert input_fields({"num_frames": 32, "tubelet_size": [2, 16, 16]}, LEVELS[0]) == {"num_frames": 4}
    assert input_fields({"num_frames": 8}, LEVELS[0]) == {"num_frames": 4}


def test_time_series_lengths_are_set_where_unset() -> None:
    assert input_fields({"prediction_length": None, "context_length": None}, LEVELS[0]) == {"prediction_length": 4, "context_length": 8}
    assert input_fields({"prediction_length": 24, "context_length": 32}, LEVELS[0]) == {"prediction_length": 4}


def test_stage_lists_shrink_only_at_the_tiny_level() -> None:
    fields = {"hidden_sizes": [64, 128, 320, 512], "num_attention_heads": [1, 2, 5, 8], "depths": [3, 4, 6, 3]}
    assert input_fields(fields, LEVELS[0]) == {"hidden_sizes": [16, 32, 80, 128], "num_attention_heads": [1, 2, 2, 2], "depths": [1, 1, 1, 1]}
    assert input_fields(fields, Level("kept", lists=False)) == {}
    # widths stay divisible by the groups of a group normalisation
    assert input_fields({"hidden_sizes": [256, 512], "num_groups": 32}, LEVELS[0]) == {"hidden_sizes": [32, 64]}


def test_the_small_level_widens_what_tiny_shrinks() -> None:
    small = next(level for level in LEVELS if level.width > 1)
    tiny = level_kwargs({"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12}, LEVELS[0])
    wide = level_kwargs({"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12}, small)
    assert wide["hidden_size"] == tiny["hidden_size"] * small.width
    assert wide["intermediate_size"] == tiny["intermediate_size"] * small.width
    assert wide["num_attention_heads"] == tiny["num_attention_heads"]


def test_a_hybrid_backbone_feature_map_sets_the_image_size() -> None:
    fields = {"image_size": 224, "patch_size": 1, "backbone_featmap_shape": [1, 1024, 24, 24]}
    assert input_fields(fields, LEVELS[0]) == {"image_size": 384}


def test_padded_frames_shrink_with_their_prompt() -> None:
    assert input_fields({"max_img_size": 448, "visual_prompt_size": 96}, LEVELS[0]) == {"max_img_size": 64, "visual_prompt_size": 8}


def test_a_default_language_is_taken_from_the_configured_ones() -> None:
    assert flag_fields({"default_language": None, "languages": ["en_XX", "de_DE"]}) == {"default_language": "en_XX"}
    assert flag_fields({"default_language": "de_DE", "languages": ["en_XX", "de_DE"]}) == {}


def test_level_kwargs_pass_changed_top_fields_and_whole_sub_configs() -> None:
    config = {
        "hidden_size": 768,
        "output_hidden_size": 768,
        "vision_config": {"model_type": "v", "hidden_size": 768, "image_size": 224, "patch_size": 16, "out_features": ["stage4"]},
    }
    kwargs = level_kwargs(config, LEVELS[0])
    assert kwargs["hidden_size"] == 32
    assert "output_hidden_size" not in kwargs  # derived in __init__: left for the constructor to derive again
    assert kwargs["vision_config"]["hidden_size"] == 32 and kwargs["vision_config"]["image_size"] == 64
    assert kwargs["vision_config"]["out_features"] == ["stage4"]
    assert level_kwargs(config, LEVELS[-1]) == {}



class _Config:  # the two things a config class has that the rule looks for
    model_type = ""

    def to_dict(self) -> dict[str, object]:
        return {}


class CompositeConfig(_Config):
    model_type = "composite"


class PartConfig(_Config):
    model_type = "part"


class _PreTrained:
    config_class = CompositeConfig


class _PartModel(_PreTrained):
    def __init__(self, config: PartConfig) -> None:  # a string under `from __future__ import annotations`
        pass


class _WholeModel(_PreTrained):
    def __init__(self, config: object) -> None:
        pass


def test_a_sub_model_is_built_from_the_config_its_constructor_names() -> None:
    """A Q-Former inside a composite inherits the composite's `config_class`; its constructor's annotation names
    its own config. An annotation that is no config class does not override `config_class`."""
    from sdpa_port.verify.configs import config_class_of

    assert config_class_of(_PartModel) is PartConfig
    assert config_class_of(_WholeModel) is CompositeConfig
    assert config_class_of(_PreTrained) is CompositeConfig


def test_a_tied_level_shrinks_sizes_equal_to_a_shrunk_hidden_size_across_sub_configs() -> None:
    """SAM: the vision neck's `output_channels` (256) must equal the prompt encoder's and mask decoder's hidden size
    (256 -> 32), and the positional features are half of it; the earlier levels leave both and fail to drive."""
    config = {
        "model_type": "sam",
        "vision_config": {"model_type": "", "hidden_size": 768, "output_channels": 256, "num_pos_feats": 128, "image_size": 1024},
        "prompt_encoder_config": {"model_type": "", "hidden_size": 256, "image_size": 1024},
        "mask_decoder_config": {"model_type": "", "hidden_size": 256, "iou_head_hidden_dim": 256, "num_multimask_outputs": 3},
    }
    (tied,) = [level for level in LEVELS if level.tied]
    assert LEVELS.index(tied) > 0 and not LEVELS[0].tied
    untied = level_kwargs(config, LEVELS[0])
    assert untied["vision_config"]["output_channels"] == 256
    kwargs = level_kwargs(config, tied)
    vision, decoder = kwargs["vision_config"], kwargs["mask_decoder_config"]
    assert (vision["hidden_size"], vision["output_channels"], vision["num_pos_feats"]) == (32, 32, 16)
    assert (decoder["hidden_size"], decoder["iou_head_hidden_dim"], decoder["num_multimask_outputs"]) == (32, 32, 3)
    assert vision["image_size"] == kwargs["prompt_encoder_config"]["image_size"] == 64  # an input size, not a width
    # 64 is a hidden size (-> 32) and half of one (128 -> 32, half 16): ambiguous, so nothing is tied
    clash = {"model_type": "x", "hidden_size": 128, "a_config": {"model_type": "", "d_model": 64, "channels": 64}}
    assert level_kwargs(clash, tied) == level_kwargs(clash, LEVELS[1])
    assert level_kwargs(clash, tied)["a_config"]["channels"] == 64


def test_image_placeholder_tokens_as_many_as_the_features_of_one_or_two_images() -> None:
    """Idefics2 replaces each `image_token_id` in the ids by one of its resampler's latents per image: the ids carry
    that many placeholders (other ids drawn below the token), the mask follows each alternative's length."""
    view = ConfigView.of(
        {
            "image_token_id": 98,
            "text_config": {"model_type": "t", "vocab_size": 99},
            "vision_config": {"model_type": "v", "image_size": 32, "patch_size": 8},
            "perceiver_config": {"model_type": "p", "resampler_n_latents": 4},
        }
    )
    plans = plan_inputs(params("input_ids", "attention_mask", "pixel_values"), view)
    assert isinstance(plans, list)
    found = {(shapes(p)["input_ids"], shapes(p)["pixel_values"]) for p in plans}
    assert ((2, 12), (2, 2, 3, 32, 32)) in found and ((2, 16), (2, 2, 3, 32, 32)) in found
    for plan in plans:
        ids = plan.spec("input_ids")
        assert ids is not None and ids.placeholder == 98 and ids.high == 98
        assert ids.placeholders == ids.shape[1] - 8 and shapes(plan)["attention_mask"] == ids.shape
    # one feature per patch without a resampler; no image token (or one outside the vocabulary): plain ids
    patches = ConfigView.of({"image_token_index": 5, "vocab_size": 99, "image_size": 32, "patch_size": 8})
    counts = {p.spec("input_ids").placeholders for p in plan_inputs(params("input_ids", "pixel_values"), patches)}  # type: ignore[union-attr]
    assert counts == {16, 32}
    plain = plan_inputs(params("input_ids", "pixel_values"), ConfigView.of({"image_token_id": 32001, "vocab_size": 99}))
    assert {p.spec("input_ids").placeholders for p in plain} == {0}  # type: ignore[union-attr]
    tiny = level_kwargs({"model_type": "x", "image_token_id": 32001, "perceiver_config": {"model_type": "p", "resampler_n_latents": 64}}, LEVELS[0])
    assert tiny["image_token_id"] == 98 and tiny["perceiver_config"]["resampler_n_latents"] == 4


def test_a_timm_backbone_config_is_rebuilt_as_the_transformers_one_without_timm() -> None:
    """Transformers 5 detection configs (DAB-DETR, Table Transformer) build a `timm_backbone` sub-config unless
    built with `use_timm_backbone=False`: without timm the rebuild asks for that and drops the sub-config (the
    constructor then builds its ResNet one, shrunk on the next round); with timm nothing changes."""
    timm = {"model_type": "timm_backbone", "backbone": "resnet50", "num_channels": 3, "out_indices": [1, 2, 3, 4]}
    config = {"d_model": 256, "encoder_layers": 6, "backbone_config": timm}
    kwargs = level_kwargs(config, LEVELS[0], timm_available=False)
    assert kwargs["use_timm_backbone"] is False and kwargs["backbone_config"] is None
    kwargs = level_kwargs(config, LEVELS[0], timm_available=True)
    assert "use_timm_backbone" not in kwargs
    resnet = {**config, "backbone_config": {"model_type": "resnet", "hidden_sizes": [256, 512, 1024, 2048]}}
    assert "use_timm_backbone" not in level_kwargs(resnet, LEVELS[0], timm_available=False)


def test_a_per_head_width_kept_apart_shrinks_with_the_hidden_size() -> None:
    """Megatron's `kv_channels` (QWen multiplies it by the heads for its projections) shrinks as `head_dim` does:
    left at 128 beside a tiny hidden size, the projections would not split into query, key and value."""
    tiny = level_kwargs({"hidden_size": 4096, "num_attention_heads": 32, "kv_channels": 128}, LEVELS[0])
    assert tiny["kv_channels"] * tiny["num_attention_heads"] == tiny["hidden_size"]
    narrow = {"hidden_size": 4096, "num_attention_heads": 32, "kv_channels": 2}
    assert "kv_channels" not in level_kwargs(narrow, LEVELS[0])
