"""The flags a verified port gets from its claim checks: each set on the classes it ran for, or a warning why not."""

from __future__ import annotations

from pathlib import Path

from sdpa_port.edge.runner import claim_flags
from sdpa_port.result import PortResult, Status, Style

PORT = '''class FooPreTrainedModel(PreTrainedModel):
    """Doc."""

    _supports_sdpa = True


class FooModel(FooPreTrainedModel):
    pass
'''
FLEX = "_supports_flex_attn"
COMPILE = "_can_compile_fullgraph"


def _port(source: str = PORT) -> PortResult:
    return PortResult(Status.PORTED, source, Style.INTERFACE)


def test_each_flag_that_matched_is_set_after_the_other_flags_and_noted() -> None:
    claimed = ((FLEX, ("FooPreTrainedModel",)), (COMPILE, ("FooPreTrainedModel",)))
    result, carried = claim_flags(_port(), None, claimed, ())
    assert "    _supports_sdpa = True\n    _supports_flex_attn = True\n    _can_compile_fullgraph = True\n" in result.source
    assert result.source.count(FLEX) == 1
    assert result.notes == (
        "FooPreTrainedModel._supports_flex_attn = True (flex attention ran and matched eager)",
        "FooPreTrainedModel._can_compile_fullgraph = True (torch.compile(fullgraph=True) ran and matched eager)",
    )
    assert carried is None and result.warnings == ()


def test_a_flag_that_did_not_match_is_not_set_and_the_port_says_why() -> None:
    why = "FooModel[left] flex_attention == eager: FAILED max|diff|=0.3"
    result, _ = claim_flags(_port(), None, ((COMPILE, ("FooPreTrainedModel",)),), ((FLEX, why),))
    assert FLEX not in result.source and COMPILE in result.source
    assert result.warnings == (f"_supports_flex_attn not claimed: {why}",)


def test_nothing_checked_nothing_said() -> None:
    """Class-style ports and runs without the claim checks: no flag, no warning."""
    assert claim_flags(_port(), None, (), ()) == (_port(), None)


def test_a_modular_file_gets_the_flag_too_or_neither_does(tmp_path: Path) -> None:
    modular = tmp_path / "modular_foo.py"
    claimed = ((FLEX, ("FooPreTrainedModel",)),)
    result, after = claim_flags(_port(), (modular, "old", PORT), claimed, ())
    assert after is not None and FLEX in after[2] and FLEX in result.source
    # the class is not defined in the modular file (it is inherited there): no claim on either side
    elsewhere = (modular, "old", "class FooModel(LlamaModel):\n    pass\n")
    result, after = claim_flags(_port(), elsewhere, claimed, ())
    assert FLEX not in result.source and after == elsewhere
    assert "not all defined in the modular file" in result.warnings[0]
