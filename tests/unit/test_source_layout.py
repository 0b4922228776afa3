"""Layout the repository's own sources keep that `ruff check --select F` does not see.

A decorator stands on the line above what it decorates (pycodestyle's E304): a blank line between them reads as if
the decorator ended a block of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("sdpa_port", "scripts", "tests")


def blank_lines_after_decorators(source: str) -> list[int]:
    """The lines of each definition preceded, after its last decorator, by a blank line."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.decorator_list:
            last = node.decorator_list[-1].end_lineno or node.lineno
            between = lines[last : node.lineno - 1]
            if any(not line.strip() for line in between):
                found.append(node.lineno)
    return found


def test_the_check_sees_a_blank_line_after_a_decorator() -> None:
    assert blank_lines_after_decorators("@dataclass\n\n\nclass A:\n    x: int\n") == [4]
    assert blank_lines_after_decorators("@dataclass\n# a comment\nclass A:\n    x: int\n") == []


def test_no_blank_line_after_a_decorator() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in blank_lines_after_decorators(path.read_text(encoding="utf-8"))
    ]
    assert found == [], f"blank lines between a decorator and its definition: {found}"
