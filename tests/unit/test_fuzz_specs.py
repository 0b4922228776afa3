"""The fuzzer's regression specs, checked without torch: each defect class gets the port decision it needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))

from regressions import REGRESSIONS, regression  # noqa: E402
from render import render  # noqa: E402

from sdpa_port import Status, port_source  # noqa: E402
from sdpa_port.discover.release import Release  # noqa: E402
from helpers import POSITION_BIAS, flat  # noqa: E402


def ported(name: str, release: Release | None = None) -> str:
    spec, _, _ = regression(name)
    result = port_source(render(spec), filename="modeling_fuzz.py", release=release)
    assert result.status is Status.PORTED, result.reasons
    return result.source


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression_decision(name: str) -> None:
    spec, verdict, code = regression(name)
    result = port_source(render(spec), filename="modeling_fuzz.py")
    if verdict == "refused":
        assert result.status is Status.REFUSED, (result.status, result.detail)
        assert code in {r.code.code for r in result.refusals}
        assert all(line.endswith("]") for line in result.reasons)
    else:
        assert result.status is Status.PORTED, result.reasons


def test_causal_fill_in_an_else_branch_reaches_the_call() -> None:
    source = ported("1: a causal fill in an else branch")
    sdpa = source[source.index("class FuzzSdpaAttention") :]
    # the causal mask chosen in the else branch is read after the if, not only assigned there
    assert sdpa.count("sdpa_causal") >= 3 and "if sdpa_causal is not None:" in sdpa


def test_cross_attention_is_never_causal() -> None:
    source = ported("3: cross-attention made causal")
    line = next(line for line in flat(source).splitlines() if "sdpa_is_causal =" in line)
    assert "encoder_hidden_states is None" in line and "self.is_causal" in line


def test_a_sole_always_applied_mask_is_causal_when_none() -> None:
    source = ported("2c: a None mask in a causal module")
    assert "_prepare_4d_causal_attention_mask_for_sdpa" in source
    assert "is_causal=sdpa_is_causal" in source


@pytest.mark.parametrize("name", ["2a: a None mask added with another term", "2d: the mask applied only under a config flag"])
def test_no_causal_contract_where_none_cannot_mean_causal(name: str) -> None:
    source = ported(name)
    assert "_prepare_4d_causal_attention_mask_for_sdpa" not in source
    assert "sdpa_is_causal" not in source


def test_an_eager_assert_on_the_mask_keeps_the_full_masks() -> None:
    spec, _, _ = regression("2b: an eager assert on the mask")
    result = port_source(render(spec), filename="modeling_fuzz.py")
    assert "_for_sdpa" not in result.source
    assert any("without a None check" in w for w in result.warnings)


def test_the_scores_shape_is_read_from_the_operands() -> None:
    """`scores.size(-2)`/`scores.shape[-1]` in a kept statement become the query's size and the key's length."""
    from dataclasses import replace

    spec, _, _ = regression("1: a causal fill in an else branch")
    source = port_source(render(replace(spec, lengths_from_scores=True)), filename="modeling_fuzz.py").source
    sdpa = source[source.index("class FuzzSdpaAttention") :]
    assert "query_length, key_length = (query).size(-2), key.size(-2)" in sdpa or (
        "query_length, key_length = query.size(-2), key.size(-2)" in sdpa
    ), sdpa
    assert "attn_weights" not in sdpa.split("def forward")[1].split("return")[0].split("scaled_dot_product_attention")[0]


def test_a_none_guarded_flat_term_joins_the_mask_per_head() -> None:
    """The `(batch * heads, q, k)` term reaches SDPA's mask as `(batch, heads, q, k)`, inside its None check."""
    source = ported("2e: a None-guarded term added to flat scores")
    sdpa = source[source.index("class FuzzSdpaAttention") :]
    assert "position_bias.unflatten(0, (" in sdpa
    assert "if position_bias is not None:" in sdpa


@pytest.mark.parametrize(
    "name,guard",
    [
        ("12j: a causal buffer under the module's flag", "if self.flag_causal:"),
        ("12k: a causal buffer for self-attention only", "if not self.is_cross_attention:"),
    ],
)
def test_a_causal_buffer_under_a_setting_is_handed_over_in_its_branch(name: str, guard: str) -> None:
    """The fill joins the additive terms (`position_bias`) in the branch that applies it; a fresh variable that
    still holds None is assigned, not tested again."""
    source = ported(name, POSITION_BIAS)
    dispatching = source[source.index("class FuzzAttention") :]
    assert "dispatch_bias = sdpa_mask" in dispatching and "position_bias=dispatch_bias" in dispatching
    assert "sdpa_mask = None" in dispatching
    branch = dispatching[dispatching.index(guard) : dispatching.index("attention_interface = ")]
    assert "sdpa_mask = torch.where(causal_mask, " in branch
    assert "if sdpa_mask is None else" not in dispatching


def test_the_branch_computing_the_attention_dispatches_and_the_alternative_stays() -> None:
    source = ported("12l: the attention beside a fused-kernel alternative (interface style)")
    eager = source[source.index("def eager_attention_forward") : source.index("class FuzzAttention")]
    forward = source[source.index("class FuzzAttention") :]
    assert "fused_attention_kernel" not in eager and "module.training" not in eager
    alternative = forward.index("attn_output = torch.fused_attention_kernel(query, key, value)")
    otherwise = forward.index("        else:\n", alternative)
    assert alternative < otherwise < forward.index("attention_interface(")


def test_an_approximation_beside_the_attention_takes_the_mask_in_eager_form() -> None:
    """The approximation's side stays eager: a boolean mask built for sdpa becomes eager's additive one there, and
    no kernel whose mask has no eager form (`_supports_attention_backend`) is claimed."""
    spec, _, _ = regression("12p: exact attention beside an approximation, 5.x")
    result = port_source(render(spec), filename="modeling_fuzz.py")
    assert result.status is Status.PORTED, result.detail
    forward = result.source[result.source.index("class FuzzAttention") :]
    otherwise = forward[forward.index("        else:\n") :]
    conversion = otherwise.index("if attention_mask is not None and attention_mask.dtype == torch.bool:")
    converted = otherwise.index("attention_mask = torch.zeros_like(attention_mask, dtype=")
    assert conversion < converted < otherwise.index("torch.tanh(")
    assert any("eager's form" in warning for warning in result.warnings)
    # a causal builder's mask: made to build always, so that sdpa's is booleans there too, never None
    causal = port_source(render(regression(CAUSAL_BESIDE)[0]), filename="modeling_fuzz.py")
    assert causal.status is Status.PORTED, causal.detail
    assert causal.source.count("allow_is_causal_skip=False") == 1
    assert "attention_mask = torch.zeros_like(attention_mask, dtype=" in causal.source


@pytest.mark.parametrize(
    "name",
    [
        "12z: two helpers computing the attention, chosen by a setting, 5.x",
        "12z2: two helpers computing the attention, chosen by a setting, causal masks, 5.x",
    ],
)
def test_two_helpers_chosen_by_a_setting_dispatch_one_and_keep_the_other(name: str) -> None:
    """The helper called where the setting is off moves into the eager function and dispatches; the twin stays a
    method, called as written, after the mask is put in eager's form; a causal builder builds always."""
    source = ported(name)
    forward = source[source.index("class FuzzAttention") :]
    kept = forward[forward.index("        if self.reorder_and_upcast:\n") : forward.index("        else:\n")]
    assert "attention_mask = torch.zeros_like(attention_mask, dtype=" in kept
    assert kept.index("torch.zeros_like(") < kept.index("self._attn_upcast(")
    assert "def _attn_upcast(" in forward and "def _attn(" not in forward
    assert "attention_interface(" in forward[forward.index("        else:\n") :]
    assert source.count("allow_is_causal_skip=False") == (1 if "causal masks" in name else 0)


CAUSAL_BESIDE = "12m: the attention in one branch of a setting, the mask read in the other (interface style)"


@pytest.mark.parametrize(
    "name",
    [
        "12x: a module built causal whose causal buffer carries its causality, bidirectional masks, 5.x",
        "12y: is_causal = True on a module whose causal buffer carries its causality, bidirectional masks, 5.x",
    ],
)
def test_a_causal_buffer_carrying_the_module_s_causality_dispatches_with_is_causal_false(name: str) -> None:
    """The module says it is causal and fills its own causal buffer; only bidirectional masks reach it. The buffer
    goes over in position_bias and the dispatch passes is_causal=False, taken out of the caller's kwargs."""
    source = ported(name, POSITION_BIAS)
    forward = source[source.index("class FuzzAttention") :]
    assert "if self.is_causal:" in forward and "dispatch_bias = sdpa_mask" in forward and "position_bias=dispatch_bias" in forward
    assert forward.count("            is_causal=False,\n") == 1
    assert 'kwargs.pop("is_causal", None)' in forward
    claimed = render(regression(name)[0]).replace(
        '    base_model_prefix = "model"\n', '    base_model_prefix = "model"\n    _supports_flash_attn = True\n'
    )
    assert "_supports_flash_attn = True" in claimed
    result = port_source(claimed, filename="modeling_fuzz.py", release=POSITION_BIAS)
    assert result.status is Status.REFUSED  # flash, claimed, would get the class without its buffer
    assert {r.code.value[0] for r in result.refusals} & {"C302", "C304"}, result.refusals


@pytest.mark.parametrize(
    "name,rate",
    [
        ("12z5: dropout under a test of the module's settings, 5.x", "dropout=self.dropout_p if self.training else 0.0,"),
        ("12z6: dropout under a test of the module's settings, 4.x", "dropout_p=self.attn_dropout.p if self.training else 0.0,"),
    ],
)
def test_dropout_under_a_test_of_the_settings_joins_the_rate_s_condition(name: str, rate: str) -> None:
    """`if self.training:` around the dropout: SDPA's rate holds where the test does; the eager function (5.x)
    keeps the test as written."""
    source = ported(name)
    assert rate in source
    if "5.x" in name:
        eager = source[source.index("def eager_attention_forward") : source.index("class FuzzAttention")]
        assert "    if module.training:\n        attn_weights = nn.functional.dropout(" in eager


def test_a_mask_added_under_a_flag_of_the_settings_goes_to_the_implementations_under_it() -> None:
    """`if self.flag_terms and attention_mask is not None:` around the addition: the implementations get the mask
    where the flag holds and None elsewhere; the eager function keeps the test as written."""
    source = ported("12z7: the mask added under a flag of the settings, bidirectional masks, 5.x")
    forward = source[source.index("class FuzzAttention") :]
    assert "attention_mask if self.flag_terms else None" in forward
    eager = source[source.index("def eager_attention_forward") : source.index("class FuzzAttention")]
    assert "    if module.flag_terms and attention_mask is not None:\n" in eager
    spec, _, _ = regression("12z8: the mask added under a flag of the settings, causal masks, 5.x")
    refused = port_source(render(spec), filename="modeling_fuzz.py")
    assert refused.status is Status.REFUSED and "create_causal_mask" in refused.reasons[0], refused.reasons


@pytest.mark.parametrize("name,whole", [("37c", True), ("37d", False)])
def test_a_key_read_from_a_stored_cache_goes_whole_only_where_stored_whole(name: str, whole: bool) -> None:
    source = ported(next(n for n in REGRESSIONS if n.startswith(name)))
    sdpa = source[source.index("class FuzzSdpaAttention") :]
    assert ("key_states.unflatten(0," not in sdpa) is whole
    assert ("key_states = key.reshape(*proj_shape)" not in sdpa) is whole


@pytest.mark.parametrize(
    "name,calls",
    [
        ("37f: two helpers making the same SDPA call, one of them on flattened heads", 1),
        ("37g: two helpers making different SDPA calls", 2),
        ("37h: the scores' shape read after flat scores are viewed in 4-D", 2),
    ],
)
def test_helpers_chosen_by_a_setting_make_one_call_where_theirs_are_the_same(name: str, calls: int) -> None:
    """The twin flattening the heads makes `_attn`'s SDPA call: the SDPA class keeps one (`plan/one_call.py`); halved
    scores, or a term reading the scores' shape, keep a call per branch."""
    source = ported(name)
    sdpa_class = source[source.index("class FuzzSdpaAttention") :].split("\nclass ", 1)[0]
    assert sdpa_class.count("torch.nn.functional.scaled_dot_product_attention(") == calls
    assert ("if self.reorder_and_upcast:" in sdpa_class) == (calls == 2)
