"""The CLI contract: exit codes, what is written where, and one-line errors for bad input."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sdpa_port.cli import port_app

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
runner = CliRunner()


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(port_app, [str(a) for a in args])


@pytest.fixture
def decoder(tmp_path: Path) -> Path:
    target = tmp_path / "modeling_tiny_decoder.py"
    shutil.copy(FIXTURES / "class_style" / "modeling_tiny_decoder.py", target)
    return target


def test_port_in_place_exit_0(decoder: Path) -> None:
    result = invoke(decoder)
    assert result.exit_code == 0, result.output
    assert decoder.read_text() == (FIXTURES / "golden" / "modeling_tiny_decoder.py").read_text()
    assert "ported:" in result.stdout


def test_nothing_to_do_exit_0(decoder: Path) -> None:
    invoke(decoder)
    before = decoder.read_text()
    result = invoke(decoder)
    assert result.exit_code == 0 and "already supports SDPA" in result.stdout
    assert decoder.read_text() == before


def test_output_leaves_input_untouched(decoder: Path, tmp_path: Path) -> None:
    before = decoder.read_text()
    destination = tmp_path / "out.py"
    result = invoke(decoder, "-o", destination)
    assert result.exit_code == 0
    assert decoder.read_text() == before
    assert destination.read_text() == (FIXTURES / "golden" / "modeling_tiny_decoder.py").read_text()


def test_check_exit_1_writes_nothing(decoder: Path) -> None:
    before = decoder.read_text()
    result = invoke(decoder, "--check")
    assert result.exit_code == 1
    assert decoder.read_text() == before


def test_diff_exit_1_prints_unified_diff(decoder: Path) -> None:
    before = decoder.read_text()
    result = invoke(decoder, "--diff")
    assert result.exit_code == 1
    assert result.stdout.startswith("--- a/")
    assert "+class TinyDecoderSdpaAttention(TinyDecoderAttention):" in result.stdout
    assert decoder.read_text() == before


def test_refused_exit_3_one_line_per_reason(tmp_path: Path) -> None:
    target = tmp_path / "modeling_tiny_topk.py"
    shutil.copy(FIXTURES / "refused" / "modeling_tiny_topk.py", target)
    before = target.read_text()
    result = invoke(target)
    assert result.exit_code == 3
    lines = result.stdout.strip().splitlines()
    assert lines == [f"refused: {target}: TinyTopKAttention (line 16): `.topk()` is applied to the scores [S101]"]
    assert target.read_text() == before


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such file"),
        (b"", "empty file"),
        (b"import torch\n\x00\x01binary", "binary file"),
        (b"import torch\nx = '\xff\xfe'\n", "not UTF-8"),
        (b"import torch\ndef broken(:\n", ":2: invalid syntax"),
        (b"def plain():\n    return 1\n", "not a modeling file"),
    ],
    ids=["missing", "empty", "binary", "latin1", "syntax", "not-modeling"],
)
def test_bad_input_exit_2_one_line(tmp_path: Path, content: bytes | None, message: str) -> None:
    target = tmp_path / "modeling_bad.py"
    if content is not None:
        target.write_bytes(content)
    result = invoke(target)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1 and message in error_lines[0]
    if content is not None:
        assert target.read_bytes() == content


def test_directory_without_modeling_files_exit_2(tmp_path: Path) -> None:
    (tmp_path / "notes.py").write_text("x = 1\n")
    result = invoke(tmp_path)
    assert result.exit_code == 2 and "no PyTorch modeling files" in result.stderr


def test_output_with_several_inputs_is_a_usage_error(decoder: Path, tmp_path: Path) -> None:
    result = invoke(decoder, decoder, "-o", tmp_path / "x.py")
    assert result.exit_code == 2


def test_unknown_option_is_a_usage_error(decoder: Path) -> None:
    assert invoke(decoder, "--no-such-option").exit_code == 2


def test_json_reports_one_object_per_file(decoder: Path) -> None:
    import json

    result = invoke(decoder, "--check", "--json")
    record = json.loads(result.stdout.strip())
    assert record["status"] == "ported" and record["attention_classes"] == ["TinyDecoderAttention"]


def test_help_in_a_subprocess() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "sdpa_port", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0
    assert "--check" in completed.stdout and "Exit codes" in completed.stdout



@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", ["port", "bench"])
def test_help_paragraphs_wrap_at_the_terminal_width(command: str, columns: int) -> None:
    """A help line ends early only where the next word would not fit, and every paragraph of the docstring is there.

    Typer keeps the line breaks of a docstring's later paragraphs, which then break in mid-sentence at any width
    but the source's; the commands reflow their paragraphs (`edge/command_help.py`).
    """
    from sdpa_port.bench.cli import bench, bench_app
    from sdpa_port.cli import port

    app, function = (port_app, port) if command == "port" else (bench_app, bench)
    result = runner.invoke(app, ["--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    # the prose outside the panels of arguments and options, in paragraphs
    lines = [line.rstrip() for line in result.stdout.splitlines() if not line.lstrip().startswith(("╭", "│", "╰"))]
    assert max(len(line) for line in lines) <= columns
    early = [
        line
        for line, following in zip(lines, lines[1:])
        if line and following and len(line) + 1 + len(following.split()[0]) <= columns - 1
    ]
    assert not early, f"lines broken before the width of {columns} columns:\n" + "\n".join(early)
    prose = " ".join(" ".join(lines).split())
    for paragraph in (function.__doc__ or "").split("\n\n"):
        assert " ".join(paragraph.split()) in prose

BAD_FILES = {
    "modeling_syntax.py": b"import torch\ndef broken(:\n",
    "modeling_empty.py": b"",
    "modeling_binary.py": b"import torch\n\x00\x01binary",
    "modeling_latin1.py": b"import torch\nx = '\xff\xfe'\n",
}


def test_batch_mixing_good_and_bad_files(tmp_path: Path) -> None:
    """Bad files are errors (one line each, exit 2) and stay as they were; the good ones are still ported."""
    folder = tmp_path / "models"
    folder.mkdir()
    good = folder / "modeling_tiny_decoder.py"
    shutil.copy(FIXTURES / "class_style" / "modeling_tiny_decoder.py", good)
    (folder / "modeling_plain.py").write_text("def plain():\n    return 1\n")  # found by the walk: not an error
    for name, content in BAD_FILES.items():
        (folder / name).write_bytes(content)
    result = invoke(folder, "--no-tests")
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert sorted(line.split(": ")[1].rsplit("/", 1)[-1].split(":")[0] for line in errors) == sorted(BAD_FILES)
    for name, content in BAD_FILES.items():
        assert (folder / name).read_bytes() == content
    assert good.read_text() == (FIXTURES / "golden" / "modeling_tiny_decoder.py").read_text()
    assert "unchanged: " in result.stdout and "modeling_plain.py" in result.stdout
    assert re.search(r"^  errors\s+4$", result.stderr, re.MULTILINE)


def test_batch_json_one_object_per_file_in_input_order(tmp_path: Path) -> None:
    for group, name in (("class_style", "modeling_tiny_encoder.py"), ("refused", "modeling_tiny_topk.py"), ("class_style", "modeling_tiny_decoder.py")):
        shutil.copy(FIXTURES / group / name, tmp_path / name)
    result = invoke(tmp_path, "--check", "--json", "-j", "2")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [Path(r["path"]).name for r in records] == sorted(p.name for p in tmp_path.glob("*.py"))
    assert [r["status"] for r in records] == ["ported", "ported", "refused"]
    assert {"path", "status", "style", "attention_classes", "reasons", "warnings"} <= set(records[0])
    assert result.exit_code == 3  # a refusal outranks "changes needed"


STARTUP_PROBE = """
import json, sys
from sdpa_port.cli import main
loaded = lambda: sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "rich"})
after_import = loaded()
sys.argv = ["sdpa-port", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
sys.__stderr__.write(json.dumps([after_import, loaded()]) + "\\n")
"""


@pytest.mark.parametrize("arguments", [["--help"], ["FILE", "--check", "--no-tests"], ["DIR", "--check", "--no-tests"]])
def test_startup_imports_neither_torch_nor_transformers(tmp_path: Path, arguments: list[str]) -> None:
    shutil.copy(FIXTURES / "class_style" / "modeling_tiny_decoder.py", tmp_path / "modeling_tiny_decoder.py")
    shutil.copy(FIXTURES / "refused" / "modeling_tiny_topk.py", tmp_path / "modeling_tiny_topk.py")
    paths = {"FILE": str(tmp_path / "modeling_tiny_decoder.py"), "DIR": str(tmp_path)}
    completed = subprocess.run(
        [sys.executable, "-c", STARTUP_PROBE, *[paths.get(a, a) for a in arguments]],
        capture_output=True, text=True, timeout=120, check=False,
    )
    after_import, after_run = json.loads(completed.stderr.strip().splitlines()[-1])
    assert after_import == []
    # typer draws --help with rich; porting off a terminal shows no progress bar and leaves rich unloaded
    assert after_run == (["rich"] if arguments == ["--help"] else [])


@pytest.mark.parametrize("code", ["W401", "W410", "A501", "C304", "F601"])
def test_every_refusal_exits_3_with_its_code(code: str, tmp_path: Path) -> None:
    """Refusals decided anywhere (class, interface or inline style, the authors' flag, the form-free detector) exit 3."""
    from test_refusal_docs import STYLES, source_of

    target = tmp_path / "modeling_tiny.py"
    target.write_text(source_of(code), encoding="utf-8")
    result = invoke(target, "--json", "--style", STYLES[code])
    assert result.exit_code == 3, result.output
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["status"] == "refused" and [r["code"] for r in record["refusals"]] == [code]
    assert target.read_text(encoding="utf-8") == source_of(code)


def test_port_source_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a planner becomes an error result naming it, not an exception out of the pure API."""
    from sdpa_port import Status, api, port_source

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyError("boom")

    monkeypatch.setattr(api, "plan_class_style", broken)
    source = (FIXTURES / "class_style" / "modeling_tiny_decoder.py").read_text()
    result = port_source(source, filename="modeling_tiny_decoder.py")
    assert result.status is Status.ERROR and "KeyError" in result.reasons[0] and result.source == source


def test_a_port_without_a_parity_test_says_why(tmp_path: Path) -> None:
    """Emitted tests drive models taking `input_ids`; a file whose models take other inputs (audio, vision) is ported
    without one, and the run says so instead of leaving the missing test to be noticed."""
    source = (FIXTURES / "class_style" / "modeling_tiny_conformer.py").read_text(encoding="utf-8")
    target = tmp_path / "modeling_tiny_conformer.py"
    target.write_text(source.replace("input_ids", "input_values"), encoding="utf-8")
    result = invoke(target, "-o", tmp_path / "out.py")
    assert result.exit_code == 0, result.output
    assert "no parity test written" in result.stderr and "--verify" in result.stderr, result.stderr
    assert not list(tmp_path.glob("**/test_sdpa_parity_*.py"))
    with_ids = tmp_path / "ids" / "modeling_tiny_conformer.py"
    with_ids.parent.mkdir()
    with_ids.write_text(source, encoding="utf-8")
    result = invoke(with_ids, "-o", tmp_path / "ids" / "out.py")
    assert result.exit_code == 0 and "no parity test written" not in result.stderr, result.stderr
    assert list((tmp_path / "ids").glob("**/test_sdpa_parity_*.py"))
