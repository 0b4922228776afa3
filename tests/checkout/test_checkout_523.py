"""Transformers 5.23.0 as a contributor's checkout (its sdist: the library and the common testers, no model tests):
port xglm, codegen and gptj in place, switch_transformers through its modular file, and BLIP's text model (the
second modeling file of the blip folder), then judge the tree."""

from __future__ import annotations

import pytest
from conftest import Session, build_session
from judge import emitted_outcomes, lost, new_findings, reformatted, stale_markers
from layout import model_file, model_folder

pytestmark = pytest.mark.checkout523

# `folder/name`: src/transformers/models/<folder>/modeling_<name>.py, its tests in tests/models/<folder>
MODELS = ["xglm", "codegen", "gptj", "switch_transformers", "blip/blip_text"]
MODULAR = {"switch_transformers"}
VERIFIED = "switch_transformers"  # ported with the default (which verifies it), the others with --no-verify

# not holding in the release itself: idefics2 and idefics3 copy CLIPAttention.__init__ without its is_causal line
PREEXISTING = {
    (
        "src/transformers/models/idefics2/modeling_idefics2.py",
        "transformers.models.clip.modeling_clip.CLIPAttention.__init__",
    ),
    (
        "src/transformers/models/idefics3/modeling_idefics3.py",
        "transformers.models.clip.modeling_clip.CLIPAttention.__init__",
    ),
}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return build_session("5.23.0", MODELS, tmp_path_factory.mktemp("checkout523"), repo_tests=False, verified=VERIFIED)


def test_a_port_in_the_checkout_is_verified_by_default(session: Session) -> None:
    """Without --verify, the port of a checkout's modular file runs the parity checks on the generated file,
    against the checkout's transformers (PYTHONPATH=src), before either is written."""
    port = session.ports[VERIFIED]
    assert port.returncode == 0, port.output
    assert any(line.startswith("ported: ") and line.endswith(" (verified)") for line in port.output.splitlines()), port.output


@pytest.mark.parametrize("model", MODELS)
def test_port_is_written_with_its_test(session: Session, model: str) -> None:
    port = session.ports[model]
    assert port.returncode == 0, port.output
    folder, name = model_folder(model), model_file(model)
    modeling = f"src/transformers/models/{folder}/modeling_{name}.py"
    expected = {modeling, f"tests/models/{folder}/test_sdpa_parity_{name}.py"}
    if model in MODULAR:
        expected.add(f"src/transformers/models/{folder}/modular_{name}.py")
    earlier = [m for m in MODELS[: MODELS.index(model)] if modeling in session.ports[m].changed]
    if earlier:
        # ported as the upstream of an earlier model's copies (codegen's blocks copy GPT-J's): already done
        assert "already supports SDPA" in port.output and f"upstream of src/transformers/models/{earlier[0]}" in (
            session.ports[earlier[0]].output
        ), (port.output, session.ports[earlier[0]].output)
        return
    assert expected <= set(port.changed), port.output


@pytest.mark.parametrize("model", sorted(MODULAR))
def test_the_modular_file_carries_the_port(session: Session, model: str) -> None:
    """Every line the port added to the generated file is in the modular file too (what regeneration reads)."""
    changed = session.changed_by(model)
    generated_before, generated_after = changed[f"src/transformers/models/{model}/modeling_{model}.py"]
    modular_before, modular_after = changed[f"src/transformers/models/{model}/modular_{model}.py"]
    added = set(generated_after.splitlines()) - set((generated_before or "").splitlines())
    assert added and added <= set(modular_after.splitlines()) - set((modular_before or "").splitlines())
    assert "warning" not in session.ports[model].output or "generated from" not in session.ports[model].output


@pytest.mark.parametrize("model", MODELS)
def test_pinned_ruff_finds_nothing_new(session: Session, model: str, ruff_for) -> None:  # type: ignore[no-untyped-def]
    assert new_findings(session, model, ruff_for(session)) == []


@pytest.mark.parametrize("model", MODELS)
def test_pinned_ruff_formats_nothing(session: Session, model: str, ruff_for) -> None:  # type: ignore[no-untyped-def]
    assert reformatted(session, model, ruff_for(session)) == {}


def test_no_stale_copied_from_markers_anywhere(session: Session, ruff_for) -> None:  # type: ignore[no-untyped-def]
    found = stale_markers(session, ruff_for(session))
    assert {(item.marker.path, item.marker.qualified) for item in found} == PREEXISTING, "\n".join(map(str, found))


def test_no_marker_of_the_tree_is_lost(session: Session) -> None:
    assert lost(session, MODELS) == {}


@pytest.mark.parametrize("model", MODELS)
def test_emitted_tests_pass(session: Session, model: str) -> None:
    mine = emitted_outcomes(session, model)
    assert "passed" in mine.values() and "failed" not in mine.values(), session.emitted.tail if session.emitted else ""
