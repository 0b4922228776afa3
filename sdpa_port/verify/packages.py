"""The transformers package a modeling file is loaded in, chosen by its folder or by its relative imports.

A file's relative imports resolve inside the package it is loaded in: `...modeling_utils` needs a package two levels
below `transformers` (any `transformers.models.<model>`), `.configuration_blip` the package that has that sibling,
`....utils` one under `models/deprecated/`. The package its folder names (or, for a lone file, its name) is taken when
the installed transformers has it and it has what the imports need. Else the file is placed by its imports: a copy of
`blip/modeling_blip_text.py` made elsewhere goes in `transformers.models.blip`, the one package with a
`configuration_blip` module. Nothing is imported here; the installed package is read from its folder.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path


class NoPackage(ImportError):
    """No package of the installed transformers can hold the file; the message says what it needs."""


@dataclass(frozen=True)
class RelativeImport:
    level: int  # the number of leading dots
    module: str | None  # what follows them, dotted

    def __str__(self) -> str:
        return "." * self.level + (self.module or "")


def package_for(named: str, source: str, path: Path) -> str:
    """The package to load `source` in, `named` when it fits, else one that its imports fit."""
    root = transformers_root()
    if root is None:
        raise NoPackage("transformers is not installed")
    imports = relative_imports(source)
    real = is_package(root, named)
    if real and not unmet(root, named, imports):
        return named
    fitting = [package for package in model_packages(root) if not unmet(root, package, imports)]
    if fitting:
        return _by_name(fitting, path)
    if real:
        return named  # nothing fits better: loading reports what is missing, as it always has
    needs = ", ".join(f"`{i}`" for i in imports) or "nothing"
    raise NoPackage(
        f"{path}: no package of the installed transformers to load it in: {named} is not one, and none has what its "
        f"relative imports need ({needs})"
    )


def transformers_root() -> Path | None:
    """The folder of the transformers package this Python would import, or None."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def relative_imports(source: str) -> list[RelativeImport]:
    """The relative imports the file needs, in order: all but those a `try` statement guards."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # loading it reports the error
    tries = [statement for statement in ast.walk(tree) if isinstance(statement, ast.Try)]
    guarded = {id(node) for statement in tries for node in ast.walk(statement)}
    found: list[RelativeImport] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in guarded:
            found.append(RelativeImport(node.level, node.module))
    return sorted(set(found), key=found.index)


def unmet(root: Path, package: str, imports: list[RelativeImport]) -> list[RelativeImport]:
    """The imports that would not resolve inside `package` of the transformers installed at `root`."""
    parts = package.split(".")
    missing = []
    for item in imports:
        kept = len(parts) - item.level + 1
        target = parts[:kept] + (item.module.split(".") if item.module else [])
        if kept < 1 or not is_module(root, ".".join(target)):
            missing.append(item)
    return missing


def is_module(root: Path, dotted: str) -> bool:
    """Whether `dotted` names a module or package of the transformers installed at `root`."""
    head, *rest = dotted.split(".")
    if head != "transformers":
        return False
    path = root.joinpath(*rest)
    return (path / "__init__.py").is_file() or (bool(rest) and path.with_suffix(".py").is_file())


def is_package(root: Path, dotted: str) -> bool:
    head, *rest = dotted.split(".")
    return head == "transformers" and (root.joinpath(*rest) / "__init__.py").is_file()


def model_packages(root: Path) -> list[str]:
    """Every model package of the installed transformers, those under `models/deprecated/` too, sorted."""
    models = root / "models"
    names = [init.parent.name for init in models.glob("*/__init__.py")]
    found = [f"transformers.models.{name}" for name in names if name != "deprecated"]
    found += [f"transformers.models.deprecated.{p.parent.name}" for p in models.glob("deprecated/*/__init__.py")]
    return sorted(found)


def _by_name(packages: list[str], path: Path) -> str:
    """The fitting package the file's name begins with, the longest, else the first.

    `modeling_blip_text` begins with blip.
    """
    stem = path.stem.removeprefix("modeling_").removeprefix("modular_")
    named = [p for p in packages if stem == p.rsplit(".", 1)[1] or stem.startswith(p.rsplit(".", 1)[1] + "_")]
    return max(named, key=lambda p: len(p.rsplit(".", 1)[1])) if named else packages[0]
