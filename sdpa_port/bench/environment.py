"""Facts about the machine and the libraries a run used, for the JSON and the docs.

No torch import.
"""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any


def cpu_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"logical_cpus": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return facts | {"model_name": platform.processor() or "unknown"}
    first = text.split("\n\n", 1)[0]
    for line in first.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "cpu family", "model", "vendor_id"):
            facts[key.replace(" ", "_")] = value
    return facts


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def describe(threads: int) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "sdpa_port": package_version("sdpa-port"),
        "cpu": cpu_facts(),
        "threads": threads,
        "load_average_at_start": load_average(),
    }
