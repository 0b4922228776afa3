"""Plan-level decisions that guard exactness: which mask helpers may switch, which modules are causal."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdpa_port import Status, Style, port_source
from helpers import flat

DECODER = '''
import torch
from torch import nn

from ...modeling_attn_mask_utils import _prepare_4d_causal_attention_mask
from ...modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, is_causal=False):
        super().__init__()
        self.is_causal = is_causal
        self.scaling = (embed_dim // num_heads) ** -0.5

    def forward(self, query, key, value, attention_mask=None, output_attentions=False):
        scores = torch.matmul(query * self.scaling, key.transpose(-1, -2))
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = scores.softmax(-1)
        return torch.matmul(probs, value), probs


TINY_ATTENTION_CLASSES = {"eager": TinyAttention}


class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = TINY_ATTENTION_CLASSES[config._attn_implementation](config.hidden_size, 4{causal})

    def forward(self, hidden_states, attention_mask=None):
        return self.attn(hidden_states, hidden_states, hidden_states, attention_mask)


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"


class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.layer = TinyLayer(config)

    def forward(self, input_ids, attention_mask=None, head_mask=None, output_attentions=False):
        mask = _prepare_4d_causal_attention_mask(attention_mask, input_ids.shape, input_ids, 0)
        return self.layer(input_ids, mask)
'''


def test_causal_helper_switches_only_when_causal_layers_are_marked() -> None:
    marked = port_source(DECODER.replace("{causal}", ", is_causal=True"))
    assert marked.status is Status.PORTED
    assert "_prepare_4d_causal_attention_mask_for_sdpa(" in marked.source
    assert "sdpa_is_causal = attention_mask is None and self.is_causal" in flat(marked.source)


def test_causal_helper_kept_when_the_flag_stays_false() -> None:
    """BioGPT's shape: causal masks reach a module whose `is_causal` keeps its False default."""
    unmarked = port_source(DECODER.replace("{causal}", ""))
    assert unmarked.status is Status.PORTED
    assert "_prepare_4d_causal_attention_mask_for_sdpa" not in unmarked.source
    assert "self.is_causal" not in unmarked.source.split("class TinySdpaAttention")[1].split("TINY_ATTENTION")[0]
    assert any("causal mask helper is kept" in w for w in unmarked.warnings)


def test_eager_only_switches_fall_back_in_both_styles() -> None:
    """A switch off by default whose branch hands the weights to a hook: the class-style port falls back to eager
    while it is on; the interface style, which has no per-call fallback, refuses (W403)."""
    hooked = DECODER.replace("{causal}", "").replace(
        "        self.scaling = (embed_dim", "        self.save_attention = False\n        self.scaling = (embed_dim"
    ).replace(
        "        probs = scores.softmax(-1)\n",
        "        probs = scores.softmax(-1)\n        if self.save_attention:\n            self.save_map(probs)\n",
    )
    ported = port_source(hooked, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    sdpa_class = ported.source.split("class TinySdpaAttention")[1].split("TINY_ATTENTION")[0]
    fallback = sdpa_class.split("return super().forward")[0]
    assert "self.save_attention" in fallback
    refused = port_source(hooked, style=Style.INTERFACE)
    assert refused.status is Status.REFUSED and "W403" in " ".join(refused.reasons)


def test_a_per_head_factor_multiplies_the_query() -> None:
    """Scores times a parameter of shape (heads, 1, 1) become SDPA on the query times it, with scale=1.0; a factor
    added after the mask would scale the mask too, so that order is refused rather than guessed."""
    per_head = DECODER.replace("{causal}", "").replace(
        "        self.scaling = (embed_dim // num_heads) ** -0.5\n",
        "        self.logit_scale = nn.Parameter(torch.ones((num_heads, 1, 1)))\n",
    )
    scaled = per_head.replace(
        "scores = torch.matmul(query * self.scaling, key.transpose(-1, -2))",
        "scores = torch.matmul(query, key.transpose(-1, -2)) * self.logit_scale.exp()",
    )
    ported = port_source(scaled, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert "sdpa_query = query * self.logit_scale.exp()" in ported.source
    assert "scale=1.0" in ported.source
    late = per_head.replace(
        "scores = torch.matmul(query * self.scaling, key.transpose(-1, -2))",
        "scores = torch.matmul(query, key.transpose(-1, -2))",
    ).replace("        probs = scores.softmax(-1)\n", "        probs = (scores * self.logit_scale).softmax(-1)\n")
    refused = port_source(late, style=Style.CLASS)
    assert refused.status is Status.REFUSED and "S102" in " ".join(refused.reasons)


GPT_TF_ERA = '''
import math

import torch
from torch import nn

from ...modeling_utils import PreTrainedModel


class OldAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        n = config.n_positions
        self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n), persistent=False)
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.split_size = config.n_embd

    def _attn(self, q, k, v, attention_mask=None):
        w = torch.matmul(q, k)
        w = w / math.sqrt(v.size(-1))
        nd, ns = w.size(-2), w.size(-1)
        b = self.bias[:, :, ns - nd : ns, :ns]
        w = w * b - 1e4 * (1 - b)
        if attention_mask is not None:
            w = w + attention_mask
        w = nn.functional.softmax(w, dim=-1)
        return torch.matmul(w, v)

    def split_heads(self, x, k=False):
        x = x.view(*x.size()[:-1], self.n_head, x.size(-1) // self.n_head)
        if k:
            return x.permute(0, 2, 3, 1)
        else:
            return x.permute(0, 2, 1, 3)

    def forward(self, x, attention_mask=None):
        query, key, value = self.c_attn(x).split(self.split_size, dim=2)
        query = self.split_heads(query)
        key = self.split_heads(key, k=True)
        value = self.split_heads(value)
        return self._attn(query, key, value, attention_mask)


class OldPreTrainedModel(PreTrainedModel):
    base_model_prefix = "old"


class OldModel(OldPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.attn = OldAttention(config)
'''


def test_a_key_split_by_a_flagged_method_and_a_blended_causal_buffer() -> None:
    """GPT-2's original form: `split_heads(key, k=True)` returns the key as (b, h, d, s) on the path its literal
    argument opens, so `q @ k` is a product with the key transposed; `w * b - 1e4 * (1 - b)` with b a slice of a
    triangle of ones is a causal fill. A top-left slice keeps each row's own position, so a real token keeps itself
    while the keys are the call's own positions; with a cache a real token's row may lose every key to left padding,
    and -1e4 does not absorb the scores: refused (M202). A weight that is no 0/1 buffer stays a scale."""
    ported = port_source(GPT_TF_ERA, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    sdpa_call = ported.source.split("scaled_dot_product_attention(")[1].split(")\n")[0]
    assert "k.transpose(-1, -2)" in sdpa_call and "is_causal=sdpa_is_causal" in sdpa_call
    assert "torch.where(b.bool()" in ported.source
    top_left = GPT_TF_ERA.replace("self.bias[:, :, ns - nd : ns, :ns]", "self.bias[:, :, :nd, :ns]")
    assert port_source(top_left, style=Style.CLASS).status is Status.PORTED
    cached = top_left.replace(
        "def forward(self, x, attention_mask=None):", "def forward(self, x, attention_mask=None, layer_past=None):"
    ).replace(
        "        value = self.split_heads(value)\n        return",
        "        value = self.split_heads(value)\n"
        "        if layer_past is not None:\n"
        "            key = torch.cat((layer_past[0], key), dim=-1)\n"
        "            value = torch.cat((layer_past[1], value), dim=-2)\n"
        "        return",
    )
    assert "layer_past[0]" in cached
    refused = port_source(cached, style=Style.CLASS)
    assert refused.status is Status.REFUSED and "M202" in " ".join(refused.reasons)
    other_keys = top_left.replace("def forward(self, x, attention_mask=None):", "def forward(self, x, attention_mask=None, memory=None):").replace(
        "query, key, value = self.c_attn(x).split(self.split_size, dim=2)",
        "query, key, value = self.c_attn(x).split(self.split_size, dim=2)\n        key = key if memory is None else memory",
    )
    assert "memory is None" in other_keys
    assert "M202" in " ".join(port_source(other_keys, style=Style.CLASS).reasons)
    unflagged = GPT_TF_ERA.replace("key = self.split_heads(key, k=True)", "key = self.split_heads(key)")
    assert port_source(unflagged, style=Style.CLASS).status is Status.REFUSED
    weighted = GPT_TF_ERA.replace("b = self.bias[:, :, ns - nd : ns, :ns]", "b = attention_mask")
    assert port_source(weighted, style=Style.CLASS).status is Status.REFUSED


def test_a_chain_wholly_inside_one_branch_changes_only_that_branch() -> None:
    """Open-Llama's form: xformers in training, the eager computation in the else branch. Only the branch holding
    the whole chain (product to product with V) is rewritten; the other is kept as written."""
    branched = DECODER.replace("{causal}", "").replace(
        "        scores = torch.matmul(query * self.scaling, key.transpose(-1, -2))\n"
        "        if attention_mask is not None:\n"
        "            scores = scores + attention_mask\n"
        "        probs = scores.softmax(-1)\n"
        "        return torch.matmul(probs, value), probs\n",
        "        if self.training and xformers is not None:\n"
        "            weights = None\n"
        "            output = xformers.attention(query, key, value)\n"
        "        else:\n"
        "            weights = torch.matmul(query * self.scaling, key.transpose(-1, -2))\n"
        "            if attention_mask is not None:\n"
        "                weights = weights + attention_mask\n"
        "            weights = weights.softmax(-1)\n"
        "            output = torch.matmul(weights, value)\n"
        "        return output, weights\n",
    ).replace("from torch import nn\n", "from torch import nn\n\nxformers = None\n")
    ported = port_source(branched, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    sdpa_class = ported.source.split("class TinySdpaAttention")[1].split("TINY_ATTENTION")[0]
    assert "output = xformers.attention(query, key, value)" in sdpa_class
    assert "scaled_dot_product_attention" in sdpa_class.split("else:")[1]


ENCODER = (Path(__file__).resolve().parents[2] / "fixtures" / "class_style" / "modeling_tiny_encoder.py").read_text()
LAYER_FORWARD = "    def forward(self, hidden_states, attention_mask=None):\n"
LAYER_CALL = "self.attention(hidden_states, attention_mask)[0]"
MODEL_CALL = "layer(hidden_states, extended_attention_mask)"
ATTENTION_FORWARD = "def forward(self, hidden_states, attention_mask=None, output_attentions=False):"


def _encoder(layer_forward: str = LAYER_FORWARD, layer_call: str = LAYER_CALL, model_call: str = MODEL_CALL,
             attention_default: str = "False") -> str:
    source = ENCODER.replace(LAYER_FORWARD, layer_forward).replace(LAYER_CALL, layer_call)
    source = source.replace(MODEL_CALL, model_call)
    return source.replace(ATTENTION_FORWARD, ATTENTION_FORWARD.replace("=False)", f"={attention_default})"))


ASKS = "    def forward(self, hidden_states, attention_mask=None, output_attentions=True):\n"
PASSES_ON = "self.attention(hidden_states, attention_mask, output_attentions)[0]"


@pytest.mark.parametrize(
    "source,always",
    [
        # the layer's own parameter defaults to True and the model never passes it (ERNIE-M)
        (_encoder(ASKS, PASSES_ON), True),
        (_encoder(ASKS, PASSES_ON.replace("output_attentions)", "output_attentions=output_attentions)")), True),
        (_encoder(ASKS, PASSES_ON, MODEL_CALL.replace(")", ", output_attentions=True)")), True),
        # the attention's own default is True and no call passes anything
        (_encoder(attention_default="True"), True),
        # a caller that can say False, a rebound parameter, or keyword arguments passed on: SDPA may run
        (_encoder(ASKS, PASSES_ON, MODEL_CALL.replace(")", ", output_attentions=False)")), False),
        (_encoder(ASKS + "        output_attentions = output_attentions and not self.training\n", PASSES_ON), False),
        (_encoder(
            "    def forward(self, hidden_states, attention_mask=None, **kwargs):\n",
            "self.attention(hidden_states, attention_mask, **kwargs)[0]",
            attention_default="True",
        ), False),
        (_encoder(), False),
    ],
)
def test_weights_asked_on_every_path_refuse_the_inert_port(source: str, always: bool) -> None:
    result = port_source(source, filename="modeling_tiny_encoder.py")
    if always:
        assert result.status is Status.REFUSED and "[W406]" in " ".join(result.reasons), result.reasons
    else:
        assert result.status is Status.PORTED, (result.status, result.reasons)


ZEROED = (Path(__file__).resolve().parents[2] / "fixtures" / "class_style" / "modeling_tiny_zeroed.py").read_text()
FILL = "            scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)\n"
ZERO = "            probs = torch.softmax(scores, dim=-1).masked_fill(masked, 0.0)\n"


@pytest.mark.parametrize(
    "change,refusal",
    [
        # zeroed where another mask holds, or where the scores got a value that does not absorb them
        ((ZERO, ZERO.replace("masked_fill(masked", "masked_fill(~masked")), "M201"),
        ((FILL, FILL.replace("torch.finfo(scores.dtype).min", "-1e4")), "M201"),
        # the mask changes between the fill and the zeroing
        ((ZERO, "            masked = masked.flip(-1)\n" + ZERO), "M201"),
        # another mask may empty the rest of a row, whose probabilities at `masked` are then not 0 before zeroing
        ((FILL, FILL + "            scores = scores + attention_mask\n"), "M202"),
        # zeroed outside the branch that masked the scores
        ((ZERO, "            probs = torch.softmax(scores, dim=-1)\n"), None),
    ],
)
def test_probabilities_zeroed_at_the_masked_keys(change: tuple[str, str], refusal: str | None) -> None:
    """`softmax(scores.masked_fill(m, finfo.min)).masked_fill(m, 0)`: rows with no key give 0; on SDPA the output
    rows where `m` masks every key are zeroed. Any other mask, value or order is refused, not guessed."""
    source = ZEROED.replace(*change)
    assert source != ZEROED
    if change[1].endswith("probs = torch.softmax(scores, dim=-1)\n"):
        # the zeroing moves after the `if`, where the scores may not have been masked
        source = source.replace("        probs = self.dropout(probs)\n", "        probs = probs.masked_fill(masked, 0.0)\n        probs = self.dropout(probs)\n")
        refusal = "M201"
    if "attention_mask" in change[1]:
        source = source.replace("def forward(self, hidden_states, masked=None, output_attentions=False):", "def forward(self, hidden_states, masked=None, attention_mask=None, output_attentions=False):")
    result = port_source(source, filename="modeling_tiny_zeroed.py")
    assert result.status is Status.REFUSED and f"[{refusal}]" in " ".join(result.reasons), result.reasons


def test_a_parameter_term_beside_a_finite_fill_may_carry_a_mask() -> None:
    """A term handed in as a parameter (T5 folds its padding mask into `position_bias`) may push keys to about
    finfo.min: beside a finfo.min fill, the masked keys then keep weight until the zeroing, so the port is refused;
    beside a -inf fill they are exactly 0 whatever the term holds (CPM-Ant), so it ports."""
    with_term = ZEROED.replace(FILL, FILL + "            scores = scores + position_bias\n").replace(
        "def forward(self, hidden_states, masked=None, output_attentions=False):",
        "def forward(self, hidden_states, masked=None, position_bias=None, output_attentions=False):",
    )
    refused = port_source(with_term, filename="modeling_tiny_zeroed.py")
    assert refused.status is Status.REFUSED and "[M202]" in " ".join(refused.reasons), refused.reasons
    infinite = with_term.replace("torch.finfo(scores.dtype).min)", 'float("-inf"))')
    assert port_source(infinite, filename="modeling_tiny_zeroed.py").status is Status.PORTED


def test_probabilities_kept_where_a_mask_holds_and_zeroed_elsewhere() -> None:
    """`torch.where(keep, probs, 0)` after `torch.where(keep, scores, finfo.min)`: rows where no key is kept."""
    source = ZEROED.replace(FILL, "            keep = ~masked\n            scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)\n")
    source = source.replace(ZERO, "            probs = torch.where(keep, torch.softmax(scores, dim=-1), 0.0)\n")
    result = port_source(source, filename="modeling_tiny_zeroed.py")
    assert result.status is Status.PORTED, result.reasons
    assert "sdpa_zero_rows = ~keep.any(-1, keepdim=True)" in result.source
    assert "context = context.masked_fill(sdpa_zero_rows, 0.0)" in result.source
    # the interface style has no step after the implementations to zero the rows: refused, the class style ports
    local = ZEROED.replace(FILL, "            strict = torch.ones(length, length, dtype=torch.bool).triu()\n" + FILL)
    local = local.replace(FILL, FILL.replace("(masked,", "(strict,")).replace(ZERO, ZERO.replace("(masked,", "(strict,"))
    refused = port_source(local, filename="modeling_tiny_zeroed.py", style=Style.INTERFACE)
    assert refused.status is Status.REFUSED and "dispatch has no step after them" in " ".join(refused.reasons)
    assert port_source(local, filename="modeling_tiny_zeroed.py", style=Style.CLASS).status is Status.PORTED


def test_a_dropout_module_that_may_be_none_and_a_fill_given_as_a_float() -> None:
    """CPM-Ant keeps `self.dropout = None` without dropout and calls it under `if self.dropout is not None`;
    FastSpeech2 fills with `float(torch.finfo(dtype).min)`. Both are exact: a rate of 0.0 where the module is None,
    and the same number."""
    source = ZEROED.replace("        self.dropout = nn.Dropout(0.0)\n", "        self.dropout = nn.Dropout(0.1) if config.num_hidden_layers > 1 else None\n")
    source = source.replace("        probs = self.dropout(probs)\n", "        if self.dropout is not None:\n            probs = self.dropout(probs)\n")
    source = source.replace("torch.finfo(scores.dtype).min)", "float(torch.finfo(scores.dtype).min))")
    assert source.count("float(torch.finfo") == 1 and "if self.dropout is not None" in source
    result = port_source(source, filename="modeling_tiny_zeroed.py")
    assert result.status is Status.PORTED, result.reasons
    # parenthesised: `a if b else 0.0 if self.training else 0.0` would drop out in evaluation
    assert "dropout_p=(self.dropout.p if self.dropout is not None else 0.0) if self.training else 0.0" in result.source
    # a test of the module's settings around it: SDPA's rate is the call's where that test holds too
    for test, when in [
        ("self.training", "self.training"),
        ("self.use_dropout", "self.use_dropout and self.training"),
        ("not self.config.frozen and self.training", "not self.config.frozen and self.training"),
        ("self.training or self.config.always", "(self.training or self.config.always) and self.training"),
    ]:
        guarded = port_source(source.replace("        if self.dropout is not None:\n", f"        if {test}:\n"), filename="modeling_tiny_zeroed.py")
        assert guarded.status is Status.PORTED, guarded.reasons
        rate = f"dropout_p=(self.dropout.p if self.dropout is not None else 0.0) if {when} else 0.0"
        assert rate in flat(guarded.source)  # over lines where the argument is too long for one
    # a test of anything else (a local, an argument) is a condition SDPA's rate cannot follow
    refused = port_source(source.replace("        if self.dropout is not None:\n", "        if drop:\n"), filename="modeling_tiny_zeroed.py")
    assert refused.status is Status.REFUSED and "[S112]" in " ".join(refused.reasons), refused.reasons
    # the module's own test inside another condition is still a condition
    nested = source.replace(
        "        if self.dropout is not None:\n            probs = self.dropout(probs)\n",
        "        if self.training:\n            if self.dropout is not None:\n                probs = self.dropout(probs)\n",
    )
    assert nested != source
    refused = port_source(nested, filename="modeling_tiny_zeroed.py")
    assert refused.status is Status.REFUSED and "[S112]" in " ".join(refused.reasons), refused.reasons


def test_the_eager_forward_docstring_stays_with_the_eager_forward() -> None:
    documented = ENCODER.replace(
        "        batch, length, _ = hidden_states.shape\n",
        '        """Self-attention with a learned distance bias."""\n        batch, length, _ = hidden_states.shape\n',
        1,
    )
    result = port_source(documented, filename="modeling_tiny_encoder.py")
    assert result.status is Status.PORTED, result.reasons
    eager, sdpa = result.source.split("class TinyEncoderSdpaSelfAttention")
    assert '"""Self-attention with a learned distance bias."""' in eager
    # the class docstring says what the SDPA forward does; the eager one describes eager's
    body = sdpa.split("    def forward(")[1].split("):\n", 1)[1].lstrip()
    assert body.startswith("if output_attentions:"), body[:200]


THREADED = '''
import torch
from torch import nn

from ...modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.scaling = (dim // heads) ** -0.5

    def forward(self, query, key, value, attention_mask=None):
        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        return torch.matmul(scores.softmax(dim=-1), value)


class TinyBlock(nn.Module):
    def __init__(self, dim, heads, *extra):
        super().__init__()
        self.attention = TinyAttention(dim, heads)


class TinyLayer(nn.Module):
    def __init__(
        self,
        dim,
        heads,
    ):
        super().__init__()
        self.block = TinyBlock(dim, heads)


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"


class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.layers = nn.ModuleList([TinyLayer(config.hidden_size, config.heads) for _ in range(2)])
'''


def test_the_implementation_is_passed_down_to_attention_built_without_a_config() -> None:
    """CvT and CTRL build their attention modules from sizes, a few constructors below the one holding the config:
    each class between takes `attn_implementation="eager"` (keyword-only after `*args`, layout kept) and passes it on;
    the class holding the config passes `config._attn_implementation`. Built outside `__init__`, or by a class the
    file never builds (its callers are out of sight and would keep the eager default), refused W401."""
    ported = port_source(THREADED, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    code = ported.source
    assert 'def __init__(self, dim, heads, *extra, attn_implementation="eager"):' in code
    assert "        heads,\n        attn_implementation=\"eager\",\n    ):" in code
    assert "self.attention = TINY_ATTENTION_CLASSES[attn_implementation](dim, heads)" in code
    assert "self.block = TinyBlock(dim, heads, attn_implementation=attn_implementation)" in code
    assert "TinyLayer(config.hidden_size, config.heads, attn_implementation=config._attn_implementation)" in code
    outside = THREADED.replace(
        "        self.block = TinyBlock(dim, heads)", "        self.block = None\n\n    def build(self, dim, heads):\n        self.block = TinyBlock(dim, heads)"
    )
    refused = port_source(outside, style=Style.CLASS)
    assert refused.status is Status.REFUSED and "W401" in " ".join(refused.reasons)
    assert "outside its `__init__`" in " ".join(refused.reasons)
    unbuilt = THREADED.replace("TinyLayer(config.hidden_size, config.heads)", "nn.Identity()")
    refused = port_source(unbuilt, style=Style.CLASS)
    assert refused.status is Status.REFUSED and "never builds TinyLayer" in " ".join(refused.reasons)


LANDMARKS = '''
import math

import torch
from torch import nn

from ...modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_landmarks = config.num_landmarks
        self.seq_len = config.seq_len

    def forward(self, query, key, value, attention_mask=None, output_attentions=False):
        query = query / math.sqrt(math.sqrt(self.head_dim))
        key = key / math.sqrt(math.sqrt(self.head_dim))
        if self.num_landmarks == self.seq_len:
            scores = torch.matmul(query, key.transpose(-1, -2))
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = nn.functional.softmax(scores, dim=-1)
            context = torch.matmul(probs, value)
        else:
            landmarks = key.reshape(key.shape[0], key.shape[1], self.num_landmarks, -1, self.head_dim).mean(dim=-2)
            kernel = nn.functional.softmax(torch.matmul(query, landmarks.transpose(-1, -2)), dim=-1)
            probs = nn.functional.softmax(torch.matmul(landmarks, key.transpose(-1, -2)), dim=-1)
            context = torch.matmul(kernel, torch.matmul(probs, value))
        return (context, probs) if output_attentions else (context,)


class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyAttention(config)


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"
'''


def test_an_exact_attention_beside_an_approximation_chosen_by_the_modules_settings() -> None:
    """Nystromformer computes exact attention when its landmarks cover the sequence (`self.num_landmarks ==
    self.seq_len`, the default) and an approximation otherwise: the SDPA class takes the exact side and falls back
    to eager on the other. A test that reads an argument (the input's length) cannot be checked before the
    computation: several attentions, refused (S109)."""
    ported = port_source(LANDMARKS, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert "if output_attentions or self.num_landmarks != self.seq_len:" in ported.source
    sdpa_forward = ported.source.split("class TinySdpaAttention")[1]
    assert "landmarks" not in sdpa_forward.split("falling back")[1].split("TINY_ATTENTION_CLASSES")[0].replace(
        "self.num_landmarks", ""
    )
    # the warning says where SDPA runs and why the other side is not ported (read from that side's trace)
    assert ported.warnings == (
        "TinyAttention computes its attention with SDPA only where `self.num_landmarks == self.seq_len`; otherwise "
        "it runs the eager computation: TinyAttention (line 30): the value operand depends on the scores [S111]",
    )
    by_length = LANDMARKS.replace("if self.num_landmarks == self.seq_len:", "if key.shape[2] == self.seq_len:")
    refused = port_source(by_length, style=Style.CLASS)
    assert refused.status is Status.REFUSED and "S109" in " ".join(refused.reasons)



def test_the_exact_side_of_a_settings_test_may_hold_a_step_only_a_switch_of_the_call_takes() -> None:
    """The exact side returns its scores when the call asks (`if return_scores: return scores`): that side alone is
    not one attention SDPA can take, that side with the switch off is; the SDPA class falls back for either. A step
    under a switch on by default stays refused, and the attention interface cannot fall back for a switch."""
    switched = LANDMARKS.replace(
        "output_attentions=False):", "output_attentions=False, return_scores=False):"
    ).replace(
        "            probs = nn.functional.softmax(scores, dim=-1)\n",
        "            if return_scores:\n"
        "                return scores\n"
        "            probs = nn.functional.softmax(scores, dim=-1)\n",
    )
    assert "return_scores:" in switched
    ported = port_source(switched, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert "if output_attentions or return_scores or self.num_landmarks != self.seq_len:" in ported.source
    # the attention interface cannot fall back to eager for a switch of the call
    interface = port_source(switched, style=Style.INTERFACE)
    assert interface.status is Status.REFUSED and "`return_scores`" in interface.reasons[0], interface.reasons
    on_by_default = switched.replace("return_scores=False):", "return_scores=True):")
    refused = port_source(on_by_default, style=Style.CLASS)
    assert refused.status is Status.REFUSED, refused.source


def test_a_settings_test_with_a_string_literal_renders_in_the_fallback_warning() -> None:
    """The fallback's warning quotes its test: a string literal in it (`self.mode == "exact"`) must not end the
    message's own string (the class rendered invalid Python: an internal error)."""
    source = LANDMARKS.replace("self.num_landmarks = config.num_landmarks", "self.mode = config.mode").replace(
        "if self.num_landmarks == self.seq_len:", 'if self.mode == "exact":'
    )
    ported = port_source(source, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert "if output_attentions or self.mode != \"exact\":" in ported.source
    assert "does not support \"\n                \"output_attentions=True or self.mode != 'exact';" in ported.source


RELATIVE_ON_ONE_SIDE = '''
import math

import torch
from torch import nn

from ...modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        self.position_embeddings_type = config.position_embeddings_type
        self.pos_bias = nn.Parameter(torch.zeros(self.head_dim))

    def _relative_scores(self, query, key, positions):
        content = torch.matmul(query + self.pos_bias, key.transpose(-1, -2))
        shifted = torch.cat([torch.zeros_like(content[..., :1]), content], dim=-1).view(content.shape)
        return (content + shifted) / math.sqrt(self.head_dim)

    def forward(self, query, key, value, attention_mask=None, positions=None, output_attentions=False):
        if self.position_embeddings_type == "relative":
            scores = self._relative_scores(query, key, positions)
        else:
            scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = torch.softmax(scores, dim=-1)
        context = torch.matmul(probs, value)
        return (context, probs) if output_attentions else (context,)


class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyAttention(config)


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"
'''


def test_scores_a_setting_computes_unreadably_keep_that_setting_on_eager() -> None:
    """One attention whose scores a settings test replaces on one side by a helper's, whose product is read again by
    a shifted term: the SDPA class takes the side it can read and falls back to eager under the other setting. A test that reads an argument cannot be decided before the computation: refused, for that term."""
    ported = port_source(RELATIVE_ON_ONE_SIDE, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert 'if output_attentions or self.position_embeddings_type == "relative":' in ported.source
    sdpa_forward = ported.source.split("class TinySdpaAttention")[1].split("falling back")[1]
    assert "_relative_scores" not in sdpa_forward.split("TINY_ATTENTION_CLASSES")[0]
    # the helper is read as its statements (`score_helpers`), whose product feeds a term too: that side stays eager,
    # with the reason at the helper's line
    (warning,) = ported.warnings
    assert "TinyAttention (line 19): the scores are passed to `torch.zeros_like` [S101]" in warning, warning
    by_argument = RELATIVE_ON_ONE_SIDE.replace(
        'if self.position_embeddings_type == "relative":', "if query.shape[2] > 64:"
    )
    refused = port_source(by_argument, style=Style.CLASS)
    assert refused.status is Status.REFUSED and "[S101]" in " ".join(refused.reasons), refused.reasons


SUPPORTED_WITH_A_TOWER = '''
import torch
from torch import nn

from ...modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel


def eager_attention_forward(module, query, key, value, attention_mask, scaling, **kwargs):
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    return torch.matmul(scores.softmax(dim=-1), value), None


class TinyAttention(nn.Module):
    def forward(self, query, key, value, attention_mask=None):
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        return interface(self, query, key, value, attention_mask, scaling=1.0)


class TinyVisionAttention(nn.Module):
    def forward(self, query, key, value):
        probs = torch.softmax(torch.matmul(query, key.transpose(-1, -2)), dim=-1)
        return torch.matmul(probs, value)


class TinyPreTrainedModel(PreTrainedModel):
    _supports_sdpa = True
'''


def test_a_file_that_supports_sdpa_names_the_eager_attention_it_keeps() -> None:
    """A vision tower computed by hand beside a language model on the attention interface: the file is left as it
    is, and the tower is named (the eager function the interface falls back to is not)."""
    result = port_source(SUPPORTED_WITH_A_TOWER)
    assert result.status is Status.UNCHANGED and result.detail == "already supports SDPA"
    assert len(result.warnings) == 1 and "TinyVisionAttention.forward (line 23)" in result.warnings[0], result.warnings
    assert "eager_attention_forward" not in result.warnings[0]
    without_tower = SUPPORTED_WITH_A_TOWER.split("class TinyVisionAttention")[0] + "class TinyPreTrainedModel" + (
        SUPPORTED_WITH_A_TOWER.split("class TinyPreTrainedModel")[1]
    )
    assert port_source(without_tower).warnings == ()


def test_a_mask_helper_called_where_the_fallbacks_cannot_be_seen_keeps_its_full_masks() -> None:
    """Layers asked for the weights (or given a head mask) fall back to eager, which must get the full masks the
    swap's guard keeps for them; a helper called in a method without those parameters cannot tell, and a None there
    would read as "no mask" to eager where SDPA reads "causal": it keeps the eager helper, with a warning."""
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    source = (fixtures / "class_style" / "modeling_tiny_decoder.py").read_text()
    assert "_prepare_4d_causal_attention_mask_for_sdpa" in port_source(source).source
    moved = source.replace(
        "        attention_mask = _prepare_4d_causal_attention_mask(attention_mask, input_ids.shape, hidden_states, 0)\n",
        "        attention_mask = self._causal_mask(attention_mask, input_ids.shape, hidden_states)\n",
    ).replace(
        "    def forward(self, input_ids, attention_mask=None, head_mask=None, output_attentions=False):\n",
        "    def _causal_mask(self, attention_mask, shape, hidden_states):\n"
        "        mask = _prepare_4d_causal_attention_mask(attention_mask, shape, hidden_states, 0)\n"
        "        return mask\n\n"
        "    def forward(self, input_ids, attention_mask=None, head_mask=None, output_attentions=False):\n",
    )
    assert "def _causal_mask" in moved and "self._causal_mask(" in moved
    result = port_source(moved)
    assert result.status is Status.PORTED, result.reasons
    assert "_for_sdpa" not in result.source
    assert any("mask helpers kept" in w and "_prepare_4d_causal_attention_mask" in w for w in result.warnings), result.warnings


HELPER_WITH_DOCSTRING = '''
import torch
from torch import nn

from ...modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.scaling = config.head_dim**-0.5

    def _attn(self, query, key, value, attention_mask=None, output_attentions=False):
        """Core attention: the scores, their softmax, the product with the values."""
        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = torch.softmax(scores, dim=-1)
        context = torch.matmul(probs, value)
        if output_attentions:
            return context, probs.permute(2, 3, 0, 1)
        return context

    def forward(self, query, key, value, attention_mask=None, output_attentions=False):
        return self._attn(query, key, value, attention_mask, output_attentions=output_attentions)


class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyAttention(config)


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"
'''


def test_a_helper_returning_permuted_weights_when_asked_ports_without_its_docstring() -> None:
    """XLNet's helper returns the weights permuted under `if output_attentions:` (the probabilities used after the
    product with V, S111, on that path alone): traced with forward's request false, as the SDPA class only runs
    then, it ports. The helper's docstring stays with the helper, not among the lines inlined for its call. Passed
    something other than forward's own request, the step is on the SDPA path: still refused."""
    ported = port_source(HELPER_WITH_DOCSTRING, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert ported.source.count("Core attention: the scores") == 1
    sdpa_class = ported.source.split("class TinySdpaAttention")[1]
    assert "scaled_dot_product_attention(" in sdpa_class and "permute(2, 3, 0, 1)" not in sdpa_class
    always = HELPER_WITH_DOCSTRING.replace("output_attentions=output_attentions)", "output_attentions=True)")
    refused = port_source(always, style=Style.CLASS)
    assert refused.status is Status.REFUSED, refused.source


FAIRSEQ_STYLE = '''
import torch
from torch import nn

from ...modeling_utils import PreTrainedModel


class TinyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.scaling = config.head_dim**-0.5

    def forward(self, query, key, value, attn_bias=None, need_weights=True, before_softmax=False, need_head_weights=False):
        if need_head_weights:
            need_weights = True
        scores = torch.bmm(query * self.scaling, key.transpose(1, 2))
        if attn_bias is not None:
            scores += attn_bias
        if before_softmax:
            return scores, value
        probs = torch.softmax(scores, dim=-1)
        context = torch.bmm(probs, value)
        weights = None
        if need_weights:
            weights = probs.view(2, -1, probs.size(1), probs.size(2)).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return context, weights


class TinyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = TinyAttention(config)

    def forward(self, states, bias=None):
        return self.attention(states, states, states, attn_bias=bias, need_weights=False)[0]


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "model"
'''


def test_fairseq_style_switches_fall_back_together() -> None:
    """fairseq's multi-head attention (Graphormer's): `need_weights` asks for the weights (on by default; every
    caller here passes False), `before_softmax` returns the scores, and `need_head_weights` turns `need_weights` on
    by assigning it. The SDPA class falls back when any of them is set; `need_weights` stays known false only
    because the one assignment to it sits under `if need_head_weights:`, which is off too. Left at its default
    by every call, `need_weights` would keep the SDPA class from ever running: refused (W406)."""
    ported = port_source(FAIRSEQ_STYLE, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    sdpa_class = ported.source.split("class TinySdpaAttention")[1]
    assert "if need_weights or before_softmax or need_head_weights:" in sdpa_class, sdpa_class[:1500]
    assert "scaled_dot_product_attention(" in sdpa_class and ".mean(dim=0)" not in sdpa_class.split("falling back")[1]
    always = FAIRSEQ_STYLE.replace("attn_bias=bias, need_weights=False)", "attn_bias=bias)")
    refused = port_source(always, style=Style.CLASS)
    assert refused.status is Status.REFUSED and "W406" in " ".join(refused.reasons), refused.reasons
    live = FAIRSEQ_STYLE.replace("        if need_head_weights:\n            need_weights = True\n", "        need_weights = bool(attn_bias)\n")
    refused = port_source(live, style=Style.CLASS)
    assert refused.status is Status.REFUSED, refused.source  # assigned on every path: nothing known about it


def test_a_port_whose_sdpa_side_no_construction_reaches_is_refused() -> None:
    """SDPA can take only the cross-attention side of `if self.is_cross_attention:`. Built for self-attention alone,
    the port would never run SDPA: refused (W408) in both styles. A construction for cross-attention, or one whose
    flag is not a literal, may reach the SDPA side: ported."""
    from test_refusal_docs import source_of

    source = source_of("W408")
    for style in (Style.CLASS, Style.INTERFACE):
        refused = port_source(source, style=style)
        assert [r.code.code for r in refused.refusals] == ["W408"], (style, refused.reasons)
        assert "`self.is_cross_attention` to False" in refused.reasons[0] and "[S101]" in refused.reasons[0]
    built = "        self.attention = TinyAttention(config)\n"
    assert built in source
    for construction in ("TinyAttention(config, True)", "TinyAttention(config, is_cross_attention=config.cross)"):
        crossed = source.replace(built, built + f"        self.crossattention = {construction}\n")
        ported = port_source(crossed, style=Style.CLASS)
        assert ported.status is Status.PORTED, (construction, ported.reasons)
    # how each construction passes the flag: read where no `*args`/`**kwargs` can carry it, or it comes before them
    for construction, code_ in (
        ("TinyAttention(config, is_cross_attention=False, **options)", "W408"),
        ("TinyAttention(config, False, *options)", "W408"),
        ("TinyAttention(config, **options)", None),
        ("TinyAttention(config, *options)", None),
        ("TinyAttention(*options, is_cross_attention=True)", None),
    ):
        passed = source.replace(built, f"        options = {{}}\n        self.attention = {construction}\n")
        result = port_source(passed, style=Style.CLASS)
        assert [r.code.code for r in result.refusals] == ([code_] if code_ else []), (construction, result.reasons)


def test_probabilities_reaching_two_products_with_v_port_with_one_call_each() -> None:
    """The two-stream fixture: one SDPA call per product in the class style; in the interface style one eager
    function (the first stream's computation alone) and one dispatch per product, the implementation chosen once,
    each dispatch's weights those of its own stream."""
    source = (Path(__file__).resolve().parents[2] / "fixtures" / "class_style" / "modeling_tiny_streams.py").read_text()
    ported = port_source(source, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert ported.source.count("scaled_dot_product_attention(") == 2
    interface = port_source(source, style=Style.INTERFACE)
    assert interface.status is Status.PORTED, interface.reasons
    assert interface.source.count("attention_interface(") == 2
    assert interface.source.count("ALL_ATTENTION_FUNCTIONS.get_interface(") == 1
    assert "attention_output, probs = attention_interface(" in interface.source  # the weights forward returns
    assert "attention_output, _ = attention_interface(" in interface.source
    eager = interface.source[interface.source.index("def eager_attention_forward") :]
    eager = eager[: eager.index("\nclass ")]
    assert "shared_scores" not in eager and "layout_probs" not in eager  # the second stream stays out
    assert eager.count("softmax(") == 1


def test_two_streams_returning_weights_no_product_takes_are_refused_in_the_interface_style() -> None:
    """The weights forward returns must be the probabilities of some product with V: the eager function returns
    its own stream's. Weights from before the dropout are not, and are refused."""
    path = Path(__file__).resolve().parents[2] / "fixtures" / "interface_style" / "modeling_tiny_streams5.py"
    source = path.read_text()
    drawn = "        probs = nn.functional.softmax(scores, dim=-1)\n        probs = self.dropout(probs)\n"
    assert drawn in source
    source = source.replace(drawn, drawn.replace("probs = nn", "undropped = nn").replace("(probs)", "(undropped)"))
    source = source.replace("outputs + (probs,)", "outputs + (undropped,)")
    refused = port_source(source, style=Style.INTERFACE)
    assert [r.code.code for r in refused.refusals] == ["F602"], refused.reasons
    assert "the weights returned are not the probabilities a product with V takes" in refused.reasons[0]


def test_the_first_streams_eager_function_keeps_every_branch_it_takes() -> None:
    """A step each stream takes in an if/else (here a scale chosen by a setting): the eager function computing the
    first stream keeps both branches, though the value after them is the one the `if` branch made (the fuzzer's seed
    208681 lost the `else` and changed the eager output by 0.533)."""
    path = Path(__file__).resolve().parents[2] / "fixtures" / "interface_style" / "modeling_tiny_streams5.py"
    source = path.read_text()
    for name in ("shared_scores", "scores"):
        mask = f"        if attention_mask is not None:\n            {name} = "
        assert mask in source
        chosen = (
            f"        if self.shrink > 1:\n            {name} = {name} * 0.5\n"
            f"        else:\n            {name} = {name} * 0.25\n"
        )
        source = source.replace(mask, chosen + mask)
    ported = port_source(source, style=Style.INTERFACE)
    assert ported.status is Status.PORTED, ported.reasons
    eager = ported.source[ported.source.index("def eager_attention_forward") :]
    eager = eager[: eager.index("\nclass ")]
    assert "shared_scores = shared_scores * 0.5" in eager and "shared_scores = shared_scores * 0.25" in eager, eager
    assert "    scores = scores *" not in eager
