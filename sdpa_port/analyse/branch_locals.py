"""Names an `if` binds that nothing reads after it: temporaries of a branch, not values the branches leave.

Before, the window mask added through temporaries only under a test (Swin's form, written in steps):

    if mask is not None:
        tmp0 = scores.view(b // w, w, heads, n, n)
        tmp1 = mask.unsqueeze(1).unsqueeze(0)
        scores = tmp0 + tmp1
        scores = scores.view(-1, heads, n, n)

After the `if`, `tmp0` holds a view of the scores on one path and nothing on the other; merging it as a value the
branches leave reads that as the scores replaced under a condition (S110). It is not one: nothing reads `tmp0` after
the `if`. A name is such a temporary when every mention of it in the traced function (nested functions included)
lies inside the `if`, and the `if` is not inside a loop of that function (where a later pass would read what an
earlier one bound). The branches' merge then leaves it unbound, as the path that does not bind it does.
"""

from __future__ import annotations

from functools import lru_cache

import libcst as cst


def unread_after(function: cst.FunctionDef, statement: cst.If, name: str) -> bool:
    """Nothing in `function` outside `statement` mentions `name`, and `statement` is in `function`, not in a loop."""
    outside = _mentions_outside(function, statement)
    return outside is not None and name not in outside


@lru_cache(maxsize=64)
def _mentions_outside(function: cst.FunctionDef, statement: cst.If) -> frozenset[str] | None:
    """The names mentioned in `function` outside `statement`; None where `statement` is not a statement of `function`
    outside every loop."""
    collector = _Outside(statement)
    function.visit(collector)
    if not collector.found or collector.in_loop:
        return None
    return frozenset(collector.names)


class _Outside(cst.CSTVisitor):
    """Every name outside one `if`, whether the `if` was met, and whether a loop holds it."""

    def __init__(self, statement: cst.If) -> None:
        self.statement = statement
        self.names: set[str] = set()
        self.loops = 0
        self.found = False
        self.in_loop = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.statement:
            self.found = True
            self.in_loop = self.loops > 0
            return False
        if isinstance(node, (cst.For, cst.While)):
            self.loops += 1
        elif isinstance(node, cst.Name):
            self.names.add(node.value)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, (cst.For, cst.While)):
            self.loops -= 1

