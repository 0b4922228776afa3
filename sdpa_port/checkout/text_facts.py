"""Facts read from a module's text: its top-level names, dicts of classes, imports and flags."""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

from sdpa_port.checkout import copies
from sdpa_port.checkout.tree import relative_module

FLAGS = (
    "_supports_sdpa",
    "_supports_flash_attn_2",
    "_supports_flash_attn",
    "_supports_flex_attn",
    "_supports_attention_backend",
)


@dataclass(frozen=True)
class Names:
    defined: frozenset[str]
    imported: frozenset[str]

    @property
    def all(self) -> frozenset[str]:
        return self.defined | self.imported


BUILTINS = frozenset(dir(builtins))


def top_level(text: str) -> Names:
    tree = ast.parse(text)
    defined: set[str] = set()
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    imported.update((a.asname or a.name).split(".")[0] for a in inner.names)
                elif isinstance(inner, (ast.ClassDef, ast.FunctionDef)):
                    defined.add(inner.name)
    return Names(frozenset(defined), frozenset(imported))


def names_used(code: str) -> set[str]:
    try:
        tree = ast.parse(copies.to_module(code))
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def sets_sdpa_flag(text: str) -> bool:
    return re.search(r"^\s+_supports_sdpa\s*=\s*True", text, re.MULTILINE) is not None


def gains_flag(code: str, copied: str) -> bool:
    """Whether the new code sets a capability flag to True that the copy does not set.

    The copy would then claim support.
    """
    for flag in FLAGS:
        pattern = rf"^\s+{flag}\s*=\s*True"
        if re.search(pattern, code, re.MULTILINE) and not re.search(pattern, copied, re.MULTILINE):
            return True
    return False


def dict_entries(text: str, name: str) -> dict[str, str] | None:
    """The entries of a top-level dict of names, or None.

    `NAME = {"eager": A, "sdpa": B}` -> {"eager": "A", "sdpa": "B"}.
    """
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [name]:
            if not isinstance(node.value, ast.Dict):
                return None
            entries = {}
            for key, value in zip(node.value.keys, node.value.values):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Name)):
                    return None
                entries[key.value] = value.id
            return entries
    return None


def dict_for(text: str, eager_class: str) -> str | None:
    """The top-level dict of this file whose "eager" entry is `eager_class`."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            entries = dict_entries(text, node.targets[0].id) if isinstance(node.value, ast.Dict) else None
            if entries and entries.get("eager") == eager_class:
                return node.targets[0].id
    return None


def absolute_import(text: str, path: str, name: str) -> str | None:
    """The absolute module a top-level `from ... import name` of the file at `path` imports `name` from."""
    package = relative_module(path)
    if package is None:
        return None
    parts = ["transformers", *package.split(".")[:-1]]
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            if node.level == 0:
                return node.module
            base = parts[: len(parts) - node.level + 1]
            return ".".join(base + ([node.module] if node.module else []))
    return None


def relative_to(module: str, path: str) -> tuple[int, str]:
    """How the file at `path` imports `module` relatively, as a level and a dotted name.

    `transformers.modeling_attn_mask_utils` from `models/clap/modeling_clap.py` -> (3, `modeling_attn_mask_utils`).
    """
    package = ["transformers", *(relative_module(path) or "").split(".")[:-1]]
    target = module.split(".")
    common = 0
    while common < min(len(package), len(target) - 1) and package[common] == target[common]:
        common += 1
    return len(package) - common + 1, ".".join(target[common:])


def definition_at(tree: ast.Module, line: int) -> tuple[str, str | None] | None:
    """The top-level name and the method name or None of the definition whose header is on `line`.

    `line` is 1-based.
    """
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.lineno == line:
                return node.name, None
            if isinstance(node, ast.ClassDef):
                for inner in node.body:
                    if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner.lineno == line:
                        return node.name, inner.name
    return None
