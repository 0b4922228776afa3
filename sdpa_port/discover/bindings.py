"""Every binding of a file, read in one `ast` walk: how often each name and attribute name is bound, what the imports
name, where the tests of branches lie, and the top-level definitions (`live.py` and `values.py` read them)."""

from __future__ import annotations

import ast
import collections
from dataclasses import dataclass
from typing import Iterator

SDPA = "scaled_dot_product_attention"


@dataclass(frozen=True)
class Bindings:
    """How often each name and each attribute name is bound anywhere in the file, read in one walk."""

    names: collections.Counter[str]  # assigned, deleted, imported, defined, a parameter, declared global
    attributes: collections.Counter[str]  # `x.attr = ...`, `del x.attr`, a class-body name, a method, `setattr`
    dynamic: bool  # `setattr(self, name, ...)` with a computed name, or `self.__dict__`: any attribute may be set
    # the tests of every `if` statement and conditional expression, with the top-level class they lie in
    tests: tuple[tuple[str | None, ast.expr], ...]
    calls_sdpa: bool  # some call is of a `scaled_dot_product_attention`, as a name or an attribute
    imports: dict[str, str]  # a name bound by a top-level import -> the dotted module or object it names
    definitions: Definitions  # the file's top-level classes, functions and statements

    @classmethod
    def of(cls, tree: ast.Module) -> Bindings:
        names: collections.Counter[str] = collections.Counter()
        attributes: collections.Counter[str] = collections.Counter()
        dynamic = calls_sdpa = False
        tests: list[tuple[str | None, ast.expr]] = []
        imports: dict[str, str] = {}
        for owner, node in owned(tree):
            kind = node.__class__
            if kind is ast.Name:
                if not isinstance(node.ctx, ast.Load):  # type: ignore[attr-defined]
                    names[node.id] += 1  # type: ignore[attr-defined]
            elif kind is ast.Attribute:
                if not isinstance(node.ctx, ast.Load):  # type: ignore[attr-defined]
                    attributes[node.attr] += 1  # type: ignore[attr-defined]
                dynamic = dynamic or (node.attr == "__dict__" and self_attr(node) is not None)  # type: ignore[attr-defined]
            elif kind is ast.If or kind is ast.IfExp:
                tests.append((owner, node.test))  # type: ignore[attr-defined]
            elif kind is ast.Call:
                func = node.func  # type: ignore[attr-defined]
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                calls_sdpa = calls_sdpa or name == SDPA
                if name in ("setattr", "delattr") and isinstance(func, ast.Name) and len(node.args) > 1:  # type: ignore[attr-defined]
                    target = node.args[1]  # type: ignore[attr-defined]
                    if isinstance(target, ast.Constant) and isinstance(target.value, str):
                        attributes[target.value] += 1
                    elif isinstance(node.args[0], ast.Name) and node.args[0].id == "self":  # type: ignore[attr-defined]
                        dynamic = True
            elif kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
                names[node.name] += 1  # type: ignore[attr-defined]
                if kind is ast.ClassDef:
                    for statement in node.body:  # type: ignore[attr-defined]
                        for target in _bound_in_class_body(statement):
                            attributes[target] += 1
            elif kind is ast.arg:
                names[node.arg] += 1  # type: ignore[attr-defined]
            elif kind is ast.alias:
                bound = node.asname or node.name.split(".")[0]  # type: ignore[attr-defined]
                names[bound] += 1
            elif kind in (ast.Global, ast.Nonlocal):
                names.update(node.names)  # type: ignore[attr-defined]
            elif kind is ast.ExceptHandler and node.name:  # type: ignore[attr-defined]
                names[node.name] += 1  # type: ignore[attr-defined]
            elif kind in (ast.MatchAs, ast.MatchStar) and node.name:  # type: ignore[attr-defined]
                names[node.name] += 1  # type: ignore[attr-defined]
            elif kind is ast.MatchMapping and node.rest:  # type: ignore[attr-defined]
                names[node.rest] += 1  # type: ignore[attr-defined]
        for statement in tree.body:
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.asname:
                        imports[alias.asname] = alias.name
                    else:
                        imports.setdefault(alias.name.split(".")[0], alias.name.split(".")[0])
            elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
                for alias in statement.names:
                    imports[alias.asname or alias.name] = f"{statement.module}.{alias.name}"
        calls_sdpa = calls_sdpa or f"torch.nn.functional.{SDPA}" in imports.values()  # imported under another name
        return cls(names, attributes, dynamic, tuple(tests), calls_sdpa, imports, Definitions.of(tree))

    def is_functional(self, node: ast.expr) -> bool:
        """`torch.nn.functional` as the file names it: `F`, `nn.functional`, `torch.nn.functional`."""
        return dotted(node, self.imports) == "torch.nn.functional"

    def is_sdpa(self, func: ast.expr) -> bool:
        """A callee that is torch's `scaled_dot_product_attention` (not a function or method of the file so named)."""
        if isinstance(func, ast.Attribute):
            return func.attr == SDPA and self.is_functional(func.value)
        return (
            isinstance(func, ast.Name)
            and self.names[func.id] == 1
            and self.imports.get(func.id) == f"torch.nn.functional.{SDPA}"
        )


@dataclass(frozen=True)
class Definitions:
    """A tree's top-level classes and functions, and how a class finds its methods."""

    body: list[ast.stmt]
    classes: dict[str, ast.ClassDef]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]

    @classmethod
    def of(cls, tree: ast.Module) -> Definitions:
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        return cls(tree.body, classes, functions)

    def mro(self, class_name: str) -> list[ast.ClassDef]:
        """The class and its in-file bases, depth first, each once."""
        out: list[ast.ClassDef] = []
        stack = [class_name]
        while stack:
            name = stack.pop(0)
            node = self.classes.get(name)
            if node is None or node in out:
                continue
            out.append(node)
            stack[:0] = [base.id for base in node.bases if isinstance(base, ast.Name)]
        return out

    def method(self, class_name: str, name: str, after: str | None = None) -> tuple[str, ast.FunctionDef] | None:
        """`name` as the class finds it in its in-file bases (after the class `after`, for `super()`), with its
        owner."""
        classes = self.mro(class_name)
        if after is not None:
            owners = [node.name for node in classes]
            classes = classes[owners.index(after) + 1:] if after in owners else []
        for node in classes:
            for statement in node.body:
                if isinstance(statement, ast.FunctionDef) and statement.name == name:
                    return node.name, statement
        return None


def _bound_in_class_body(statement: ast.stmt) -> Iterator[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield statement.name
    elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        for target in targets:
            yield from (n.id for n in ast.walk(target) if isinstance(n, ast.Name))


def dotted(node: ast.expr, imports: dict[str, str]) -> str | None:
    """The dotted path an expression names, its first name read through the file's imports."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imports:
        return None
    return ".".join([imports[node.id], *reversed(parts)])


def owned(tree: ast.Module) -> Iterator[tuple[str | None, ast.AST]]:
    """Every node of the tree with the top-level class it lies in (None outside classes)."""
    yield None, tree
    for statement in tree.body:
        owner = statement.name if isinstance(statement, ast.ClassDef) else None
        for node in walk_list(statement):
            yield owner, node


def self_attr(node: ast.AST) -> str | None:
    """`attr` for `self.attr`, None for any other node."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def walk_list(node: ast.AST) -> list[ast.AST]:
    """`ast.walk(node)` as a list (breadth first), without its per-node generator overhead."""
    out = [node]
    for current in out:  # grows while read
        for name in current._fields:
            value = getattr(current, name, None)
            if isinstance(value, ast.AST):
                out.append(value)
            elif isinstance(value, list):
                out.extend(item for item in value if isinstance(item, ast.AST))
    return out
