"""The verifying checks themselves, on a real port inside transformers 4.40.2: the bf16 bound must pass a correct port
on every input drawn and fail one that is subtly wrong, else the emitted tests are flaky or blind."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from pathlib import Path

import pytest

from harness import load, port_file

pytestmark = pytest.mark.tf440

DRAWS = 24  # weights and inputs drawn with these seeds (the largest difference failed a correct port on 7 of 160)


@contextmanager
def patched_sdpa(make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """torch's SDPA replaced by `make(original)` for the time of the block."""
    import torch

    original = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = make(original)
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def halved_bias() -> contextlib.AbstractContextManager[None]:
    """SDPA with the finite part of a float `attn_mask` halved (T5's position bias at half strength)."""
    import torch

    def make(original):  # type: ignore[no-untyped-def]
        def halved(query, key, value, attn_mask=None, **options):  # type: ignore[no-untyped-def]
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = torch.where(attn_mask < -1e3, attn_mask, attn_mask * 0.5)
            return original(query, key, value, attn_mask=attn_mask, **options)

        return halved

    return patched_sdpa(make)


def test_the_bf16_bound_passes_a_correct_t5_port_on_every_draw_and_fails_a_halved_bias(tmp_path: Path) -> None:
    import torch

    from sdpa_port.verify import checks
    from sdpa_port.verify.configs import tiny_config

    module = load("t5", port_file("t5"), tmp_path)
    config = tiny_config(module.T5Config)
    model_class = module.T5ForConditionalGeneration
    kind = checks.model_kind(config, model_class)
    passed, caught = [], []
    for seed in range(DRAWS):
        eager = checks.build(model_class, config, "eager")
        checks.sharpen(eager, seed=seed)
        sdpa = checks.build(model_class, config, "sdpa")
        sdpa.load_state_dict(eager.state_dict())
        reference = copy.deepcopy(eager).to(torch.bfloat16).float()
        eager, sdpa = eager.to(torch.bfloat16), sdpa.to(torch.bfloat16)
        batch = checks.make_batch(config, kind, "left" if seed % 2 else "right", seed=seed, length=checks.BF16_LENGTH)
        error, eager_error, bound = checks.bf16_error(reference, eager, sdpa, batch)
        passed.append((seed, round(error / bound, 2)))
        with halved_bias():
            caught.append((seed, round(checks.bf16_error(reference, eager, sdpa, batch)[0] / bound, 2)))
    assert all(ratio <= 1 for _, ratio in passed), f"a correct port failed (error / bound): {passed}"
    assert all(ratio > 1 for _, ratio in caught), f"a halved bias passed (error / bound): {caught}"


def test_the_bf16_bound_on_a_layer_and_which_outputs_are_attention_weights() -> None:
    import torch

    from sdpa_port.verify import checks

    torch.manual_seed(0)
    reference = torch.nn.Linear(8, 8)
    batch = checks.Batch({"input": torch.randn(2, 3, 8)}, torch.ones(2, 3))
    eager = torch.nn.Linear(8, 8).to(torch.bfloat16)
    eager.load_state_dict(reference.state_dict())
    wrong = torch.nn.Linear(8, 8).to(torch.bfloat16)  # other weights: far outside bf16 rounding

    def run(model):  # type: ignore[no-untyped-def]
        return lambda input: {"out": model(input.to(next(model.parameters()).dtype))}

    sdpa_error, eager_error, bound = checks.bf16_error(run(reference), run(eager), run(eager), batch)
    assert sdpa_error == eager_error <= bound
    assert checks.bf16_error(run(reference), run(eager), run(wrong), batch)[0] > bound
    output = {"encoder_attentions": (torch.ones(1),), "decoder_attentions": (), "logits": torch.ones(1)}
    assert list(checks.attention_weights(output)) == ["encoder_attentions"]


def test_the_bf16_bound_reads_a_classifier_by_its_last_hidden_state(tmp_path: Path) -> None:
    """BERT's sequence classifier returns two logits per example: a median over two rows failed its correct port
    (0.018 against a bound of 0.0159). Its last hidden state has a position per token and decides instead."""
    import torch

    from sdpa_port.verify import checks
    from sdpa_port.verify.configs import tiny_config

    module = load("bert", port_file("bert"), tmp_path)
    config = tiny_config(module.BertConfig)
    model_class = module.BertForSequenceClassification
    ratios = []
    for seed in range(12):
        eager = checks.build(model_class, config, "eager")
        checks.sharpen(eager, seed=seed)
        sdpa = checks.build(model_class, config, "sdpa")
        sdpa.load_state_dict(eager.state_dict())
        reference = copy.deepcopy(eager).to(torch.bfloat16).float()
        batch = checks.make_batch(config, "encoder", "left" if seed % 2 else "right", seed=seed, length=checks.BF16_LENGTH)
        expected = checks.with_last_hidden_states(reference, batch.inputs)
        assert "hidden_states[-1]" in expected and expected["logits"].shape[0] < checks.MIN_POSITIONS
        error, _, bound = checks.bf16_error(reference, eager.to(torch.bfloat16), sdpa.to(torch.bfloat16), batch)
        ratios.append(round(error / bound, 2))
    assert all(ratio <= 1 for ratio in ratios), ratios


def test_rounding_excuses_only_what_a_smooth_model_makes_of_rounding_in_its_attention() -> None:
    """`within_rounding` (amplifying models such as CvT): a difference no larger than the model's response to changing
    its attention outputs by a few units in the last place passes; a larger one fails; and a model whose outputs
    do not respond in proportion (a threshold) is never excused, however small the difference."""
    import torch

    from sdpa_port.verify.checks import Batch
    from sdpa_port.verify.model_builds import forward
    from sdpa_port.verify.outputs import Difference
    from sdpa_port.verify.rounding import within_rounding

    class Attend(torch.nn.Module):  # stands for the attention module the port replaces
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.softmax(-1)

    class Amplifying(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attend = Attend()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.attend(x) * 1e6,)

    class Thresholded(Amplifying):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return ((self.attend(x) > 0.1).float(),)

    batch = Batch({"x": torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))}, torch.ones(2, 0))
    smooth = Amplifying()
    expected = forward(smooth, batch)
    response = within_rounding(smooth, batch, {"Attend"}, expected, Difference(0.0, 0.0, 1))
    assert response.excused and "within rounding" in response.note
    moved = response.rounding
    assert 0.0 < moved and response.probe > 100 * moved
    assert within_rounding(smooth, batch, {"Attend"}, expected, Difference(moved / 2, 0.0, 1)).excused
    beyond = within_rounding(smooth, batch, {"Attend"}, expected, Difference(moved * 2, 0.0, 1))
    assert not beyond.excused and "beyond rounding" in beyond.note
    assert not within_rounding(smooth, batch, {"Other"}, expected, Difference(0.0, 0.0, 1)).excused
    step = Thresholded()
    judged = within_rounding(step, batch, {"Attend"}, forward(step, batch), Difference(0.0, 0.0, 1))
    assert not judged.excused and "not in proportion" in judged.note


def test_a_pooled_output_is_not_compared_where_left_padding_puts_padding_first() -> None:
    """BERT's pooler reads the first token, which left padding makes a pad: only there is it left out."""
    import torch

    from sdpa_port.verify.checks import Batch, max_difference

    keep = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    states = torch.zeros(2, 4, 3)
    pooled = torch.zeros(2, 3)
    shifted = {"last_hidden_state": states, "pooler_output": pooled + 1.0}
    plain = {"last_hidden_state": states, "pooler_output": pooled}
    assert max_difference(plain, shifted, Batch({}, keep)) == 0.0
    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert max_difference(plain, shifted, Batch({}, right)) == 1.0
    moved = {"last_hidden_state": states + torch.tensor([0.0, 0.0, 0.0, 2.0])[None, :, None], "pooler_output": pooled}
    assert max_difference(plain, moved, Batch({}, keep)) == 2.0  # the positions are still compared


def test_infinities_by_design_compare_equal_where_both_sides_hold_them() -> None:
    """Masked logits (`masked_fill(~mask, -inf)`) are infinite in eager and SDPA alike; elsewhere they count."""
    import math

    import torch

    from sdpa_port.verify.outputs import difference, infinite_entries, same_entries

    keep = torch.ones(2, 3, dtype=torch.bool)
    logits = torch.tensor([[[0.5, -math.inf], [1.0, 2.0], [0.0, -math.inf]]] * 2)
    assert difference({"logits": logits}, {"logits": logits.clone()}, keep).absolute == 0.0
    moved = logits.clone()
    moved[0, 1, 0] = 1.5
    assert difference({"logits": logits}, {"logits": moved}, keep).absolute == 0.5
    unmasked = logits.clone()
    unmasked[0, 0, 1] = 0.0
    assert math.isinf(difference({"logits": logits}, {"logits": unmasked}, keep).absolute)
    assert same_entries(infinite_entries({"logits": logits}), infinite_entries({"logits": logits * 2}))
    assert not same_entries(infinite_entries({"logits": logits}), infinite_entries({"logits": unmasked}))
    assert infinite_entries({"logits": torch.tensor([math.nan])}) is None


def test_a_pooled_output_alone_is_still_compared() -> None:
    """A classifier's logits are all there is: compared even in a left-padded batch."""
    import torch

    from sdpa_port.verify.checks import Batch, max_difference

    keep = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    assert max_difference({"logits": torch.zeros(2, 3)}, {"logits": torch.ones(2, 3)}, Batch({}, keep)) == 1.0


def shifted_in_bf16() -> contextlib.AbstractContextManager[None]:
    """SDPA with its output shifted by a fifth of a unit, for bf16 operands alone: float32 stays exact."""
    import torch

    def make(original):  # type: ignore[no-untyped-def]
        def shifted(query, key, value, **options):  # type: ignore[no-untyped-def]
            out = original(query, key, value, **options)
            return out + 0.2 if out.dtype == torch.bfloat16 else out

        return shifted

    return patched_sdpa(make)


def test_verify_checks_bf16_and_fails_a_port_wrong_only_in_bf16(tmp_path: Path) -> None:
    """`--verify` runs the bf16 rule on the base model: a correct XGLM port passes it, one whose SDPA is off in bf16
    alone fails it while every float32 check passes."""
    from harness import original
    from sdpa_port.verify.auto import pick_targets
    from sdpa_port.verify.configs import tiny_config
    from sdpa_port.verify.parity import check_bf16, check_forward

    module = load("xglm", port_file("xglm"), tmp_path)
    targets = pick_targets(original("xglm"))
    assert targets is not None
    config = tiny_config(targets.config_class)
    ported_class = getattr(module, targets.base.__name__)
    [passed] = check_bf16(targets.base, ported_class, config, "left", kind="decoder")
    assert passed.passed and not passed.skipped, str(passed)
    with shifted_in_bf16():
        assert all(c.passed for c in check_forward(targets.base, ported_class, config, "left", kind="decoder"))
        [failed] = check_bf16(targets.base, ported_class, config, "left", kind="decoder")
    assert not failed.passed, str(failed)


@pytest.mark.parametrize(
    "model,base", [("gpt_neox", "GPTNeoXModel"), ("gpt_neox_japanese", "GPTNeoXJapaneseModel")]
)
def test_operands_wider_than_the_value_reach_sdpa_in_the_values_dtype(model: str, base: str, tmp_path: Path) -> None:
    """GPT-NeoX's float32 rotary tables make query and key float32 beside a bf16 value; eager casts the probabilities
    to the value's dtype. The port hands SDPA query and key in the value's dtype (its causal fill then built at that
    dtype's own minimum): the bf16 check passes, where the port raised before, as the same port without the casts
    still does."""
    from harness import original

    from sdpa_port.verify import parity
    from sdpa_port.verify.configs import tiny_config

    source = port_file(model)
    assert "sdpa_query = query.to(value.dtype)" in source
    module = load(model, source, tmp_path)
    config = tiny_config(getattr(module, base).config_class)
    reference = getattr(original(model), base)
    (check,) = parity.check_bf16(reference, getattr(module, base), config, "left", kind="decoder")
    assert check.passed, check
    uncast = source.replace("query.to(value.dtype)", "query").replace("key.to(value.dtype)", "key")
    module = load(model, uncast, tmp_path, tag="uncast")
    (check,) = parity.check_bf16(reference, getattr(module, base), config, "left", kind="decoder")
    assert not check.passed and "raised RuntimeError" in check.detail, check
