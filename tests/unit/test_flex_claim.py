"""The flex attention claim a verified port gets: the flag on the classes flex ran for, or a warning why not."""

from __future__ import annotations

from pathlib import Path

from sdpa_port.edge.runner import claim_flex
from sdpa_port.result import PortResult, Status, Style

PORT = '''class FooPreTrainedModel(PreTrainedModel):
    """Doc."""

    _supports_sdpa = True


class FooModel(FooPreTrainedModel):
    pass
'''


def _port(source: str = PORT) -> PortResult:
    return PortResult(Status.PORTED, source, Style.INTERFACE)


def test_the_classes_flex_ran_for_get_the_flag_after_their_other_flags() -> None:
    result, carried = claim_flex(_port(), None, ("FooPreTrainedModel",), "")
    assert "    _supports_sdpa = True\n    _supports_flex_attn = True\n" in result.source
    assert result.source.count("_supports_flex_attn") == 1
    assert result.notes == ("FooPreTrainedModel._supports_flex_attn = True (flex attention ran and matched eager)",)
    assert carried is None and result.warnings == ()


def test_without_classes_the_port_is_unchanged_and_says_why() -> None:
    result, _ = claim_flex(_port(), None, (), "FooModel[left] flex_attention == eager: FAILED max|diff|=0.3")
    assert result.source == PORT
    assert result.warnings == (
        "flex attention not claimed (_supports_flex_attn is not set): FooModel[left] flex_attention == eager: FAILED "
        "max|diff|=0.3",
    )


def test_nothing_checked_nothing_said() -> None:
    """Class-style ports and runs without the flex check: no flag, no warning."""
    assert claim_flex(_port(), None, (), "") == (_port(), None)


def test_a_modular_file_gets_the_flag_too_or_neither_does(tmp_path: Path) -> None:
    modular = tmp_path / "modular_foo.py"
    carried = (modular, "old", PORT)
    result, after = claim_flex(_port(), carried, ("FooPreTrainedModel",), "")
    assert after is not None and "_supports_flex_attn = True" in after[2] and "_supports_flex_attn" in result.source
    # the class is not defined in the modular file (it is inherited there): no claim on either side
    elsewhere = (modular, "old", "class FooModel(LlamaModel):\n    pass\n")
    result, after = claim_flex(_port(), elsewhere, ("FooPreTrainedModel",), "")
    assert "_supports_flex_attn" not in result.source and after == elsewhere
    assert "not all defined in the modular file" in result.warnings[0]
