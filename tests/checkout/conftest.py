"""A Transformers checkout laid out from a release's sdist, ported in place as a contributor would, then judged.

Run by `nox -s checkout440` / `nox -s checkout523`, which install the checkout's test dependencies and its pinned
ruff. Outside those sessions the tests skip; inside (SDPA_PORT_REQUIRE set) a missing piece is an error.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from layout import PytestRun, Timings, lay_out, model_file, model_folder, run_pytest, sdist, snapshot  # noqa: E402

PINNED_RUFF = {"4.40.2": "0.1.5", "5.23.0": "0.14.10"}
REPO_TEST_DESELECT = ["-k", "not test_pipeline_", "-p", "no:randomly"]  # pipeline tests download from the hub


@dataclass
class Port:
    model: str
    returncode: int
    output: str
    changed: dict[str, tuple[str | None, str]]  # path -> (text before this port or None when new, text after)


@dataclass
class Session:
    version: str
    root: Path
    pristine: dict[str, str]
    ports: dict[str, Port] = field(default_factory=dict)
    emitted: PytestRun | None = None
    repo_before: PytestRun | None = None
    repo_after: PytestRun | None = None
    timings: Timings = field(default_factory=Timings)
    wall: float = 0.0

    def changed_by(self, model: str) -> dict[str, tuple[str | None, str]]:
        return self.ports[model].changed


def _problem(version: str) -> str | None:
    if not os.environ.get("SDPA_PORT_SDISTS"):
        return "needs SDPA_PORT_SDISTS: a folder for the transformers sdists (nox -s checkout440)"
    if version == "4.40.2" and not Path(os.environ.get("SDPA_PORT_TRANSFORMERS_TESTS", "")).is_dir():
        return "needs SDPA_PORT_TRANSFORMERS_TESTS: Transformers' tests at v4.40.2 to lay over the sdist"
    ruff = shutil.which("ruff")
    if ruff is None:
        return f"needs ruff {PINNED_RUFF[version]} on PATH"
    from sdpa_port.checkout.ruff import Ruff

    found = Ruff(ruff, None, Path.cwd()).version()
    if found != PINNED_RUFF[version]:
        return f"needs ruff {PINNED_RUFF[version]} on PATH, found {found}"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "needs torch (nox installs it)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    required = os.environ.get("SDPA_PORT_REQUIRE")
    for item in items:
        for marker, version in (("checkout440", "4.40.2"), ("checkout523", "5.23.0")):
            if marker not in item.keywords:
                continue
            problem = _problem(version)
            if problem is None:
                continue
            if required == marker:
                raise pytest.UsageError(problem)
            item.add_marker(pytest.mark.skip(reason=problem))


def build_session(version: str, models: list[str], workdir: Path, repo_tests: bool, verified: str) -> Session:
    """Lay out, run the model tests, port each model in place with the CLI, run the emitted and model tests again.

    A file of a checkout is verified before it is written by default; only the `verified` model keeps that default
    (verifying costs about ten seconds of CPU a model, and the emitted tests check every port again); the others are
    ported with --no-verify."""
    started = time.perf_counter()
    overlay = Path(os.environ["SDPA_PORT_TRANSFORMERS_TESTS"]) if version == "4.40.2" else None
    archive = sdist(version, Path(os.environ["SDPA_PORT_SDISTS"]))
    root = lay_out(archive, workdir / f"transformers-{version}", overlay, models)
    session = Session(version, root, snapshot(root))
    session.timings.steps["lay out"] = time.perf_counter() - started
    repo_paths = [
        f"tests/models/{model_folder(m)}/test_modeling_{model_file(m)}.py"
        for m in models
        if (root / "tests/models" / model_folder(m) / f"test_modeling_{model_file(m)}.py").is_file()
    ]
    if repo_tests and repo_paths:
        session.repo_before = run_pytest(
            session.timings, "repository tests before", root, repo_paths, workdir / "before.xml", REPO_TEST_DESELECT
        )
    for model in models:
        before = snapshot(root)
        folder, name = model_folder(model), model_file(model)  # `blip/blip_text`: blip/modeling_blip_text.py
        path = f"src/transformers/models/{folder}/modeling_{name}.py"
        if (root / f"src/transformers/models/{folder}/modular_{name}.py").is_file():
            path = f"src/transformers/models/{folder}/modular_{name}.py"
        command = [sys.executable, "-m", "sdpa_port", path, *([] if model == verified else ["--no-verify"])]
        completed = session.timings.run(f"port {model}", command, root, timeout=900)
        after = snapshot(root)
        changed = {p: (before.get(p), t) for p, t in after.items() if before.get(p) != t}
        session.ports[model] = Port(model, completed.returncode, completed.stdout + completed.stderr, changed)
    emitted = sorted(p for model in models for p in session.ports[model].changed if "/test_sdpa_parity_" in p)
    if emitted:
        session.emitted = run_pytest(session.timings, "emitted tests", root, emitted, workdir / "emitted.xml", [])
    if repo_tests and repo_paths:
        session.repo_after = run_pytest(
            session.timings, "repository tests after", root, repo_paths, workdir / "after.xml", REPO_TEST_DESELECT
        )
    session.wall = time.perf_counter() - started
    _record(session)
    return session


def _record(session: Session) -> None:
    directory = os.environ.get("SDPA_PORT_REPORT_DIR")
    if not directory:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    data = {
        "version": session.version,
        "wall_s": round(session.wall, 1),
        "steps_s": {k: round(v, 1) for k, v in session.timings.steps.items()},
        "ports": {
            m: {"returncode": p.returncode, "changed": sorted(p.changed), "output": p.output[-3000:]}
            for m, p in session.ports.items()
        },
        "emitted": session.emitted.outcomes if session.emitted else {},
        "repo_before": session.repo_before.outcomes if session.repo_before else {},
        "repo_after": session.repo_after.outcomes if session.repo_after else {},
        "repo_after_messages": session.repo_after.messages if session.repo_after else {},
        "ruff": _ruff_lines(session),
    }
    (Path(directory) / f"checkout-{session.version}.json").write_text(json.dumps(data, indent=1), encoding="utf-8")


def _ruff_lines(session: Session) -> dict[str, dict[str, list[str]]]:
    """What the pinned ruff says about each file each port changed (for the session's report)."""
    from sdpa_port.checkout.ruff import Ruff

    ruff = Ruff(shutil.which("ruff") or "ruff", session.root / "pyproject.toml", session.root)
    out: dict[str, dict[str, list[str]]] = {}
    for model, port in session.ports.items():
        for path, (before, after) in port.changed.items():
            lines = ruff.review(path, before, after).lines(named=False)
            if lines:
                out.setdefault(model, {})[path] = lines
    return out


@pytest.fixture(scope="session")
def ruff_for():  # type: ignore[no-untyped-def]
    from sdpa_port.checkout.ruff import Ruff

    def make(session: Session) -> Ruff:
        return Ruff(shutil.which("ruff") or "ruff", session.root / "pyproject.toml", session.root)

    return make
