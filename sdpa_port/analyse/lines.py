"""Line numbers for nodes, computed per top-level class on demand (whole-module positions cost too much)."""

from __future__ import annotations

import ast
from typing import Iterable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


def top_level_starts(tree: ast.Module) -> dict[str, int]:
    """Name of each top-level class/function -> line of its first decorator or of its `def`/`class`."""
    out: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = [node.lineno] + [d.lineno for d in node.decorator_list]
            out[node.name] = min(lines)
    return out


class Lines:
    """`lines(node)` gives the 1-based line of a node inside one of the prepared top-level definitions, else 0."""

    def __init__(self, module: cst.Module, starts: dict[str, int]) -> None:
        self.module = module
        self.starts = starts
        self.definitions = {
            s.name.value: s for s in module.body if isinstance(s, (cst.ClassDef, cst.FunctionDef))
        }
        self.positions: dict[cst.CSTNode, int] = {}
        self.prepared: set[str] = set()

    def prepare(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self.prepared or name not in self.definitions or name not in self.starts:
                continue
            self.prepared.add(name)
            definition = self.definitions[name]
            alone = self.module.with_changes(body=[definition.with_changes(leading_lines=[])], header=[], footer=[])
            wrapper = MetadataWrapper(alone, unsafe_skip_copy=True)
            offset = self.starts[name] - 1
            for node, position in wrapper.resolve(PositionProvider).items():
                self.positions[node] = position.start.line + offset

    def place(self, tree: cst.CSTNode, line: int) -> None:
        """Every node of `tree` (made, not parsed: a helper's statement written out at its call) is at `line`, where
        it has no line of its own."""
        lines = self

        class _Place(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                lines.positions.setdefault(node, line)
                return True

        tree.visit(_Place())

    def __call__(self, node: cst.CSTNode) -> int:
        return self.positions.get(node, 0)
