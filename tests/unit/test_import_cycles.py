"""No two modules of sdpa_port import each other, directly or through others.

The graph is read from the source (no module is imported, so no torch is needed): every `import` counts, those
inside functions and under `if TYPE_CHECKING:` too, since an import a function defers still ties the modules
together. Any strongly connected component of more than one module fails, but the ones `KNOWN_CORE_CYCLES` allows.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sdpa_port"

# Cycles allowed while a restructuring removes them, each as its two sides (a module, or a package with its modules): a
# component whose modules all lie on the two sides of one entry is allowed, so while an entry stands a new cycle among
# those modules hides in it. None is left: the recognisers and statement modules name the tracer by
# `analyse.tracing.TracerView`, so the core has no cycle (the second test says when an entry is no longer needed).
KNOWN_CORE_CYCLES: frozenset[tuple[str, str]] = frozenset()


def modules(root: Path) -> dict[str, Path]:
    """Every module under `root` by its dotted name, a package by its own name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The dotted names an import statement names: `from x import y` names `x.y`, which is `x` unless a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports, wherever in its body the import stands."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in imported(node, package):
                while target and target not in known:  # `from pkg import name`: the package, unless a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _under(name: str, side: str) -> bool:
    return name == side or name.startswith(side + ".")


def known(component: list[str], allowed: frozenset[tuple[str, str]] = KNOWN_CORE_CYCLES) -> bool:
    """Whether a component is one of the `allowed` cycles: its modules on the entry's two sides, both met."""
    return any(
        all(_under(m, a) or _under(m, b) for m in component)
        and any(_under(m, a) for m in component)
        and any(_under(m, b) for m in component)
        for a, b in allowed
    )


def test_no_import_cycles_but_the_known_core_ones() -> None:
    found = [component for component in cycles(import_graph(PACKAGE)) if not known(component)]
    assert not found, "import cycles (move what both sides need into a lower module):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_every_known_core_cycle_still_exists() -> None:
    """An allowance the core no longer needs is removed, so that the cycle cannot come back unnoticed."""
    components = cycles(import_graph(PACKAGE))
    for a, b in sorted(KNOWN_CORE_CYCLES):
        assert any(any(_under(m, a) for m in c) and any(_under(m, b) for m in c) for c in components), (
            f"{a} <-> {b} is no cycle any more: remove it from KNOWN_CORE_CYCLES"
        )


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    """The detector itself: a cycle held together by a deferred import, across a package, is reported."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "low.py").write_text("import os\n")
    (root / "a.py").write_text("from pkg.low import os\n\n\ndef f():\n    from pkg.sub import b\n    return b\n")
    (root / "sub" / "b.py").write_text("from ..a import f\n")
    graph = import_graph(root)
    assert graph["pkg.a"] == {"pkg.low", "pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    assert known(cycles(graph)[0], frozenset({("pkg.sub", "pkg.a")}))
    assert not known(cycles(graph)[0], frozenset({("pkg.sub", "pkg.low")}))
