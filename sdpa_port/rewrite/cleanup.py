"""Remove what the SDPA rewrite left dead: pure assignments whose values only fed the removed eager chain."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from sdpa_port.analyse.cstutil import assigned_names, block_body, single_target
from sdpa_port.analyse.names import ImportMap
from sdpa_port.analyse.patterns import walk_names

PURE_FUNCTIONS = frozenset(
    {
        "torch.zeros",
        "torch.empty",
        "torch.ones",
        "torch.full",
        "torch.zeros_like",
        "torch.empty_like",
        "torch.ones_like",
        "torch.full_like",
        "torch.tensor",
        "torch.finfo",
        "torch.arange",
        "float",
        "int",
        "math.sqrt",
    }
)
PURE_METHODS = frozenset(
    {"view", "reshape", "transpose", "permute", "size", "to", "contiguous", "float", "half", "type", "type_as",
     "unsqueeze", "squeeze", "expand", "expand_as", "dim", "bool"}
)


def is_pure(node: cst.CSTNode, imports: ImportMap) -> bool:
    checker = _Purity(imports)
    node.visit(checker)
    return checker.pure


class _Purity(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        self.imports = imports
        self.pure = True

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.imports.qualify(node.func)
        if qualified in PURE_FUNCTIONS:
            return
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in PURE_METHODS:
            return
        self.pure = False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self.pure = False
        return False

    def visit_NamedExpr(self, node: cst.NamedExpr) -> bool:
        self.pure = False
        return False

    def visit_Await(self, node: cst.Await) -> bool:
        self.pure = False
        return False

    def visit_Yield(self, node: cst.Yield) -> bool:
        self.pure = False
        return False


def remove_dead(
    statements: Sequence[cst.BaseStatement], removable: set[str], imports: ImportMap, live_after: set[str] | None = None
) -> list[cst.BaseStatement]:
    """Drop `name = <pure expression>` statements for names in `removable` that nothing reads afterwards."""
    kept, _ = _dead(list(statements), removable, imports, set(live_after or ()))
    return kept


def _dead(
    statements: list[cst.BaseStatement], removable: set[str], imports: ImportMap, live: set[str]
) -> tuple[list[cst.BaseStatement], set[str]]:
    out: list[cst.BaseStatement] = []
    for statement in reversed(statements):
        if isinstance(statement, cst.SimpleStatementLine):
            if _is_noop(statement):
                continue
            target = single_target(statement)
            if target is not None and target in removable and target not in live:
                value = statement.body[0].value  # type: ignore[attr-defined]
                if is_pure(value, imports):
                    continue
            assigned: set[str] = set()
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        if isinstance(t.target, cst.Name):
                            assigned.add(t.target.value)
            live = (live - assigned) | walk_names(statement)
            out.append(statement)
        elif isinstance(statement, cst.If):
            new, live_before = _dead_if(statement, removable, imports, live)
            if new is not None:
                out.append(new)
            live = live_before
        elif isinstance(statement, cst.With):
            body, live_body = _dead(list(block_body(statement.body)), removable, imports, set(live))
            if body:
                out.append(statement.with_changes(body=statement.body.with_changes(body=body)))
                live = live_body | walk_names(statement.items[0]) if statement.items else live_body
        else:
            live = live | walk_names(statement)
            out.append(statement)
    out.reverse()
    return out, live


def _dead_if(
    node: cst.If, removable: set[str], imports: ImportMap, live: set[str]
) -> tuple[cst.If | None, set[str]]:
    body, live_body = _dead(list(block_body(node.body)), removable, imports, set(live))
    live_before = live_body | walk_names(node.test)
    orelse: cst.If | cst.Else | None = None
    if isinstance(node.orelse, cst.If):
        orelse, live_else = _dead_if(node.orelse, removable, imports, live)
        live_before |= live_else
    elif isinstance(node.orelse, cst.Else):
        else_body, live_else = _dead(list(block_body(node.orelse.body)), removable, imports, set(live))
        live_before |= live_else
        if else_body:
            orelse = node.orelse.with_changes(body=node.orelse.body.with_changes(body=else_body))
    else:
        live_before |= live
    if not body and orelse is None:
        return None, live
    if not body:
        body = [cst.SimpleStatementLine(body=[cst.Pass()])]
    return node.with_changes(body=node.body.with_changes(body=body), orelse=orelse), live_before


def _is_noop(statement: cst.SimpleStatementLine) -> bool:
    """`a, b = a, b` and `a = a`, which inlining a helper's `return a, b` can produce."""
    if len(statement.body) != 1 or not isinstance(statement.body[0], cst.Assign):
        return False
    assign = statement.body[0]
    if len(assign.targets) != 1:
        return False
    target, value = assign.targets[0].target, assign.value
    if isinstance(target, cst.Name) and isinstance(value, cst.Name):
        return target.value == value.value
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) != len(value.elements):
            return False
        return all(
            isinstance(a.value, cst.Name) and isinstance(b.value, cst.Name) and a.value.value == b.value.value
            for a, b in zip(target.elements, value.elements)
        )
    return False


def names_in_statements(statements: Sequence[cst.CSTNode]) -> set[str]:
    out: set[str] = set()
    for statement in statements:
        out |= walk_names(statement)
    return out


__all__ = ["remove_dead", "is_pure", "names_in_statements", "assigned_names"]
