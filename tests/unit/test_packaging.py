"""A non-editable install must carry every subpackage and declare every package it imports.

`pip install .` is the README's first command: what it installs must be enough for the tool without the extras.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "sdpa_port").rglob("__init__.py")
    }
    assert on_disk - listed == set(), f"packages missing from pyproject.toml: {sorted(on_disk - listed)}"


# imported only by the checks and the benchmark (sdpa_port/verify, sdpa_port/bench), which the extras bring
OPTIONAL = {"torch", "transformers", "matplotlib", "executorch"}
OPTIONAL_HOMES = ("verify", "bench")


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level names of the absolute imports outside the standard library, each with the modules importing it."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != root.name:
                    found.setdefault(top, set()).add(path.relative_to(root).as_posix())
    return found


def test_every_third_party_import_is_declared() -> None:
    """What the package imports, wherever the import stands, is in `dependencies`; torch, transformers, matplotlib
    and executorch only under verify/ and bench/, whose users install the extras."""
    declared = {
        _requirement_name(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    }
    distributions = importlib.metadata.packages_distributions()
    undeclared = []
    for name, importers in sorted(third_party_imports(ROOT / "sdpa_port").items()):
        if name in OPTIONAL:
            outside = sorted(i for i in importers if i.split("/")[0] not in OPTIONAL_HOMES)
            if outside:
                undeclared.append(f"{name} (optional) imported outside {'/, '.join(OPTIONAL_HOMES)}/: {outside}")
            continue
        providers = {_requirement_name(d) for d in distributions.get(name, [name])}
        if not providers & declared:
            undeclared.append(f"{name} (from {', '.join(sorted(providers))}) imported by {sorted(importers)}")
    assert not undeclared, "imports not declared in pyproject.toml's dependencies:\n" + "\n".join(undeclared)
