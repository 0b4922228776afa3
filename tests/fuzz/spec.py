"""The variation axes of the fuzzer: one `Spec` describes one generated modeling file.

Every field has a simplest value (listed first in its choices); the shrinker moves fields towards it. `draw` picks
a consistent spec from a seeded random generator, so a seed names a case for good.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from typing import Any

# ------------------------------------------------------------------ the axes and their choices (simplest first)

LAYOUTS = ("heads", "flat")
CACHES_STORED = ("none", "whole", "flat")
HEAD_PRODUCTS = (
    "matmul",  # torch.matmul(q, k.transpose(-1, -2))
    "operator",  # q @ k.transpose(-2, -1)
    "method",  # q.matmul(k.transpose(2, 3))
    "einsum",  # torch.einsum("bhqd,bhkd->bhqk", q, k)
    "einsum_kt",  # torch.einsum("bhqd,bhdk->bhqk", q, k.transpose(-1, -2))
    "pretransposed",  # key_t = k.transpose(-1, -2) earlier, then q @ key_t
    "permuted",  # the key is permuted to (b, h, d, s) when split into heads, then q @ k
    "einsum_bthd",  # q, k, v kept as (b, t, h, d): torch.einsum("bqhd,bkhd->bhqk", q, k)
)
FLAT_PRODUCTS = (
    "bmm",
    "baddbmm_zero",
    "baddbmm_alpha",
    "bmm_method",
    "einsum_flat",  # torch.einsum("bqd,bkd->bqk", q, k); length first, states (t, b*h, d): "qbd,kbd->bqk"
)
SWITCHES = ("none", "single", "chained")
VALUE_LEFTS = ("none", "inline", "statement")
SCALE_PLACES = ("scores", "none", "query", "after_terms", "alpha", "qk_quarter")
SCALE_FORMS = ("sqrt_div", "attr_mul", "pow_div", "full_div", "size_div", "inplace_div", "literal_mul", "tensor_div")
SCALE_GUARDS = ("none", "flag", "flag_else", "layer")  # where the scale is conditional
TERM_GUARDS = ("plain", "not_none", "flag")
CAUSAL_SOURCES = ("mask", "buffer", "none")
CAUSAL_SLICES = ("bottom_right", "top_left")
BUFFER_FORMS = ("inline", "local", "window")
FILL_FORMS = ("where", "masked_fill", "masked_fill_inplace", "where_inverted", "blend")  # blend: s * b + f * (1 - b)
FILL_VALUES = ("finfo_min", "tensor_finfo_min", "minus_1e4", "minus_inf", "masked_bias", "minus_1e9")
CAUSAL_GUARDS = ("plain", "not_cross", "cross_pass_else", "cross_none_else", "flag")
SOFTMAXES = ("functional", "upcast", "method", "module_attribute", "dim3", "float_first")
DROPOUTS = ("none", "module", "functional")
WIRINGS = ("dict", "direct", "dict_public_key", "direct_no_config")
PLACEMENTS = ("forward", "helper", "function")
HAZARDS = (
    "none",
    "softcap",
    "topk",
    "square",
    "param_scale",
    "post_softmax_term",
    "renorm",
    "dropout_before_softmax",
    "value_relative",
    "loop",
    "zero_fill",
    "score_dependent_term",
    "authors_off",
    "optional_renorm",
)
# a port of these is wrong even when eval-mode outputs agree: dropout on the scores only acts in training, and the
# file's authors set `_supports_sdpa = False`
SEMANTIC_HAZARDS = frozenset({"dropout_before_softmax", "authors_off"})


# transformers 4.40.2 (class style) and 5.23.0 (interface style) skeletons; "inline" draws 4.40.2 skeletons of its own
# and ports them with `--style inline` (each attention class rewritten in place, judged against the original)
FAMILIES = ("440", "523", "inline")


@dataclass(frozen=True)
class Spec:
    seed: int = 0
    family: str = "440"
    layout: str = "heads"
    product: str = "matmul"
    scale_place: str = "scores"
    scale_form: str = "sqrt_div"
    scale_guard: str = "none"
    terms: tuple[tuple[str, str], ...] = (("mask", "not_none"),)  # (kind, guard) in order
    mask_style: str = "plain_helper"
    causal: str = "none"  # where causality comes from
    causal_slice: str = "bottom_right"
    buffer_form: str = "inline"  # the causal buffer: registered inline, built in a local, or a sliding window
    lengths_from_scores: bool = False  # the causal slice reads the lengths from the scores' shape (CTRL's form)
    fill_form: str = "where"
    fill_value: str = "finfo_min"
    causal_guard: str = "plain"
    causal_after_terms: bool = False  # the causal fill comes after the additive terms
    guard_floor: bool = False  # torch.max(scores, finfo.min) before the softmax
    floor_with_mask: bool = False  # the floor sits inside the mask's `if ... is not None:` block (OPT's form)
    mask_assert: bool = False  # `assert attention_mask is not None` before the computation
    softmax: str = "functional"
    dropout: str = "none"
    dropout_guarded: bool = False  # dropout only under `if self.training`-like flag
    head_mask: bool = False
    output_attentions: bool = True
    cache: bool = False
    cross: bool = False  # the same class serves cross-attention (GPT-2's convention)
    is_causal_attr: bool = False  # `self.is_causal = True` on the class
    placement: str = "forward"
    wiring: str = "dict"
    hazard: str = "none"
    config_stored: bool = True  # `self.config = config` in the attention's __init__
    # the chain in the else branch of another kernel used in training (Open-Llama's xformers path)
    alternative: bool = False
    # the probabilities zeroed again where the causal fill masked the scores (CPM-Ant's, FastSpeech2's form)
    zero_masked: bool = False
    # the chain under `if self.landmarks == self.seq_len:`, an approximation in the else branch (Nystromformer)
    settings_branch: bool = False
    # 5.x: the layer builds its self-attention with a literal `is_causal=True` (BridgeTower's cross-modal layers)
    pinned_causal: bool = False
    # a second attention no SDPA call expresses (tanh of its scores), beside the first: its band mask built by the
    # model from the 2-D input ("own": it may stay eager) or the implementation's mask handed to it ("mask": refused)
    sparse_sibling: str = "none"
    # 5.x: the model converts the causal builder's mask to booleans and the attention fills where it is True
    # (MPT's `create_causal_mask(...).to(torch.bool)` with `masked_fill(mask, finfo.min)`)
    bool_fill: bool = False
    # flat layout: the model hands the position bias flattened to `(batch * heads, q, k)` and the attention adds it to
    # the flat scores under `if position_bias is not None:` (DeBERTa's relative term)
    flat_bias: bool = False
    # a helper or module function returns the product with V and the probabilities in one statement
    # (`return torch.matmul(attn_weights, value), attn_weights`), which the caller unpacks
    returned_together: bool = False
    # with `einsum_bthd`: the states run length first, (t, b, h, d) as in Transformer-XL and XLNet, and both einsums
    # read them so (`torch.einsum("qbhd,kbhd->bhqk", q, k)`, the output `...->qbhd`)
    length_first: bool = False
    # 4.x, the chain in forward: the weights returned for `output_attentions` are the scores before the softmax,
    # kept under `if output_attentions:` (ProphetNet)
    scores_returned: bool = False
    # 4.x, the chain in forward: fairseq's `before_softmax`, a switch of the call (off by default, never passed by the
    # layer) that returns the scores; with `chained`, a second switch turns it on by assigning it
    # (`if all_scores: return_scores = True`, as `need_head_weights` turns on `need_weights`)
    switches: str = "none"
    # 5.x, causal masks: the model picks its builder by an `is_decoder` argument of the call (BLIP's text model), so
    # one module is causal for some calls and not for others
    per_call: bool = False
    # 5.x: the attention prepends keys of its own (prompt keys) and extends the mask with zeros for them (MVP)
    prompt_keys: bool = False
    # the causal buffer fill under `if self.is_causal:`, the module's own flag (Bark's blocks, built with
    # `is_causal=True` and given bidirectional masks)
    own_flag_guard: bool = False
    # the chain in a helper, with an upcast twin of it in a second helper: forward calls one or the other under
    # `if self.flag_twin:` (ImageGPT's `_attn` beside `_upcast_and_reordered_attn`, chosen by a setting)
    twin_helper: bool = False
    # with `settings_branch`: the exact side chosen by a flag, `if not self.approximate:`, rather than a comparison
    settings_flag: bool = False
    # a second product with V of the same probabilities, its value `value.flip(-1)`, added to the output (LiLT's two
    # streams): "remade" computes the chain again from the scores for it (a draw of its own where there is dropout),
    # "shared" multiplies the same probabilities (one draw: with dropout, SDPA calls cannot reproduce it)
    streams: str = "one"
    # the product with V and what follows it written in each arm of `if self.flag_arms:`, the `else` arm negating the
    # output (ONMT's `use_final_linear` arms, `analyse/outputs.py`): one SDPA call per arm, one of them run per call
    output_arms: bool = False
    # the scores joined by `torch.cat` from four blocks (the query and key each split in two along their lengths,
    # each block's query scaled its own way, a key half read through two names: LUKE's form): "joined" always,
    # "branch" only under `if self.flag_blocks:`, one plain product otherwise
    blocks: str = "none"
    # with blocks "branch": what the plain branch does to its own product before the branches meet, "scale" (by a
    # number) or "term" (a per-key bias added)
    branch_op: str = "none"
    # the query-key product (with any scaling of the query before it) computed by a method of the attention class,
    # `attn_weights = self._scores(query, key)`, which the class style reads as its statements written out
    score_helper: bool = False
    # the dtype of the causal buffer's entries (a triangle of 0s and 1s): `tril(ones(n, n, dtype=...))`, float
    # without a dtype
    buffer_dtype: str = "bool"
    # 4.x, the `manual_bool` style: the padding mask's dtype as the model hands it to the attention (a 0/1 tensor)
    mask_dtype: str = "bool"
    # how a fill reads a 0/1 tensor (the causal buffer's slice, the padding mask): "natural" the existing forms
    # (boolean tensors only), else a comparison that makes a boolean of any dtype (`mask == 0`, `mask.eq(0)`, ...)
    compare: str = "natural"
    # 4.x: a mask helper of another library with the name of Transformers' and another signature, defined in the file
    # (a BERT-derived Q-Former's): "function" shadows the imported helper the mask style calls, with the caller's
    # `is_decoder` before the dtype; "method" is the model's own `get_extended_attention_mask(self, attention_mask,
    # input_shape, device, is_decoder, has_query=False)` (LAVIS's)
    own_helper: str = "none"
    # 4.x: causality chosen per call by an `is_decoder` argument of the model's forward (default True): "helper" picks
    # the causal or the plain mask helper by it (BLIP's and LAVIS's text models), "argument" hands it down through the
    # layer to the attention, whose causal fill runs under `if is_decoder:`
    call_causal: str = "none"
    # 4.x: the layer sets the implementation before it builds its attention: "shared" writes
    # `config._attn_implementation = "eager"` into the model's config, "copy" into a copy of it
    selection_override: str = "none"
    # 5.x: the attention adds its mask to a bias of its own in forward, `own_bias = zeros(...) + attention_mask`, and
    # adds that sum to the scores (T5's form before transformers ported it): the mask is read beside the chain
    mask_read: bool = False
    # the query-key product taken on float32 copies of the query and key under `if self.flag_precision:`, in their own
    # dtype otherwise (latent diffusion's `_ATTN_PRECISION` switch)
    precision_branch: bool = False
    # the style the file is ported with: "auto", or "inline" (the inline family: its forward rewritten in place)
    style: str = "auto"
    # a fused softmax beside the softmax that can never run (`analyse/certain.py`): "attribute" tests a module the
    # constructor leaves None (`if self.fused_softmax:`, ChatGLM's form), "constant" a module constant set False
    dead_softmax: str = "none"
    # 4.x: the value multiplies the transposed probabilities from the left, the output transposed back
    # (`torch.matmul(value.transpose(-1, -2), attn_weights.transpose(-1, -2)).transpose(-1, -2)`, a VAE's form):
    # "inline" in the product, "statement" by `attn_weights = attn_weights.transpose(-1, -2)` before it
    value_left: str = "none"
    # the key unbound after the scores (`del k`, a diffusion UNet's memory saving), just before the product with V:
    # the SDPA call reads the key there, so the port must not keep the `del` ahead of it
    del_key: bool = False
    # an out-of-place fill of the scores called as a statement, its result thrown away
    # (`attn_weights.masked_fill(attn_weights > 0, -10000.0)`): eager's scores stay as they were, and the port's must
    discarded_fill: bool = False
    # with the `permuted` product, the key laid out (b, h, d, s) by a view of its projection made channels-first
    # (no permute): a right operand no transpose says is a key, read as one by the product's rank
    key_viewed: bool = False
    # the chain in a function forward defines and calls (`analyse/closures.py`), reading forward's mask, head mask,
    # bias and module: "direct" once, "checkpoint" through `torch.utils.checkpoint.checkpoint`, "twice" twice (the two
    # outputs averaged)
    closure: str = "none"
    # 4.x, flat `bmm` scores: a non-local block's form, every operand channels-first, the key transposed inside the
    # product (`torch.bmm(key_cf.permute(0, 2, 1).contiguous(), query_cf)`, the query's layout shown by nothing else),
    # the softmax over dim 1 (the keys, the product's left operand), the value on the left of the probabilities as they
    # are (`torch.bmm(v.transpose(1, 2), attn_weights).transpose(1, 2)`)
    over_queries: bool = False
    # flat layout: the batch size and the query length swapped between the view of the scores (batch, heads, q, k)
    # and the product with V, which views its output with them swapped back (`bsz, q_len = q_len, bsz`): the sizes the
    # view read are bound again before the SDPA call (Megatron's output_size tuples), so the port reads them at the view
    sizes_swapped: bool = False
    # flat layout, 4.x, the chain in forward: BART's form, the query viewed with its length (`view(bsz, q_len, ...)`),
    # the batch size and length read once from the hidden states and never again, the key's length read from the
    # flat key (`key_states.size(1)`), the output's size checked after the product with V before its view back
    flat_kept: bool = False
    # BART's form, its cache stored in the parameter it came in (`layer_past = (...)`, returned as the present): the
    # second layer reuses the cache whole (`key = layer_past[0]`, as BART's cross-attention does), so only what forward
    # stores tells the key's shape (a buffer's causal mask follows the keys; a built mask no longer fits). "whole"
    # stores `(key, value)`; "flat" stores the flattened states (Bloom's cache), which the key then is
    cache_stored: str = "none"
    # the inline family, 4.x, no request for the weights: forward returns them all the same, and the layer "unpacked"
    # them into `_`, "indexed" the output out of the triple, or "read" them (passing them on, which refuses the port)
    weights_discarded: str = "none"
    # 4.x, heads layout: the additive padding mask expanded to the scores' shape read from them right after the
    # product (`attention_mask.expand(attn_weights.shape[0], ..., attn_weights.shape[3])`), at a rank the port may not
    # know (a helper's or function's parameters): their sizes come from the query and key, or from the product's shape
    mask_expanded: bool = False
    # 4.x, heads layout, after the additive mask: the kept keys paired with every query by a product shaped like a
    # query-key product (`torch.matmul(ones, kept.transpose(-1, -2))`), which masks the scores by a fill: a product of
    # masks, read by the fill as its condition, not other scores
    mask_paired: bool = False
    # how the additive helper function (the "helper" term) adds its per-head bias: "returned" returns the scores plus
    # it, viewed back; "slice" assigns the keys past the first their slice plus it, viewed and viewed back, and
    # "augmented" adds it to that slice with `+=` (MViT's and ViTDet's in-place forms); both return the scores
    helper_form: str = "returned"
    # with `einsum`: one key and one value for every head, their heads averaged away (multi-query, CoCa's form):
    # `torch.einsum("bhqd,bkd->bhqk", q, k.mean(1))`, and the value likewise in the product with V
    shared_kv: bool = False
    # the probabilities' dtype read beside the chain, by its name (`weights_type = attn_weights.type()`, a string, as
    # MGLM keeps it) or its attribute (`.dtype`): the port points the read at the query it hands SDPA
    dtype_read: str = "none"
    # with `twin_helper`, what the twin does otherwise: "upcast" its softmax in float32 first (the same SDPA call: the
    # port keeps one), "reordered" also its product on the heads flattened for `baddbmm`, on float32 copies, split
    # again after (GPT-2's `_upcast_and_reordered_attn`: the same call too), "rescaled" its scores halved after the
    # product (another call: the port keeps both)
    twin_form: str = "upcast"
    # the inline family: the dtype the caller hands the attention its additive terms in (the padding mask, the position
    # bias), which eager's `scores + term` promotes: "float32" as the model builds them, or converted by the judge on
    # the way into each layer (`judge.caller_terms`) to "bool", "int64" or "float16" (the model is float32)
    term_dtype: str = "float32"
    # the inline family: a term guarded by `is not None` written instead as a number where it is None
    # (`attention_mask = 0.0 if attention_mask is None else attention_mask`, then added unguarded), which eager adds to
    # every score and SDPA takes as no mask of its own (`rewrite/term_dtype.number_as_tensor`)
    number_term: bool = False
    # the padding mask added only off an XLA device (`if hidden_states.device.type != "xla":`), the other arm leaving
    # it out (fairseq's TPU branch, made different): the port takes the arm this device runs, eager the other on XLA
    xla_branch: bool = False
    # the windowed term added with the regrouped scores permuted to put the heads before the windows, then permuted
    # back before the view back (video Swin's frames beside the heads)
    windowed_permuted: bool = False

    # -------------------------------------------------------------- derived facts

    @property
    def decoder(self) -> bool:
        return self.causal != "none"

    @property
    def must_refuse(self) -> bool:
        """Cases whose port would be wrong in a way the eval-mode judge cannot see (training-only, authors' flags)."""
        return self.hazard in SEMANTIC_HAZARDS

    def flags(self) -> list[str]:
        """The boolean config fields the file branches on; the judge runs every combination."""
        out: list[str] = []
        if self.scale_guard in ("flag", "flag_else"):
            out.append("flag_scale")
        if any(guard == "flag" for _, guard in self.terms):
            out.append("flag_terms")
        if self.causal == "buffer" and self.causal_guard == "flag":
            out.append("flag_causal")
        if self.settings_branch:
            out.append("flag_landmarks")
        if self.twin_helper:
            out.append("flag_twin")
        if self.blocks == "branch":
            out.append("flag_blocks")
        if self.precision_branch:
            out.append("flag_precision")
        if self.output_arms:
            out.append("flag_arms")
        return out

    def describe(self) -> str:
        default = Spec()
        parts = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name not in ("seed",) and getattr(self, f.name) != getattr(default, f.name)]
        return f"Spec(seed={self.seed}" + (", " + ", ".join(parts) if parts else "") + ")"


# ------------------------------------------------------------------ drawing


SPARSE_SIBLINGS = ("none", "own", "mask")
WEIGHTS_DISCARDED = ("none", "unpacked", "indexed", "read")
HELPER_FORMS = ("returned", "slice", "augmented")
DTYPE_READS = ("none", "name", "attribute")
TWIN_FORMS = ("upcast", "reordered", "rescaled")
TERM_DTYPES = ("float32", "bool", "int64", "float16")
CLOSURES = ("none", "direct", "checkpoint", "twice")
STREAMS = ("one", "remade", "shared")
BLOCKS = ("none", "joined", "branch")
BRANCH_OPS = ("none", "scale", "term")
OWN_HELPERS = ("none", "function", "method")
CALL_CAUSAL = ("none", "helper", "argument")
SELECTION_OVERRIDES = ("none", "shared", "copy")
DEAD_SOFTMAXES = ("none", "attribute", "constant")
# a causal buffer's and a padding mask's dtypes; the comparisons a fill makes of such a 0/1 tensor
BUFFER_DTYPES = ("bool", "uint8", "float", "long")
MASK_DTYPES = ("bool", "long", "float")
COMPARES = ("natural", "eq0", "eq_method", "torch_eq", "ne0", "lt_half", "gt_half", "logical_not", "bool_cast")
# products a method can compute from the query and key alone (no lengths or batch sizes of forward's)
HELPER_PRODUCTS = ("matmul", "operator", "method", "einsum", "einsum_kt", "pretransposed", "permuted")


def _pick(rng: random.Random, choices: tuple[str, ...], weights: tuple[float, ...] | None = None) -> str:
    return rng.choices(choices, weights=weights)[0] if weights else rng.choice(choices)


def draw(seed: int, family: str = "440") -> Spec:
    """A consistent random spec; most cases are portable, about one in six carries a hazard."""
    if family == "inline":  # 4.40.2 skeletons drawn from seeds of their own, ported in place
        spec = replace(_draw(seed, "440", random.Random(f"inline:{seed}")), style="inline")
        discarded = _pick(random.Random(f"discarded:{seed}"), WEIGHTS_DISCARDED, (6, 2, 2, 1))
        if discarded != "none":  # the weights returned with no request; built by its name, as remote code does
            wiring = "direct" if spec.wiring.startswith("dict") else spec.wiring
            spec = normalise(replace(spec, weights_discarded=discarded, output_attentions=False, wiring=wiring))
        term_dtype = _pick(random.Random(f"term_dtype:{seed}"), TERM_DTYPES, (3, 1, 1, 1))
        if term_dtype != "float32":  # a generator of its own: a float32 draw leaves the spec as it was
            spec = normalise(replace(spec, term_dtype=term_dtype))
        if random.Random(f"number_term:{seed}").random() < 0.25:
            spec = normalise(replace(spec, number_term=True))
        return _with_xla_branch(spec, seed, family)
    spec = _draw(seed, family, random.Random(seed if family == "440" else f"{family}:{seed}"))
    return _with_xla_branch(spec, seed, family)


def _with_xla_branch(spec: Spec, seed: int, family: str) -> Spec:
    """The spec with `xla_branch` drawn from a generator of its own (every other field keeps its draw), for the
    families whose ports fall back to eager by a test of their own (the interface style refuses it: W403); and
    `windowed_permuted`, likewise, for every family."""
    if random.Random(f"permuted:{family}:{seed}").random() < 0.5:
        spec = normalise(replace(spec, windowed_permuted=True))
    if family in ("440", "inline") and random.Random(f"xla:{family}:{seed}").random() < 0.15:
        return normalise(replace(spec, xla_branch=True))
    return spec


def _draw(seed: int, family: str, rng: random.Random) -> Spec:
    layout = _pick(rng, LAYOUTS, (3, 1))
    product = _pick(rng, HEAD_PRODUCTS, (4, 2, 1, 1, 1, 1, 1, 1)) if layout == "heads" else _pick(rng, FLAT_PRODUCTS)
    causal = _pick(rng, CAUSAL_SOURCES, (2, 2, 3))
    if causal == "mask":
        mask_style = "causal_helper"
    elif causal == "buffer":
        mask_style = _pick(rng, ("manual_float", "manual_bool", "none", "plain_helper"), (3, 1, 1, 1))
    else:
        mask_style = _pick(rng, ("plain_helper", "extended", "manual_float", "manual_bool", "none"), (3, 2, 2, 1, 1))
    kinds: list[tuple[str, str]] = []
    if mask_style != "none" and mask_style != "manual_bool":
        kinds.append(("mask", _pick(rng, TERM_GUARDS, (2, 3, 0.3))))
    elif mask_style == "manual_bool":
        kinds.append(("bool_mask", _pick(rng, ("plain", "not_none"), (1, 3))))
    for kind in ("bias", "alibi", "relative", "windowed", "helper"):
        if rng.random() < 0.18:
            kinds.append((kind, _pick(rng, TERM_GUARDS, (3, 1, 1))))
    rng.shuffle(kinds)
    scale_place = _pick(rng, SCALE_PLACES, (5, 1, 2, 1, 1 if product.startswith("baddbmm") else 0, 1))
    if scale_place == "alpha" and not product.startswith("baddbmm"):
        scale_place = "scores"
    if product == "baddbmm_alpha" and scale_place != "alpha":
        product = "baddbmm_zero"
    cross = rng.random() < 0.2
    cache = rng.random() < 0.35
    hazard = _pick(rng, HAZARDS, (30,) + (0.5,) * (len(HAZARDS) - 1))
    spec = Spec(
        seed=seed,
        family=family,
        layout=layout,
        product=product,
        scale_place=scale_place,
        scale_form=_pick(rng, SCALE_FORMS),
        scale_guard=_pick(rng, SCALE_GUARDS, (6, 1, 1, 1)),
        terms=tuple(kinds),
        mask_style=mask_style,
        causal=causal,
        causal_slice=_pick(rng, CAUSAL_SLICES, (4, 1)),
        buffer_form=_pick(rng, BUFFER_FORMS, (3, 1, 1)),
        lengths_from_scores=rng.random() < 0.3,
        fill_form=_pick(rng, FILL_FORMS),
        fill_value=_pick(rng, FILL_VALUES, (4, 2, 1, 1, 1, 1)),
        causal_guard=_pick(rng, CAUSAL_GUARDS, (4, 1, 1, 1, 1)) if not cross else _pick(rng, CAUSAL_GUARDS[1:4]),
        causal_after_terms=rng.random() < 0.3,
        guard_floor=rng.random() < 0.12,
        floor_with_mask=rng.random() < 0.5,
        mask_assert=rng.random() < 0.05,
        softmax=_pick(rng, SOFTMAXES, (4, 2, 1, 1, 1, 1)),
        dropout=_pick(rng, DROPOUTS, (2, 2, 1)),
        dropout_guarded=rng.random() < 0.05,
        head_mask=rng.random() < 0.4,
        output_attentions=rng.random() < 0.8,
        cache=cache,
        cross=cross,
        is_causal_attr=rng.random() < (0.6 if causal != "none" else 0.15),
        placement=_pick(rng, PLACEMENTS, (5, 3, 1)),
        wiring=_pick(rng, WIRINGS, (6, 4, 0.5, 0.5)),
        hazard=hazard,
        config_stored=rng.random() < 0.7,
        alternative=rng.random() < 0.1,
        zero_masked=rng.random() < 0.15,  # drawn late: the draws of the fields above keep their seeds
        settings_branch=rng.random() < 0.1,  # drawn late, likewise
        pinned_causal=rng.random() < 0.15,
        sparse_sibling=_pick(rng, SPARSE_SIBLINGS, (8, 1, 1)),
        bool_fill=rng.random() < 0.3,
        flat_bias=rng.random() < 0.5,
        returned_together=rng.random() < 0.5,
        length_first=rng.random() < 0.5,
        scores_returned=rng.random() < 0.3,  # drawn late
        switches=_pick(rng, SWITCHES, (6, 2, 2)),
        per_call=rng.random() < 0.3,
        prompt_keys=rng.random() < 0.2,
        own_flag_guard=rng.random() < 0.5,
        twin_helper=rng.random() < 0.3,
        settings_flag=rng.random() < 0.5,
        streams=_pick(rng, STREAMS, (0.88, 0.08, 0.04)),
        blocks=_pick(rng, BLOCKS, (0.8, 0.1, 0.1)),
        branch_op=_pick(rng, BRANCH_OPS, (2, 1, 1)),  # drawn after the fields before it, so their draws stay
        score_helper=rng.random() < 0.2,
        buffer_dtype=_pick(rng, BUFFER_DTYPES, (2, 1, 1, 1)),  # drawn last: the fields above keep their seeds
        mask_dtype=_pick(rng, MASK_DTYPES, (2, 1, 1)),
        compare=_pick(rng, COMPARES, (4, 1, 1, 1, 1, 1, 1, 1, 1)),
        own_helper=_pick(rng, OWN_HELPERS, (6, 1, 1)),
        call_causal=_pick(rng, CALL_CAUSAL, (5, 1, 2)),
        selection_override=_pick(rng, SELECTION_OVERRIDES, (16, 1, 1)),
        mask_read=rng.random() < 0.25,  # drawn last: the fields above keep their seeds
        precision_branch=rng.random() < 0.15,  # drawn after mask_read, likewise
        # from a generator of its own: every field above keeps its seed's draw
        dead_softmax=_pick(random.Random(f"dead:{family}:{seed}"), DEAD_SOFTMAXES, (8, 1, 1)),
        value_left=_pick(rng, VALUE_LEFTS, (6, 1, 1)),  # drawn last, likewise
        del_key=random.Random(f"del:{family}:{seed}").random() < 0.15,  # its own generator: the draws above stay
        discarded_fill=random.Random(f"discard:{family}:{seed}").random() < 0.15,  # likewise
        closure=_pick(random.Random(f"closure:{family}:{seed}"), CLOSURES, (14, 2, 2, 2)),  # likewise
        over_queries=random.Random(f"queries:{family}:{seed}").random() < 0.2,  # likewise
        sizes_swapped=random.Random(f"sizes:{family}:{seed}").random() < 0.2,  # its own generator, likewise
        flat_kept=random.Random(f"kept:{family}:{seed}").random() < 0.3,  # likewise
        cache_stored=_pick(random.Random(f"stored:{family}:{seed}"), CACHES_STORED),  # likewise; only BART's form keeps it
        mask_expanded=random.Random(f"expanded:{family}:{seed}").random() < 0.2,  # likewise
        mask_paired=random.Random(f"paired:{family}:{seed}").random() < 0.2,  # likewise
        helper_form=_pick(random.Random(f"helper:{family}:{seed}"), HELPER_FORMS, (2, 1, 1)),  # likewise
        shared_kv=random.Random(f"shared:{family}:{seed}").random() < 0.3,  # likewise; only `einsum` keeps it
        dtype_read=_pick(random.Random(f"dtype:{family}:{seed}"), DTYPE_READS, (6, 1, 1)),  # likewise
        key_viewed=random.Random(f"viewed:{family}:{seed}").random() < 0.5,  # likewise; only `permuted` keeps it
        twin_form=_pick(random.Random(f"twin:{family}:{seed}"), TWIN_FORMS, (2, 1, 1)),  # likewise
        output_arms=random.Random(f"arms:{family}:{seed}").random() < 0.2,  # likewise
    )
    if spec.flat_kept and spec.layout == "flat" and family in ("440", "inline"):
        # BART's form takes the skeleton it is written in: one plain bmm of (b * h, L, d) states in forward
        spec = replace(spec, product="bmm", length_first=False, placement="forward", closure="none")
    if spec.over_queries and family == "440":
        # a non-local block's form takes the skeleton it can be written in: one plain flat product in forward
        softmax = spec.softmax if spec.softmax in QUERY_SOFTMAXES else "functional"
        spec = replace(spec, layout="flat", product="bmm", softmax=softmax, **NON_LOCAL)
    return normalise(spec)


# the softmax forms whose dimension is written; what a non-local block has none of: masks, fills, terms or floors
# (laid out (queries, keys), they would be added to scores (keys, queries); a softmax over the queries takes the
# product alone), a dropout or a head mask between the transposed probabilities and V, caches, other products or
# streams
QUERY_SOFTMAXES = ("functional", "method")  # a cast after it would come between the transposed probabilities and V
NON_LOCAL: dict[str, Any] = dict(
    terms=(),
    mask_style="none",
    causal="none",
    guard_floor=False,
    zero_masked=False,
    flat_bias=False,
    scores_returned=False,
    switches="none",
    dropout="none",
    head_mask=False,
    value_left="none",
    streams="one",
    blocks="none",
    cache=False,
    cross=False,
    precision_branch=False,
    score_helper=False,
    returned_together=False,
)


def normalise(spec: Spec) -> Spec:
    """Resolve combinations the skeleton cannot express into the nearest one it can."""
    if spec.family == "523":
        spec = _interface_family(spec)
    changes: dict[str, Any] = {}
    if spec.mask_read and spec.family != "523":
        changes["mask_read"] = False  # 4.x builds no mask per implementation
    if spec.layout == "flat" and spec.product not in FLAT_PRODUCTS:
        changes["product"] = "bmm"
    if spec.layout == "heads" and spec.product not in HEAD_PRODUCTS:
        changes["product"] = "matmul"
    product = changes.get("product", spec.product)
    if spec.scale_place == "alpha" and product not in ("baddbmm_alpha",):
        changes["scale_place"] = "scores"
    if product == "baddbmm_alpha" and changes.get("scale_place", spec.scale_place) != "alpha":
        changes["product"] = "baddbmm_zero"
    if spec.family == "440" and spec.causal == "mask" and spec.mask_style != "causal_helper":
        changes["mask_style"] = "causal_helper"
    if spec.family == "440" and spec.causal != "mask" and spec.mask_style == "causal_helper":
        changes["mask_style"] = "plain_helper"
    style = changes.get("mask_style", spec.mask_style)
    terms = []
    for kind, guard in spec.terms:
        if kind in ("mask", "bool_mask"):
            continue
        terms.append((kind, guard))
    if style not in ("none", "manual_bool"):
        guard = next((g for k, g in spec.terms if k == "mask"), "not_none")
        terms.insert(next((i for i, (k, _) in enumerate(spec.terms) if k in ("mask", "bool_mask")), 0), ("mask", guard))
    elif style == "manual_bool":
        guard = next((g for k, g in spec.terms if k == "bool_mask"), "not_none")
        terms.insert(next((i for i, (k, _) in enumerate(spec.terms) if k in ("mask", "bool_mask")), 0), ("bool_mask", "not_none" if guard == "flag" else guard))
    if tuple(terms) != spec.terms:
        changes["terms"] = tuple(terms)
    if spec.causal != "buffer":
        for name, default in (
            ("causal_guard", "plain"), ("causal_slice", "bottom_right"), ("causal_after_terms", False), ("buffer_form", "inline"),
            ("lengths_from_scores", False),
        ):
            if getattr(spec, name) != default:
                changes[name] = default
    if spec.cross and spec.causal == "buffer" and spec.causal_guard in ("plain", "flag"):
        changes["causal_guard"] = "not_cross"
    if not spec.cross and spec.causal_guard in ("not_cross", "cross_pass_else", "cross_none_else") and spec.causal == "buffer":
        pass  # a self-attention-only module may still test the flag; it is always False there
    if spec.floor_with_mask and not (spec.guard_floor and any(k == "mask" and g == "not_none" for k, g in changes.get("terms", spec.terms))):
        changes["floor_with_mask"] = False
    if spec.mask_assert and style in ("none",):
        changes["mask_assert"] = False
    if spec.cross:
        guarded = tuple((k, "not_none" if k == "bias" and g != "not_none" else g) for k, g in changes.get("terms", spec.terms))
        if guarded != changes.get("terms", spec.terms):
            changes["terms"] = guarded
    if spec.hazard == "loop" and spec.placement == "function":
        changes["placement"] = "forward"
    if spec.hazard == "value_relative" and spec.layout == "flat":
        changes["layout"], changes["product"] = "heads", "matmul"
    if spec.layout == "flat" and spec.softmax == "dim3":
        changes["softmax"] = "functional"
    if spec.layout == "flat" and any(kind in ("relative",) for kind, _ in spec.terms):
        changes["terms"] = tuple((k, g) for k, g in changes.get("terms", spec.terms) if k != "relative")
    if spec.product == "einsum_bthd" and spec.layout == "heads" and spec.placement == "function":
        changes["placement"] = "forward"
    zeroable = spec.causal == "buffer" and spec.causal_guard == "plain" and changes.get("layout", spec.layout) == "heads"
    if spec.zero_masked and not zeroable:
        changes["zero_masked"] = False  # the zeroing reads `causal_mask` where the causal fill defined it, per head
    if spec.pinned_causal and (spec.family != "523" or spec.is_causal_attr):
        changes["pinned_causal"] = False  # a 5.x construction keyword; `self.is_causal = True` is the other form
    fillable = spec.family == "523" and spec.causal == "mask" and changes.get("layout", spec.layout) == "heads"
    if spec.bool_fill and not (fillable and any(kind == "mask" for kind, _ in changes.get("terms", spec.terms))):
        changes["bool_fill"] = False  # the causal builder's mask, added per head in the chain
    if spec.settings_branch and (spec.alternative or spec.hazard != "none"):
        changes["settings_branch"] = False  # one branching of the chain at a time; the approximation is a hazard's
    if spec.returned_together and changes.get("placement", spec.placement) == "forward":
        changes["returned_together"] = False  # a return of the helper or function the chain is in
    if spec.length_first and changes.get("product", spec.product) not in ("einsum_bthd", "einsum_flat"):
        changes["length_first"] = False  # the einsum layouts' variant
    returnable = spec.family == "440" and spec.output_attentions and changes.get("placement", spec.placement) != "function"
    if spec.switches != "none" and not (spec.family == "440" and changes.get("placement", spec.placement) == "forward"):
        changes["switches"] = "none"  # a parameter of forward, returning forward's triple
    if spec.per_call and spec.family != "523":
        changes["per_call"] = False
    if spec.prompt_keys and spec.family != "523":
        changes["prompt_keys"] = False
    if spec.scores_returned and not returnable:
        changes["scores_returned"] = False  # the request for weights is forward's parameter, passed on to a helper
    if spec.own_flag_guard and not (
        spec.causal == "buffer"
        and changes.get("causal_guard", spec.causal_guard) == "plain"
        and (changes.get("pinned_causal", spec.pinned_causal) or spec.is_causal_attr)
    ):
        changes["own_flag_guard"] = False
    if spec.twin_helper and not (
        changes.get("placement", spec.placement) == "helper"
        and not changes.get("settings_branch", spec.settings_branch)
        and not spec.alternative
        and spec.hazard == "none"
        and not changes.get("scores_returned", spec.scores_returned)
    ):
        changes["twin_helper"] = False  # one branching at a time, between two helpers computing the attention
    if spec.settings_flag and not changes.get("settings_branch", spec.settings_branch):
        changes["settings_flag"] = False
    blockable = changes.get("layout", spec.layout) == "heads" and changes.get("product", spec.product) in ("matmul", "operator", "method")
    if spec.blocks != "none" and not (blockable and spec.streams == "one"):
        changes["blocks"] = "none"  # 4-D scores from a plain product; the second stream copies the lines after it
    if spec.branch_op != "none" and changes.get("blocks", spec.blocks) != "branch":
        changes["branch_op"] = "none"
    if spec.precision_branch and (
        changes.get("blocks", spec.blocks) != "none" or spec.score_helper or spec.streams != "one"
    ):
        changes["precision_branch"] = False  # the branch holds one plain product; a second stream copies one line
    if spec.score_helper and not (
        changes.get("placement", spec.placement) == "forward"
        and changes.get("blocks", spec.blocks) == "none"
        and changes.get("product", spec.product) in HELPER_PRODUCTS
    ):
        changes["score_helper"] = False  # the chain in forward, its product one a method computes from q and k
    compared = changes.get("causal", spec.causal) == "buffer" or style == "manual_bool"
    if spec.buffer_dtype != "bool" and spec.causal != "buffer":
        changes["buffer_dtype"] = "bool"
    if spec.buffer_dtype == "float" and changes.get("buffer_form", spec.buffer_form) == "window":
        changes["buffer_dtype"] = "long"  # the window is cut out with bitwise_xor, which takes no floats
    if spec.mask_dtype != "bool" and style != "manual_bool":
        changes["mask_dtype"] = "bool"
    if not compared and spec.compare != "natural":
        changes["compare"] = "natural"
    booleans = changes.get("buffer_dtype", spec.buffer_dtype) == "bool" and changes.get("mask_dtype", spec.mask_dtype) == "bool"
    if compared and not booleans and changes.get("compare", spec.compare) == "natural":
        changes["compare"] = "eq0"  # a 0/1 tensor of another dtype is compared before it masks
    if spec.value_left != "none" and not (
        spec.family == "440"
        and changes.get("product", spec.product) in ("matmul", "operator", "method", "pretransposed", "permuted", "bmm")
        and changes.get("hazard", spec.hazard) == "none"
        and spec.streams == "one"
    ):
        changes["value_left"] = "none"  # one plain product with V, written in the open
    if spec.closure != "none" and not (
        spec.family != "523"
        and changes.get("placement", spec.placement) == "forward"
        and not changes.get("scores_returned", spec.scores_returned)
        and changes.get("switches", spec.switches) == "none"
    ):
        changes["closure"] = "none"  # the chain of forward, returning its output alone to forward
    if spec.over_queries and not (
        spec.family in ("440", "inline")
        and changes.get("layout", spec.layout) == "flat"
        and changes.get("product", spec.product) == "bmm"
        and changes.get("hazard", spec.hazard) == "none"
        and changes.get("softmax", spec.softmax) in QUERY_SOFTMAXES
        and all(changes.get(name, getattr(spec, name)) == value for name, value in NON_LOCAL.items())
    ):
        changes["over_queries"] = False  # `draw` gave it the skeleton it needs; a spec written otherwise has not
    if spec.sizes_swapped and not (
        changes.get("layout", spec.layout) == "flat"
        and changes.get("product", spec.product) != "einsum_flat"
        and changes.get("value_left", spec.value_left) == "none"
        and changes.get("hazard", spec.hazard) not in ("loop", "value_relative")
        and spec.streams == "one"
    ):
        changes["sizes_swapped"] = False  # the flat layout's one bmm with V
    if spec.flat_kept and not (
        spec.family in ("440", "inline")
        and changes.get("layout", spec.layout) == "flat"
        and changes.get("product", spec.product) == "bmm"
        and not spec.length_first
        and changes.get("placement", spec.placement) == "forward"
        and changes.get("closure", spec.closure) == "none"
        and not changes.get("sizes_swapped", spec.sizes_swapped)
        and changes.get("value_left", spec.value_left) == "none"
        and not changes.get("over_queries", spec.over_queries)
        and changes.get("hazard", spec.hazard) not in ("loop", "value_relative")
        and spec.streams == "one"
    ):
        changes["flat_kept"] = False  # BART's sizes, in the one flat chain of forward
    if spec.cache_stored != "none" and not (
        changes.get("flat_kept", spec.flat_kept) and changes.get("cache", spec.cache) and not spec.cross
    ):
        changes["cache_stored"] = "none"  # BART's form with a cache of its own
    if spec.output_arms and not (spec.streams == "one" and changes.get("hazard", spec.hazard) not in ("loop", "value_relative")):
        changes["output_arms"] = False  # one product with V, written in the open, copied into the other arm
    if spec.weights_discarded != "none" and (
        spec.style != "inline" or spec.output_attentions or changes.get("scores_returned", spec.scores_returned)
    ):
        changes["weights_discarded"] = "none"  # forward's triple, its weights returned with no request for them
    elif spec.weights_discarded == "indexed" and spec.cache:
        changes["weights_discarded"] = "unpacked"  # `self.attn(...)[0]` leaves the layer no cache to return
    if spec.mask_expanded and not (
        spec.family == "440"
        and changes.get("layout", spec.layout) == "heads"
        and changes.get("product", spec.product) in ("matmul", "operator", "method", "pretransposed", "permuted")
        and changes.get("blocks", spec.blocks) == "none"
        and not changes.get("bool_fill", spec.bool_fill)
        and any(kind == "mask" for kind, _ in changes.get("terms", spec.terms))
        and changes.get("hazard", spec.hazard) == "none"
        and changes.get("closure", spec.closure) == "none"  # a closure rebinding the mask would make it its own local
    ):
        changes["mask_expanded"] = False  # 4-D scores of a plain product, an additive mask among the terms
    if spec.mask_paired and not (
        spec.family == "440"
        and changes.get("layout", spec.layout) == "heads"
        and not changes.get("bool_fill", spec.bool_fill)
        and not changes.get("mask_read", spec.mask_read)
        and any(kind == "mask" for kind, _ in changes.get("terms", spec.terms))
    ):
        changes["mask_paired"] = False  # 4-D scores, an additive 4-D mask among the terms
    if spec.shared_kv and not (
        changes.get("product", spec.product) == "einsum"
        and changes.get("value_left", spec.value_left) == "none"
        and changes.get("hazard", spec.hazard) != "value_relative"
    ):
        changes["shared_kv"] = False  # the `einsum` product's two einsums, the output's the only one with V
    if spec.key_viewed and changes.get("product", spec.product) != "permuted":
        changes["key_viewed"] = False  # the key the product takes as it is
    changes.update(_wiring(spec, changes))
    twin = changes.get("twin_helper", spec.twin_helper)
    if spec.twin_form != "upcast" and not (twin and spec.family == "440"):
        changes["twin_form"] = "upcast"
    elif spec.twin_form == "reordered" and not (
        changes.get("layout", spec.layout) == "heads"
        and changes.get("product", spec.product) in ("matmul", "operator", "method")
        and changes.get("blocks", spec.blocks) == "none"
        and not changes.get("precision_branch", spec.precision_branch)
        and not changes.get("score_helper", spec.score_helper)
    ):
        changes["twin_form"] = "upcast"  # the plain product of (b, h, L, d) states, which the twin flattens
    if spec.term_dtype != "float32" and not (
        spec.style == "inline"
        and any(kind in ("mask", "bias") for kind, _ in changes.get("terms", spec.terms))
        and not changes.get("mask_paired", spec.mask_paired)  # a product of the mask with ones of the scores' dtype
    ):
        changes["term_dtype"] = "float32"  # an additive term of the caller's, added by an inline port's forward
    if spec.number_term and not number_term_drawable(spec, changes):
        changes["number_term"] = False
    if spec.windowed_permuted and not any(kind == "windowed" for kind, _ in changes.get("terms", spec.terms)):
        changes["windowed_permuted"] = False
    if spec.xla_branch and not (
        ("mask", "not_none") in changes.get("terms", spec.terms)
        and changes.get("layout", spec.layout) != "flat"
        and not changes.get("bool_fill", spec.bool_fill)
        and not changes.get("mask_read", spec.mask_read)
        and not changes.get("number_term", spec.number_term)
        and changes.get("placement", spec.placement) == "forward"
    ):
        # the plain `scores + attention_mask` under `is not None`, in the heads layout, in forward (the test reads the
        # states it is given)
        changes["xla_branch"] = False
    return replace(spec, **changes) if changes else spec


def number_term_drawable(spec: Spec, changes: dict[str, Any]) -> bool:
    """An inline skeleton with a mask or bias term guarded by `is not None`, whose other uses of that parameter take
    a number too (no fill from the mask, no product of it, no floor under it), bound in forward itself."""
    return (
        spec.style == "inline"
        and any(kind in ("mask", "bias") and guard == "not_none" for kind, guard in changes.get("terms", spec.terms))
        and not changes.get("bool_fill", spec.bool_fill)
        and not changes.get("mask_paired", spec.mask_paired)
        and not changes.get("mask_expanded", spec.mask_expanded)
        and not changes.get("floor_with_mask", spec.floor_with_mask)
        and changes.get("closure", spec.closure) == "none"  # a closure would make the parameter its own local
    )


def _wiring(spec: Spec, changes: dict[str, Any]) -> dict[str, Any]:
    """The 4.x wiring axes where the skeleton can draw them: an own helper in place of the one the mask style calls,
    causality from the call where the mask or a plain causal fill in forward carries it, and an override of the
    implementation before a lookup keyed by `config._attn_implementation` (in a dict, or one the port writes)."""
    out: dict[str, Any] = {}
    style = changes.get("mask_style", spec.mask_style)
    causal_by_call = spec.call_causal
    if causal_by_call == "helper" and not (spec.family == "440" and spec.causal == "mask"):
        causal_by_call = "none"
    if causal_by_call == "argument" and not (
        spec.family == "440"
        and spec.causal == "buffer"
        and changes.get("causal_guard", spec.causal_guard) == "plain"
        and changes.get("placement", spec.placement) == "forward"
        and not changes.get("own_flag_guard", spec.own_flag_guard)
        and not changes.get("zero_masked", spec.zero_masked)
    ):
        causal_by_call = "none"  # the fill in forward, where the argument is; nothing reads its mask when it is off
    if causal_by_call != spec.call_causal:
        out["call_causal"] = causal_by_call
    own = spec.own_helper
    if own == "function" and not (spec.family == "440" and style in ("plain_helper", "causal_helper")):
        own = "none"
    if own == "method" and not (spec.family == "440" and style == "extended"):
        own = "none"
    if own != "none" and causal_by_call == "helper":
        own = "none"  # the call picks between Transformers' two helpers
    if own != spec.own_helper:
        out["own_helper"] = own
    if spec.selection_override != "none" and not (spec.family == "440" and spec.wiring in ("dict", "direct")):
        out["selection_override"] = "none"
    return out


def _interface_family(spec: Spec) -> Spec:
    """Transformers 5.x files build masks with `create_causal_mask` / `create_bidirectional_mask` ("builder"), keep
    the key/value cache in a `DynamicCache`, return weights through hooks rather than an `output_attentions`
    argument, and select the attention implementation from the config alone (no class dicts)."""
    changes: dict[str, Any] = {}
    if spec.mask_style not in ("builder", "none"):
        changes["mask_style"] = "builder"
    if spec.causal == "mask" and spec.mask_style == "none":
        changes["mask_style"] = "builder"
    style = changes.get("mask_style", spec.mask_style)
    terms = tuple((k if k != "bool_mask" else "mask", g) for k, g in spec.terms if (k not in ("mask", "bool_mask")) or style == "builder")
    if style == "builder" and not any(k == "mask" for k, _ in terms):
        terms = (("mask", "not_none"),) + terms
    if terms != spec.terms:
        changes["terms"] = terms
    for name, value in (("output_attentions", False), ("head_mask", False), ("wiring", "direct"), ("mask_assert", False)):
        if getattr(spec, name) != value:
            changes[name] = value
    if spec.cache and spec.causal == "none":
        changes["cache"] = False
    if spec.per_call and not (spec.causal == "mask" and style == "builder"):
        changes["per_call"] = False
    if spec.mask_read and not (
        style == "builder"
        and spec.layout == "heads"
        and not (spec.bool_fill or spec.settings_branch or changes.get("prompt_keys", spec.prompt_keys))
        and spec.sparse_sibling == "none"
    ):
        changes["mask_read"] = False
    if spec.prompt_keys and not (
        style == "builder"
        and spec.causal in ("mask", "none")
        and spec.layout == "heads"
        and spec.product not in ("permuted", "einsum_bthd", "einsum_tbhd")
        and not spec.length_first
        and all(kind == "mask" for kind, _ in terms)
        and not (spec.cross or spec.bool_fill or spec.settings_branch)
        and spec.sparse_sibling == "none"
    ):
        changes["prompt_keys"] = False
    return replace(spec, **changes) if changes else spec


# ------------------------------------------------------------------ shrinking order


def simpler(spec: Spec) -> list[Spec]:
    """Specs one step simpler than `spec` (one field towards its simplest value), most promising first."""
    out: list[Spec] = []
    base = Spec()
    for f in fields(Spec):
        if f.name in ("seed", "family"):
            continue
        current = getattr(spec, f.name)
        simplest = getattr(base, f.name)
        if current == simplest:
            continue
        if f.name == "terms":
            for index in range(len(current)):
                out.append(normalise(replace(spec, terms=current[:index] + current[index + 1 :])))
            continue
        out.append(normalise(replace(spec, **{f.name: simplest})))
    return [s for s in out if s != spec]


__all__ = ["Spec", "draw", "normalise", "simpler"]
