"""Load a modeling file, ported or not, as a module of the installed transformers package."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def package_of(model_dir_name: str) -> str:
    return f"transformers.models.{model_dir_name}"


def load_in_package(path: Path, package: str, alias: str | None = None) -> ModuleType:
    """Execute `path` as `<package>.<alias>` so its relative imports resolve inside transformers."""
    importlib.import_module(package)
    source = Path(path).read_bytes()
    alias = alias or f"{Path(path).stem}_sdpa_port_{hashlib.sha1(source).hexdigest()[:10]}"
    name = f"{package}.{alias}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    module.__sdpa_port_source__ = source.decode("utf-8")  # type: ignore[attr-defined]  # its file may go first
    return module


def source_of(module: ModuleType) -> str:
    """The text a module was loaded from, kept beside it: a verification's temporary file may be gone."""
    kept = getattr(module, "__sdpa_port_source__", None)
    return kept if kept is not None else Path(str(module.__file__)).read_text(encoding="utf-8")


def load_source_in_package(source: str, package: str, directory: Path, stem: str) -> ModuleType:
    """Write `source` under `directory` and load it inside `package`."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:10]
    path = Path(directory) / f"{stem}_{digest}.py"
    path.write_text(source, encoding="utf-8")
    return load_in_package(path, package, alias=path.stem)
