"""The recogniser: what it reads out of eager attention, and what it refuses (read-only analysis)."""

from __future__ import annotations

import textwrap

import pytest

from helpers import analyse, attention_module

from sdpa_port import Status, port_source
from sdpa_port.analyse.forms.common import EXAMPLE_INIT
from sdpa_port.analyse.patterns import ProductForm
from sdpa_port.analyse.site import CausalSource, Dropout, Layout, ScaleSite, TermKind

INIT = EXAMPLE_INIT  # the module the forms' examples run in


def site_of(body: str, **kwargs):  # type: ignore[no-untyped-def]
    analysis = analyse(attention_module(body, init=kwargs.pop("init", INIT), **kwargs))
    assert analysis is not None, "not recognised as attention"
    assert analysis.refusal is None, str(analysis.refusal)
    (site,) = analysis.sites
    return site


PLAIN = """
scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(query.size(-1))
if attention_mask is not None:
    scores = scores + attention_mask
probs = nn.functional.softmax(scores, dim=-1)
probs = self.dropout(probs)
if head_mask is not None:
    probs = probs * head_mask
return torch.matmul(probs, value), probs
"""


def test_plain_site_facts() -> None:
    site = site_of(PLAIN)
    assert (site.query, site.key, site.value) == ("query", "key", "value")
    assert site.product is ProductForm.MATMUL and site.layout is Layout.HEADS
    assert [(s.where, s.expression, s.divide) for s in site.scaling] == [
        (ScaleSite.SCORES, "math.sqrt(query.size(-1))", True)
    ]
    assert [(t.kind, t.expression, t.conditional) for t in site.terms] == [(TermKind.MASK, "attention_mask", True)]
    assert site.softmax == "functional(dim=-1)"
    assert site.dropout == Dropout("self.dropout.p")
    assert site.head_mask == "head_mask"
    assert site.returns_weights


@pytest.mark.parametrize(
    "product",
    [
        "query @ key.transpose(-1, -2)",
        "torch.matmul(query, key.transpose(2, 3))",
        "torch.matmul(query, key.permute(0, 1, 3, 2))",
        'torch.einsum("bhqd,bhkd->bhqk", query, key)',
        'torch.einsum("bhqd,bhkd->bhqk", [query, key])',  # operands as one list (CvT) or tuple
        'torch.einsum("bhqd,bhkd->bhqk", (query, key))',
        "query.matmul(key.mT)",
    ],
)
def test_product_forms(product: str) -> None:
    site = site_of(f"scores = {product}\nprobs = scores.softmax(dim=-1)\nreturn torch.matmul(probs, value)")
    assert site.key == "key"
    assert site.scaling == ()


@pytest.mark.parametrize(
    "softmax,form,upcast",
    [
        ("nn.functional.softmax(scores, dim=-1)", "functional", False),
        ("torch.softmax(scores, -1)", "functional", False),
        ("scores.softmax(-1)", "method", False),
        ("nn.Softmax(dim=-1)(scores)", "module", False),
        ("self.softmax(scores)", "module_attribute", False),
        ("nn.functional.softmax(scores.float(), dim=-1).type_as(scores)", "functional", True),
        ("nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)", "functional", True),
    ],
)
def test_softmax_forms(softmax: str, form: str, upcast: bool) -> None:
    site = site_of(f"scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = {softmax}\nreturn torch.matmul(probs, value)")
    assert site.softmax.startswith(form)
    assert site.upcast is upcast


@pytest.mark.parametrize(
    "dropout,expected",
    [
        ("self.dropout(probs)", "self.dropout.p"),
        ("nn.functional.dropout(probs, p=self.p, training=self.training)", "self.p"),
        ("nn.functional.dropout(probs, self.p, self.training)", "self.p"),
    ],
)
def test_dropout_forms(dropout: str, expected: str) -> None:
    site = site_of(
        f"scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(-1)\nprobs = {dropout}\n"
        "return torch.matmul(probs, value)"
    )
    assert site.dropout == Dropout(expected)


def test_query_scaled_before_the_product() -> None:
    site = site_of("query = query * self.scaling\nscores = query @ key.transpose(-1, -2)\nreturn scores.softmax(-1) @ value")
    assert [(s.where, s.expression) for s in site.scaling] == [(ScaleSite.QUERY, "self.scaling")]


def test_scale_after_terms_and_conditional_scale() -> None:
    site = site_of(
        """
        scores = torch.matmul(query, key.transpose(-1, -2))
        scores = scores + attention_mask
        if self.training:
            scores = scores * self.scaling
        return torch.matmul(scores.softmax(-1), value)
        """
    )
    assert [(s.where, s.conditional) for s in site.scaling] == [(ScaleSite.AFTER_TERMS, True)]


def test_flat_layout_with_per_head_mask_view() -> None:
    site = site_of(
        """
        bsz, heads, length, dim = query.shape
        q = query.reshape(bsz * heads, length, dim)
        k = key.reshape(bsz * heads, length, dim)
        v = value.reshape(bsz * heads, length, dim)
        scores = torch.bmm(q, k.transpose(1, 2))
        scores = scores.view(bsz, heads, length, length) + attention_mask
        scores = scores.view(bsz * heads, length, length)
        return torch.bmm(scores.softmax(-1), v)
        """
    )
    assert site.product is ProductForm.BMM and site.layout is Layout.FLAT_TO_HEADS


def test_baddbmm_alpha_and_causal_buffer() -> None:
    site = site_of(
        """
        b, h, q_len, d = query.shape
        k_len = key.size(-2)
        causal_mask = self.bias[:, :, k_len - q_len : k_len, :k_len]
        scores = torch.zeros(b * h, q_len, k_len, dtype=query.dtype)
        scores = torch.baddbmm(scores, query.view(b * h, q_len, d), key.view(b * h, k_len, d).transpose(1, 2), beta=1.0, alpha=self.scaling)
        scores = scores.view(b, h, q_len, k_len)
        scores = torch.where(causal_mask, scores, torch.finfo(scores.dtype).min)
        return torch.matmul(scores.softmax(-1), value)
        """
    )
    assert site.product is ProductForm.BADDBMM
    assert [(s.where, s.expression) for s in site.scaling] == [(ScaleSite.PRODUCT, "self.scaling")]
    assert site.causal is CausalSource.BUFFER
    assert [t.kind for t in site.terms] == [TermKind.CAUSAL_BUFFER]


def test_masked_fill_is_a_term() -> None:
    site = site_of(
        """
        scores = torch.matmul(query, key.transpose(-1, -2))
        scores = scores.masked_fill(attention_mask == 0, torch.finfo(scores.dtype).min)
        return torch.matmul(scores.softmax(-1), value)
        """
    )
    assert [t.kind for t in site.terms] == [TermKind.MASKED_FILL]


@pytest.mark.parametrize("statement", ["masked_fill(attention_mask == 0, -1e9)", "add(attention_mask)", "float()"])
def test_a_discarded_result_is_no_step(statement: str) -> None:
    """`scores.masked_fill(...)` as a statement throws its result away: eager's scores are unchanged, and the port's."""
    site = site_of(
        f"""
        scores = torch.matmul(query, key.transpose(-1, -2))
        scores.{statement}
        return torch.matmul(scores.softmax(-1), value)
        """
    )
    assert not site.terms


def test_the_in_place_fill_beside_it_is_a_term() -> None:
    site = site_of(
        """
        scores = torch.matmul(query, key.transpose(-1, -2))
        scores.masked_fill_(attention_mask == 0, -1e9)
        return torch.matmul(scores.softmax(-1), value)
        """
    )
    assert [t.kind for t in site.terms] == [TermKind.MASKED_FILL]


def test_nan_guard_is_dropped() -> None:
    site = site_of(
        """
        scores = torch.matmul(query, key.transpose(-1, -2)) + attention_mask
        scores = torch.max(scores, torch.tensor(torch.finfo(scores.dtype).min))
        return torch.matmul(scores.softmax(-1), value)
        """
    )
    assert site.guards == 1


@pytest.mark.parametrize(
    "body,reason",
    [
        (
            "scores = torch.matmul(query, key.transpose(-1, -2))\nscores = torch.tanh(scores)\n"
            "return torch.matmul(scores.softmax(-1), value)",
            "passed to `torch.tanh`",
        ),
        (
            "scores = torch.matmul(query, key.transpose(-1, -2))\nscores = scores.masked_fill(attention_mask == 0, 0.0)\n"
            "return torch.matmul(scores.softmax(-1), value)",
            "not to a large negative value",
        ),
        (
            "scores = torch.matmul(query, key.transpose(-1, -2)) * self.temperature\n"
            "return torch.matmul(scores.softmax(-1), value)",
            "not provably a number",
        ),
        (
            "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(-1)\nprobs = probs * 2.0\n"
            "return torch.matmul(probs, value)",
            "outside a `... is not None` head-mask guard",
        ),
        (
            "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(-1)\n"
            "out = torch.matmul(probs, value)\nreturn out + torch.matmul(probs.to(value.dtype), attention_mask)",
            "multiplied by a second tensor",
        ),
        (
            "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(dim=1)\n"
            "return torch.matmul(probs, value)",
            "not the key dimension",
        ),
        (
            "out = 0\nfor chunk in range(4):\n    scores = torch.matmul(query, key.transpose(-1, -2))\n"
            "    out = out + torch.matmul(scores.softmax(-1), value)\nreturn out",
            "",
        ),
        (
            "scores = self.score(query, key)\nreturn torch.matmul(scores.softmax(-1), value)",
            "not from a recognised query-key product",
        ),
    ],
    ids=["tanh", "fill-zero", "tensor-scale", "unguarded-multiply", "value-side", "softmax-dim", "loop", "unknown-scores"],
)
def test_refusals_name_the_problem(body: str, reason: str) -> None:
    analysis = analyse(attention_module(body, init=INIT))
    assert analysis is not None and analysis.refusal is not None, "expected a refusal"
    assert reason in analysis.refusal.detail
    assert analysis.refusal.line > 0


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # a product of a module the tool reads as one, its key not seen transposed: the reason names where it is
        (
            "scores = self.score(query, key)\nscores = scores / 8.0\nreturn torch.matmul(scores.softmax(-1), value)",
            "come from `scores` (`self.score(query, key)`, line ",
        ),
        (
            "scores = torch.matmul(query, key)\nreturn torch.matmul(scores.softmax(-1), value)",
            "(`torch.matmul(query, key)`, line 18, a product whose right operand is not seen as a key with its last "
            "two dims swapped, of operands whose one rank (at least 3) cannot be read)",
        ),
        (
            "return torch.matmul(torch.matmul(query, key).softmax(-1), value)",
            "come from `torch.matmul(query, key)` (a product whose right operand is not seen as a key",
        ),
        (
            "scores = torch.einsum('bqd,bkd->bqdk', query, key)\nreturn torch.matmul(scores.softmax(-1), value)",
            "an einsum the tool does not read as a query-key product",
        ),
        # the key's dims 1 and 0 swapped (PGL-SUM's `K.transpose(1, 0)`): the last two only of 2-D operands
        (
            "scores = torch.matmul(query, key.transpose(1, 0))\nreturn torch.matmul(scores.softmax(-1), value)",
            "a product whose right operand swaps dims 1 and 0, its last two only where the operands have 2 dims, a "
            "rank the file does not show)",
        ),
    ],
    ids=["module", "untransposed", "in-place", "einsum", "front-dims"],
)
def test_scores_of_unknown_origin_name_their_origin(body: str, reason: str) -> None:
    analysis = analyse(attention_module(body, init=INIT))
    assert analysis is not None and analysis.refusal is not None, "expected a refusal"
    assert analysis.refusal.code.code == "S107"
    assert reason in analysis.refusal.detail, analysis.refusal.detail


def test_an_imported_modules_softmax_is_no_tensor_method() -> None:
    """`utils.softmax(scores, dim=-1)` (fairseq's) is a function of another package, not `.softmax()` of `utils`."""
    body = (
        "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = utils.softmax(scores, dim=-1)\n"
        "return torch.matmul(probs, value)"
    )
    source = attention_module(body, init=INIT).replace("import torch\n", "import torch\nfrom fairseq import utils\n", 1)
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED
    said = "the scores are passed to `utils.softmax`, a function of `fairseq.utils`, another package, whose computation"
    assert said in result.reasons[0], result.reasons


def test_router_softmax_is_not_attention() -> None:
    source = attention_module("weights = self.gate(query).softmax(-1)\nreturn query * weights", init="self.gate = nn.Linear(4, 4)")
    assert analyse(source) is None


def test_helper_method_site_and_head_mask_parameter() -> None:
    source = attention_module(
        "out, weights = self._attn(query, key, value, attention_mask, head_mask)\nreturn out",
        init=INIT,
        helpers="""
        def _attn(self, q, k, v, mask=None, layer_mask=None):
            scores = torch.matmul(q, k.transpose(-1, -2))
            if mask is not None:
                scores = scores + mask
            probs = scores.softmax(-1)
            if layer_mask is not None:
                probs = probs * layer_mask
            return torch.matmul(probs, v), probs
        """,
    )
    analysis = analyse(source)
    assert analysis is not None and analysis.refusal is None
    assert [h.method for h in analysis.helpers] == ["_attn"]
    assert analysis.eager_only_params == ("head_mask",)
    assert analysis.sites[0].method == "_attn"


@pytest.mark.parametrize(
    "init,scores",
    [
        # GPT-J / CodeGen: the square root of the head size in a 0-d tensor, cast to the default dtype
        (
            "self.scale_attn = torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32)).to(torch.get_default_dtype())",
            "scores = torch.matmul(query, key.transpose(-1, -2)) / self.scale_attn",
        ),
        # GPT-NeoX-Japanese: baddbmm's alpha, one over such a tensor
        (
            "self.norm_factor = torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32)).to(torch.get_default_dtype())",
            "scores = torch.matmul(query, key.transpose(-1, -2)) * (torch.tensor(1.0, dtype=self.norm_factor.dtype) / self.norm_factor)",
        ),
    ],
)
def test_numbers_in_tensors_are_scales(init: str, scores: str) -> None:
    site = site_of(f"{scores}\nprobs = scores.softmax(dim=-1)\nreturn torch.matmul(probs, value)", init=INIT + "\nself.head_dim = 8\n" + init)
    assert [s.where for s in site.scaling] == [ScaleSite.SCORES]


def test_what_math_returns_is_a_number() -> None:
    """math.sqrt of anything is a Python float or raises: FastSpeech2-Conformer's head size read from a dict
    (`self.num_heads = module_config["num_attention_heads"]`) scales by a number."""
    init = INIT + '\nself.dim_key = config.hidden_size // settings["heads"]\n'
    scores = "scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.dim_key)"
    site = site_of(f"{scores}\nprobs = scores.softmax(dim=-1)\nreturn torch.matmul(probs, value)", init=init)
    assert [(s.where, s.expression) for s in site.scaling] == [(ScaleSite.SCORES, "math.sqrt(self.dim_key)")]


@pytest.mark.parametrize(
    "factor",
    ["self.temperature", "torch.sqrt(self.temperature)", "torch.sqrt(query.abs().sum())"],
)
def test_tensors_that_are_not_numbers_are_not_scales(factor: str) -> None:
    analysis = analyse(attention_module(
        f"scores = torch.matmul(query, key.transpose(-1, -2)) * {factor}\nreturn torch.matmul(scores.softmax(dim=-1), value)",
        init=INIT,
    ))
    assert analysis is not None and analysis.refusal is not None and analysis.refusal.code.code == "S102"


@pytest.mark.parametrize(
    "setup,product",
    [
        # bloom: keys permuted to (b, h, d, s), flattened to (b*h, d, s), extended by a cache along the last dim
        (
            "key = key.permute(0, 2, 3, 1).reshape(-1, key.size(-1), key.size(1))\nif head_mask is not None:\n    key = torch.cat((head_mask, key), dim=2)",
            "torch.bmm(query.reshape(-1, query.size(-2), query.size(-1)), key)",
        ),
        ("key = key.permute(0, 2, 3, 1)", "torch.matmul(query, key)"),
        ("", "query @ key.permute(0, 1, 3, 2)"),
    ],
)
def test_keys_laid_out_for_the_product(setup: str, product: str) -> None:
    body = f"{setup}\nscores = {product}\nprobs = scores.softmax(dim=-1)\nreturn torch.matmul(probs, value)".lstrip()
    analysis = analyse(attention_module(body, init=INIT))
    assert analysis is not None and analysis.refusal is None, analysis and analysis.refusal
    assert analysis.sites[0].key.endswith((".transpose(-1, -2)", "key"))


def test_a_key_concatenated_along_another_dim_is_not_a_transposed_key() -> None:
    body = (
        "key = key.permute(0, 2, 3, 1)\nif attention_mask is not None:\n    key = torch.cat((value, key), dim=1)\n"
        "scores = torch.matmul(query, key)\nreturn torch.matmul(scores.softmax(dim=-1), value)"
    )
    analysis = analyse(attention_module(body, init=INIT))
    assert analysis is None or analysis.refusal is not None


def test_a_step_under_an_optional_argument_falls_back_to_eager() -> None:
    """SAM's form: a second softmax when an optional argument is given; the SDPA class takes the other path and
    falls back to eager when the argument is given. A step that stays on every path is still refused."""
    body = (
        "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(dim=-1)\n"
        "if similarity is not None:\n    probs = torch.softmax(probs + similarity, dim=-1)\n"
        "return torch.matmul(probs, value)"
    )
    signature = "query, key, value, attention_mask=None, similarity=None"
    analysis = analyse(attention_module(body, init=INIT, signature=signature))
    assert analysis is not None and analysis.refusal is None and analysis.eager_only_params == ("similarity",)
    always = body.replace("if similarity is not None:\n    probs", "probs")
    analysis = analyse(attention_module(always, init=INIT, signature=signature))
    assert analysis is not None and analysis.refusal is not None
    # a mask is not optional in that sense: falling back whenever it is given would leave SDPA unused
    masked = body.replace("similarity", "attention_mask")
    analysis = analyse(attention_module(masked, init=INIT, signature=signature))
    assert analysis is not None and analysis.refusal is not None


def test_a_step_under_a_switch_off_by_default_falls_back_to_eager() -> None:
    """BLIP-2's form: `if self.save_attention:` hands the weights to a method (a hook); __init__ sets the switch to
    False, so the SDPA class takes the other path and falls back to eager while the switch is on. A switch that
    __init__ turns on is not assumed off."""
    body = (
        "scores = torch.matmul(query, key.transpose(-1, -2))\nprobs = scores.softmax(dim=-1)\n"
        "if self.save_attention:\n    self.save_attention_map(probs)\n"
        "return torch.matmul(probs, value)"
    )
    analysis = analyse(attention_module(body, init=INIT + "self.save_attention = False\n"))
    assert analysis is not None and analysis.refusal is None and analysis.eager_only_flags == ("self.save_attention",)
    analysis = analyse(attention_module(body, init=INIT + "self.save_attention = True\n"))
    assert analysis is not None and analysis.refusal is not None and analysis.eager_only_flags == ()


def test_a_step_only_a_request_for_weights_takes_falls_back_to_eager() -> None:
    """ProphetNet's form: the weights returned are the scores before the softmax, kept under `if output_attentions:`,
    and a head mask applied to a view of the probabilities. The SDPA class returns to eager for either (it does for
    `output_attentions` anyway); the head mask is tried as absent together with the request for weights."""
    body = (
        "scores = torch.matmul(query, key.transpose(-1, -2))\n"
        "if attention_mask is not None:\n    scores = scores + attention_mask\n"
        "if output_attentions:\n    returned = scores\nelse:\n    returned = None\n"
        "probs = scores.softmax(dim=-1)\n"
        "if head_mask is not None:\n    probs = head_mask.view(1, -1, 1, 1) * probs.view(b, h, q, k)\n"
        "return torch.matmul(probs, value), returned"
    )
    analysis = analyse(attention_module(body, init=INIT))
    assert analysis is not None and analysis.refusal is None, analysis
    assert analysis.eager_only_flags == ("output_attentions",) and analysis.eager_only_params == ("head_mask",)
    # a read of the scores every call makes is still refused
    always = body.replace("if output_attentions:\n    returned = scores\nelse:\n    returned = None\n", "returned = scores\n")
    analysis = analyse(attention_module(always, init=INIT))
    assert analysis is not None and analysis.refusal is not None


def test_a_tensor_factor_the_same_for_every_key_scales_the_query() -> None:
    """Swin V2's cosine attention: scores times a per-head parameter of shape (heads, 1, 1), clamped and
    exponentiated; `(q @ k.T) * f == (q * f) @ k.T` since f is the same along the keys. A factor that varies along
    the keys (last dimension not 1) is refused, and so is one whose shape cannot be read."""
    body = (
        "scale = torch.clamp(self.logit_scale, max=4.6).exp()\n"
        "scores = torch.matmul(nn.functional.normalize(query, dim=-1), nn.functional.normalize(key, dim=-1).transpose(-1, -2))\n"
        "scores = scores * scale\nprobs = scores.softmax(dim=-1)\nreturn torch.matmul(probs, value)"
    )
    per_head = INIT + "self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((4, 1, 1))))\n"
    site = site_of(body, init=per_head)
    assert [(s.where, s.expression) for s in site.scaling] == [(ScaleSite.QUERY, "scale")]
    for init in (per_head.replace("(4, 1, 1)", "(4, 1, 8)"), INIT + "self.logit_scale = nn.Parameter(torch.randn(shape))\n"):
        analysis = analyse(attention_module(body, init=init))
        assert analysis is not None and analysis.refusal is not None and analysis.refusal.code.value[0] == "S102"


def test_relative_scores_added_in_place_are_a_term() -> None:
    """SpeechT5's form: `scores += relative` where `relative` is another product (the query times position
    embeddings); like `scores + relative`, the younger product is an additive term of the older chain."""
    body = (
        "scores = torch.matmul(query, key.transpose(-1, -2))\n"
        "relative = torch.matmul(query, position_bias.transpose(-2, -1))\n"
        "scores += relative\nprobs = scores.softmax(dim=-1)\nreturn torch.matmul(probs, value)"
    )
    site = site_of(body, signature="query, key, value, position_bias, attention_mask=None")
    assert [t.expression for t in site.terms] == ["relative"]


def _with_function(function: str, body: str):  # type: ignore[no-untyped-def]
    """The analysis of a module whose attention calls a module-level `function` of the file."""
    source = attention_module(body, init=INIT)
    source = source.replace("\n\nclass Attention", f"\n\n{textwrap.dedent(function).strip()}\n\n\nclass Attention", 1)
    return analyse(source)


KEY_SCALED = """
scale = key_scale(query, 2)
scores = torch.matmul(query, key.transpose(-1, -2) / scale.to(dtype=query.dtype))
return torch.matmul(scores.softmax(-1), value)
"""


@pytest.mark.parametrize(
    "function",
    [
        "def key_scale(layer, factor):\n    return torch.sqrt(torch.tensor(layer.size(-1), dtype=torch.float) * factor)",
        'def key_scale(layer, factor=2):\n    """Docstring."""\n    return math.sqrt(layer.shape[-1] * factor)',
    ],
    ids=["torch-sqrt-of-a-tensor", "math-with-docstring"],
)
def test_a_key_divided_by_a_number_a_file_function_returns(function: str) -> None:
    """DeBERTa's `bmm(q, k^T / scaled_size_sqrt(q, factor))`: the division scales the product."""
    analysis = _with_function(function, KEY_SCALED)
    assert analysis is not None and analysis.refusal is None, analysis and str(analysis.refusal)
    (site,) = analysis.sites
    assert [(s.expression, s.divide) for s in site.scaling] == [("scale.to(dtype=query.dtype)", True)]


@pytest.mark.parametrize(
    "function",
    [
        "SCALE = 2.0\n\n\ndef key_scale(layer, factor):\n    return SCALE * layer.size(-1) * factor",  # a global
        "def key_scale(layer, factor):\n    size = layer.size(-1)\n    return size * factor",  # two statements
        "def key_scale(layer, factor):\n    return layer.norm(dim=-1, keepdim=True) * factor",  # a tensor
    ],
    ids=["reads-a-global", "two-statements", "returns-a-tensor"],
)
def test_a_function_not_shown_to_return_a_number_is_no_scale(function: str) -> None:
    analysis = _with_function(function, KEY_SCALED)
    assert analysis is not None and analysis.refusal is not None
    assert analysis.refusal.code.code == "S102", str(analysis.refusal)


TALKING_HEADS_INIT = INIT + """
self.head_logits_proj = nn.Linear(4, 4, bias=False) if config.talking_head else None
self.head_weights_proj = nn.Linear(4, 4, bias=False) if config.talking_head else None
"""

TALKING_HEADS = """
scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
if self.head_logits_proj is not None:
    scores = self.head_logits_proj(scores.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
if attention_mask is not None:
    scores = scores + attention_mask
probs = nn.functional.softmax(scores, dim=-1)
if self.head_weights_proj is not None:
    probs = self.head_weights_proj(probs.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
return torch.matmul(probs, value), probs
"""


def test_projections_built_only_under_a_flag_send_the_sdpa_class_back_to_eager() -> None:
    """DeBERTa's talking heads: modules the class sets to None at the defaults; SDPA runs while both are None."""
    analysis = analyse(attention_module(TALKING_HEADS, init=TALKING_HEADS_INIT))
    assert analysis is not None and analysis.refusal is None, analysis and str(analysis.refusal)
    assert set(analysis.eager_only_params) == {"self.head_logits_proj", "self.head_weights_proj"}


def test_a_projection_always_built_is_refused() -> None:
    init = INIT + "\nself.head_logits_proj = nn.Linear(4, 4, bias=False)\nself.head_weights_proj = None"
    analysis = analyse(attention_module(TALKING_HEADS, init=init))
    assert analysis is not None and analysis.refusal is not None
    assert analysis.refusal.code.code == "S101", str(analysis.refusal)


def test_a_config_switch_off_by_default_sends_the_sdpa_class_back_to_eager() -> None:
    """DeBERTa 4.x: `self.talking_head = getattr(config, "talking_head", False)` tested before a projection."""
    init = INIT + '\nself.talking_head = getattr(config, "talking_head", False)\nself.head_logits_proj = nn.Linear(4, 4)'
    body = TALKING_HEADS.replace("if self.head_logits_proj is not None:", "if self.talking_head:").replace(
        "if self.head_weights_proj is not None:\n    probs = self.head_weights_proj(probs.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)\n", ""
    )
    analysis = analyse(attention_module(body, init=init))
    assert analysis is not None and analysis.refusal is None, analysis and str(analysis.refusal)
    assert analysis.eager_only_flags == ("self.talking_head",)
    on = init.replace('getattr(config, "talking_head", False)', 'getattr(config, "talking_head", True)')
    refused = analyse(attention_module(body, init=on))
    assert refused is not None and refused.refusal is not None and refused.refusal.code.code == "S101"


def test_assigned_values_marks_every_binding_that_is_no_plain_assignment() -> None:
    """`assigned_values` gives each binding's value: the expression of `name = value` (each name of `a = b = v`),
    None for every other kind, so that a reader of ranks or values can tell a name bound otherwise too."""
    import libcst as cst

    from sdpa_port.analyse.cstutil import all_assigned_names, assigned_values

    source = (
        "a = b = x.view(1, 2)\n"
        "c, d = pair\n"
        "a += 1\n"
        "e: int = 3\n"
        "for f in items:\n"
        "    pass\n"
        "with g() as h:\n"
        "    pass\n"
        "if (i := 4):\n"
        "    pass\n"
        "def j():\n"
        "    k = 5\n"
        "class L:\n"
        "    m = 6\n"
    )
    values = assigned_values(cst.parse_module(source).body)
    shown = {name: [None if v is None else cst.Module([]).code_for_node(v) for v in vs] for name, vs in values.items()}
    assert shown == {
        "a": ["x.view(1, 2)", None],
        "b": ["x.view(1, 2)"],
        "c": [None],
        "d": [None],
        "e": [None],
        "f": [None],
        "h": [None],
        "i": [None],
        "j": [None],
        "L": [None],
    }
    assert all_assigned_names(cst.parse_module(source).body) == set(shown)


FORKED = """
scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(query.size(-1))
{fork}
probs = nn.functional.softmax(scores, dim=-1)
return torch.matmul(probs, value), probs
"""


PRODUCT = "query @ key.transpose(-1, -2)"


@pytest.mark.parametrize(
    "fork,terms",
    [
        # a second name goes on from the scores, and the chain goes on from the earlier value another way: the
        # operations recorded for the chain would hold both (the bias added twice, the scores doubled)
        ("other = scores * 2\nscores = scores + attention_mask", None),
        ("other = scores + attention_mask\nscores = scores + 2 * attention_mask", None),
        ("other = scores + attention_mask\nscores = scores - attention_mask", None),
        # an alias, and the same computation made again (FLAVA's softmax twice, LiLT's sum in both orders): one
        # computation, its operations recorded once
        ("other = scores\nscores = other + attention_mask", ["attention_mask"]),
        ("other = scores + attention_mask\nother = scores + attention_mask\nscores = other", ["attention_mask"]),
        ("other = scores + attention_mask\nscores = scores + attention_mask", ["attention_mask"]),
        ("other = scores + attention_mask\nscores = attention_mask + scores", ["attention_mask"]),
        (f"first = scores + {PRODUCT}\nscores = {PRODUCT} + scores", [PRODUCT]),
        # the same text, but a name it reads assigned in between: another value, so a fork
        (
            "other = scores + attention_mask\nattention_mask = attention_mask * 2\n"
            "other = scores + attention_mask\nscores = other",
            None,
        ),
        # ... or changed in place in between
        ("other = scores + attention_mask\nattention_mask.mul_(2)\nscores = scores + attention_mask", None),
        ("other = scores + attention_mask\nattention_mask[0] = 1\nscores = scores + attention_mask", None),
        # the same text under other branch tests: another computation where the tests differ
        (
            "other = scores\nif attention_mask is not None:\n    other = scores + attention_mask\n"
            "if attention_mask is not None and attention_mask.dim() == 4:\n    scores = scores + attention_mask",
            None,
        ),
        ("scores = scores + attention_mask\nscores = scores + attention_mask", ["attention_mask"] * 2),  # in turn
        ("probs = nn.functional.softmax(scores, dim=-1)", []),  # the softmax below makes it again
    ],
)
def test_scores_that_fork_into_two_computations_are_refused(fork: str, terms: list[str] | None) -> None:
    analysis = analyse(attention_module(FORKED.format(fork=fork), init=INIT))
    assert analysis is not None
    if terms is None:
        assert analysis.refusal is not None and "fork" in analysis.refusal.detail, analysis.refusal
        assert analysis.refusal.code.code == "S104"
        return
    assert analysis.refusal is None, str(analysis.refusal)
    (site,) = analysis.sites
    assert [t.expression for t in site.terms] == terms


STREAMS = """
scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
probs = nn.functional.softmax(scores, dim=-1)
{first}
{second}
return text + layout
"""


@pytest.mark.parametrize(
    "first,second,more,refusal",
    [
        # the same probabilities reach two products with V: one SDPA call each
        ("text = torch.matmul(probs, value)", "layout = torch.matmul(probs, attention_mask)", ["attention_mask"], None),
        # each dropped out by a draw of its own (the dropout made again for the second product)
        (
            "text = torch.matmul(self.dropout(probs), value)",
            "layout = torch.matmul(self.dropout(probs), attention_mask)",
            ["attention_mask"],
            None,
        ),
        (
            "dropped = self.dropout(probs)\ntext = torch.matmul(dropped, value)",
            "dropped = self.dropout(probs)\nlayout = torch.matmul(dropped, attention_mask)",
            ["attention_mask"],
            None,
        ),
        # one draw reaching both products: SDPA calls would draw two
        (
            "probs = self.dropout(probs)\ntext = torch.matmul(probs, value)",
            "layout = torch.matmul(probs, attention_mask)",
            None,
            "one dropout draw",
        ),
        (
            "dropped = self.dropout(probs)\nagain = dropped.to(value.dtype)\ntext = torch.matmul(again, value)",
            "again = dropped.to(value.dtype)\nlayout = torch.matmul(again, attention_mask)",
            None,
            "one dropout draw",
        ),
        # other probabilities: another computation
        (
            "text = torch.matmul(self.dropout(probs), value)",
            "layout = torch.matmul(probs, attention_mask)",
            None,
            "multiplied by a second tensor",
        ),
    ],
)
def test_probabilities_reaching_several_products_with_v(
    first: str, second: str, more: list[str] | None, refusal: str | None
) -> None:
    analysis = analyse(attention_module(STREAMS.format(first=first, second=second), init=INIT))
    assert analysis is not None
    if refusal is not None:
        assert analysis.refusal is not None and refusal in analysis.refusal.detail, analysis.refusal
        assert analysis.refusal.code.code == "S111"
        return
    assert analysis.refusal is None, str(analysis.refusal)
    (site,) = analysis.sites
    assert (site.value, list(site.more_values)) == ("value", more)
    assert site.dropout is None or site.dropout.probability == "self.dropout.p"


STORED = '''
import torch
from torch import nn


class StoreAttention(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.att = None

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2))
        {target} = scores.softmax(dim=-1)
        out = torch.matmul({read}, v)
        return out.transpose(1, 2).reshape(b, n, c)
'''


def test_probabilities_stored_on_the_module_are_named() -> None:
    """`self.att = softmax(...)` keeps the weights for other code to read, which SDPA cannot give."""
    result = port_source(STORED.format(target="self.att", read="self.att"), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED
    assert "the probabilities are stored in `self.att`, where code outside the computation may read them (S104)" in (
        result.reasons[0]
    )
    # unpacked into several names, the old reason stands
    result = port_source(STORED.format(target="probs, other", read="probs"), filename="modeling_tiny.py")
    assert "unpacked into several names" in result.reasons[0]
