"""Corpus acceptance: every PyTorch modeling file of transformers 4.40.2 and 5.23.0, ported in one batch run."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdpa_port.edge.wheels import modeling_members

from corpus_run import Corpus

pytestmark = pytest.mark.corpus


def test_every_modeling_file_is_reported_once(corpus: Corpus) -> None:
    expected = sorted(Path(member) for member in modeling_members(corpus.wheel))
    assert len(expected) > 200
    assert sorted(corpus.relative(r["path"]) for r in corpus.first.records) == expected


def test_no_file_is_an_error(corpus: Corpus) -> None:
    errors = [f"{r['path']}: {r['reasons']}" for r in corpus.first.by_status("error")]
    assert errors == []
    assert corpus.first.code in (0, 3) and (corpus.first.code == 3) == bool(corpus.first.by_status("refused"))
    assert "Traceback" not in corpus.first.stderr


def test_every_written_output_compiles(corpus: Corpus) -> None:
    ported = corpus.first.by_status("ported")
    assert ported, "a release with nothing to port says nothing about the porter"
    written = [Path(r["written"]) for r in ported] + [Path(r["tests"]) for r in ported if r["tests"]]
    assert len(written) >= len(ported)
    for path in written:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


def test_files_not_ported_are_left_byte_for_byte(corpus: Corpus) -> None:
    for record in corpus.first.records:
        if record["status"] != "ported":
            relative = corpus.relative(record["path"])
            assert (corpus.tree / relative).read_bytes() == (corpus.pristine / relative).read_bytes(), relative


def test_a_second_run_with_check_finds_nothing_to_change(corpus: Corpus) -> None:
    second = corpus.second
    assert [r["path"] for r in second.by_status("ported")] == []
    assert second.by_status("error") == []
    assert second.code in (0, 3), second.stderr[-2000:]
    assert {r["path"] for r in second.by_status("refused")} == {r["path"] for r in corpus.first.by_status("refused")}
    for record in second.records:
        if record["path"] in {r["path"] for r in corpus.first.by_status("ported")}:
            assert record["detail"] == "already supports SDPA", record
