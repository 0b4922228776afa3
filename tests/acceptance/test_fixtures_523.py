"""The golden interface-style ports of the transformers 5 fixtures run inside transformers 5.23.0 with parity to the
fixtures themselves, and the check sees each port broken: its scale halved, its additive term or its mask withheld
from the implementations."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import sabotage_interface

pytestmark = pytest.mark.tf523

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PACKAGE = "transformers.models.gpt2"  # any package two levels below transformers resolves `...` imports
CASES = {
    # causal masks from create_causal_mask, ALiBi added to scaled scores, weights returned on every call
    "modeling_tiny_alibi.py": ("TinyAlibiModel", "decoder"),
    # bidirectional masks, einsum in a helper, the query scaled first, a relative bias the model hands every layer
    "modeling_tiny_relative.py": ("TinyRelativeModel", "encoder"),
    # states length first: einsum operands permuted for SDPA, a biased query, a subtracted distance penalty
    "modeling_tiny_lengthfirst.py": ("TinyLengthFirstModel", "encoder"),
    # two streams sharing one score matrix, the second stream's weights returned: one dispatch per stream's values
    "modeling_tiny_streams5.py": ("TinyStreams5Model", "encoder"),
    # four score blocks joined by torch.cat, or one product where the config builds no blocks: the operands each
    # branch builds are dispatched, the eager function computes both branches as written
    "modeling_tiny_blocks5.py": ("TinyBlocks5Model", "encoder"),
    # batch and heads flattened for bmm, sizes checked, a scale computed in forward, weights reshaped on request: the
    # eager function takes the standard signature and computes what it reads (`plan/eager_values.py`)
    "modeling_tiny_flat5.py": ("TinyFlat5Model", "decoder"),
}


def _checks(name: str, ported_source: str | None, padding: str, directory: Path | None = None, **overrides):  # type: ignore[no-untyped-def]
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_in_package, load_source_in_package

    model, kind = CASES[name]
    original = load_in_package(FIXTURES / "interface_style" / name, PACKAGE, alias=f"fixture5_{Path(name).stem}")
    if ported_source is None:
        ported = load_in_package(FIXTURES / "golden" / name, PACKAGE, alias=f"golden5_{Path(name).stem}")
    else:
        assert directory is not None
        ported = load_source_in_package(ported_source, PACKAGE, directory, f"{Path(name).stem}_broken")
    config = getattr(original, model).config_class(**overrides)
    side = ("left" if kind == "decoder" else "right") if padding == "padded" else "none"
    return parity.check_forward(getattr(original, model), getattr(ported, model), config, side, kind=kind)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("padding", ["padded", "none"])
def test_golden_fixture_parity(name: str, padding: str) -> None:
    checks = _checks(name, None, padding)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


# fixtures whose dispatch hands over no additive term (`position_bias`) to withhold
NO_TERM = {"modeling_tiny_blocks5.py", "modeling_tiny_flat5.py"}


@pytest.mark.parametrize(
    "name,kind",
    [(name, kind) for name in CASES for kind in ("scale", "mask", "attn_mask") if kind != "mask" or name not in NO_TERM],
)
def test_golden_fixture_sabotage_is_seen(name: str, kind: str, tmp_path: Path) -> None:
    broken = sabotage_interface((FIXTURES / "golden" / name).read_text(encoding="utf-8"), kind)
    checks = _checks(name, broken, "padded", tmp_path)
    failed = [c for c in checks if c.name.endswith("sdpa == eager") and not c.passed]
    assert failed, "the sabotage went unnoticed:\n" + "\n".join(str(c) for c in checks)


def test_the_blocks_fixture_without_blocks_dispatches_the_other_branch() -> None:
    """`block_queries=False`: the plain product's branch, whose eager product reads the query and key handed over."""
    checks = _checks("modeling_tiny_blocks5.py", None, "padded", block_queries=False)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_weights_asked_for_come_from_the_eager_function_reading_the_flag_from_kwargs(implementation: str) -> None:
    """The flat fixture's eager function reads `output_attentions` from `**kwargs` (it reshapes the weights only when
    they are asked for): asked for, every implementation setting returns the fixture's own weights."""
    import torch

    from sdpa_port.verify.loader import load_in_package

    name = "modeling_tiny_flat5.py"
    golden = (FIXTURES / "golden" / name).read_text(encoding="utf-8")
    assert 'output_attentions = kwargs.get("output_attentions", False)' in golden
    original = load_in_package(FIXTURES / "interface_style" / name, PACKAGE, alias="fixture5_flat5_weights")
    ported = load_in_package(FIXTURES / "golden" / name, PACKAGE, alias="golden5_flat5_weights")
    torch.manual_seed(0)
    expected_model = original.TinyFlat5Model(original.TinyFlat5Config(attn_implementation="eager")).eval()
    model = ported.TinyFlat5Model(ported.TinyFlat5Config(attn_implementation=implementation)).eval()
    model.load_state_dict(expected_model.state_dict())
    ids = torch.randint(1, 99, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :2] = 0
    with torch.no_grad():
        expected = expected_model(ids, attention_mask=mask, output_attentions=True).attentions
        got = model(ids, attention_mask=mask, output_attentions=True).attentions
    assert len(got) == len(expected) and all(g is not None for g in got)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
