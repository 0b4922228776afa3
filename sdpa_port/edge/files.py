"""File-system edge: reading inputs safely, finding modeling files, writing atomically."""

from __future__ import annotations

import ast
import errno
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sdpa_port.discover.screen import screen
from sdpa_port.edge.modular_step import generated_from_modular


class InputError(Exception):
    """Bad input, reported as one line with exit code 2."""


@dataclass(frozen=True)
class Target:
    path: Path
    # set when the target was given as a model name and resolved inside the installed transformers
    model: str | None = None
    # named by the user (not found by walking a directory): a file that is not a modeling file is an error
    explicit: bool = True


def read_source(path: Path) -> str:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory")
    data = path.read_bytes()
    if not data.strip():
        raise InputError(f"{path}: empty file")
    if b"\x00" in data:
        raise InputError(f"{path}: binary file, not Python source")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 ({error.reason} at byte {error.start})") from None


def is_pytorch_modeling_file(path: Path) -> bool:
    name = path.name
    if not (name.startswith("modeling_") or name.startswith("modular_")) or path.suffix != ".py":
        return False
    stem = path.stem
    return not (stem.startswith("modeling_tf_") or stem.startswith("modeling_flax_"))


def discover(paths: list[Path]) -> list[Target]:
    """Expand directories into their PyTorch modeling and modular files, sorted; files are taken as given.

    A directory holding a remote-code model (a `config.json` with an `auto_map`) also yields the modules the map names
    (`modelling_RW.py`) and the modules they import from their own directory (`attention.py`, `blocks.py`), where those
    define PyTorch code. A file reached twice (named and inside a named directory) is processed once, where it first
    appears; so is a modular file and the modeling file generated from it (either is ported through the generated file,
    and the port carried back into the modular one).
    """
    out: list[Target] = []
    for path in paths:
        if path.is_dir():
            named = {p for p in path.rglob("mod*_*.py") if is_pytorch_modeling_file(p) and p.is_file()}
            found = sorted(named | followed_modules(path))
            if not found:
                raise InputError(f"{path}: no PyTorch modeling files (modeling_*.py) in this directory")
            out.extend(Target(p, explicit=False) for p in found)
        elif path.exists():
            out.append(Target(path))
        else:
            resolved = resolve_model_name(str(path))
            if resolved is None:
                raise InputError(f"{path}: no such file, directory or model name in the installed transformers")
            out.append(resolved)
    seen: set[Path] = set()
    unique: list[Target] = []
    for target in out:
        key = (generated_from_modular(target.path) or target.path).resolve()
        if key not in seen:
            seen.add(key)
            unique.append(target)
    return unique


def followed_modules(directory: Path) -> set[Path]:
    """The PyTorch modules of the remote-code models under `directory`.

    Those each `config.json`'s `auto_map` names and, transitively, the modules they import from their own directory
    (`from .attention import ...`).
    """
    pending: list[Path] = []
    for config in directory.rglob("config.json"):
        for module in _auto_map_modules(config):
            candidate = config.parent / f"{module}.py"
            if candidate.is_file():
                pending.append(candidate)
    seen: set[Path] = set()
    out: set[Path] = set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        tree = _parsed(current)
        if tree is None:
            continue
        if screen(tree).modeling:
            out.add(current)
        for name in _sibling_imports(tree):
            sibling = current.parent / f"{name}.py"
            if sibling.is_file():
                pending.append(sibling)
    return out


def _auto_map_modules(config: Path) -> set[str]:
    """`{"AutoModel": "modelling_RW.RWModel", "AutoTokenizer": ["tok.T", null]}` -> {"modelling_RW", "tok"}."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return set()
    mapping = data.get("auto_map") if isinstance(data, dict) else None
    if not isinstance(mapping, dict):
        return set()
    out: set[str] = set()
    for value in mapping.values():
        for reference in value if isinstance(value, list) else [value]:
            if isinstance(reference, str) and "." in reference:
                module = reference.split("--")[-1].rsplit(".", 1)[0]  # "repo--module.Class" names another repo's
                if module.isidentifier():
                    out.add(module)
    return out


def _parsed(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None


def _sibling_imports(tree: ast.Module) -> set[str]:
    """The modules of its own directory that a file imports.

    `from .attention import x`, `from . import blocks`.
    """
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is not None:
                out.add(node.module.split(".")[0])
            else:
                out.update(alias.name for alias in node.names)
    return out


def resolve_model_name(name: str) -> Target | None:
    """`bert` -> the installed `transformers/models/bert/modeling_bert.py`, found without importing transformers."""
    root = installed_transformers() if name.replace("_", "").isalnum() else None
    if root is None:
        return None
    candidate = root / "models" / name / f"modeling_{name}.py"
    return Target(candidate, model=name) if candidate.exists() else None


def installed_transformers() -> Path | None:
    """The folder of the transformers package `import transformers` would load, found without importing it."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):  # a module in sys.modules without a spec
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def atomic_write(path: Path, text: str) -> None:
    """Write through a temporary file in the same directory, renamed into place.

    A link's target is written.
    """
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    directory = path.parent if str(path.parent) else Path(".")
    mode = path.stat().st_mode & 0o777 if path.exists() else None
    if mode is not None and not (mode & 0o222 and os.access(path, os.W_OK)):
        # a read-only file stays as it is, even for root (whom the rename below would let replace it)
        raise PermissionError(errno.EACCES, "read-only file", str(path))
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
