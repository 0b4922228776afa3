"""What `sdpa-port bench TARGET` measures: the target resolved, and ported in memory when needed.

No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sdpa_port.api import port_source
from sdpa_port.discover.release import target_release
from sdpa_port.edge.files import InputError, installed_transformers, read_source, resolve_model_name
from sdpa_port.result import Status


class TargetError(Exception):
    """A target that cannot be benchmarked, reported as one line."""


@dataclass(frozen=True)
class Prepared:
    source_path: Path  # the file the user named (or the model name resolved)
    module: str | None  # set when the file is imported as installed (it already supports SDPA)
    path: Path | None  # set when a file is loaded inside `package` (a port written by the bench, or a user file)
    package: str
    ported_here: bool  # True when the bench ported the file in memory
    detail: str

    def describe(self) -> dict[str, object]:
        return {
            "source": str(self.source_path),
            "module": self.module,
            "loaded_from": str(self.path) if self.path else None,
            "package": self.package,
            "ported_by_bench": self.ported_here,
            "detail": self.detail,
        }


def transformers_root() -> Path | None:
    root = installed_transformers()
    return root.resolve() if root is not None else None


def installed_module_name(path: Path, root: Path | None) -> str | None:
    """`.../transformers/models/bert/modeling_bert.py` -> `transformers.models.bert.modeling_bert` when installed."""
    if root is None:
        return None
    try:
        relative = path.resolve().relative_to(root)
    except ValueError:
        return None
    return ".".join(("transformers", *relative.with_suffix("").parts))


def guess_package(path: Path, root: Path | None, explicit: str | None = None) -> str:
    """The transformers package a loose modeling file belongs in, so its relative imports resolve.

    `modeling_bert_sdpa.py` -> `transformers.models.bert`: the longest underscore prefix of the name after
    `modeling_` that is a model directory of the installed transformers.
    """
    if explicit:
        return explicit
    if root is None:
        raise TargetError("transformers is not installed")
    module = installed_module_name(path, root)
    if module is not None:
        return module.rsplit(".", 1)[0]
    stem = path.stem
    if not stem.startswith("modeling_"):
        raise TargetError(f"{path}: cannot tell which transformers model it belongs to; give --package")
    words = stem[len("modeling_") :].split("_")
    for end in range(len(words), 0, -1):
        name = "_".join(words[:end])
        if (root / "models" / name / "__init__.py").exists():
            return f"transformers.models.{name}"
    raise TargetError(f"{path}: no transformers model directory matches its name; give --package")


def resolve(target: str) -> Path:
    path = Path(target)
    if path.is_file():
        return path
    if path.exists():
        raise TargetError(f"{target}: give one modeling file or a model name, not a directory")
    found = resolve_model_name(target)
    if found is None:
        raise TargetError(f"{target}: no such file or model name in the installed transformers")
    return found.path


def prepare(target: str, out_dir: Path, package: str | None = None) -> Prepared:
    """Resolve `target`; a file without SDPA support is ported and the port written to `out_dir`."""
    path = resolve(target)
    try:
        source = read_source(path)
    except InputError as error:
        raise TargetError(str(error)) from None
    root = transformers_root()
    chosen = guess_package(path, root, package)
    try:
        result = port_source(source, filename=path.name, release=target_release(path))
    except ImportError as error:  # a style whose planner is not available in this checkout
        raise TargetError(f"{path}: cannot port: {error}") from None
    if result.status is Status.PORTED:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = out_dir / f"{path.stem}_sdpa_port.py"
        written.write_text(result.source, encoding="utf-8")
        return Prepared(path, None, written, chosen, True, f"ported here: {result.detail}")
    if result.status is Status.UNCHANGED and result.detail == "already supports SDPA":
        module = installed_module_name(path, root)
        if module is not None and package is None:
            return Prepared(path, module, None, chosen, False, "already supports SDPA (installed module)")
        return Prepared(path, None, path, chosen, False, "already supports SDPA")
    reasons = "; ".join(result.reasons) or result.detail
    raise TargetError(f"{path}: nothing to benchmark ({result.status.value}: {reasons})")
