"""The transformers release a port targets, read from that release's own source: what its implementations read.

A port hands the attention implementations only what the release's implementations read, and sets a flag only
where the release makes it true. Those are facts of the release, read here from its source text (nothing is
imported): `release_facts` parses the texts, `read_release` reads them from a package folder, `target_release`
finds the package a file will run in (the one it sits in, a checkout's `src/transformers`, else the installed one).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

# the release's sources read, relative to its package folder (`transformers/`)
INIT = "__init__.py"
SDPA = "integrations/sdpa_attention.py"
FLEX = "integrations/flex_attention.py"
PAGED_CACHE = "generation/continuous_batching/cache.py"
# `ALL_ATTENTION_FUNCTIONS`' own mapping: the implementations the release offers by name
MODELING_UTILS = "modeling_utils.py"
# the implementations continuous batching runs (`paged|sdpa`, `paged|eager`, `paged|flash...`) beside sdpa's
PAGED_IMPLEMENTATIONS = ("integrations/sdpa_paged.py", "integrations/eager_paged.py", "integrations/flash_paged.py")
SOURCES = (INIT, SDPA, FLEX, PAGED_CACHE, *PAGED_IMPLEMENTATIONS, MODELING_UTILS)

PAGED_CACHE_CLASS = "PagedAttentionCache"
# the keyword continuous batching hands a model its paged cache by (`PagedAttentionArgs.cache`, every 5.x release)
PAGED_CACHE_KEYWORD = "cache"

ATTENTION_INTERFACE = "AttentionInterface"  # the class of `ALL_ATTENTION_FUNCTIONS`, its `_global_mapping`
FLASH_ATTENTION = "flash_attention_2"


@dataclass(frozen=True)
class Release:
    """What a transformers release's attention machinery does, as its source says."""

    version: str | None
    # `sdpa_attention_forward` / `flex_attention_forward` apply an additive `position_bias` keyword (5.17.0 on)
    sdpa_position_bias: bool
    flex_position_bias: bool
    # the paged cache of continuous batching is updated by the attention modules of the model (`cache.update(...,
    # kwargs=kwargs)`, 5.25.0) rather than inside the implementations, which read it from their keywords
    model_updates_paged_cache: bool
    # the parameters of `PagedAttentionCache.update` after the layer index (`("kwargs",)` in 5.25.0)
    paged_update_parameters: tuple[str, ...]
    # the methods a paged cache has: a model reaching it through its own cache parameter may call only these
    paged_cache_methods: frozenset[str]
    # `ALL_ATTENTION_FUNCTIONS` maps "flash_attention_2" to an implementation (every 5.x release)
    offers_flash: bool = False


def release_facts(sources: Mapping[str, str]) -> Release:
    """The facts of a release from its sources (keys as in SOURCES; a missing one is a release without it)."""
    trees = {name: _parse(text) for name, text in sources.items()}
    init = sources.get(INIT)
    update, methods = _paged_cache(trees.get(PAGED_CACHE))
    updating = [tree for name in (SDPA, *PAGED_IMPLEMENTATIONS) if (tree := trees.get(name)) is not None]
    return Release(
        version=_version(init) if init is not None else None,
        sdpa_position_bias=_reads_keyword(trees.get(SDPA), "sdpa_attention_forward", "position_bias"),
        flex_position_bias=_reads_keyword(trees.get(FLEX), "flex_attention_forward", "position_bias"),
        model_updates_paged_cache=bool(methods) and not any(_calls_update(tree) for tree in updating),
        paged_update_parameters=update,
        paged_cache_methods=methods,
        offers_flash=FLASH_ATTENTION in _global_mapping(trees.get(MODELING_UTILS)),
    )


def read_release(package: Path) -> Release:
    """The facts of the release whose package folder (`.../transformers`) is `package`."""
    sources: dict[str, str] = {}
    for name in SOURCES:
        try:
            sources[name] = (package / name).read_text(encoding="utf-8")
        except OSError:
            continue
    return release_facts(sources)


def target_release(path: Path | None) -> Release | None:
    """The release a modeling file at `path` will run in: the transformers package it sits in (an installed one, a
    checkout's `src/transformers`, a tree read out of a wheel), else the installed package; None when there is
    none (the port then takes the form exact in every release)."""
    package = _enclosing_package(path) if path is not None else None
    if package is None:
        package = installed_package()
    return _read_once(package) if package is not None else None


@functools.lru_cache(maxsize=8)
def _read_once(package: Path) -> Release:
    """`read_release`, once per package in a process (a batch ports hundreds of files of one release)."""
    return read_release(package)


def installed_package() -> Path | None:
    """The folder of the installed `transformers` package, found without importing it (nor torch)."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder if (folder / INIT).is_file() else None


def _enclosing_package(path: Path) -> Path | None:
    for parent in path.resolve().parents:
        if parent.name == "transformers" and (parent / INIT).is_file() and (parent / "models").is_dir():
            return parent
    return None


# ------------------------------------------------------------------ reading the sources


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _version(init: str) -> str | None:
    tree = _parse(init)
    for node in tree.body if tree is not None else ():
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def _function(tree: ast.Module | None, name: str) -> ast.FunctionDef | None:
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _reads_keyword(tree: ast.Module | None, function: str, keyword: str) -> bool:
    """The module-level `function` takes `keyword` (a parameter its body reads, or `kwargs.get/pop("keyword")`,
    `kwargs["keyword"]` of its `**kwargs`)."""
    found = _function(tree, function)
    if found is None:
        return False
    args = found.args
    parameters = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    star = args.kwarg.arg if args.kwarg is not None else None
    for node in ast.walk(found):
        if keyword in parameters and isinstance(node, ast.Name) and node.id == keyword and isinstance(node.ctx, ast.Load):
            return True
        if star is None:
            continue
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == star
            and node.args
            and _is_string(node.args[0], keyword)
        ):
            return True
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == star
            and _is_string(node.slice, keyword)
        ):
            return True
    return False


def _is_string(node: ast.expr, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def _paged_cache(tree: ast.Module | None) -> tuple[tuple[str, ...], frozenset[str]]:
    """`PagedAttentionCache.update`'s parameters after the layer index, and the class's methods."""
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == PAGED_CACHE_CLASS:
            methods = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
            update = methods.get("update")
            names = [a.arg for a in [*update.args.posonlyargs, *update.args.args]] if update is not None else []
            after = names[names.index("layer_idx") + 1 :] if "layer_idx" in names else []
            return tuple(after), frozenset(methods)
    return (), frozenset()


def _global_mapping(tree: ast.Module | None) -> frozenset[str]:
    """The string keys of `AttentionInterface._global_mapping`: what `ALL_ATTENTION_FUNCTIONS` offers by name."""
    for node in tree.body if tree is not None else ():
        if not (isinstance(node, ast.ClassDef) and node.name == ATTENTION_INTERFACE):
            continue
        for item in node.body:
            if not isinstance(item, (ast.Assign, ast.AnnAssign)):
                continue
            target = item.target if isinstance(item, ast.AnnAssign) else item.targets[0] if len(item.targets) == 1 else None
            if isinstance(target, ast.Name) and target.id == "_global_mapping" and isinstance(item.value, ast.Dict):
                keys = item.value.keys
                return frozenset(k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return frozenset()


def _calls_update(tree: ast.Module) -> bool:
    """Some function of the module calls `<x>.update(...)` with keys and values (an implementation updating the
    cache it is handed), rather than a dict's `update` of one mapping."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
            and len(node.args) + len(node.keywords) >= 2
        ):
            return True
    return False


__all__ = ["PAGED_CACHE_KEYWORD", "Release", "read_release", "release_facts", "target_release"]
