"""Functions that only add to the scores they are given: `f(scores, ...) == scores + f(zeros, ...)`.

Decomposed relative positions (MViT2, SAM, ViTDet, SegGPT) are added to the scores by a helper that takes them as
an argument: `attn.view(b, qh, qw, kh, kw) + rel_h[..., None] + rel_w[..., None, :]`, viewed back. Views keep the
entries' order, so such a helper adds `f(zeros of the scores' shape, ...)` to the scores, a term SDPA takes in its
mask. This module proves that shape of a helper (read-only analysis): the parameter flows to the returned value
through views, reshapes and additions of values that do not depend on it, and nowhere else.

The same terms may be added to a slice of the parameter in place (MViT, ViTDet with a class token):
`attn[:, :, sp:, sp:] = (attn[:, :, sp:, sp:].view(b, -1, qh, qw, kh, kw) + rel_h + rel_w).view(b, -1, n, m)`.
The value adds terms to the slice it replaces, and the assignment broadcasts it to the slice's shape: the view back
holds at least the slice's entries (the terms broadcast), so it fits only when it holds exactly those, in their order.
The slice is basic indexing (slices and `...`, bounds that call nothing and read no value of the parameter), the same
on both sides. `p += terms` and `p[s] -= terms` add in place too. Only the parameter itself changes in place, while
no other name holds a value made from it: a view shares its memory only sometimes (`x.contiguous()` may copy), so
zeros and scores could part there. The caller's own name for the scores changes with them; the tracer refuses a
later read of that older value (a fork of the chain).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import block_body, is_docstring
from sdpa_port.analyse.patterns import walk_names

VIEWS = frozenset({"view", "reshape"})
KEEPS = frozenset({"contiguous"})


@dataclass(frozen=True)
class Additive:
    """`f` adds to its parameter; `rank` is the rank of what it returns when its last view writes the sizes out,
    None when it returns the parameter's own shape (no view), `reshaped` whether a view was applied at all,
    `in_place` whether it adds to the parameter's own entries (every name holding that tensor changes with it)."""

    rank: int | None
    reshaped: bool
    in_place: bool = False


META = frozenset({"shape", "dtype", "device", "ndim"})
META_CALLS = frozenset({"size", "dim"})


def additive_in(function: cst.FunctionDef, parameter: str) -> Additive | None:
    """How `function` returns its `parameter` plus terms independent of it, or None when it may do anything else.

    Reading the parameter's shape, dtype or device is allowed (zeros of its shape have the same); a view back to
    the parameter's own shape (`x.view(shape)` with `shape = scores.shape`) returns it in that shape."""
    reader = _Reader(parameter)
    body = list(block_body(function.body))
    if body and is_docstring(body[0]):
        body = body[1:]
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, cst.Return):
                found = reader.additive(small.value) if small.value is not None else None
                return replace(found, in_place=True) if found is not None and reader.changed else found
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target = small.targets[0].target
                if isinstance(target, cst.Subscript) and reader.holds(target.value):
                    if not reader.add_to_slice(target, small.value):
                        return None
                    reader.changed = True
                    continue
                if not reader.assign(target, small.value):
                    return None
                continue
            if m.matches(small, m.AugAssign(operator=m.AddAssign() | m.SubtractAssign())):
                assert isinstance(small, cst.AugAssign)
                if reader.holds(small.target) or reader.holds(getattr(small.target, "value", None)):
                    if not reader.add_in_place(small.target, small.value):
                        return None
                    reader.changed = True
                    continue
        if reader.reads(statement):
            return None  # read or rebound under control flow, in place, or in an expression statement
    return None  # no return of the parameter


class _Reader:
    def __init__(self, parameter: str) -> None:
        self.parameter = parameter
        self.rebound = False  # the parameter's name was assigned again
        self.changed = False  # terms were added to the parameter's own entries
        self.tainted = {parameter: Additive(None, False)}
        self.shapes: set[str] = set()  # names holding the parameter's own shape

    def reads(self, node: cst.CSTNode) -> bool:
        """`node` reads a tainted value other than through its shape, dtype or device."""
        finder = _ValueReads(set(self.tainted))
        node.visit(finder)
        return finder.found

    def assign(self, target: cst.BaseExpression, value: cst.BaseExpression) -> bool:
        reads = self.reads(value)
        found = self.additive(value) if reads else None
        shape = not reads and self.own_shape(value)
        for name in walk_names(target):  # rebound: what the names held before no longer counts
            self.rebound = self.rebound or name == self.parameter
            self.tainted.pop(name, None)
            self.shapes.discard(name)
        if not reads:
            if shape and isinstance(target, cst.Name):
                self.shapes.add(target.value)
            return True
        if found is None or not isinstance(target, cst.Name):
            return False
        self.tainted[target.value] = found
        return True

    def holds(self, node: cst.BaseExpression | None) -> bool:
        """`node` is a name holding a tainted value."""
        return isinstance(node, cst.Name) and node.value in self.tainted

    def add_to_slice(self, target: cst.Subscript, value: cst.BaseExpression) -> bool:
        """`p[s] = p[s] + terms`, viewed and viewed back: terms added to a slice of the parameter in place."""
        if not self.changeable(target):
            return False
        token = _free_name(value, "slice")
        replaced = _SameSlice(target, token)
        read = value.visit(replaced)
        if not replaced.count or not isinstance(read, cst.BaseExpression):
            return False
        self.tainted[token] = Additive(None, False)
        try:
            return self.additive(read) is not None
        finally:
            del self.tainted[token]

    def add_in_place(self, target: cst.BaseAssignTargetExpression, value: cst.BaseExpression) -> bool:
        """`p += terms` or `p[s] -= terms`: the parameter's entries, or a slice's, keep their shape."""
        return self.changeable(target) and not self.reads(value)

    def changeable(self, target: cst.BaseExpression) -> bool:
        """`target` is the parameter itself, or a basic slice of it, while no other name holds a view of it.

        Changed in place, a view changes what it views only where they share memory (`x.contiguous()` may copy):
        the parameter alone, never rebound, changes as its zeros do."""
        if len(self.tainted) != 1 or self.parameter not in self.tainted or self.rebound:
            return False
        if isinstance(target, cst.Name):
            return target.value == self.parameter
        if not (isinstance(target, cst.Subscript) and self.holds(target.value) and _basic_slice(target)):
            return False
        return not any(self.reads(element.slice) for element in target.slice)

    def own_shape(self, node: cst.BaseExpression) -> bool:
        """`p.shape` / `p.size()` of a tainted value still in the parameter's shape, or a name holding one."""
        if isinstance(node, cst.Name):
            return node.value in self.shapes
        if isinstance(node, cst.Attribute) and node.attr.value == "shape":
            inner = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size" and not node.args:
            inner = node.func.value
        else:
            return False
        found = self.tainted.get(inner.value) if isinstance(inner, cst.Name) else None
        return found is not None and not found.reshaped

    def additive(self, node: cst.BaseExpression) -> Additive | None:
        if isinstance(node, cst.Name):
            return self.tainted.get(node.value)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
            left, right = self.reads(node.left), self.reads(node.right)
            if left and not right:
                return self.additive(node.left)
            if right and not left and isinstance(node.operator, cst.Add):
                return self.additive(node.right)
            return None
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            if any(self.reads(a.value) for a in node.args):
                return None
            found = self.additive(node.func.value)
            if found is None:
                return None
            if method in KEEPS and not node.args:
                return found
            if method in VIEWS:
                if len(node.args) == 1 and not node.args[0].star and self.own_shape(node.args[0].value):
                    return Additive(None, False)  # back to the parameter's shape
                explicit = len(node.args) > 1 and not any(a.star or a.keyword for a in node.args)
                return Additive(len(node.args) if explicit else None, True)
        return None


class _ValueReads(cst.CSTVisitor):
    """Whether an expression reads one of `names` for its values (not only its shape, dtype or device)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.found = False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return not (isinstance(node.value, cst.Name) and node.value.value in self.names and node.attr.value in META)

    def visit_Call(self, node: cst.Call) -> bool:
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in META_CALLS
            and isinstance(func.value, cst.Name)
            and func.value.value in self.names
        ):
            for arg in node.args:
                arg.visit(self)
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.found = True


def _basic_slice(target: cst.Subscript) -> bool:
    """Slices and `...` alone, whose bounds call nothing (each side of the assignment evaluates them once)."""
    for element in target.slice:
        index = element.slice
        if isinstance(index, cst.Index):
            if not m.matches(index.value, m.Ellipsis()) or index.star is not None:
                return False
        elif any(m.findall(index, m.Call() | m.Await() | m.NamedExpr() | m.Yield() | m.Lambda())):
            return False
    return True


def _free_name(node: cst.CSTNode, stem: str) -> str:
    names = walk_names(node)
    name = stem
    while name in names:
        name += "_"
    return name


class _SameSlice(cst.CSTTransformer):
    """Each read of the assigned slice, `p[s]` written as the target is, replaced by a name of its own."""

    def __init__(self, target: cst.Subscript, name: str) -> None:
        self.target = target
        self.name = name
        self.count = 0

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        if original_node.deep_equals(self.target):
            self.count += 1
            return cst.Name(self.name)
        return updated_node
