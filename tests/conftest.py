"""Shared test configuration.

Acceptance tests need a particular transformers release with torch, the corpus tests the release wheels. Outside
their nox session they are skipped; inside it (SDPA_PORT_REQUIRE set) a missing environment is an error, so CI
cannot pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ENVIRONMENTS = {"tf440": "4.40.2", "tf523": "5.23.0", "tf510": "5.10.4", "tf525": "5.25.0"}
# the corpus tests read these wheels from the folder named by SDPA_PORT_WHEELS (nothing needs to be installed)
CORPUS_RELEASES = ("4.40.2", "5.23.0")


def corpus_wheels() -> tuple[Path | None, str | None]:
    """The wheel folder, or None with the reason the corpus cannot run."""
    folder = os.environ.get("SDPA_PORT_WHEELS")
    if not folder:
        return None, "needs SDPA_PORT_WHEELS: a folder with the transformers 4.40.2 and 5.23.0 wheels (nox -s corpus)"
    missing = [v for v in CORPUS_RELEASES if not (Path(folder) / f"transformers-{v}-py3-none-any.whl").is_file()]
    if missing:
        return None, f"no transformers {', '.join(missing)} wheel in {folder} (pip download --no-deps -d {folder} ...)"
    return Path(folder), None


def _installed_transformers() -> str | None:
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        return None
    from importlib.metadata import version

    return version("transformers")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("SDPA_PORT_REGEN"):
        # tests never write what they compare against; golden files have their own command
        raise pytest.UsageError("SDPA_PORT_REGEN is set: regenerate golden files with scripts/regen_golden.py instead")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    required_all = set(os.environ.get("SDPA_PORT_REQUIRE", "").split(","))
    if "executorch" in required_all and importlib.util.find_spec("executorch") is None:
        raise pytest.UsageError("SDPA_PORT_REQUIRE names executorch, which is not installed (nox -s serving)")
    required = next((r for r in required_all if r in ENVIRONMENTS or r == "corpus"), None)
    installed = None
    checked = False
    corpus_problem: str | None = None
    corpus_checked = False
    for item in items:
        if "corpus" in item.keywords:
            if not corpus_checked:
                corpus_problem, corpus_checked = corpus_wheels()[1], True
            if corpus_problem is not None:
                if required == "corpus":
                    raise pytest.UsageError(corpus_problem)
                item.add_marker(pytest.mark.skip(reason=corpus_problem))
        for marker, wanted in ENVIRONMENTS.items():
            if marker not in item.keywords:
                continue
            if not checked:
                installed, checked = _installed_transformers(), True
            if installed == wanted:
                continue
            message = f"needs transformers {wanted} with torch (found {installed or 'none'})"
            if required == marker:
                raise pytest.UsageError(message)
            item.add_marker(pytest.mark.skip(reason=message))
