"""`sdpa-port bench` end to end inside transformers 4.40.2, on tiny models and lengths (a smoke test, not a benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sdpa_port.bench.cli import bench_app

pytestmark = pytest.mark.tf440

TINY = ["--hidden", "32", "--ffn", "64", "--layers", "1", "--heads", "2", "--runs", "1", "--warmup", "0", "--threads", "1"]
runner = CliRunner()


def bench(*args: str) -> dict:
    out = Path(args[args.index("--out") + 1])
    result = runner.invoke(bench_app, [*args, *TINY, "--no-plot", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    (written,) = out.glob("bench_*.json")
    return json.loads(written.read_text())


def test_encoder_is_ported_in_memory_and_measured(tmp_path: Path) -> None:
    data = bench("bert", "--lengths", "16,24", "--out", str(tmp_path))
    assert data["target"]["ported_by_bench"] and data["target"]["model_class"] == "BertModel"
    assert data["target"]["kind"] == "encoder"
    assert (tmp_path / "modeling_bert_sdpa_port.py").exists()
    assert [(r["phase"], r["length"]) for r in data["rows"]] == [("forward", 16), ("forward", 24)]
    for row in data["rows"]:
        assert row["eager_s"] > 0 and row["sdpa_s"] > 0
        assert row["eager_peak_bytes"] >= 0 and row["sdpa_peak_bytes"] >= 0
    assert data["checks"]["cpu"]["max_abs_diff"] < 1e-4


def test_decoder_gets_prefill_and_decode_with_padding(tmp_path: Path) -> None:
    data = bench("gpt2", "--lengths", "16", "--out", str(tmp_path), "--batch", "2", "--padding", "auto", "--no-memory", "--decode-tokens", "2")
    assert data["target"]["kind"] == "decoder"
    assert sorted(r["phase"] for r in data["rows"]) == ["decode", "forward", "prefill"]
    assert all(r["sdpa_peak_bytes"] is None for r in data["rows"])
    assert data["settings"]["padding"] == "auto" and data["checks"]["cpu"]["max_abs_diff"] < 1e-4


def test_seq2seq_decodes_against_encoder_outputs(tmp_path: Path) -> None:
    data = bench("mbart", "--lengths", "12", "--out", str(tmp_path), "--no-memory", "--decode-tokens", "2")
    assert data["target"]["kind"] == "seq2seq"
    assert sorted(r["phase"] for r in data["rows"]) == ["decode", "forward", "prefill"]


def test_an_already_ported_file_is_measured_as_it_is(tmp_path: Path) -> None:
    from harness import port_file

    ported = tmp_path / "modeling_distilbert_sdpa.py"
    ported.write_text(port_file("distilbert"), encoding="utf-8")
    data = bench(str(ported), "--lengths", "16", "--out", str(tmp_path / "out"), "--no-memory")
    assert not data["target"]["ported_by_bench"] and data["target"]["detail"] == "already supports SDPA"
    assert data["target"]["package"] == "transformers.models.distilbert"


def test_plot_is_written_or_explained(tmp_path: Path) -> None:
    result = runner.invoke(bench_app, ["bert", "--lengths", "16", "--out", str(tmp_path), "--no-memory", *TINY, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in result.output
    else:
        assert list(tmp_path.glob("bench_*.png"))


def test_unknown_target_is_one_line_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(bench_app, ["no_such_model_xyz", "--out", str(tmp_path), "--device", "cpu"])
    assert result.exit_code == 2
    assert "no such file or model name" in result.output
