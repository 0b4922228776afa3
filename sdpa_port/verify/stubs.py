"""Load a file whose own package cannot be imported here, with stand-ins for what it imports from that package.

Imports torch only through the file it loads.

Remote code imports its own package (`from .utils import to_2tuple`, `from modelscope.models.base import Model`);
neither the package nor its dependencies are installed where a port is verified. Its attention classes, though,
usually need torch alone. The file is then executed as a module of a package of its own, and every import it makes
outside a `try` block that this Python cannot satisfy (its relative imports, absolute imports of missing top-level
packages) gets a stand-in module. A name taken from a stand-in is a class that can be subclassed and instantiated,
and whose instances fail on any use once the file has loaded: a check that reaches one raises, and reports the class
as not verified, never as a pass. While the file loads, the registries and constants of the missing package
(`@MODELS.register_module(module_name=Models.bert)`) give values that decorate by giving back what they decorate. Imports inside a `try` block stay real, so an optional fast path (xformers) is never taken by a stand-in.
Original and port are loaded with the same stand-ins.

Where the file's folder is known (`origin`), a relative import naming a file that sits there (`from .configuration
import T5Config`, `from ..utils import to_2tuple`) runs that file in its stand-in module: what it defines is real
(the config class the attention reads), its own missing imports stand in, and what it fails to define stands in too.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Sequence

PACKAGE = "_sdpa_port_stubbed"
DEPTH = 6  # package levels above the file: room for `from ......utils import x`


class StubUsed(RuntimeError):
    """A stand-in for an import this Python cannot satisfy was used."""


_loading = [0]  # files being executed by `load_with_stand_ins`: while one is, attributes of stand-ins can decorate


class _StandValue:
    """An attribute of a stand-in class (`MODELS.register_module`, `Tasks.backbone`), reached while the file loads.

    Registries and constants of the missing package decorate the file's classes as it loads
    (`@MODELS.register_module(module_name=Models.bert)`): while a file loads, calling one gives another value, and
    calling one on a class or function alone gives it back, as a registering decorator does. Once loaded, any call or
    attribute of one fails like a stand-in instance."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _loading[0]:
            raise StubUsed(f"{self._name} stands in for an import this Python cannot satisfy")
        if len(args) == 1 and not kwargs and (isinstance(args[0], type) or callable(args[0])):
            return args[0]
        return _StandValue(f"{self._name}(...)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or not _loading[0]:
            raise StubUsed(f"{self._name}.{name} stands in for an import this Python cannot satisfy")
        return _StandValue(f"{self._name}.{name}")


class _StandType(type):
    """The type of stand-in classes: their class attributes are `_StandValue`s while the file loads. Classes of the
    file subclassing a stand-in keep Python's lookup (a missing attribute is an AttributeError)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") or not cls.__dict__.get("_sdpa_port_stand_in", False):
            raise AttributeError(name)
        if not _loading[0]:
            missing = _missing(cls)
            raise StubUsed(f"{cls.__qualname__}.{name} stands in for an import this Python cannot satisfy{missing}")
        return _StandValue(f"{cls.__qualname__}.{name}")


def _missing(cls: type) -> str:
    """The package a stand-in class stands in for, said where it is not the file's own (`megatron_util`, whose `mpu`
    gives Megatron's parallel layers: a world size of 1 alone would leave them standing in)."""
    module = getattr(cls, "__module__", "") or ""
    if not module or module.startswith(PACKAGE):
        return ""
    return f" (`{module}.{cls.__qualname__}`: `{module.split('.')[0]}` is not installed here)"


class _Stand(metaclass=_StandType):
    """The base of every stand-in class: it can be subclassed and built; its instances fail when used once the file
    has loaded, and act as `_StandValue`s while it loads (`MODELS = Registry("models")`, then
    `@MODELS.register_module()`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _StandValue(type(self).__qualname__)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(_StandValue(type(self).__qualname__), name)


class StandInModule(ModuleType):
    """A module whose every attribute is a stand-in class (a package too: its submodules are stand-ins)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _StandType(name, (_Stand,), {"__module__": self.__name__, "_sdpa_port_stand_in": True})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on `sys.meta_path`: stands in for the names given, and for anything under the stand-in package."""

    def __init__(self, tops: frozenset[str], folders: dict[str, Path] | None = None) -> None:
        self.tops = set(tops)
        self.folders = folders or {}  # stand-in package -> the folder on disk its relative imports name
        self.made: list[str] = []  # the stand-in modules made, taken out of `sys.modules` again after loading

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        top = fullname.split(".")[0]
        if top in self.tops or fullname.startswith(PACKAGE + "."):
            sibling = self._sibling(fullname)
            if sibling is not None:
                return importlib.machinery.ModuleSpec(fullname, self, origin=str(sibling), is_package=True)
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def _sibling(self, fullname: str) -> Path | None:
        """The file a relative import names where the loaded file's folder is known (`.configuration` beside it)."""
        package, _, name = fullname.rpartition(".")
        folder = self.folders.get(package)
        if folder is None:
            return None
        candidate = folder / f"{name}.py"
        return candidate if candidate.is_file() else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        self.made.append(spec.name)
        return StandInModule(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        """A sibling file on disk runs in its stand-in module: what it defines is real, the rest stands in, and a
        sibling that fails part-way keeps what it defined before (a config class, usually first)."""
        spec = module.__spec__
        if spec is None or spec.origin is None:
            return
        source = Path(spec.origin).read_text(encoding="utf-8")
        self.tops.update(missing_imports(source)[0])
        module.__file__ = spec.origin
        module.__package__ = module.__name__.rpartition(".")[0]
        with contextlib.suppress(Exception):
            exec(compile(source, spec.origin, "exec"), module.__dict__)


def imported_tops(tree: ast.AST, skip: frozenset[int] = frozenset()) -> tuple[list[str], bool]:
    """The top-level packages of the absolute imports in `tree`, in order, and whether it has relative imports; nodes
    whose `id` is in `skip` are passed by."""
    tops: list[str] = []
    relative = False
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                relative = True
                continue
            names = [node.module or ""]
        for name in names:
            top = name.split(".")[0]
            if top and top not in tops:
                tops.append(top)
    return tops, relative


def missing_imports(source: str) -> tuple[list[str], bool]:
    """The top-level packages the file imports outside `try` blocks that this Python cannot import, and whether it
    has relative imports there."""
    tree = ast.parse(source)
    guarded = frozenset(
        id(node) for statement in ast.walk(tree) if isinstance(statement, ast.Try) for node in ast.walk(statement)
    )
    tops, relative = imported_tops(tree, guarded)
    return [top for top in tops if importlib.util.find_spec(top) is None], relative


def guarded_import(source: str, name: str) -> str | None:
    """The module a file imports `name` from inside a `try` block, where this Python cannot import it; or None.

    Such imports stay real (no stand-in takes an optional path), so a class using the name fails with a NameError
    where its package is missing: the reason says which package."""
    for statement in ast.walk(ast.parse(source)):
        if not isinstance(statement, ast.Try):
            continue
        for node in (n for part in statement.body for n in ast.walk(part)):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if any((alias.asname or alias.name) == name for alias in node.names):
                    top = node.module.split(".")[0]
                    return node.module if importlib.util.find_spec(top) is None else None
    return None


def explained(reason: object, source: str) -> str:
    """A failure's text, with the missing package named where it is a name the file imports inside a `try` block."""
    text = str(reason)
    found = re.match(r"name '(\w+)' is not defined", text)
    module = guarded_import(source, found.group(1)) if found else None
    if module is None:
        return text
    top = module.split(".")[0]
    return f"{text}: the file imports it from `{module}` inside a try block, and `{top}` is not installed here"


@contextlib.contextmanager
def stand_ins(tops: Sequence[str], folders: dict[str, Path] | None = None) -> Iterator[None]:
    finder = _Finder(frozenset(tops), folders)
    sys.meta_path.append(finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in finder.made:  # later imports of those names fail as they would have
            if not name.startswith(PACKAGE + "."):
                sys.modules.pop(name, None)


def load_with_stand_ins(source: str, directory: Path, stem: str, origin: Path | None = None) -> ModuleType:
    """Execute `source` as a module of a package of its own, missing imports standing in (module docstring).

    `origin`: the folder the file sits in, where its relative imports name files of its package that exist there
    (`from .configuration import T5Config`): those files run in their stand-in modules (`_Finder.exec_module`)."""
    tops, _ = missing_imports(source)
    # the folder too: its siblings are modules of this package, never of one loaded from another folder
    digest = hashlib.sha1(f"{origin}\n{source}".encode()).hexdigest()[:10]
    # a package per file: its relative imports (`.utils`, `..layers`) land in stand-in modules under it
    parts = [PACKAGE, f"{stem}_{digest}", *(f"level{depth}" for depth in range(DEPTH))]
    for end in range(1, len(parts) + 1):
        name = ".".join(parts[:end])
        if name not in sys.modules:
            holder = ModuleType(name)
            holder.__path__ = []
            sys.modules[name] = holder
    package = ".".join(parts)
    folders: dict[str, Path] = {}
    if origin is not None:  # level5 is the file's folder, level4 its parent, and so on while there are parents
        above = [Path(origin), *Path(origin).parents]
        for depth in range(DEPTH):
            if DEPTH - 1 - depth < len(above):
                folders[".".join(parts[: 3 + depth])] = above[DEPTH - 1 - depth]
    path = Path(directory) / f"{stem}_{digest}.py"
    path.write_text(source, encoding="utf-8")
    name = f"{package}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package
    sys.modules[name] = module
    with stand_ins(tops, folders):
        _loading[0] += 1
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        finally:
            _loading[0] -= 1
    module.__sdpa_port_source__ = source  # type: ignore[attr-defined]
    return module


__all__ = ["imported_tops", "load_with_stand_ins", "missing_imports", "StubUsed", "StandInModule"]
