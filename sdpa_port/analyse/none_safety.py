"""Whether a function copes with its mask parameters being None (so the `_for_sdpa` mask helpers may return None)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m



def mask_parameters(function: cst.FunctionDef) -> list[str]:
    params = [*function.params.posonly_params, *function.params.params, *function.params.kwonly_params]
    return [p.name.value for p in params if "mask" in p.name.value and not p.name.value.endswith("head_mask")]


def safe_for_none(function: cst.FunctionDef, names: set[str]) -> bool:
    """Every read of `names` (and of their aliases) in `function` copes with None: guarded, or passed on as is."""
    return _safe(function, names)


def _safe(function: cst.FunctionDef, names: set[str]) -> bool:
    checker = _Reads(names)
    checker.guards.append(set())
    function.body.visit(checker)
    return not checker.unsafe


class _Reads(cst.CSTVisitor):
    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.guards: list[set[str]] = []
        self.unsafe: list[str] = []

    def guarded(self) -> set[str]:
        out: set[str] = set()
        for guard in self.guards:
            out |= guard
        return out

    def visit_If(self, node: cst.If) -> bool:
        node.test.visit(self)
        self.guards.append(not_none_names(node.test))
        node.body.visit(self)
        self.guards.pop()
        if node.orelse is not None:
            self.guards.append(_is_none_names(node.test))
            node.orelse.visit(self)
            self.guards.pop()
        return False

    def visit_Assert(self, node: cst.Assert) -> bool:
        # `assert mask is not None` is a read that fails on None
        for name in not_none_names(node.test) & self.names:
            if name not in self.guarded():
                self.unsafe.append(name)
        return True

    def visit_IfExp(self, node: cst.IfExp) -> bool:
        node.test.visit(self)
        self.guards.append(not_none_names(node.test))
        node.body.visit(self)
        self.guards.pop()
        self.guards.append(_is_none_names(node.test))
        node.orelse.visit(self)
        self.guards.pop()
        return False

    def visit_Comparison(self, node: cst.Comparison) -> bool:
        if (
            isinstance(node.left, cst.Name)
            and len(node.comparisons) == 1
            and isinstance(node.comparisons[0].operator, (cst.Is, cst.IsNot))
        ):
            return False
        return True

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return False

    def visit_Assign(self, node: cst.Assign) -> bool:
        # `attention_mask = encoder_attention_mask` only moves a possibly-None value; `mask = attention_mask` makes
        # an alias whose reads count as reads of the mask
        if isinstance(node.value, cst.Name):
            if node.value.value in self.names and node.value.value not in self.guarded():
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        self.names = self.names | {target.target.value}
            return False
        node.value.visit(self)
        # `mask = torch.ones(...)` rebinds the name to a tensor: later reads in this block are safe
        for target in node.targets:
            if isinstance(target.target, cst.Name) and target.target.value in self.names and self.guards:
                self.guards[-1] = self.guards[-1] | {target.target.value}
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        # passing the mask on (to a sub-module or a call) is the callee's business
        if isinstance(node.value, cst.Name) and node.value.value in self.names:
            return False
        return True

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names and node.value not in self.guarded():
            self.unsafe.append(node.value)


def not_none_names(test: cst.BaseExpression) -> set[str]:
    """The names a test shows are not None where it holds: `x is not None`, and each side of an `and`."""
    out: set[str] = set()
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return not_none_names(test.left) | not_none_names(test.right)
    if m.matches(
        test, m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))])
    ):
        out.add(test.left.value)  # type: ignore[attr-defined]
    return out


def _is_none_names(test: cst.BaseExpression) -> set[str]:
    if m.matches(
        test, m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(operator=m.Is(), comparator=m.Name("None"))])
    ):
        return {test.left.value}  # type: ignore[attr-defined]
    return set()
