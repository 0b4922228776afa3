"""Trees of transformers modeling files read out of a release wheel, for the corpus tests and benchmarks.

A wheel is a zip file: nothing is installed or imported. The tree also holds the release's own sources the port
reads its facts from (`discover/release.py`: the package's `__init__.py`, its attention integrations, the paged
cache), so a file of the tree is ported for its release. An extracted tree is cached beside the wheel's cache and
reused while the wheel is unchanged; it is written into a temporary folder first and renamed into place, so a cache
is either complete or absent.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from sdpa_port.discover.release import SOURCES
from sdpa_port.edge.files import is_pytorch_modeling_file

PACKAGE = "transformers/"
MODELS = PACKAGE + "models/"
STAMP = ".sdpa-port-tree.json"
LAYOUT = 2  # what an extracted tree holds: 2, the release's sources beside the modeling files


class WheelError(Exception):
    """No usable wheel: missing, unreadable, or without modeling files."""


def wheel_path(directory: Path, version: str) -> Path:
    return directory / f"transformers-{version}-py3-none-any.whl"


def modeling_members(wheel: Path, modular: bool = False) -> list[str]:
    """The paths of the wheel's PyTorch modeling files, sorted, its modular files too when asked."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as error:
        raise WheelError(f"{wheel}: cannot read the wheel ({error})") from None
    out = []
    for name in names:
        if not name.startswith(MODELS):
            continue
        path = PurePosixPath(name)
        if is_pytorch_modeling_file(Path(path.name)) and (modular or path.name.startswith("modeling_")):
            out.append(name)
    if not out:
        raise WheelError(f"{wheel}: no modeling files under {MODELS}")
    return sorted(out)


def release_members(wheel: Path) -> list[str]:
    """Paths in the wheel of the release's sources its facts are read from (those it has)."""
    with zipfile.ZipFile(wheel) as archive:
        present = set(archive.namelist())
    return [PACKAGE + source for source in SOURCES if PACKAGE + source in present]


def extract_tree(wheel: Path, cache: Path, modular: bool = False) -> Path:
    """The cached tree `<cache>/<wheel stem>[-modular]/transformers/models/...`; its root is returned."""
    if not wheel.is_file():
        raise WheelError(f"{wheel}: no such wheel")
    stat = wheel.stat()
    stamp = {"wheel": wheel.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "modular": modular, "layout": LAYOUT}
    root = cache / (wheel.stem + ("-modular" if modular else ""))
    if _stamp(root) == stamp:
        return root
    members = modeling_members(wheel, modular) + release_members(wheel)
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=cache))
    try:
        with zipfile.ZipFile(wheel) as archive:
            for member in members:
                archive.extract(member, staging)
        (staging / STAMP).write_text(json.dumps(stamp), encoding="utf-8")
        if root.exists():
            shutil.rmtree(root)
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root


def copy_tree(root: Path, destination: Path) -> Path:
    """A writable copy of an extracted tree, for a run that ports in place.

    The copy holds the tree's `transformers/models` part and the release's own sources."""
    shutil.copytree(root / MODELS, destination / MODELS)
    for source in SOURCES:
        if (root / PACKAGE / source).is_file():
            (destination / PACKAGE / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / PACKAGE / source, destination / PACKAGE / source)
    return destination


def _stamp(root: Path) -> dict[str, object] | None:
    try:
        return json.loads((root / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
