"""The benchmark's pure parts: CLI help without torch, options, config synthesis, targets, tables, JSON, ratios."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import typer
from typer.testing import CliRunner

from sdpa_port.bench import report
from sdpa_port.bench.cli import bench_app
from sdpa_port.bench.config import bench_config_kwargs, role_of
from sdpa_port.bench.options import parse_lengths, parse_phases
from sdpa_port.bench.run import phases_of
from sdpa_port.bench.spec import BenchResult, Kind, ModelRef, Phase, Row, Settings, Size
from sdpa_port.bench.target import TargetError, guess_package, prepare

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
runner = CliRunner()


def test_help_lists_the_options() -> None:
    result = runner.invoke(bench_app, ["--help"])
    assert result.exit_code == 0, result.output
    for option in ("--lengths", "--runs", "--threads", "--out", "--device", "--padding", "--phases", "--no-memory"):
        assert option in result.output


def test_main_cli_and_bench_help_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from sdpa_port.cli import main\n"
        "try:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported at start-up'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "sdpa-port bench" in done.stdout


def test_lengths_and_phases_parse() -> None:
    assert parse_lengths("4096, 512,1024,512") == (512, 1024, 4096)
    with pytest.raises(typer.BadParameter):
        parse_lengths("512,x")
    with pytest.raises(typer.BadParameter):
        parse_lengths("1")
    assert parse_phases("forward,decode") == ("forward", "decode")
    with pytest.raises(typer.BadParameter):
        parse_phases("backward")


def test_phases_follow_the_kind() -> None:
    assert phases_of(Kind.ENCODER) == (Phase.FORWARD,)
    assert phases_of(Kind.DECODER) == (Phase.FORWARD, Phase.PREFILL, Phase.DECODE)
    assert phases_of(Kind.SEQ2SEQ, ("forward", "decode")) == (Phase.FORWARD, Phase.DECODE)


class _Config:
    def __init__(self, values: dict) -> None:
        self.values = values

    def to_dict(self) -> dict:
        return dict(self.values)


def test_config_sizes_come_from_attribute_names() -> None:
    default = _Config(
        {
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "n_inner": None,
            "n_positions": 1024,
            "vocab_size": 50257,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
            "scale_attn_weights": True,
            "layer_norm_epsilon": 1e-5,
        }
    )
    kwargs = bench_config_kwargs(default, Size(hidden=256, layers=4, heads=4, ffn=1024, vocab=1000), longest=4096)
    assert kwargs["n_embd"] == 256 and kwargs["n_layer"] == 4 and kwargs["n_head"] == 4
    assert kwargs["n_positions"] >= 4096 + 2 and kwargs["vocab_size"] == 1000
    assert "n_inner" not in kwargs  # derived from the hidden size by the config itself
    assert kwargs["bos_token_id"] < 1000 and kwargs["eos_token_id"] < 1000
    assert "scale_attn_weights" not in kwargs and "layer_norm_epsilon" not in kwargs
    assert role_of("encoder_ffn_dim") == "ffn" and role_of("decoder_attention_heads") == "heads"
    assert role_of("initializer_range") is None


def test_package_guessed_from_a_loose_file_name(tmp_path: Path) -> None:
    root = tmp_path / "transformers"
    (root / "models" / "bert").mkdir(parents=True)
    (root / "models" / "bert" / "__init__.py").write_text("")
    (root / "models" / "gpt_neox").mkdir(parents=True)
    (root / "models" / "gpt_neox" / "__init__.py").write_text("")
    assert guess_package(tmp_path / "modeling_bert_sdpa.py", root) == "transformers.models.bert"
    assert guess_package(tmp_path / "modeling_gpt_neox_port.py", root) == "transformers.models.gpt_neox"
    assert guess_package(root / "models" / "bert" / "modeling_bert.py", root) == "transformers.models.bert"
    assert guess_package(tmp_path / "x.py", root, explicit="transformers.models.opt") == "transformers.models.opt"
    with pytest.raises(TargetError):
        guess_package(tmp_path / "modeling_nosuchmodel.py", root)


def test_prepare_ports_an_unported_file_and_keeps_a_ported_one(tmp_path: Path) -> None:
    package = "transformers.models.gpt2"
    first = prepare(str(FIXTURES / "class_style" / "modeling_tiny_decoder.py"), tmp_path / "a", package)
    assert first.ported_here and first.path is not None and first.path.exists()
    assert "_supports_sdpa = True" in first.path.read_text()
    second = prepare(str(first.path), tmp_path / "b", package)
    assert not second.ported_here and second.path == first.path and second.detail == "already supports SDPA"
    with pytest.raises(TargetError):
        prepare(str(tmp_path / "missing.py"), tmp_path / "c", package)


def _result(padding: str = "none", eager_peak: int = 400 << 20, sdpa_peak: int = 40 << 20, version: str = "4.40.2") -> BenchResult:
    rows = (
        Row("cpu", Phase.FORWARD, 1024, 1.0, 0.5, eager_peak // 4, sdpa_peak // 4),
        Row("cpu", Phase.FORWARD, 4096, 8.0, 2.0, eager_peak, sdpa_peak),
        Row("cpu", Phase.DECODE, 1024, 0.002, 0.001),
    )
    ref = ModelRef(None, "/tmp/modeling_x_sdpa_port.py", "transformers.models.x", "XModel", {"hidden_size": 256}, Kind.DECODER)
    target = {"source": "/site/transformers/models/x/modeling_x.py", "model_class": "XModel", "kind": "decoder", "detail": "ported"}
    environment = {"torch": "2.13.0", "transformers": version, "threads": 1}
    settings = Settings(lengths=(1024, 4096), padding=padding, batch=1 if padding == "none" else 2)
    return BenchResult(target, environment, settings, ref, rows, {"cpu": {"length": 1024, "max_abs_diff": 1e-6}})


def test_result_round_trips_through_json(tmp_path: Path) -> None:
    result = _result()
    path = tmp_path / "r.json"
    report.write_json(result, path)
    again = report.read_json(path)
    assert again == result
    data = json.loads(path.read_text())
    assert data["rows"][1]["speedup"] == pytest.approx(4.0) and data["rows"][1]["memory_ratio"] == pytest.approx(0.1)


def test_table_has_one_line_per_row() -> None:
    text = report.table(_result())
    lines = text.splitlines()
    assert len(lines) == 4 and "speed-up" in lines[0]
    assert "4.00" in lines[2] and "0.10" in lines[2]  # forward at 4096 sorts after 1024
    assert report.table(_result(), markdown=True).count("\n") == 4
    assert report.stem_of(_result("auto")) == "bench_modeling_x_tf4.40.2_pad-auto"


def test_executorch_latency_round_trips_and_adds_columns(tmp_path: Path) -> None:
    from dataclasses import replace

    result = _result()
    rows = (result.rows[0], replace(result.rows[2], executorch_s=0.0005))
    with_executorch = replace(result, rows=rows, settings=replace(result.settings, executorch=True))
    path = tmp_path / "r.json"
    report.write_json(with_executorch, path)
    assert report.read_json(path) == with_executorch
    lines = report.table(with_executorch).splitlines()
    assert lines[0].split()[-2:] == ["executorch", "ms"] or "executorch ms" in lines[0]
    decode = next(line for line in lines if "decode" in line)
    assert decode.split()[-2:] == ["0.500", "2.00"]  # 0.5 ms, SDPA's 1 ms over it
    assert next(line for line in lines if "forward" in line).split()[-2:] == ["-", "-"]
    assert "executorch" not in report.table(result)


def _compare_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "scripts" / "bench_compare.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_ratios_and_goal() -> None:
    compare = _compare_module()
    same = compare.ratios(_result(), _result(version="4.47.1"))
    assert same["speedup_ratio"] == pytest.approx(1.0) and same["memory_ratio"] == pytest.approx(1.0)
    assert same["decode_speedup_ratio"] == pytest.approx(1.0) and same["meets_goal"]
    worse = compare.ratios(_result(sdpa_peak=80 << 20), _result(version="4.47.1"))
    assert worse["memory_ratio"] == pytest.approx(2.0) and not worse["meets_goal"]
    assert "missed" in compare.markdown({"x unpadded": worse})


def test_paired_speedup_is_the_median_of_per_run_ratios() -> None:
    from sdpa_port.bench.spec import Timing, paired_speedup

    eager = Timing(wall=(4.0, 9.0, 3.0), cpu=(2.0, 6.0, 3.0))
    sdpa = Timing(wall=(2.0, 3.0, 1.0), cpu=(1.0, 2.0, 1.0))
    assert eager.cpu_s == 2.0 and eager.wall_s == 3.0
    assert paired_speedup(eager, sdpa, "cpu") == 3.0  # ratios 2, 3, 3
    assert paired_speedup(eager, sdpa, "wall") == 3.0  # ratios 2, 3, 3
    assert paired_speedup(Timing((1.0, 4.0), (1.0, 4.0)), Timing((1.0, 1.0), (1.0, 1.0)), "cpu") == 2.5


def test_lockstep_summary_takes_the_median_of_per_round_ratios(tmp_path: Path) -> None:
    compare = _compare_module()
    samples = {
        "auto": {"eager": [4.0, 8.0, 4.0], "sdpa": [2.0, 4.0, 2.5]},  # speed-ups 2.0, 2.0, 1.6
        "hand": {"eager": [4.0, 8.0, 4.0], "sdpa": [2.0, 4.0, 2.0]},  # speed-ups 2.0, 2.0, 2.0
    }
    summary = compare.lockstep_summary(samples)
    assert summary["rounds"] == 3 and summary["speedup_ratio"] == pytest.approx(1.0)
    assert summary["speedup_ratio_min"] == pytest.approx(1.0) and summary["sdpa_time_ratio"] == pytest.approx(1.0)
    assert summary["min_ms"]["auto"]["sdpa"] == pytest.approx(2000.0)
    (tmp_path / "lockstep").mkdir()
    record = {"model": "x", "case": "padded", "label": "", "summary": summary}
    (tmp_path / "lockstep" / "x_padded.json").write_text(json.dumps(record))
    table = compare.lockstep_table(tmp_path)
    assert list(table) == ["x padded"] and "**1.00**" in compare.lockstep_markdown(table)
