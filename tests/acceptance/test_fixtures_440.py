"""The golden ports of the fixtures run, inside transformers 4.40.2, with parity to the fixtures themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.tf440

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = [
    ("modeling_tiny_decoder.py", "TinyDecoderModel", "decoder", {}),
    ("modeling_tiny_decoder.py", "TinyDecoderModel", "decoder", {"scale_by_layer": True}),
    ("modeling_tiny_encoder.py", "TinyEncoderModel", "encoder", {}),
    ("modeling_tiny_windows.py", "TinyWindowsModel", "encoder", {}),  # a per-window mask on regrouped scores
    ("modeling_tiny_zeroed.py", "TinyZeroedModel", "encoder", {}),  # probabilities zeroed after the softmax
    # a key divided by a number a file function returns; a relative term on flat scores, under a None check
    ("modeling_tiny_disentangled.py", "TinyDisentangledModel", "encoder", {}),
    # ... which is the number 0 when no term kind is configured
    ("modeling_tiny_disentangled.py", "TinyDisentangledModel", "encoder", {"term_kinds": ()}),
    ("modeling_tiny_disentangled.py", "TinyDisentangledModel", "encoder", {"relative_attention": False}),
    # two streams sharing one score matrix: one SDPA call per stream's values
    ("modeling_tiny_streams.py", "TinyStreamsModel", "encoder", {}),
]


@pytest.mark.parametrize("name,model,kind,overrides", CASES)
@pytest.mark.parametrize("padding", ["padded", "none"])
def test_golden_fixture_parity(name: str, model: str, kind: str, overrides: dict, padding: str) -> None:
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_in_package

    package = "transformers.models.gpt2"  # any package two levels below transformers resolves `...` imports
    original = load_in_package(FIXTURES / "class_style" / name, package, alias=f"fixture_{Path(name).stem}")
    ported = load_in_package(FIXTURES / "golden" / name, package, alias=f"golden_{Path(name).stem}")
    config = getattr(original, model).config_class(**overrides)
    side = ("left" if kind == "decoder" else "right") if padding == "padded" else "none"
    checks = parity.check_forward(getattr(original, model), getattr(ported, model), config, side, kind=kind)
    failed = [str(c) for c in checks if not c.passed]
    assert not failed, "\n".join(failed)


def test_a_configured_talking_heads_projection_falls_back_to_eager() -> None:
    """With the projections built the SDPA class runs the eager computation: equal outputs, no SDPA call."""
    from sdpa_port.verify import parity
    from sdpa_port.verify.loader import load_in_package

    name = "modeling_tiny_disentangled.py"
    package = "transformers.models.gpt2"
    original = load_in_package(FIXTURES / "class_style" / name, package, alias="fixture_talking")
    ported = load_in_package(FIXTURES / "golden" / name, package, alias="golden_talking")
    config = original.TinyDisentangledConfig(talking_head=True)
    checks = {c.name.split(" ", 1)[1]: c for c in parity.check_forward(
        original.TinyDisentangledModel, ported.TinyDisentangledModel, config, "right", kind="encoder"
    )}
    assert checks["eager unchanged"].passed and checks["sdpa == eager"].passed, checks
    assert not checks["sdpa executed"].passed, checks["sdpa executed"]
