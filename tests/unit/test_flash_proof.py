"""The static half of `_supports_flash_attn` (`plan/flash_proof.py`): a port may ask for flash attention only where
the release offers it and each attention it dispatches is a plain masked attention, its mask as transformers'
builders made it and its causality `is_causal`'s. The run half (`verify/flash_claim.py`) needs torch: see
tests/acceptance/test_flash_523.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdpa_port import Status, port_source
from sdpa_port.discover.release import INIT, MODELING_UTILS, release_facts
from sdpa_port.edge.after_port import with_flash_proof
from sdpa_port.plan.flash_proof import FLASH_FLAG
from sdpa_port.result import PortResult, Style

from helpers import POSITION_BIAS
from test_release import RELATIVE
from test_serving_passes import MODEL

FLASH = replace(POSITION_BIAS, offers_flash=True)

INTERFACE = '''
class AttentionInterface(GeneralInterface):
    _global_mapping = {
        "flash_attention_2": flash_attention_forward,
        "flex_attention": flex_attention_forward,
        "sdpa": sdpa_attention_forward,
    }
'''


def _no_flash(source: str, release: object = FLASH) -> str:
    result = port_source(source, style="interface", release=release)  # type: ignore[arg-type]
    assert result.status is Status.PORTED, result.reasons
    assert result.no_flash is not None
    return result.no_flash


def test_the_release_offers_flash_where_its_attention_interface_maps_it() -> None:
    assert release_facts({INIT: '__version__ = "5.23.0"', MODELING_UTILS: INTERFACE}).offers_flash
    without = INTERFACE.replace('"flash_attention_2": flash_attention_forward,', "")
    assert not release_facts({INIT: '__version__ = "5.23.0"', MODELING_UTILS: without}).offers_flash
    assert not release_facts({INIT: '__version__ = "5.23.0"'}).offers_flash


def test_a_plain_masked_attention_is_proven() -> None:
    """Its mask straight from `create_causal_mask`, every layer handing its kwargs over, no term beside."""
    assert _no_flash(MODEL) == ""


@pytest.mark.parametrize(
    ("release", "why"),
    [(POSITION_BIAS, "offers no flash_attention_2"), (None, "the target release is unknown")],
    ids=["without-flash", "unknown"],
)
def test_not_where_the_release_offers_no_flash(release: object, why: str) -> None:
    assert why in _no_flash(MODEL, release)


def test_not_with_additive_terms_flash_would_drop() -> None:
    why = _no_flash(RELATIVE)
    assert "`position_bias`" in why and "by keyword, which flash attention drops" in why


def test_not_where_the_mask_builder_takes_a_mask_function() -> None:
    source = MODEL.replace(
        "past_key_values=past_key_values,\n        )",
        "past_key_values=past_key_values,\n            or_mask_function=None,\n        )",
    )
    assert "or_mask_function=None" in source
    assert "take a mask function" in _no_flash(source)


def test_not_where_the_mask_comes_from_a_builder_whose_window_flash_would_not_see() -> None:
    source = MODEL.replace("create_causal_mask", "create_sliding_window_causal_mask")
    assert "cannot be followed past `create_sliding_window_causal_mask(...)`" in _no_flash(source)


def test_not_where_the_model_changes_the_mask_before_handing_it_on() -> None:
    source = MODEL.replace(
        "        hidden_states = inputs_embeds\n",
        "        mask = mask[:, :, -1:]\n        hidden_states = inputs_embeds\n",
    )
    assert "mask = mask[" in source
    assert "cannot be followed past `mask[:, :, -1:]`" in _no_flash(source)


def test_a_run_that_matched_is_no_proof() -> None:
    """The edge sets the flag only where both hold: the run's verdict, and the proof."""
    proven = PortResult(Status.PORTED, "", Style.INTERFACE, no_flash="")
    unproven = replace(proven, no_flash="additive terms go as `position_bias`")
    assert with_flash_proof({FLASH_FLAG: ""}, proven) == {FLASH_FLAG: ""}
    withheld = with_flash_proof({FLASH_FLAG: "", "_supports_flex_attn": ""}, unproven)
    assert withheld["_supports_flex_attn"] == ""
    assert withheld[FLASH_FLAG].startswith("not a plain masked attention: additive terms go as `position_bias`")
    assert "matched eager" in withheld[FLASH_FLAG]
    assert with_flash_proof({FLASH_FLAG: ""}, replace(proven, no_flash=None))[FLASH_FLAG]
