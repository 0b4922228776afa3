"""Attention modules checked on their own, for the port's attention classes that no driven model builds.

Imports torch.

A model may be out of the harness's reach (an optional package such as detectron2 or torchvision is missing, its inputs
cannot be synthesised) or may build its attention only under configurations the harness does not make (ZoeDepth's patch
transformer exists only with two bin configurations). The port's attention classes are then built from their own
constructors, sharpened, and run on synthetic states: the original's eager class, the port's eager computation and its
SDPA computation (`attention_calls.sdpa_call` on the port's eager module), without a mask, with padded keys (the 4-D
extended mask transformers hands such modules, expanded over the queries, or the 2-D key mask; a boolean one where
none of those runs), and with every optional score term the module accepts. A window the constructor needs, and
states other than `(batch, length, width)` (heads split out, packed channels first, an image or channels-first map),
are tried in order until the original runs (`alone_inputs.py`). The port's eager outputs must equal the original's,
its SDPA outputs must agree within
the SDPA tolerances, and SDPA must run from the port.

These are module checks, reported as such (`<Class> alone`): they do not prove that a model selects the class.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import re
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from sdpa_port.verify import alone_inputs
from sdpa_port.verify.checks import Check
from sdpa_port.verify.configs import HEADS, HIDDEN, LEVELS
from sdpa_port.verify.diagnose import PortCalls
from sdpa_port.verify.layer_widths import layer_sized
from sdpa_port.verify.attention_calls import eager_class_of, first_tensor, sdpa_call
from sdpa_port.verify.model_builds import sharpen
from sdpa_port.verify.outputs import EAGER_TOLERANCE, RELATIVE_TOLERANCE, SDPA_TOLERANCE
from sdpa_port.verify.sized_configs import config_at
from sdpa_port.verify.unverified import unverified

BATCH = alone_inputs.BATCH
LENGTH = 7
PADDED = 2  # keys masked at the end of the second sequence
GAIN = 2.0

_WIDTHS = re.compile(
    r"^(hidden_size|embed_dim|d_model|dim|hidden_dim|n_embd|n_state|width|model_dim|in_features|in_dim|embed_dims|"
    r"query_dim|channels|in_channels|n_channels|num_channels|ch|in_ch|in_chans|q_dim|k_dim|v_dim|kv_dim)$"
)
# switches a constructor or a config takes with no default: off, the plain computation (`is_cross_attention`)
_SWITCHES = re.compile(r"^(is|use|with|has|add|output|return|enable)_")
_HEADS = re.compile(r"^(num_heads|num_attention_heads|n_heads?|heads|n_head|head_count)$")
# a layer's index (Megatron's `layer_id`, `layer_number`): the second layer, so a coefficient it makes is not 1
_LAYERS = re.compile(r"^(layer_id|layer_idx|layer_number|layer_index)$")
LAYER = 1
_RATES = re.compile(r"(^|_)(dropout|drop|p)(_prob|_rate|_p)?$")
_MASKS = re.compile(r"^(attention_mask|attn_mask|mask|key_padding_mask)$")
_TERMS = re.compile(r"(pos|bias)")  # optional score terms: position bias, relative positions, ALiBi
# optional states another sequence gives, which a cross-attention reads (some read them whether given or not)
_CROSS = re.compile(r"^(encoder_hidden_states|key_value_states|encoder_states|context|memory|cross_states)$")


@dataclass(frozen=True)
class Pair:
    """One attention class built twice with the same weights, as the original's class and the port's.

    `original` is the original's eager class, `eager` the port's eager class, whose SDPA computation `sdpa_class`
    gives.
    """

    original: torch.nn.Module
    eager: torch.nn.Module
    sdpa_class: type


def verify_alone(original: ModuleType, ported: ModuleType, names: list[str], why: str) -> list[Check]:
    """One check per attention class in `names`, as the module docstring says.

    `why` says why no model covers them.
    """
    checks = [Check("attention modules checked on their own", True, None, why)]
    for name in names:
        checks.append(_check_class(original, ported, name))
    return checks


def _check_class(original: ModuleType, ported: ModuleType, name: str) -> Check:
    label = f"{name} alone"
    cases: list[tuple[str, dict[str, Any]]] = []
    window: Any = None
    built: Pair | None = None
    failure: _CannotBuild | None = None
    # the window values in order (alone_inputs.WINDOWS): the first the original builds and runs with is taken
    for option in alone_inputs.window_options(_original_class(original, ported, name)):
        try:
            built = _build(original, ported, name, option)
        except _CannotBuild as reason:
            failure = failure or reason
            continue
        width, heads = _width(built.original), _heads(built.original)
        window = next(iter(option.values()), None)
        cases = _cases(built.original, width, heads, window)
        if cases:
            break
    if built is None:
        return unverified(f"{name} of the port, checked alone: {failure}")
    pair = built
    if not cases:
        return unverified(f"{name} of the port, checked alone: the original's eager class runs on none of the synthetic inputs")
    worst = worst_relative = worst_eager = 0.0
    calls = 0
    described: list[str] = []
    # every side runs with the values that keep the SDPA class on SDPA (no weights asked for, no head mask)
    accepted = inspect.signature(pair.sdpa_class.forward).parameters
    sdpa_side = {k: v for k, v in alone_inputs.sdpa_side_values(pair.sdpa_class.forward).items() if k in accepted}
    with torch.no_grad():
        for case, given in cases:
            kwargs = {**given, **sdpa_side}
            expected = first_tensor(pair.original(**copy.deepcopy(kwargs)))
            try:
                eager = first_tensor(pair.eager(**copy.deepcopy(kwargs)))
                with PortCalls(ported.__name__) as port_calls:
                    got = first_tensor(sdpa_call(pair.eager, pair.sdpa_class, (), copy.deepcopy(kwargs)))
            except Exception as error:  # the port fails where the original ran: a failed check, not an error
                return Check(label, False, None, f"[{case}] the port raised {type(error).__name__}: {str(error)[:160]}")
            calls += port_calls.from_port
            if expected is None or eager is None or got is None or got.shape != expected.shape:
                return Check(label, False, None, f"[{case}] outputs of different shapes or not tensors")
            worst_eager = max(worst_eager, float((eager.float() - expected.float()).abs().max()))
            gap = float((got.float() - expected.float()).abs().max())
            worst = max(worst, gap)
            worst_relative = max(worst_relative, gap / max(float(expected.float().abs().max()), 1e-6))
            described.append(case)
    shown = f", window {window}" if window is not None else ""
    detail = f"hidden {width}, {heads} heads{shown}, gain {GAIN:g}; {', '.join(described)}; port's eager max|diff|={worst_eager:.3g}"
    if worst_eager > EAGER_TOLERANCE:
        return Check(label, False, worst, f"{detail}: the port's eager computation changed")
    if not calls:
        return Check(label, False, worst, f"{detail}: no SDPA call from the port")
    detail += f"; {calls} SDPA call(s) from the port"
    passed = worst <= SDPA_TOLERANCE or worst_relative <= RELATIVE_TOLERANCE
    return Check(label, passed, worst, f"({detail}, relative {worst_relative:.2g})")


class _CannotBuild(Exception):
    pass


def _original_class(original: ModuleType, ported: ModuleType, name: str) -> type:
    """The original's class of the port's class `name` (its eager class), or `type` where the original has none."""
    found = getattr(original, eager_class_of(original, getattr(ported, name)).__name__, None)
    return found if isinstance(found, type) else type


def _build(original: ModuleType, ported: ModuleType, name: str, extra: dict[str, Any] | None = None) -> Pair:
    klass = getattr(ported, name)
    eager_class = eager_class_of(original, klass)
    original_class = getattr(original, eager_class.__name__, None)
    if not isinstance(original_class, type):
        raise _CannotBuild(f"the original has no class {eager_class.__name__}")
    config = _config(original)
    arguments = {**_arguments(original_class, config), **(extra or {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            reference, eager = construct(original_class, eager_class, arguments, config)
        except Exception as error:
            raise _CannotBuild(f"its constructor raised {type(error).__name__}: {str(error)[:160]}") from error
    sharpen(reference, GAIN)
    eager.load_state_dict(reference.state_dict())
    reference.eval()
    eager.eval()
    return Pair(reference, eager, klass)


def construct(original_class: type, other_class: type, arguments: dict[str, Any], config: Any | None) -> tuple[Any, Any]:
    """The original's class and the other built with the same arguments (a config of their own each), `config`
    given the attributes its class leaves to `config.json` as the constructor asks for them (`_give_missing`)."""
    given: set[str] = set()
    while True:
        try:
            return original_class(**_eager_arguments(arguments)), other_class(**_eager_arguments(arguments))
        except AttributeError as error:
            if not _give_missing(config, error, given):
                raise


_MISSING = re.compile(r"^'(\w+)' object has no attribute '(\w+)'$")


def _give_missing(config: Any | None, error: AttributeError, given: set[str]) -> bool:
    """Give the file's config an attribute its class leaves to `config.json` and the constructor reads; whether one
    was given.

    Remote code's config classes often set a value only from the keyword arguments of a saved `config.json` (QWen's
    `seq_length`, or `max_position_embeddings` mapped to an `n_positions` its `__init__` never sets), so the class's
    defaults lack it. It is valued by its name, as `generic_config` values a config of no class; once per name.
    """
    found = _MISSING.match(str(error))
    if config is None or found is None or found.group(1) != type(config).__name__ or found.group(2) in given:
        return False
    name = found.group(2)
    value = _value_for(name)
    if value is None:
        return False
    given.add(name)
    setattr(config, name, value)
    return True


def _config(original: ModuleType) -> Any | None:
    """A tiny config of the file's model, from its pretrained base's `config_class`, or None."""
    for value in vars(original).values():
        if not isinstance(value, type) or value.__module__ != original.__name__:
            continue  # a stand-in's instance (`logger = get_logger()`) fails when its attributes are read
        config_class = getattr(value, "config_class", None)
        if isinstance(config_class, type):
            with contextlib.suppress(Exception):
                return config_at(config_class, LEVELS[0])
    return None


def _arguments(klass: type, config: Any | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    indexed = alone_inputs.subscripted(klass.__init__)
    sized: frozenset[str] = frozenset()  # read once, where a parameter no name values needs it
    for parameter in list(inspect.signature(klass.__init__).parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        name = parameter.name
        if name == "config":
            out[name] = config if config is not None else generic_config(klass)
        elif _WIDTHS.match(name):
            out[name] = HIDDEN
        elif _HEADS.match(name):
            out[name] = HEADS
        elif _LAYERS.match(name) and parameter.default in (parameter.empty, None):
            out[name] = LAYER  # also where None is the default (QWen's `max(1, layer_number)` needs a number)
        elif name == alone_inputs.window_parameter(klass):
            # the first of the windows tried (alone_inputs.window_options); a default of None stays where none runs
            if parameter.default is parameter.empty:
                out[name] = alone_inputs.WINDOWS[0]
        elif _RATES.search(name) and (parameter.default is parameter.empty or isinstance(parameter.default, float)):
            out[name] = 0.0
        elif _SWITCHES.match(name) and parameter.default is parameter.empty:
            out[name] = False
        elif alone_inputs.side_width(name, _WIDTHS) and parameter.default is parameter.empty:
            out[name] = HIDDEN  # `dim_in`, `dim_out`, `out_channels`: the module's width, as `dim_out=dim` builds it
        elif _SIZES.search(name) and parameter.default is parameter.empty:
            out[name] = HIDDEN // HEADS  # a head's width (`d_head`), as the config's head sizes are valued
        elif name in indexed and parameter.default is parameter.empty:
            out[name] = alone_inputs.sides(indexed[name])  # `input_size[1]`: a size of that many sides
        elif parameter.default is parameter.empty and name in (sized := sized or layer_sized(klass)):
            out[name] = HIDDEN  # `nn.Conv2d(in_channels, key_channels, 1)`: a layer's size, the module's width
        elif parameter.default is parameter.empty:
            raise _CannotBuild(f"no value for its constructor's parameter `{name}`")
    return out


_SIZES = re.compile(r"(^|_)(head_dim|head_size|attention_head_size|kv_channels|d_head|dim_head)$")
_LENGTHS = re.compile(r"(max_position_embeddings|_length|_len|window_size|n_positions|n_ctx)$")
_EPSILONS = re.compile(r"(eps|epsilon)$")
_CONFIG_READS = re.compile(r"\bconfig\.([A-Za-z_][A-Za-z0-9_]*)")


def generic_config(klass: type) -> Any:
    """A config for a class whose file has no config class (remote code keeps it in another file): a
    `PretrainedConfig` holding each `config.<name>` the class reads, valued by
    the name (widths, heads, head sizes, lengths, rates, epsilons), or off where the class only tests it for truth; a
    name none of those fits cannot be given."""
    from transformers import PretrainedConfig

    try:
        source = alone_inputs.class_source(klass)
    except OSError as error:
        raise _CannotBuild(f"its constructor takes `config`, the file has no config class, and its source is unread: {error}") from error
    values: dict[str, Any] = {}
    for name in dict.fromkeys(_CONFIG_READS.findall(source)):
        if name.startswith("_") or name in ("to_dict", "get", "update"):
            continue
        value = _value_for(name)
        if value is None and alone_inputs.tested_only(source, name):
            value = False  # a switch the class only tests (`if config.pre_ln:`): off
        if value is None:
            raise _CannotBuild(f"its constructor reads `config.{name}`, and the file has no config class to give it")
        values[name] = value
    config = PretrainedConfig(**values)
    for name, value in values.items():
        setattr(config, name, value)
    return config


def _value_for(name: str) -> Any | None:
    """A config attribute's value told by its name (widths, heads, head sizes, lengths, rates, epsilons, switches),
    None where the name tells none."""
    if _HEADS.match(name) or name in ("num_key_value_heads", "num_attention_heads"):
        return HEADS
    if _WIDTHS.match(name) or name.endswith("_hidden_size"):  # `encoder_hidden_size`: a cross-attention's keys
        return HIDDEN
    if _SIZES.search(name):
        return HIDDEN // HEADS
    if _LENGTHS.search(name):
        return 64
    if name == "dtype" or name.endswith("_dtype"):  # `params_dtype`: the model's dtype
        return torch.float32
    if _RATES.search(name) or name.endswith(("_prob", "_dropout")):
        return 0.0
    if _EPSILONS.search(name):
        return 1e-5
    if _SWITCHES.match(name) or name.endswith(("_norm", "_normalization")):
        return False
    if name.endswith("_bias"):  # a projection's bias switch (`qkv_bias`)
        return True
    return None


def _eager_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments with a config of their own per build, set to eager.

    Transformers 5 dispatches from the config at call time: `sdpa_call` switches the port's own config to sdpa for one
    call, which must not reach the original's.
    """
    out = dict(arguments)
    for name, value in arguments.items():
        if hasattr(value, "_attn_implementation"):
            config = copy.deepcopy(value)
            with contextlib.suppress(Exception):
                config._attn_implementation = "eager"
            out[name] = config
    return out


def _layer_width(module: torch.nn.Module) -> int | None:
    """The input width of the module's first linear layer, else of its first convolution, group or layer norm.

    A linear layer reading the width the module keeps (`self.dim`) comes first: a small network ahead of the
    projections (Swin v2's continuous position bias, `Linear(1, 512)`) reads something else."""
    linears = [child.in_features for child in module.modules() if isinstance(child, torch.nn.Linear)]
    for attribute in ("dim", "embed_dim", "hidden_size", "d_model"):
        value = getattr(module, attribute, None)
        if isinstance(value, int) and value in linears:
            return value
    if linears:
        return linears[0]
    for child in module.modules():
        if isinstance(child, torch.nn.modules.conv._ConvNd):
            return child.in_channels
        if isinstance(child, torch.nn.GroupNorm):
            return child.num_channels
        if isinstance(child, torch.nn.LayerNorm) and len(child.normalized_shape) == 1:
            return int(child.normalized_shape[0])
    return None


def _window_mask(length: int) -> torch.Tensor:
    """An additive `(windows, tokens, tokens)` mask of 0 and -100 as shifted windows get: the second window's tokens
    attend only within their half, the first window unmasked."""
    half = torch.arange(length) >= length // 2
    mask = torch.zeros(BATCH, length, length)
    mask[1] = torch.where(half[:, None] != half[None, :], -100.0, 0.0)
    return mask


def _width(module: torch.nn.Module) -> int:
    found = _layer_width(module)
    if found is not None:
        return found
    for attribute in ("embed_dim", "hidden_size", "all_head_size"):
        value = getattr(module, attribute, None)
        if isinstance(value, int):
            return value
    return HIDDEN


def _heads(module: torch.nn.Module) -> int:
    for attribute in ("num_attention_heads", "num_heads", "n_heads", "n_head", "heads"):
        value = getattr(module, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    return HEADS


def _cases(module: torch.nn.Module, width: int, heads: int, window: Any = None) -> list[tuple[str, dict[str, Any]]]:
    """The inputs the original eager module runs on with finite outputs: no mask, padded keys, optional terms.

    The states take the first layout of `alone_inputs.state_shapes` that the original runs on in any case; a window's
    tokens, or the product of the spatial sizes the forward takes, are the length. Where none runs and the module
    holds a window of frames, its frames are folded into the batch (`alone_inputs.folded_options`)."""
    found = _laid_out_cases(module, width, heads, window)
    if found:
        return found
    for counts, batch, plane in alone_inputs.folded_options(module):
        found = _laid_out_cases(module, width, heads, plane, counts, batch)
        if found:
            # said once, on the first case: every case ran so
            note = alone_inputs.folded_note(module, counts, batch)
            return [(case + (note if index == 0 else ""), kwargs) for index, (case, kwargs) in enumerate(found)]
    return []


def _laid_out_cases(
    module: torch.nn.Module, width: int, heads: int, window: Any = None, counts: dict[str, int] | None = None, batch: int = BATCH
) -> list[tuple[str, dict[str, Any]]]:
    """`_cases` for one window, the forward's `counts` given as they are and states of `batch` sequences."""
    spatial = alone_inputs.spatial_parameters(module.forward)
    sizes = alone_inputs.spatial_values(spatial, window)
    length = alone_inputs.tokens(window) if window is not None else math.prod(sizes.values()) if sizes else LENGTH
    sizes.update(counts or {})
    first: list[tuple[str, dict[str, Any]]] = []
    for shape in alone_inputs.state_shapes(width, heads, length, window, alone_inputs.image_sides(module), batch):
        for positions in _positions(module, length):
            found = _cases_at(module, width, heads, shape, {**sizes, **positions}, length, window is not None)
            # an image or a channels-first map (a VAE's `AttnBlock`), or (length, batch, width) states (Megatron's
            # seq-first layout): said in the case, the reader sees what ran
            masked = any(case != "no mask" for case, _ in found)
            suffix = alone_inputs.layout_note(shape, width, length, batch)
            found = [(case + suffix, kwargs) for case, kwargs in found]
            if masked:
                return found
            first = first or found
    # the states of a layout the masks run on are preferred: a seq-first module runs (b, s, w) states unmasked as s
    # sequences of b tokens, where no mask of (b, s) fits
    return first


def _positions(module: torch.nn.Module, length: int) -> list[dict[str, Any]]:
    """Position ids a forward requires, in each shape tried: (batch, length), then ChatGLM's (batch, 2, length) of
    positions and block positions; none where it requires none."""
    parameter = inspect.signature(module.forward).parameters.get("position_ids")
    if parameter is None or parameter.default is not parameter.empty:
        return [{}]
    positions = torch.arange(length).expand(BATCH, length)
    return [{"position_ids": positions}, {"position_ids": torch.stack([positions, torch.zeros_like(positions)], 1)}]


def _cases_at(
    module: torch.nn.Module,
    width: int,
    heads: int,
    shape: tuple[int, ...],
    sizes: dict[str, Any],
    length: int,
    windowed: bool,
) -> list[tuple[str, dict[str, Any]]]:
    generator = torch.Generator().manual_seed(1)
    signature = inspect.signature(module.forward)
    base: dict[str, Any] = dict(sizes)
    masks: list[str] = []
    terms: list[str] = []
    cross: list[str] = []
    roles = alone_inputs.forward_roles(module.forward)  # how the forward uses a parameter no name tells
    sizes_of = _embedded_sizes(module)
    indices: dict[str, int] = {}
    states: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or parameter.name in sizes:
            continue
        name = parameter.name
        required = parameter.default is parameter.empty
        if _LAYERS.match(name) and required:  # Megatron's forward(..., layer_id)
            base[name] = LAYER
        elif _MASKS.match(name) or (required and roles.get(name) == "mask"):  # `scores.masked_fill(m, ...)`
            masks.append(name)
            if required:  # a mask the forward requires is None where none is given
                base[name] = None
        elif required and roles.get(name) == "term":  # `if pos_k is not None`: an optional term, given or not
            terms.append(name)
            base[name] = None
        elif required and name in sizes_of:
            indices[name] = sizes_of[name]
        elif required and roles.get(name) == "index":  # positions `index=` takes: a segment per two tokens
            base[name] = (torch.arange(length) // 2).repeat(BATCH, 1)
        elif required and roles.get(name) == "flags":  # a boolean per token: the first flagged (PoNet's [CLS])
            base[name] = torch.arange(length).repeat(BATCH, 1) == 0
        elif parameter.default is parameter.empty:  # states, whatever their name (`fv`, `fe`): the original decides
            base[name] = torch.randn(shape, generator=generator)
            states.append(name)
        elif parameter.default is None and _TERMS.search(name):
            terms.append(name)
        elif parameter.default is None and _CROSS.match(name):
            cross.append(name)
    mask_options = _mask_options(masks, length, windowed)
    # score terms at the shapes they take: (batch, heads, queries, keys) or (batch, length, width), or an embedding of
    # a head's width per pair of positions, shared by the batch or not (`q @ pos_k.transpose(-2, -1)` on the queries
    # laid out (length, batch * heads, head width)); all of them at one shape (a module may need several), or each alone
    term_shapes: list[tuple[int, ...]] = [(BATCH, heads, length, length), (BATCH, length, width)]
    if heads > 0 and width % heads == 0:
        term_shapes += [(length, length, width // heads), (BATCH, length, length, width // heads)]
    term_options: list[dict[str, Any]] = [{}]
    for term_shape in term_shapes:
        term_options.append({term: torch.randn(term_shape, generator=generator) for term in terms})
        if len(terms) > 1:
            term_options += [{term: torch.randn(term_shape, generator=generator)} for term in terms]
    # the other sequence's states, where the forward takes them: left out, then given (a cross-attention built to
    # read them always runs only with them)
    cross_options: list[dict[str, Any]] = [{}]
    if cross:
        cross_options.append({name: torch.randn(shape, generator=generator) for name in cross})
    input_options = _input_options(indices, states, length, width, generator, shape)
    cases: dict[str, dict[str, Any]] = {}
    for mask_case, mask_kwargs in mask_options:
        for term_kwargs in term_options:
            for cross_kwargs in cross_options:
                given = [*term_kwargs, *cross_kwargs]
                label = f"{mask_case} with {', '.join(given)}" if given else mask_case
                for index_kwargs in input_options:
                    kwargs = {**base, **index_kwargs, **mask_kwargs, **term_kwargs, **cross_kwargs}
                    if label not in cases and _runs(module, kwargs):
                        cases[label] = kwargs
    return list(cases.items())


def _mask_options(masks: list[str], length: int, windowed: bool) -> list[tuple[str, dict[str, Any]]]:
    """The masks tried, labelled: none, then padded keys, a causal triangle and shifted windows' mask where the
    forward takes one (`masks`, the first given)."""
    # padded keys in the extended form (batch, 1, 1, keys), expanded over the queries for modules that check it,
    # or as the (batch, keys) mask of ones and zeros for modules that extend it themselves
    broadcast = torch.zeros(BATCH, 1, 1, length)
    broadcast[1, ..., length - PADDED :] = torch.finfo(torch.float32).min
    keys = torch.ones(BATCH, length)
    keys[1, length - PADDED :] = 0
    mask_options: list[tuple[str, dict[str, Any]]] = [("no mask", {})]
    # or, for modules that fill where a boolean mask says (`scores.masked_fill(mask, -10000.0)`, Megatron's form) and
    # take none of those, as booleans: true where masked, then true where kept
    # (a module scoring (batch, queries, keys) without heads takes them as (batch, 1, keys)), and as fairseq's key
    # padding mask, (batch, keys), true where padded
    padded = broadcast < 0
    values = (broadcast, broadcast.expand(-1, -1, length, -1), keys, padded, ~padded, padded[:, 0], ~padded[:, 0])
    for value in (*values, padded[:, 0, 0]):
        mask_options += [("padded keys", {masks[0]: value})] if masks else []
    if masks:  # a causal mask of ones and zeros, (1, 1, queries, keys), as decoders keep in a buffer
        mask_options.append(("causal ones", {masks[0]: torch.ones(1, 1, length, length).tril()}))
    if windowed and masks:  # an additive (windows, tokens, tokens) mask of 0 and -100, as shifted windows get
        mask_options.append(("window mask", {masks[0]: _window_mask(length)}))
    return mask_options


def _embedded_sizes(module: torch.nn.Module) -> dict[str, int]:
    """The forward's parameters passed alone to an `nn.Embedding` of the module (`self.links(relation)`), each with
    the embedding's size: index tensors, below it."""
    out: dict[str, int] = {}
    for name, attribute in alone_inputs.embedded(module.forward).items():
        found = getattr(module, attribute, None)
        if isinstance(found, torch.nn.Embedding):
            out[name] = found.num_embeddings
    return out


def _input_options(
    indices: dict[str, int],
    states: list[str],
    length: int,
    width: int,
    generator: torch.Generator,
    shape: tuple[int, ...] = (),
) -> list[dict[str, Any]]:
    """The index tensors and the required tensors after the states, in the orders tried (the first that runs)."""
    # the indices the forward embeds, one per pair of positions, then one per position: the first shape that runs
    options: list[dict[str, Any]] = [
        {name: torch.randint(0, size, index_shape, generator=generator) for name, size in indices.items()}
        for index_shape in alone_inputs.index_shapes(length)
    ] if indices else [{}]
    # the required tensors after the first: the states' shape, then a (length, width) table shared by the batch
    # (Transformer-XL's relative position embeddings `r`, which the forward projects and views per position)
    if len(states) > 1:
        table = {name: torch.randn((length, width), generator=generator) for name in states[1:]}
        tried = [{**option, **table} for option in options]
        # where the first states are maps, the others tokens (BATCH, length, width): vidt's [DET] tokens beside its
        # channels-last patch tokens
        if len(shape) == 4:
            tokens = {name: torch.randn((BATCH, length, width), generator=generator) for name in states[1:]}
            tried += [{**option, **tokens} for option in options]
        options += tried
    return options


def _runs(module: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether the module runs on `kwargs` with finite outputs no larger than its largest input: a mask of more
    dimensions than the scores it fills (`scores.masked_fill(m, ...)` out of place) broadcasts them, and the outputs,
    to a batch of batches no caller makes."""
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            output = first_tensor(module(**copy.deepcopy(kwargs)))
    except Exception:
        return False
    largest = max((value.numel() for value in kwargs.values() if isinstance(value, torch.Tensor)), default=0)
    if output is None or (largest and output.numel() > largest):
        return False
    return bool(torch.isfinite(output).all())
