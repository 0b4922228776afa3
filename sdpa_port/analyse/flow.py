"""Which names are bound on every path to a point of a function (read-only, structured control flow only)."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from sdpa_port.analyse.cstutil import assigned_names, block_body, if_chain


def bound_before(statements: Sequence[cst.BaseStatement], target: cst.CSTNode) -> set[str] | None:
    """Names assigned on every path from the start of `statements` to the statement holding `target` (by identity),
    or None when `target` is not among them. Loops and try blocks are not counted as binding anything."""
    bound: set[str] = set()
    for statement in statements:
        if _contains(statement, target):
            if isinstance(statement, cst.If):
                for body in _branch_bodies(statement):
                    inner = bound_before(body, target)
                    if inner is not None:
                        return bound | inner
            if isinstance(statement, cst.With):
                inner = bound_before(block_body(statement.body), target)
                if inner is not None:
                    return bound | inner
            return bound
        bound |= _always_binds(statement)
    return None


def _always_binds(statement: cst.BaseStatement) -> set[str]:
    if isinstance(statement, cst.SimpleStatementLine):
        out: set[str] = set()
        for small in statement.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    out.update(assigned_names(target.target))
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and getattr(small, "value", None) is not None:
                out.update(assigned_names(small.target))
        return out
    if isinstance(statement, cst.If):
        bodies = _branch_bodies(statement)
        if not isinstance(_last_orelse(statement), cst.Else):
            return set()
        sets = [set().union(*(_always_binds(s) for s in body)) if body else set() for body in bodies]
        return set.intersection(*sets) if sets else set()
    if isinstance(statement, cst.With):
        return set().union(*(_always_binds(s) for s in block_body(statement.body)))
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return {statement.name.value}
    return set()


def _branch_bodies(node: cst.If) -> list[Sequence[cst.BaseStatement]]:
    return [block_body(branch.body) for branch in if_chain(node)]


def _last_orelse(node: cst.If) -> cst.Else | None:
    last = if_chain(node)[-1]
    return last if isinstance(last, cst.Else) else None


def _contains(statement: cst.CSTNode, target: cst.CSTNode) -> bool:
    found = False

    class Find(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if node is target:
                found = True
            return not found

    statement.visit(Find())
    return found


__all__ = ["bound_before"]
