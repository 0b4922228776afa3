"""Batch runs: parallel processing in input order, one file's failure never stops or corrupts the others."""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from sdpa_port.edge import runner
from sdpa_port.edge.files import Target, discover
from sdpa_port.edge.progress import progress_bar
from sdpa_port.edge.report import summary_lines
from sdpa_port.edge.outcome import Outcome, RunOptions, Summary
from sdpa_port.edge.runner import run
from sdpa_port.result import PortResult, Status

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NO_TESTS = RunOptions(tests=False)


def _tree(tmp_path: Path) -> Path:
    """Two ports, one refusal, two already supported, one without attention, spread over sub-folders."""
    root = tmp_path / "models"
    for group, names in (
        ("class_style", ("modeling_tiny_decoder.py", "modeling_tiny_encoder.py")),
        ("refused", ("modeling_tiny_softcap.py", "modeling_tiny_topk.py")),
        ("unchanged", ("modeling_tiny_router.py", "modeling_tiny_supported.py")),
    ):
        for source in (FIXTURES / group / name for name in names):
            folder = root / source.stem.removeprefix("modeling_")
            folder.mkdir(parents=True)
            shutil.copy(source, folder / source.name)
    return root


def _by_name(summary: Summary) -> dict[str, Status]:
    return {o.path.name: o.status for o in summary.outcomes}


def test_parallel_outcomes_equal_serial_ones_in_input_order(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    targets = discover([root])
    seen: list[Path] = []
    completed: list[Path] = []
    parallel = run(
        targets,
        RunOptions(write=False, tests=False),
        jobs=2,
        progress=lambda o: seen.append(o.path),
        advanced=lambda o: completed.append(o.path),
    )
    serial = run(targets, RunOptions(write=False, tests=False), jobs=1)
    assert [o.path for o in parallel.outcomes] == [t.path for t in targets] == seen
    assert sorted(completed) == sorted(seen)
    assert [(o.status, o.result.source, o.result.reasons) for o in parallel.outcomes] == [
        (o.status, o.result.source, o.result.reasons) for o in serial.outcomes
    ]
    assert set(_by_name(parallel).values()) == {Status.PORTED, Status.REFUSED, Status.UNCHANGED}


def _raise_for(name: str):  # type: ignore[no-untyped-def]
    real = runner.port_source

    def port(source: str, **options):  # type: ignore[no-untyped-def]
        if options.get("filename", "").endswith(name):
            raise RuntimeError("boom")
        return real(source, **options)

    return port


def _die_for(name: str):  # type: ignore[no-untyped-def]
    real = runner.port_source

    def port(source: str, **options):  # type: ignore[no-untyped-def]
        if options.get("filename", "").endswith(name):
            os._exit(13)  # the worker process dies without a word
        return real(source, **options)

    return port


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_crash_in_port_source_is_an_error_for_that_file_only(tmp_path: Path, monkeypatch, jobs: int) -> None:  # type: ignore[no-untyped-def]
    root = _tree(tmp_path)
    monkeypatch.setattr(runner, "port_source", _raise_for("modeling_tiny_decoder.py"))
    summary = run(discover([root]), NO_TESTS, jobs=jobs)
    statuses = _by_name(summary)
    assert statuses["modeling_tiny_decoder.py"] is Status.ERROR
    assert statuses["modeling_tiny_encoder.py"] is Status.PORTED
    crashed = next(o for o in summary.outcomes if o.path.name == "modeling_tiny_decoder.py")
    assert "internal error: RuntimeError: boom" in crashed.result.reasons[0]
    assert summary.exit_code(checking=False) == 2
    decoder = next(root.rglob("modeling_tiny_decoder.py"))
    assert decoder.read_text() == (FIXTURES / "class_style" / "modeling_tiny_decoder.py").read_text()


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_unexpected_failure_around_the_port_is_an_error_for_that_file_only(
    tmp_path: Path, monkeypatch, jobs: int  # type: ignore[no-untyped-def]
) -> None:
    root = _tree(tmp_path)
    real = runner.read_source

    def read(path: Path) -> str:
        if path.name == "modeling_tiny_encoder.py":
            raise MemoryError("no room")
        return real(path)

    monkeypatch.setattr(runner, "read_source", read)
    summary = run(discover([root]), NO_TESTS, jobs=jobs)
    statuses = _by_name(summary)
    assert statuses["modeling_tiny_encoder.py"] is Status.ERROR and statuses["modeling_tiny_decoder.py"] is Status.PORTED
    assert "MemoryError: no room" in next(o for o in summary.outcomes if o.status is Status.ERROR).result.reasons[0]


def test_a_dying_worker_process_fails_only_its_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    root = _tree(tmp_path)
    monkeypatch.setattr(runner, "port_source", _die_for("modeling_tiny_topk.py"))
    summary = run(discover([root]), NO_TESTS, jobs=2)
    statuses = _by_name(summary)
    assert statuses["modeling_tiny_topk.py"] is Status.ERROR
    assert "worker process died" in next(o for o in summary.outcomes if o.status is Status.ERROR).result.reasons[0]
    assert [s for name, s in statuses.items() if name != "modeling_tiny_topk.py"].count(Status.ERROR) == 0
    assert statuses["modeling_tiny_decoder.py"] is statuses["modeling_tiny_encoder.py"] is Status.PORTED
    assert len(summary.outcomes) == len(discover([root]))


def test_workers_leave_every_write_to_the_parent(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a worker that wrote its port and then died with the pool would have its file rerun from the port itself
    root = _tree(tmp_path)
    writers = tmp_path / "writers"
    real = runner.atomic_write

    def write(path: Path, text: str) -> None:
        with writers.open("a") as log:
            log.write(f"{os.getpid()}\n")
        real(path, text)

    monkeypatch.setattr(runner, "atomic_write", write)
    summary = run(discover([root]), NO_TESTS, jobs=2)
    assert summary.count(Status.PORTED) >= 2
    assert set(writers.read_text().split()) == {str(os.getpid())}


def test_an_unwritable_target_is_an_error_for_that_file_only(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    decoder = next(root.rglob("modeling_tiny_decoder.py"))
    decoder.chmod(stat.S_IRUSR | stat.S_IRGRP)  # read-only: refused even to root, who could rename over it
    before = decoder.read_bytes()
    summary = run(discover([root]), NO_TESTS, jobs=2)
    statuses = _by_name(summary)
    assert statuses["modeling_tiny_decoder.py"] is Status.ERROR and statuses["modeling_tiny_encoder.py"] is Status.PORTED
    failed = next(o for o in summary.outcomes if o.status is Status.ERROR)
    assert "cannot write" in failed.result.reasons[0] and "read-only" in failed.result.reasons[0]
    assert decoder.read_bytes() == before
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]  # no temporary file left behind


def test_write_into_a_missing_folder_is_an_error_and_leaves_the_input(tmp_path: Path) -> None:
    source = tmp_path / "modeling_tiny_decoder.py"
    shutil.copy(FIXTURES / "class_style" / "modeling_tiny_decoder.py", source)
    before = source.read_bytes()
    options = RunOptions(output=tmp_path / "no-such-folder" / "out.py", tests=False)
    summary = run([Target(source)], options)
    assert summary.outcomes[0].status is Status.ERROR and "cannot write" in summary.outcomes[0].result.reasons[0]
    assert source.read_bytes() == before


def test_in_place_write_keeps_mode_and_writes_through_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real" / "modeling_tiny_decoder.py"
    real.parent.mkdir()
    shutil.copy(FIXTURES / "class_style" / "modeling_tiny_decoder.py", real)
    real.chmod(0o640)
    link = tmp_path / "modeling_link.py"
    link.symlink_to(real)
    summary = run([Target(link)], NO_TESTS)
    assert summary.outcomes[0].status is Status.PORTED
    assert link.is_symlink() and real.read_text() == (FIXTURES / "golden" / "modeling_tiny_decoder.py").read_text()
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_discover_walks_modeling_and_modular_files_once(tmp_path: Path) -> None:
    root = tmp_path / "models" / "tiny"
    root.mkdir(parents=True)
    for name in ("modeling_tiny.py", "modular_tiny.py", "modeling_tf_tiny.py", "modeling_flax_tiny.py", "configuration_tiny.py"):
        (root / name).write_text("import torch\n")
    found = discover([tmp_path, root / "modeling_tiny.py"])
    assert [t.path.name for t in found] == ["modeling_tiny.py", "modular_tiny.py"]
    assert not any(t.explicit for t in found)


def test_summary_counts_every_kind_and_groups_refusal_reasons(tmp_path: Path) -> None:
    summary = run(discover([_tree(tmp_path)]), RunOptions(write=False, tests=False), jobs=1)
    lines = summary_lines(summary)
    rows = [re.match(r"^  (\S.*?)\s+(\d+)$", line) for line in lines[1:]]
    counts = {row.group(1): int(row.group(2)) for row in rows if row}
    assert lines[0] == f"sdpa-port: {len(summary.outcomes)} file(s)"
    assert counts == {"ported": 2, "verified": 0, "already support SDPA": 1, "nothing to port": 1, "refused": 2, "errors": 0}
    # the refused files are counted by code, each code with its title
    assert any(line.split()[1:3] == ["S101", "the"] for line in lines if line.strip()[:1].isdigit())


def test_no_progress_bar_off_a_terminal(tmp_path: Path) -> None:
    with open(tmp_path / "log", "w") as stream:
        assert progress_bar(10, stream) is None


def test_progress_bar_on_a_terminal_counts_files(tmp_path: Path) -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    assert progress_bar(1, stream) is None  # one file: nothing to show
    bar = progress_bar(2, stream)
    assert bar is not None
    done = PortResult(Status.PORTED, "")
    bar.advance(Outcome(Path("a.py"), done))
    bar.advance(Outcome(Path("b.py"), done))
    bar.close()
    assert "2/2" in stream.getvalue()


def test_a_remote_code_directory_is_followed_from_its_auto_map(tmp_path: Path) -> None:
    """A `trust_remote_code` repository names its modules in `config.json`'s `auto_map` (`modelling_RW.py`), and they
    import their attention from siblings (`attention.py`, `from . import blocks`): directory mode takes every one
    that holds PyTorch code, not the configuration module nor a file nothing imports."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text(
        '{"auto_map": {"AutoConfig": "configuration_RW.RWConfig", "AutoModel": "modelling_RW.RWModel",'
        ' "AutoTokenizer": ["other/repo--tokenizer.Tok", null]}}',
        encoding="utf-8",
    )
    (repo / "configuration_RW.py").write_text("from transformers import PretrainedConfig\n", encoding="utf-8")
    (repo / "modelling_RW.py").write_text(
        "import torch\nfrom .attention import Attention\nfrom . import blocks\nfrom .configuration_RW import RWConfig\n",
        encoding="utf-8",
    )
    (repo / "attention.py").write_text("import torch\nfrom .rotary import rotate\n", encoding="utf-8")
    (repo / "rotary.py").write_text("import torch\n", encoding="utf-8")
    (repo / "blocks.py").write_text("from torch import nn\n", encoding="utf-8")
    (repo / "unrelated.py").write_text("import torch\n", encoding="utf-8")
    found = sorted(target.path.name for target in discover([repo]))
    assert found == ["attention.py", "blocks.py", "modelling_RW.py", "rotary.py"]
    (repo / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(Exception, match="no PyTorch modeling files"):
        discover([repo])
