"""Qualified names of expressions, resolved through the module's own imports."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.helpers import get_full_name_for_node


@dataclass(frozen=True)
class ImportMap:
    """Local name -> fully qualified dotted name, read from top-level imports."""

    aliases: dict[str, str] = field(default_factory=dict)
    # module basename -> (relative level, dotted module) as imported, e.g. "modeling_utils" -> (3, "modeling_utils")
    sources: dict[str, tuple[int, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, module: cst.Module) -> "ImportMap":
        aliases: dict[str, str] = {}
        roots: dict[str, tuple[int, str]] = {}
        for stmt in module.body:
            for small in _small_statements(stmt):
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        full = get_full_name_for_node(alias.name) or ""
                        if alias.asname is not None:
                            aliases[_asname(alias)] = full
                        else:
                            head = full.split(".")[0]
                            aliases.setdefault(head, head)
                elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    base = get_full_name_for_node(small.module) if small.module is not None else ""
                    level = len(small.relative)
                    for alias in small.names:
                        name = get_full_name_for_node(alias.name) or ""
                        local = _asname(alias) if alias.asname is not None else name
                        if level:
                            qualified = f"{'.' * level}{base + '.' if base else ''}{name}"
                        else:
                            qualified = f"{base}.{name}" if base else name
                        aliases[local] = qualified
                    if base:
                        roots.setdefault(base.split(".")[-1], (level, base))
        return cls(aliases, roots)

    def package_of(self, basename: str) -> tuple[int, str] | None:
        """How the file imports a sibling of `basename` (e.g. `modeling_utils`): (relative level, module)."""
        return self.sources.get(basename)

    def qualify(self, node: cst.CSTNode) -> str | None:
        """`nn.functional.softmax` -> `torch.nn.functional.softmax` when `nn` is `torch.nn`."""
        full = get_full_name_for_node(node)
        if full is None:
            return None
        head, _, rest = full.partition(".")
        base = self.aliases.get(head)
        if base is None:
            return full
        return f"{base}.{rest}" if rest else base


def _asname(alias: cst.ImportAlias) -> str:
    assert alias.asname is not None
    name = alias.asname.name
    return name.value if isinstance(name, cst.Name) else (get_full_name_for_node(name) or "")


def _small_statements(stmt: cst.CSTNode) -> list[cst.BaseSmallStatement]:
    if isinstance(stmt, cst.SimpleStatementLine):
        return list(stmt.body)
    if isinstance(stmt, cst.If):
        # `if is_torch_available(): import torch` and friends
        out: list[cst.BaseSmallStatement] = []
        for inner in stmt.body.body:
            out.extend(_small_statements(inner))
        return out
    if isinstance(stmt, cst.Try):
        out = []
        for inner in stmt.body.body:
            out.extend(_small_statements(inner))
        return out
    return []
