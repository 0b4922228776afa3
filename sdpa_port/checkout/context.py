"""Which Transformers checkout a file lives in, and what that checkout pins: the facts a port in it depends on.

A checkout is a directory with `src/transformers/` and `tests/models/` (a clone, or the source distribution with
the repository's tests laid over it). Reading it is the only I/O here; the parsing helpers are pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "src/transformers"
MODEL_TESTS = "tests/models"
CONVERTER = "utils/modular_model_converter.py"


@dataclass(frozen=True)
class Checkout:
    root: Path
    version: str | None  # transformers.__version__ of the tree
    ruff: str | None  # the ruff version setup.py pins (`make style` and `make quality` use it)
    ruff_config: Path | None  # the pyproject.toml ruff reads
    converter: Path | None  # utils/modular_model_converter.py, in clones of transformers >= 4.45

    def relative(self, path: Path) -> str:
        """`path` relative to the root, with `/` separators, as the copy checker names files."""
        return path.resolve().relative_to(self.root).as_posix()

    def model_tests(self, folder: str) -> Path:
        """The tests of a model folder such as `bert` or `deprecated.mctct`."""
        return model_tests_dir(self.root, folder)

    def tester_module(self, folder: str, model: str) -> Path:
        """The repository's own test file for a model.

        For example `tests/models/blip/test_modeling_blip_text.py`.
        """
        return self.model_tests(folder) / f"test_modeling_{model}.py"


def model_tests_dir(root: Path, folder: str) -> Path:
    """The folder of a model folder's tests under `<root>/tests/models`.

    `bert` has `bert`; `deprecated.mctct` lies in `deprecated/mctct`.
    """
    return root / MODEL_TESTS / folder.replace(".", "/")


def root_of(path: Path) -> Path | None:
    """`<root>` for a path inside `<root>/src/transformers/` when `<root>/tests/models` exists."""
    resolved = path.resolve()
    for parent in resolved.parents:
        if parent.name == "transformers" and parent.parent.name == "src":
            root = parent.parent.parent
            if (root / MODEL_TESTS).is_dir():
                return root
            return None
    return None


def find_checkout(path: Path) -> Checkout | None:
    root = root_of(path)
    if root is None:
        return None
    setup = _read(root / "setup.py")
    init = _read(root / PACKAGE / "__init__.py")
    pyproject = root / "pyproject.toml"
    converter = root / CONVERTER
    return Checkout(
        root=root,
        version=package_version(init) if init else None,
        ruff=pinned_version(setup, "ruff") if setup else None,
        ruff_config=pyproject if pyproject.is_file() else None,
        converter=converter if converter.is_file() else None,
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def pinned_version(setup_py: str, package: str) -> str | None:
    """The exact version setup.py pins for `package` in its `_deps` list, such as `"ruff==0.1.5"`."""
    found = re.search(rf"[\"']{re.escape(package)}==([0-9][^\"']*)[\"']", setup_py)
    return found.group(1) if found else None


def package_version(init_py: str) -> str | None:
    found = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", init_py, re.MULTILINE)
    return found.group(1) if found else None

