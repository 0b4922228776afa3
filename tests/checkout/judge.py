"""What the checkout tests ask of a ported tree, shared by the 4.40.2 and 5.23.0 sessions."""

from __future__ import annotations

from conftest import Session
from layout import model_file, model_folder

from sdpa_port.checkout.copies import Inconsistency, check_tree
from sdpa_port.checkout.markers import lost_markers
from sdpa_port.checkout.ruff import Ruff
from sdpa_port.checkout.tree import Directory


def new_findings(session: Session, model: str, ruff: Ruff) -> list[str]:
    """Lint findings the port of `model` (with everything it changed) adds over the files as they were."""
    changed = session.changed_by(model).items()
    return [
        f"{path}:{finding}"
        for path, (before, after) in changed
        for finding in ruff.review(path, before, after).findings
    ]


def reformatted(session: Session, model: str, ruff: Ruff) -> dict[str, tuple[int, ...]]:
    """The lines `ruff format` would change in the files the port of `model` changed or wrote."""
    found = {
        path: ruff.review(path, before, after).reformatted
        for path, (before, after) in session.changed_by(model).items()
    }
    return {path: lines for path, lines in found.items() if lines}


def stale_markers(session: Session, ruff: Ruff) -> list[Inconsistency]:
    return check_tree(Directory(session.root), formatter=ruff.format_modules)


def emitted_outcomes(session: Session, model: str) -> dict[str, str]:
    assert session.emitted is not None
    prefix = f"tests.models.{model_folder(model)}.test_sdpa_parity_{model_file(model)}"
    return {t: s for t, s in session.emitted.outcomes.items() if t.startswith((prefix + ".", prefix + "::"))}


def lost(session: Session, models: list[str]) -> dict[str, list[str]]:
    """Markers of the original tree that no changed file keeps in any form."""
    out = {}
    for model in models:
        for path, (before, after) in session.changed_by(model).items():
            gone = lost_markers(session.pristine.get(path) or before or "", after, path) if before is not None else []
            if gone:
                out[path] = gone
    return out
