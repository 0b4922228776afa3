"""Shared test configuration.

Acceptance tests need a particular transformers release with torch. Outside their nox session they are skipped;
inside it (SDPA_PORT_REQUIRE set) a missing environment is an error, so CI cannot pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

ENVIRONMENTS = {"tf440": "4.40.2", "tf523": "5.23.0"}


def _installed_transformers() -> str | None:
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        return None
    from importlib.metadata import version

    return version("transformers")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    required = os.environ.get("SDPA_PORT_REQUIRE")
    installed = None
    checked = False
    for item in items:
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
