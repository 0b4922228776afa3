"""Deciding the inputs of a model's `forward` from its signature and its config, without torch.

`plan_inputs` reads the parameter names of a model class's `forward` and the fields of its (tiny) config and returns
the tensors to build, as shapes and value ranges: token ids, raw audio sized from the convolution strides, mel
features, boxes, region features, images and videos at the configured size, time series sized from the context and
prediction lengths. Where the config cannot tell a layout apart (mel features are `(batch, time, bins)` in some models
and `(batch, bins, time)` in others) the plan lists alternatives; the driver keeps the first one the original model
accepts. `drive.py` turns a plan into tensors.

What an argument means is read from its name: these are the documented argument names of transformers' `forward`
methods, shared across models. Nothing here is keyed on a model's name.
"""

from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

BATCH = 2
TEXT_LENGTH = 8  # token ids (as in checks.make_batch)
DECODER_LENGTH = 6
ENTITY_LENGTH = 3  # entities beside the tokens (LUKE)
FRAMES = 16  # audio frames after the feature encoder's convolutions
FEATURE_FRAMES = 32  # frames of mel features
REGIONS = 5  # region features (visual_feats, visual_embeds)
DEFAULT_IMAGE = 64  # for image models whose config has no image size (convolutional backbones)
MAX_ALTERNATIVES = 8

# ------------------------------------------------------------------ descriptions


@dataclass(frozen=True)
class Param:
    name: str
    required: bool


def describe(function: Callable[..., Any]) -> tuple[Param, ...]:
    """The named parameters of a model's forward, without self and catch-alls."""
    out = []
    for name, parameter in inspect.signature(function).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        out.append(Param(name, parameter.default is inspect.Parameter.empty))
    return tuple(out)


SUB_CONFIG_ORDER = {
    # where a kind of input looks for its sizes first: a composite config keeps them in its sub-configs
    "text": ("text_config", "text_encoder", "decoder_config", "encoder_config"),
    "vision": ("vision_config", "image_config", "visual_config", "backbone_config"),
    "audio": ("audio_config", "speech_config", "audio_encoder", "encoder_config"),
}


@dataclass(frozen=True)
class ConfigView:
    """A config's fields and those of its sub-configs, read from `to_dict()`.

    `fields` maps names to values, `subs` names to sub-configs' fields.
    """

    fields: Mapping[str, Any]
    subs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, config_dict: Mapping[str, Any]) -> "ConfigView":
        top = {k: v for k, v in config_dict.items() if not _is_config_dict(v)}
        subs = {k: v for k, v in config_dict.items() if _is_config_dict(v)}
        return cls(top, subs)

    def get(self, names: Sequence[str], prefer: str | None = None, default: Any = None) -> Any:
        """The first of `names` set to a value in the preferred sub-configs, then the config, then the others."""
        for fields in self._order(prefer):
            for name in names:
                value = fields.get(name)
                if value is not None:
                    return value
        return default

    def _order(self, prefer: str | None) -> Iterable[Mapping[str, Any]]:
        preferred = [self.subs[n] for n in SUB_CONFIG_ORDER.get(prefer or "", ()) if n in self.subs]
        yield from preferred
        yield self.fields
        for fields in self.subs.values():
            if not any(fields is p for p in preferred):
                yield fields


def _is_config_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and "model_type" in value


# ------------------------------------------------------------------ plans


@dataclass(frozen=True)
class TensorSpec:
    """One argument of a forward, as the shape and the values to draw.

    `fill` says how values are drawn, `shape` its size.

    fill: ids (integers in [low, high)), normal, uniform (0..1), ones, boxes (x0<=x1, y0<=y1 within 0..high), patches
    (flattened patches: row, column, then values), categorical (integers below each column's cardinality).
    """

    name: str
    fill: str
    shape: tuple[int, ...]
    high: int = 0
    low: int = 0
    dtype: str = "float"  # float | long | bool
    cardinality: tuple[int, ...] = ()
    # ids: `placeholders` copies of the token `placeholder` from position 1 on (the image tokens a multimodal model
    # replaces by image features), the other ids drawn below it
    placeholder: int = -1
    placeholders: int = 0


@dataclass(frozen=True)
class Plan:
    tensors: tuple[TensorSpec, ...]
    kinds: tuple[str, ...]  # text, image, video, audio, features, boxes, regions, time-series, patches
    sequence: str | None = None  # the argument the attention mask pads (its axis 1), if any
    mask: str | None = None  # the attention mask argument, if the forward takes one
    padding_side: str = "right"
    description: str = ""

    def spec(self, name: str) -> TensorSpec | None:
        return next((t for t in self.tensors if t.name == name), None)


@dataclass(frozen=True)
class Unsupported:
    reason: str


# argument names the harness leaves at their defaults even when they are required in no model
_NEVER = {
    "labels", "return_dict", "output_attentions", "output_hidden_states", "use_cache", "past_key_values",
    "head_mask", "decoder_head_mask", "cross_attn_head_mask", "inputs_embeds", "decoder_inputs_embeds",
    "encoder_outputs", "cache_position", "position_ids", "token_type_ids", "return_loss",
}


def plan_inputs(params: Sequence[Param], view: ConfigView, *, decoder: bool = False, batch: int = BATCH) -> list[Plan] | Unsupported:
    """The inputs to drive a forward taking `params` under the config `view`, as alternatives to try in order.

    `decoder`: the model is a causal decoder (its padding goes on the left). `batch`: examples per batch (the
    driver falls back to one for models that only run one at a time).
    """
    names = {p.name for p in params}
    options: list[list[TensorSpec]] = []
    kinds: list[str] = []
    notes: list[str] = []
    built: set[str] = set()

    def add(name: str, alternatives: list[TensorSpec] | TensorSpec | Unsupported, kind: str | None = None) -> Unsupported | None:
        if isinstance(alternatives, Unsupported):
            return alternatives
        alternatives = alternatives if isinstance(alternatives, list) else [alternatives]
        options.append(alternatives)
        built.add(name)
        if kind and kind not in kinds:
            kinds.append(kind)
        return None

    text_vocab = _vocab(view)
    sequence: str | None = None
    for param in params:
        name = param.name
        builder = _BUILDERS.get(name)
        if builder is None or name in built:
            continue
        wanted = param.required or name in _PRIMARY or (name in _WITH_CONFIG and _WITH_CONFIG[name](view))
        if name == "decoder_input_ids":
            wanted = param.required or bool(view.get(("is_encoder_decoder",))) or "input_ids" not in names
            wanted = wanted and ("input_ids" in names or any(p in names for p in _ENCODER_INPUTS))
        if not wanted:
            continue
        made, kind = builder(view, names, text_vocab)
        problem = add(name, made, kind)
        if problem is not None:
            if param.required:
                return problem
            notes.append(problem.reason)
            continue
        if sequence is None and name in _SEQUENCES:
            sequence = name
    missing = [p.name for p in params if p.required and p.name not in built]
    if missing:
        return Unsupported(f"forward requires {', '.join(f'`{m}`' for m in missing)}, which this harness cannot build")
    if not any(kind in _DRIVING for kind in kinds):
        taken = ", ".join(p.name for p in params[:6])
        return Unsupported(f"forward takes no input the harness can build (takes {taken}, ...)")
    mask = None
    if "attention_mask" in names and sequence is not None and _axis_length(options, sequence):
        mask = "attention_mask"
    if batch != BATCH:
        options = [[replace(spec, shape=(batch, *spec.shape[1:])) for spec in alternatives] for alternatives in options]
    plans = []
    for combination in itertools.islice(itertools.product(*options), MAX_ALTERNATIVES):
        if mask is not None:  # as long as this combination's sequence (alternatives may differ in length)
            padded = next(spec for spec in combination if spec.name == sequence)
            combination = (*combination, TensorSpec(mask, "ones", padded.shape[:2], dtype="long"))
        described = ", ".join(f"{t.name}{list(t.shape)}{'' if t.dtype == 'float' else ' ' + t.dtype}" for t in combination)
        plans.append(
            Plan(
                tuple(combination),
                tuple(kinds),
                sequence=sequence if mask else None,
                mask=mask,
                padding_side="left" if decoder and sequence == "input_ids" else "right",
                description=described,
            )
        )
    return plans


def _axis_length(options: list[list[TensorSpec]], name: str) -> int | None:
    for alternatives in options:
        for spec in alternatives:
            if spec.name == name and len(spec.shape) >= 2:
                return spec.shape[1]
    return None


# ------------------------------------------------------------------ argument builders

# arguments built whenever the forward takes them (optional ones too): the inputs a model is about
_PRIMARY = {
    "input_ids", "pixel_values", "input_values", "input_features", "bbox", "visual_feats", "visual_pos",
    "visual_embeds", "past_values", "past_time_features", "past_observed_mask", "future_values",
    "future_time_features", "flattened_patches", "audio_values", "image",
}
# the arguments a mask may pad: token ids, raw audio, mel features, flattened patches
_SEQUENCES = ("input_ids", "input_values", "input_features", "flattened_patches")
_ENCODER_INPUTS = ("input_features", "flattened_patches", "pixel_values")
# kinds that are a model's main input; boxes or region features alone do not drive a model
_DRIVING = {"text", "image", "video", "audio", "features", "time-series", "patches", "spectrogram"}


def _vocab(view: ConfigView) -> int:
    return int(view.get(("vocab_size",), "text", 99))


def _ids(name: str, length: int) -> Callable[..., tuple[Any, str]]:
    def build(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
        return TensorSpec(name, "ids", (BATCH, length), high=vocab, low=3, dtype="long"), "text"

    return build


def _text_ids(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    """Token ids, with image tokens where a model replaces them by image features.

    With pixels, a model that replaces an image token by image features gets those tokens, as many as its features per
    image (a resampler's latents, or one per patch) times one or two images.
    """
    plain, kind = _ids("input_ids", TEXT_LENGTH)(view, names, vocab)
    token = view.get(("image_token_id", "image_token_index"))
    if "pixel_values" not in names or not isinstance(token, int) or not 0 < token < vocab:
        return plain, kind
    per_image = image_features(view)
    if not per_image:
        return plain, kind
    out = []
    for images in (1, 2):  # pixel_values as (batch, channels, h, w), or with an images axis
        count = images * per_image
        out.append(replace(plain, shape=(BATCH, TEXT_LENGTH + count), high=token, placeholder=token, placeholders=count))
    return out, kind


def image_features(view: ConfigView) -> int | None:
    """How many features a multimodal model makes of one image: its resampler's latents, else one per patch."""
    latents = view.get(("resampler_n_latents", "num_query_tokens", "image_seq_length"), "vision")
    if isinstance(latents, int) and latents > 0:
        return latents
    patch = view.get(("patch_size",), "vision")
    if isinstance(patch, int) and patch > 0:
        height, width = image_size(view)
        return (height // patch) * (width // patch)
    return None


def _pixels(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    channels = int(view.get(("num_channels", "num_image_channels", "in_channels", "in_chans"), "vision", 3))
    sizes = [image_size(view)]
    if "prompt_pixel_values" in names:  # the image and its prompt are stacked along the height (SegGPT)
        sizes = [(h // 2, w) for h, w in sizes]
    frames = view.get(("num_frames",), "vision")
    if frames:
        return [TensorSpec("pixel_values", "normal", (BATCH, int(frames), channels, h, w)) for h, w in sizes], "video"
    single = [TensorSpec("pixel_values", "normal", (BATCH, channels, h, w)) for h, w in sizes]
    # last, image pairs (batch, 2, channels, height, width): keypoint matchers take two images per example
    pairs = [TensorSpec("pixel_values", "normal", (BATCH, 2, channels, h, w)) for h, w in sizes]
    return single + pairs, "image"


def _image(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    specs, kind = _pixels(view, names, vocab)
    return [TensorSpec("image", spec.fill, spec.shape) for spec in specs], kind


def _like_pixels(name: str) -> Callable[..., tuple[Any, str]]:
    """A second image the size of `pixel_values`, such as SegGPT's prompt image and prompt mask."""

    def build(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
        specs, kind = _pixels(view, names, vocab)
        return [TensorSpec(name, spec.fill, spec.shape) for spec in specs if len(spec.shape) == 4], kind

    return build


def image_size(view: ConfigView) -> tuple[int, int]:
    # `input_size`: LayoutLMv3 names its image size so (read only for pixel inputs: time series use the name too)
    size = view.get(("image_size", "img_size", "max_img_size", "input_size"), "vision", DEFAULT_IMAGE)
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return int(size), int(size)


def conv_input_length(frames: int, kernels: Sequence[int], strides: Sequence[int]) -> int:
    """The shortest input that a stack of valid convolutions maps to `frames`.

    Kernel k, stride s, no padding.
    """
    length = frames
    for kernel, stride in reversed(list(zip(kernels, strides))):
        length = (length - 1) * int(stride) + int(kernel)
    return length


def _input_values(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    kernels, strides = view.get(("conv_kernel",), "audio"), view.get(("conv_stride",), "audio")
    if kernels and strides:
        frames = FRAMES
        squeeze = view.get(("squeeze_factor",), "audio")  # SEW pools frames by this factor
        if squeeze:
            frames = FRAMES * int(squeeze)
        return TensorSpec("input_values", "normal", (BATCH, conv_input_length(frames, kernels, strides))), "audio"
    bins = view.get(("num_mel_bins", "feature_size"), "audio")
    length = view.get(("max_length",), "audio")
    if bins and length:  # a spectrogram of fixed length (the audio spectrogram transformer)
        return TensorSpec("input_values", "normal", (BATCH, int(length), int(bins))), "spectrogram"
    return Unsupported("`input_values`: the config gives no convolution strides (conv_kernel, conv_stride) nor mel bins"), ""


def feature_sizes(view: ConfigView) -> list[int]:
    """Candidate feature widths of `input_features`, from the config fields that name them."""
    out: list[int] = []
    per_channel = view.get(("input_feat_per_channel",), "audio")
    if per_channel:
        out.append(int(per_channel) * int(view.get(("input_channels",), "audio", 1)))
    for name in ("num_mel_bins", "feature_size", "feature_projection_input_dim", "input_dim"):
        value = view.get((name,), "audio")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0 and value not in out:
            out.append(value)
    return out


def _input_features(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    widths = feature_sizes(view)
    if not widths:
        return Unsupported("`input_features`: the config names no feature width (num_mel_bins, feature_size, ...)"), ""
    lengths = [FEATURE_FRAMES]
    positions = view.get(("max_source_positions",), "audio")
    if isinstance(positions, int) and 0 < 2 * positions <= 4096 and 2 * positions != FEATURE_FRAMES:
        lengths.append(2 * positions)  # encoders that insist on their full input length (two stride-2 convolutions)
    alternatives = []
    image = view.get(("spec_size",), "audio")  # a spectrogram resized as an image: (batch, channels, frames, bins)
    for width in widths:
        for length in lengths:
            if isinstance(image, int) and image > 0:
                alternatives.append(TensorSpec("input_features", "normal", (BATCH, 1, length, width)))
            alternatives.append(TensorSpec("input_features", "normal", (BATCH, length, width)))
            alternatives.append(TensorSpec("input_features", "normal", (BATCH, width, length)))
    return alternatives, "features"


def _audio_values(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    bins = view.get(("frequency_length", "num_mel_bins"), "audio")
    patch = view.get(("audio_patch_size",), "audio")
    if not bins:
        return Unsupported("`audio_values`: the config gives no frequency length"), ""
    step = int(patch[0]) if isinstance(patch, (list, tuple)) else int(patch or 16)
    channels = int(view.get(("num_audio_channels",), "audio", 1))
    return TensorSpec("audio_values", "normal", (BATCH, channels, 2 * step, int(bins))), "spectrogram"


def _bbox(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    top = int(view.get(("max_2d_position_embeddings",), "text", 1024)) - 1
    top = min(top, 1000)
    return [
        TensorSpec("bbox", "boxes", (BATCH, TEXT_LENGTH, 4), high=top, dtype="long"),
        TensorSpec("bbox", "boxes", (BATCH, TEXT_LENGTH, 4), high=1, dtype="float"),
    ], "boxes"


def _region(name: str, dims: tuple[str, ...], fill: str) -> Callable[..., tuple[Any, str]]:
    def build(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
        width = view.get(dims)
        if not width:
            return Unsupported(f"`{name}`: the config has none of {', '.join(dims)}"), ""
        return TensorSpec(name, fill, (BATCH, REGIONS, int(width))), "regions"

    return build


def _flattened_patches(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    width = view.get(("patch_embed_hidden_size",), "vision")
    if not width:
        return Unsupported("`flattened_patches`: the config has no patch_embed_hidden_size"), ""
    return TensorSpec("flattened_patches", "patches", (BATCH, 16, int(width) + 2), high=4), "patches"


def series_lengths(view: ConfigView) -> tuple[int, int]:
    """The past and future lengths of a time series: the context plus the largest lag, and the prediction length."""
    context = int(view.get(("context_length",), None, 0) or 0)
    lags = view.get(("lags_sequence",))
    past = context + (max(lags) if lags else 0)
    future = int(view.get(("prediction_length",), None, 0) or 0)
    return past, future


def _series_channels(view: ConfigView) -> tuple[int, ...]:
    channels = view.get(("num_input_channels",))
    if channels:
        return (int(channels),)
    size = view.get(("input_size",))
    return () if size in (None, 1) else (int(size),)


def _series(name: str, future: bool, fill: str = "normal", width: str | None = None) -> Callable[..., tuple[Any, str]]:
    def build(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
        past, ahead = series_lengths(view)
        length = ahead if future else past
        if length <= 0:
            return Unsupported(f"`{name}`: the config gives no {'prediction' if future else 'context'} length"), ""
        if width is None:
            shape = (BATCH, length, *_series_channels(view))
        else:
            shape = (BATCH, length, int(view.get((width,), None, 0) or 0))
        return TensorSpec(name, fill, shape), "time-series"

    return build


def _static_categorical(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    count = int(view.get(("num_static_categorical_features",), None, 0) or 0)
    cardinality = tuple(int(c) for c in (view.get(("cardinality",)) or ())[:count])
    return TensorSpec("static_categorical_features", "categorical", (BATCH, count), dtype="long", cardinality=cardinality), ""


def _has_entities(view: ConfigView) -> bool:
    """The config has an entity vocabulary: its model's entity-aware attention runs only when entities are given."""
    return bool(view.get(("entity_vocab_size",)))


def _entity_ids(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    """Entity ids below the entity vocabulary, for LUKE's entities beside the tokens."""
    high = int(view.get(("entity_vocab_size",), None, 10))
    return TensorSpec("entity_ids", "ids", (BATCH, ENTITY_LENGTH), high=high, low=1, dtype="long"), "entities"


def _entity_positions(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    """The token positions of each entity's mention, as many as the configured mention length."""
    width = int(view.get(("max_mention_length",), None, 30))
    return TensorSpec("entity_position_ids", "ids", (BATCH, ENTITY_LENGTH, width), high=TEXT_LENGTH, dtype="long"), "entities"


def _static_real(view: ConfigView, names: set[str], vocab: int) -> tuple[Any, str]:
    return TensorSpec("static_real_features", "normal", (BATCH, int(view.get(("num_static_real_features",), None, 0) or 0))), ""


_BUILDERS: dict[str, Callable[..., tuple[Any, str]]] = {
    "input_ids": _text_ids,
    "decoder_input_ids": _ids("decoder_input_ids", DECODER_LENGTH),
    "pixel_values": _pixels,
    "image": _image,  # LayoutLMv2's page image
    "prompt_pixel_values": _like_pixels("prompt_pixel_values"),
    "prompt_masks": _like_pixels("prompt_masks"),
    "input_values": _input_values,
    "input_features": _input_features,
    "audio_values": _audio_values,
    "bbox": _bbox,
    "visual_feats": _region("visual_feats", ("visual_feat_dim",), "normal"),
    "visual_pos": _region("visual_pos", ("visual_pos_dim",), "uniform"),
    "visual_embeds": _region("visual_embeds", ("visual_embedding_dim",), "normal"),
    "flattened_patches": _flattened_patches,
    "past_values": _series("past_values", future=False),
    "past_time_features": _series("past_time_features", future=False, width="num_time_features"),
    "past_observed_mask": _series("past_observed_mask", future=False, fill="ones"),
    "future_values": _series("future_values", future=True),
    "future_time_features": _series("future_time_features", future=True, width="num_time_features"),
    "static_categorical_features": _static_categorical,
    "static_real_features": _static_real,
    "entity_ids": _entity_ids,
    "entity_position_ids": _entity_positions,
}

# optional arguments built only when the config says the model uses them
_WITH_CONFIG: dict[str, Callable[[ConfigView], bool]] = {
    "static_categorical_features": lambda view: bool(view.get(("num_static_categorical_features",))),
    "static_real_features": lambda view: bool(view.get(("num_static_real_features",))),
    "entity_ids": _has_entities,
    "entity_position_ids": _has_entities,
}
