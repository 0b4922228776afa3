"""Terms of a caller's dtype added to float32 scores (`fixtures/inline_style/modeling_tiny_term_dtype.py`): the
inline port agrees with eager for a bool, an int64 and a float16 term, where eager's addition promotes them and SDPA
would read a bool mask as keep or drop and raise on the others; and for a term that is a Python number where no mask
is given, which SDPA takes as no mask at all."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sdpa_port import Status, port_source

pytestmark = pytest.mark.tf440

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "inline_style" / "modeling_tiny_term_dtype.py"


def _load(path: Path, name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _terms(torch, batch: int, n: int):  # type: ignore[no-untyped-def]
    """(name, 4-D term, key term) for each dtype: the bool and integer ones adding 0 and 1 or small integers."""
    generator = torch.Generator().manual_seed(0)
    keys = torch.rand(batch, n, generator=generator) > 0.5
    full = torch.rand(batch, 1, n, n, generator=generator) > 0.5
    return [
        ("bool", full, keys),
        ("int64", (full.long() * 3 - 1), keys.long() * -2),
        ("float16", torch.randn(batch, 1, n, n, generator=generator).half(), torch.randn(batch, n).half()),
    ]


@pytest.mark.parametrize("dtype", ["bool", "int64", "float16"])
def test_port_agrees_with_eager_for_a_caller_term(tmp_path: Path, dtype: str) -> None:
    import torch

    result = port_source(FIXTURE.read_text(encoding="utf-8"), filename=FIXTURE.name, style="inline")
    assert result.status is Status.PORTED
    ported_path = tmp_path / "ported_term_dtype.py"
    ported_path.write_text(result.source, encoding="utf-8")
    original, ported = _load(FIXTURE, "original_term_dtype"), _load(ported_path, "ported_term_dtype")
    batch, n, dim = 2, 5, 32
    x = torch.randn(batch, n, dim, generator=torch.Generator().manual_seed(1))
    term = next(full for name, full, keys in _terms(torch, batch, n) if name == dtype)
    for class_name, argument in (
        ("OptionalTermAttention", term),
        ("CastTermAttention", term),
        ("NumberOrTermAttention", term),
    ):
        torch.manual_seed(2)
        eager = getattr(original, class_name)().eval()
        sdpa = getattr(ported, class_name)().eval()
        sdpa.load_state_dict(eager.state_dict())
        with torch.no_grad():
            expected = eager(x, argument)
            got = sdpa(x, argument)
        assert expected.dtype == got.dtype == torch.float32
        assert torch.allclose(expected, got, atol=1e-5, rtol=1e-4), (class_name, dtype)
    for class_name in ("OptionalTermAttention", "NumberOrTermAttention"):  # an optional term left out
        torch.manual_seed(2)
        eager = getattr(original, class_name)().eval()
        sdpa = getattr(ported, class_name)().eval()
        sdpa.load_state_dict(eager.state_dict())
        with torch.no_grad():
            assert torch.allclose(eager(x), sdpa(x), atol=1e-5, rtol=1e-4), class_name
