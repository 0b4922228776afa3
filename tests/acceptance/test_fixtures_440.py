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
