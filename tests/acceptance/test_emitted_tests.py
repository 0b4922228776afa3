"""The emitted parity tests pass on a correct port and fail on sabotaged ones, in the matching environment."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import modeling_path, port_file, record, sabotage, sabotage_interface

SABOTAGES = ["output", "mask", "scale"]


def emit(model: str, directory: Path, source: str) -> Path:
    from sdpa_port import __version__
    from sdpa_port.emit.parity_test import render_parity_test

    written = directory / f"modeling_{model}.py"
    written.write_text(source, encoding="utf-8")
    style = "interface" if "ALL_ATTENTION_FUNCTIONS.get_interface" in source else "class"
    emitted = render_parity_test(source, modeling_path(model), written, directory, style, __version__)
    assert emitted is not None
    emitted.path.write_text(emitted.source, encoding="utf-8")
    return emitted.path


def run_pytest(test: Path, *extra: str) -> tuple[int, str, float]:
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(test), *extra],
        capture_output=True,
        text=True,
        cwd=test.parent,
        timeout=1800,
        check=False,
    )
    return completed.returncode, completed.stdout[-3000:], time.perf_counter() - started


def _break(model: str, source: str, kind: str) -> str:
    if "ALL_ATTENTION_FUNCTIONS.get_interface" in source:
        return sabotage_interface(source, {"mask": "attn_mask"}.get(kind, kind))
    return sabotage(source, kind)


def _check(model: str, tmp_path: Path) -> None:
    source = port_file(model)
    test = emit(model, tmp_path, source)
    code, output, seconds = run_pytest(test)
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    record("emitted", f"{model}: {summary}", round(seconds, 1))
    assert code == 0, output
    for kind in SABOTAGES:
        (tmp_path / f"modeling_{model}.py").write_text(_break(model, source, kind), encoding="utf-8")
        code, output, _ = run_pytest(test, "-x")
        record("emitted-sabotage", f"{model}:{kind}", output.strip().splitlines()[-1] if output.strip() else "")
        assert code == 1, f"sabotage {kind} went unnoticed by the emitted tests:\n{output}"


@pytest.mark.tf440
@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_emitted_tests_class_style(model: str, tmp_path: Path) -> None:
    _check(model, tmp_path)


@pytest.mark.tf523
@pytest.mark.parametrize("model", ["xglm", "gptj"])
def test_emitted_tests_interface_style(model: str, tmp_path: Path) -> None:
    _check(model, tmp_path)
