"""Transformers 4.40.2 as a contributor's checkout: port t5, bert, gpt2, mbart, distilbert and opt in place with
`sdpa-port src/transformers/models/<m>/modeling_<m>.py`, then data2vec's text model (a second modeling file of its
folder, copying BERT), and hold the result to the repository's own checks."""

from __future__ import annotations

import pytest
from conftest import Session, build_session
from judge import emitted_outcomes, lost, new_findings, reformatted, stale_markers
from layout import model_file, model_folder, snapshot

from sdpa_port.checkout.copies import check_tree
from sdpa_port.checkout.tree import Directory, Overlay

pytestmark = pytest.mark.checkout440

# the models whose own tests the 4.40.2 overlay carries
WITH_REPO_TESTS = ["t5", "bert", "gpt2", "mbart", "distilbert", "opt"]
# `folder/name`: data2vec/modeling_data2vec_text.py, whose copies of BERT's code follow BERT's port first and then
# meet its own port (a swap already made must not be made again, or its BertModel.forward marker would be lost)
MODELS = [*WITH_REPO_TESTS, "data2vec/data2vec_text"]
VERIFIED = "bert"  # ported with the default (which verifies it), the others with --no-verify

# not holding in the release itself: clap's copy of BertEmbeddings.__init__ differs (persistent=True), and two
# markers in gpt_neox's tests name test files the 4.40.2 overlay does not carry
PREEXISTING = {
    (
        "src/transformers/models/clap/modeling_clap.py",
        "transformers.models.bert.modeling_bert.BertEmbeddings.__init__",
    ),
    (
        "tests/models/gpt_neox/test_modeling_gpt_neox.py",
        "tests.models.llama.test_modeling_llama.LlamaModelTest.test_model_rope_scaling_from_config",
    ),
    (
        "tests/models/gpt_neox/test_modeling_gpt_neox.py",
        "tests.models.falcon.test_modeling_falcon.FalconModelTest.test_model_rope_scaling",
    ),
}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return build_session("4.40.2", MODELS, tmp_path_factory.mktemp("checkout440"), repo_tests=True, verified=VERIFIED)


def test_a_port_in_the_checkout_is_verified_by_default(session: Session) -> None:
    """Without --verify, the port of a checkout's file runs the parity checks against the checkout's transformers
    (PYTHONPATH=src) before it is written."""
    port = session.ports[VERIFIED]
    assert port.returncode == 0, port.output
    assert any(line.startswith("ported: ") and line.endswith(" (verified)") for line in port.output.splitlines()), port.output


@pytest.mark.parametrize("model", MODELS)
def test_port_is_written_with_its_test(session: Session, model: str) -> None:
    port = session.ports[model]
    assert port.returncode == 0, port.output
    folder, name = model_folder(model), model_file(model)
    assert f"src/transformers/models/{folder}/modeling_{name}.py" in port.changed
    assert f"tests/models/{folder}/test_sdpa_parity_{name}.py" in port.changed


@pytest.mark.parametrize("model", MODELS)
def test_pinned_ruff_finds_nothing_new(session: Session, model: str, ruff_for) -> None:  # type: ignore[no-untyped-def]
    assert new_findings(session, model, ruff_for(session)) == []


@pytest.mark.parametrize("model", MODELS)
def test_pinned_ruff_formats_nothing(session: Session, model: str, ruff_for) -> None:  # type: ignore[no-untyped-def]
    assert reformatted(session, model, ruff_for(session)) == {}


def test_emitted_tests_are_formatted_even_where_the_port_is_not(session: Session, ruff_for) -> None:  # type: ignore[no-untyped-def]
    ruff = ruff_for(session)
    emitted = {p: t for m in MODELS for p, (_, t) in session.changed_by(m).items() if "/test_sdpa_parity_" in p}
    assert (
        emitted
        and {p: ruff.review(p, None, t).lines() for p, t in emitted.items() if not ruff.review(p, None, t).clean} == {}
    )


def test_no_stale_copied_from_markers_anywhere(session: Session, ruff_for) -> None:  # type: ignore[no-untyped-def]
    found = stale_markers(session, ruff_for(session))
    assert {(item.marker.path, item.marker.qualified) for item in found} == PREEXISTING, "\n".join(map(str, found))


def test_the_marker_check_sees_a_stale_copy(session: Session) -> None:
    tree = Directory(session.root)
    path = "src/transformers/models/clap/modeling_clap.py"
    text = tree.read(path)
    assert text is not None and "CLAP_TEXT_SELF_ATTENTION_CLASSES[config._attn_implementation]" in text
    broken = text.replace("CLAP_TEXT_SELF_ATTENTION_CLASSES[config._attn_implementation]", "ClapTextSelfAttention", 1)
    stale = [
        str(i) for i in check_tree(Overlay(tree, {path: broken}), paths=[path]) if "BertAttention" in i.marker.target
    ]
    assert len(stale) == 1


def test_the_ruff_review_sees_an_unsorted_import(session: Session, ruff_for) -> None:  # type: ignore[no-untyped-def]
    path = "src/transformers/models/opt/modeling_opt.py"
    text = (session.root / path).read_text(encoding="utf-8")
    unsorted = text.replace("from ...activations import ACT2FN\n", "", 1).replace(
        "from ...utils import (", "from ...activations import ACT2FN\nfrom ...utils import (", 1
    )
    assert any(f.code == "I001" for f in ruff_for(session).review(path, text, unsorted).findings)


def test_no_marker_of_the_tree_is_lost(session: Session) -> None:
    assert lost(session, MODELS) == {}


@pytest.mark.parametrize("model", MODELS)
def test_emitted_tests_pass(session: Session, model: str) -> None:
    mine = emitted_outcomes(session, model)
    # built on the repository's testers, every test applies; the standalone test (no tester to build on) skips what
    # a CPU machine lacks
    allowed = {"passed"} if model in WITH_REPO_TESTS else {"passed", "skipped"}
    assert mine and "passed" in mine.values() and set(mine.values()) <= allowed, (
        session.emitted.tail if session.emitted else ""
    )


@pytest.mark.parametrize("model", WITH_REPO_TESTS)
def test_repository_tests_that_passed_still_pass(session: Session, model: str) -> None:
    assert session.repo_before is not None and session.repo_after is not None
    prefix = f"tests.models.{model}.test_modeling_{model}."
    passed = {t for t in session.repo_before.ids("passed") if t.startswith(prefix)}
    assert passed, session.repo_before.tail
    broken = {
        t: session.repo_after.messages.get(t, session.repo_after.outcomes.get(t, "missing"))
        for t in passed - session.repo_after.ids("passed")
    }
    assert broken == {}


def test_only_the_reported_files_changed(session: Session) -> None:
    changed = {p for m in MODELS for p in session.changed_by(m)}
    assert {p for p, t in snapshot(session.root).items() if session.pristine.get(p) != t} == changed
