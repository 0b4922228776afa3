"""Which driven models decide the claim flags: the batch they run on, and why none do where they cannot."""

from __future__ import annotations

from sdpa_port.verify.claim_scope import claim_padding, why_not_claimable


def test_the_claim_batch_is_padded_as_the_sdpa_check_was() -> None:
    assert claim_padding("attention_mask", "left") == "left"
    assert claim_padding("attention_mask", "right") == "right"
    assert claim_padding(None, "right") == "none"  # a forward without a mask: the unpadded batch


def test_driven_models_covering_every_attention_class_decide() -> None:
    assert why_not_claimable(["GitModel[text+image]"], []) is None


def test_no_driven_model_says_so_not_the_token_ids_line() -> None:
    why = why_not_claimable([], ["FooAttention"])
    assert why is not None and "no model of the file could be driven" in why and "token ids" not in why


def test_attention_classes_checked_only_alone_withhold_both_flags_by_name() -> None:
    why = why_not_claimable(["FooModel[image]"], ["BarAttention", "BazAttention"])
    assert why is not None and why.startswith("BarAttention, BazAttention built by no driven model")
    assert "them" in why
    one = why_not_claimable(["FooModel[image]"], ["BarAttention"])
    assert one is not None and "runs it " in one
