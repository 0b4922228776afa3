"""Tiny random-init configurations synthesised from a model's config class."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
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
LATENTS = 4  # a perceiver resampler's outputs per image: the image placeholders in the token ids
_TOKEN_NAMES = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id", "cls_token_id")


def shrink_values(config: Any) -> dict[str, Any]:
    """The attribute values that make `config` tiny, found by the attribute names transformers configs use."""
    present = set(config.to_dict()) | set(getattr(config, "attribute_map", {}) or {})
    return shrink_fields({name: getattr(config, name, None) for name in present})


def shrink_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Tiny values for the size fields among `fields`, which map names to current or default values."""
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
        elif name in ("image_token_id", "image_token_index") and current is not None and current >= VOCAB:
            values[name] = VOCAB - 1  # the image placeholder stays a token of the tiny vocabulary
        elif name == "resampler_n_latents" and current is not None and current > LATENTS:
            values[name] = LATENTS
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


# ------------------------------------------------------------------ configs for models driven by other inputs

IMAGE = 64  # pixels a side, or four patches a side when patches are larger
FRAMES = 4  # video frames (two tubelets where frames are grouped)
CONV_LAYERS = 2  # convolutional feature encoders of audio models keep their first layers
CONV_WIDTH = 32
SPECTROGRAM_LENGTH = 64
MEL_BINS = 32
PREDICTION = 4  # time series: prediction length, and context length where the config leaves it unset
CONTEXT = 8
_CONV_STACKS = ("conv_dim", "conv_kernel", "conv_stride")
_LIST_WIDTHS = re.compile(r"^(hidden_sizes|embed_dims?|hidden_dims|dims|channels|neck_hidden_sizes)$")
_LIST_HEADS = re.compile(r"^(num_attention_heads|num_heads|heads)$")
_LIST_DEPTHS = re.compile(r"^(depths|num_layers|layers)$")


@dataclass(frozen=True)
class Level:
    """How far a config is shrunk for a model driven by images, audio or series.

    The driver tries them in order.
    """

    name: str
    scalars: bool = True  # widths, depths and heads given as integers (shrink_fields)
    inputs: bool = True  # frames, convolution stacks, spectrogram and series lengths
    spatial: bool = True  # image sizes
    lists: bool = True  # per-stage widths, depths and heads of hierarchical backbones
    width: int = 1  # widths times this (some models derive sizes that vanish at width 32, e.g. BROS's box embedding)
    projections: bool = False  # projection sizes too (CLVP sizes rotary embeddings from them; X-CLIP ties them)
    tied: bool = False  # any size equal to a shrunk hidden size, or half of one, shrinks with it (SAM's channels)


LEVELS = (
    Level("tiny"),
    Level("tiny, projections shrunk", projections=True),
    Level("tiny, sizes tied to hidden sizes", projections=True, tied=True),
    Level("small", width=4, projections=True),
    Level("tiny, per-stage sizes kept", lists=False),
    Level("tiny, image size kept", lists=False, spatial=False),
    Level("default sizes", scalars=False, inputs=False, spatial=False, lists=False),
)


def input_fields(fields: dict[str, Any], level: Level, timm_available: bool = True) -> dict[str, Any]:
    """The config changes of one level that keep a non-text model small and runnable.

    Name -> value, with the `flag_fields` that matter at every level.
    """
    values = flag_fields(fields, timm_available)
    if level.inputs:
        values.update(_input_sizes(fields))
    if level.spatial:
        values.update(_spatial(fields))
    if level.lists:
        values.update(_stage_lists(fields))
    return values


def flag_fields(fields: dict[str, Any], timm_available: bool = True) -> dict[str, Any]:
    """Settings a check needs whatever the sizes.

    No pretrained backbone is ever loaded (nothing is downloaded); attention weights are not requested (they force the
    eager fallback: ERNIE-M asks for them by default); a timm backbone is replaced by the transformers one the config
    also offers when timm is not installed; a model that needs a default language gets the first of its configured
    languages (X-MOD).
    """
    values: dict[str, Any] = {}
    if fields.get("use_pretrained_backbone"):
        values["use_pretrained_backbone"] = False
    if fields.get("output_attentions"):
        values["output_attentions"] = False
    if fields.get("use_timm_backbone") and not timm_available:
        values["use_timm_backbone"] = False
        if fields.get("backbone") is not None and fields.get("backbone_config") is None:
            values["backbone"] = None  # the config then builds its default transformers backbone
    languages = fields.get("languages")
    if "default_language" in fields and fields["default_language"] is None and isinstance(languages, (list, tuple)) and languages:
        values["default_language"] = languages[0]
    return values


def timm_backbone(fields: dict[str, Any]) -> bool:
    """Whether the config's backbone is a timm one, with a `timm_backbone` sub-config."""
    backbone = fields.get("backbone_config")
    return isinstance(backbone, dict) and backbone.get("model_type") == "timm_backbone"


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


QUERIES = 16


def _input_sizes(fields: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    featmap = fields.get("backbone_featmap_shape")
    if isinstance(featmap, (list, tuple)) and len(featmap) == 4 and _int(featmap[-1]) and _int(fields.get("image_size")):
        # hybrid ViTs size their patch grid from this feature map of a BiT backbone, whose output stride is 16 (a
        # fact of the backbone, not in the config); ViT-hybrid's default config pairs a 24x24 map with 224 pixels
        values["image_size"] = int(featmap[-1]) * 16
    frames, tubelet = fields.get("num_frames"), fields.get("tubelet_size")
    if _int(frames):
        step = tubelet[0] if isinstance(tubelet, (list, tuple)) else tubelet
        wanted = 2 * step if _int(step) and step > 1 else FRAMES
        if frames > wanted:
            values["num_frames"] = wanted
    stacks = [fields.get(name) for name in _CONV_STACKS]
    if all(isinstance(s, (list, tuple)) for s in stacks) and len({len(s) for s in stacks}) == 1 and len(stacks[0]) > CONV_LAYERS:
        values["conv_dim"] = [min(int(d), CONV_WIDTH) for d in stacks[0][:CONV_LAYERS]]
        values["conv_kernel"] = list(stacks[1][:CONV_LAYERS])
        values["conv_stride"] = list(stacks[2][:CONV_LAYERS])
        if _int(fields.get("num_feat_extract_layers")):
            values["num_feat_extract_layers"] = CONV_LAYERS
    if _int(fields.get("num_conv_pos_embeddings")) and fields["num_conv_pos_embeddings"] > 16:
        values["num_conv_pos_embeddings"] = 16
    if _int(fields.get("conv_channels")) and fields["conv_channels"] > 2 * CONV_WIDTH:
        values["conv_channels"] = 2 * CONV_WIDTH
    if _int(fields.get("num_mel_bins")) and _int(fields.get("max_length")) and fields["max_length"] > SPECTROGRAM_LENGTH:
        # a fixed-length spectrogram (its patches are position-embedded): shorter, with fewer bins
        values["max_length"] = SPECTROGRAM_LENGTH
        values["num_mel_bins"] = min(fields["num_mel_bins"], MEL_BINS)
    if "prediction_length" in fields and (fields["prediction_length"] is None or fields["prediction_length"] > 4 * PREDICTION):
        values["prediction_length"] = PREDICTION
    if "context_length" in fields and fields["context_length"] is None:
        values["context_length"] = CONTEXT
    if _int(fields.get("num_queries")) and fields["num_queries"] > QUERIES:
        # two-stage detectors (Grounding DINO) take the top `num_queries` of the encoder's positions, which a small
        # image has far fewer of than the 900 they default to
        values["num_queries"] = QUERIES
    return values


def _spatial(fields: dict[str, Any]) -> dict[str, Any]:
    if fields.get("backbone_featmap_shape"):
        return {}  # the image size follows the feature map (see _input_sizes)
    patch = fields.get("patch_size")
    step = patch[0] if isinstance(patch, (list, tuple)) and patch and _int(patch[0]) else patch
    wanted = max(4 * step, IMAGE) if _int(step) else IMAGE
    values: dict[str, Any] = {}
    for name in ("image_size", "max_img_size"):  # TVP pads its frames to max_img_size
        size = fields.get(name)
        if _int(size) and size > wanted:
            values[name] = wanted
        elif isinstance(size, (list, tuple)) and len(size) == 2 and all(_int(s) for s in size) and max(size) > wanted:
            values[name] = [wanted, wanted]
    if values.get("max_img_size") and _int(fields.get("visual_prompt_size")):
        values["visual_prompt_size"] = min(fields["visual_prompt_size"], wanted // 8)  # a frame around the image
    return values


def _stage_lists(fields: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    # group normalisation needs widths divisible by its groups
    floor = max(16, fields["num_groups"]) if _int(fields.get("num_groups")) else 16
    for name, value in fields.items():
        if not (isinstance(value, (list, tuple)) and value and all(_int(v) for v in value)):
            continue
        if _LIST_WIDTHS.match(name) and min(value) > floor:
            factor = min(value) // floor
            values[name] = [max(v // factor, 1) for v in value]
        elif _LIST_HEADS.match(name):
            values[name] = [min(v, 2) for v in value]
        elif _LIST_DEPTHS.match(name):
            values[name] = [min(v, 1) for v in value]
    return values


def level_kwargs(config_dict: dict[str, Any], level: Level, timm_available: bool = True) -> dict[str, Any]:
    """Keyword arguments that rebuild a config, given as its `to_dict()`, at `level`.

    Top-level fields are passed only where they change, so values the config derives in `__init__` are derived again;
    sub-configs (dicts with a `model_type`) are passed whole with their changes, since a composite config's defaults
    for them may differ from the sub-config class's own.
    """
    kwargs = _level_kwargs(config_dict, level, timm_available)
    if level.tied:
        ties = _hidden_ties(config_dict, kwargs)
        if ties:
            kwargs = _tie(config_dict, kwargs, ties)
    return kwargs


def _level_kwargs(config_dict: dict[str, Any], level: Level, timm_available: bool) -> dict[str, Any]:
    top = {k: v for k, v in config_dict.items() if not _is_sub_config(v)}
    kwargs = _changes(top, level, timm_available)
    if timm_backbone(config_dict) and not timm_available:
        # transformers 5 configs build a timm backbone config unless told `use_timm_backbone=False` when built;
        # the transformers backbone they build then is shrunk on the next round
        kwargs["use_timm_backbone"] = False
        kwargs["backbone_config"] = None
    for name, value in config_dict.items():
        if name in kwargs and kwargs[name] is None:
            continue
        if _is_sub_config(value):
            changed = _level_kwargs(value, level, timm_available)
            if changed:
                kwargs[name] = {**value, **changed}
    return kwargs


def _hidden_ties(config_dict: dict[str, Any], kwargs: dict[str, Any]) -> dict[int, int]:
    """Old size to new size for every hidden size the level shrank, and for their halves.

    At any depth; empty when one old size would get two new ones.
    """
    ties: dict[int, set[int]] = {}

    def collect(old: dict[str, Any], new: dict[str, Any]) -> None:
        for name, value in new.items():
            before = old.get(name)
            if isinstance(value, dict) and isinstance(before, dict):
                collect(before, value)
            elif isinstance(name, str) and _HIDDEN_NAMES.match(name) and _int(before) and _int(value) and before != value:
                ties.setdefault(before, set()).add(value)
                if before % 2 == 0 and value % 2 == 0:
                    ties.setdefault(before // 2, set()).add(value // 2)

    collect(config_dict, kwargs)
    if any(len(values) > 1 for values in ties.values()):
        return {}
    return {old: next(iter(values)) for old, values in ties.items()}


def _tie(config_dict: dict[str, Any], kwargs: dict[str, Any], ties: dict[int, int]) -> dict[str, Any]:
    tied = dict(kwargs)
    for name, value in config_dict.items():
        if name in _TIE_EXCLUDED:
            continue
        current = tied.get(name, value)
        if _is_sub_config(current):
            changed = _tie(value, {k: v for k, v in current.items() if v != value.get(k)}, ties)
            if changed:
                tied[name] = {**value, **changed}
        elif name not in kwargs and _int(value) and value in ties:
            tied[name] = ties[value]
    return tied


# sizes of the inputs and vocabularies, not widths
_TIE_EXCLUDED = frozenset({"image_size", "patch_size", "vocab_size", "max_position_embeddings", "num_channels"})


def _changes(fields: dict[str, Any], level: Level, timm_available: bool) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if level.scalars:
        shrunk = shrink_fields(fields)
        if level.width > 1:
            for name, value in shrunk.items():
                if _HIDDEN_NAMES.match(name) or _FFN_NAMES.match(name) or name in ("d_kv", "rotary_dim"):
                    shrunk[name] = value * level.width
        # per-head width given apart from the hidden size (M-CTC-T; Megatron's `kv_channels`, QWen's projections)
        for name in ("attention_head_dim", "head_dim", "kv_channels"):
            if _int(fields.get(name)) and fields[name] > HIDDEN * level.width // HEADS:
                shrunk[name] = HIDDEN * level.width // HEADS
        if level.projections and _int(fields.get("projection_dim")) and fields["projection_dim"] > HIDDEN * level.width:
            shrunk["projection_dim"] = HIDDEN * level.width  # some models size rotary embeddings from it (CLVP)
        values.update({k: v for k, v in shrunk.items() if fields.get(k, object()) != v})
        values.update(_backbone_stages(fields, values))
    values.update(input_fields(fields, level, timm_available))
    return values


def _backbone_stages(fields: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The output stages of a backbone whose stages are its layers, kept in number as its depth shrinks.

    A ViT backbone keeps as many output stages as before, the last ones: `out_features` naming stage 24 of a two-layer
    model is rejected.
    """
    layers, indices, names = values.get("num_hidden_layers"), fields.get("out_indices"), fields.get("stage_names")
    if not (_int(layers) and isinstance(indices, (list, tuple)) and indices and isinstance(names, (list, tuple))):
        return {}
    if len(names) != fields.get("num_hidden_layers", -1) + 1:
        return {}  # stages are not layers (ResNet, Swin): their names do not change with the depth
    depth = max(layers, len(indices))
    chosen = list(range(depth - len(indices) + 1, depth + 1))
    return {
        "num_hidden_layers": depth,
        "out_indices": chosen,
        "out_features": [f"stage{i}" for i in chosen],
        "stage_names": ["stem"] + [f"stage{i}" for i in range(1, depth + 1)],
    }


def _is_sub_config(value: Any) -> bool:
    return isinstance(value, dict) and "model_type" in value


def config_class_of(model_class: type) -> type | None:
    """The config class a model class is built from.

    Its constructor's annotation when that names a config class (a sub-model's own config, e.g. a Q-Former inside a
    composite whose shared `config_class` is the composite's), else its `config_class`, else a `config` annotation.
    """
    annotated = _init_annotation(model_class)
    config_class = getattr(model_class, "config_class", None)
    if annotated is not None and not (isinstance(config_class, type) and issubclass(config_class, annotated)):
        return annotated  # more specific than config_class (a base class annotation such as PretrainedConfig is not)
    if isinstance(config_class, type):
        return config_class
    for klass in model_class.__mro__:
        annotations = getattr(klass, "__annotations__", {})
        candidate = annotations.get("config")
        if isinstance(candidate, type):
            return candidate
        if isinstance(candidate, str):
            module = inspect.getmodule(klass)
            resolved = getattr(module, candidate, None)
            if isinstance(resolved, type):
                return resolved
    return None


def _init_annotation(model_class: type) -> type | None:
    init = model_class.__dict__.get("__init__")
    if init is None:
        return None
    try:
        parameter = inspect.signature(init).parameters.get("config")
    except (TypeError, ValueError):
        return None
    annotation = getattr(parameter, "annotation", None)
    if isinstance(annotation, str):
        annotation = getattr(inspect.getmodule(model_class), annotation, None)
    if isinstance(annotation, type) and hasattr(annotation, "to_dict") and hasattr(annotation, "model_type"):
        return annotation
    return None
