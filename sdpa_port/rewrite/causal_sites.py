"""Pass `is_causal=True` to an attention class where it is built for causal masks (`self.attr = Cls(...)`)."""

from __future__ import annotations

from typing import Iterable

import libcst as cst
import libcst.matchers as m

from sdpa_port.rewrite.layout import append_arguments, keyword_argument
from sdpa_port.rewrite.targeted import transform_named


def pass_is_causal(module: cst.Module, class_name: str, sites: Iterable[tuple[str, str]]) -> tuple[cst.Module, int]:
    """`Cls(...)` assigned to each `(owner, attribute)` site gains `is_causal=True`; the count of calls changed."""
    by_owner: dict[str, set[str]] = {}
    for owner, attribute in sites:
        by_owner.setdefault(owner, set()).add(attribute)
    count = 0
    for owner, attributes in sorted(by_owner.items()):
        transformer = _PassCausal(class_name, frozenset(attributes))
        module = transform_named(module, {owner}, transformer)
        count += transformer.count
    return module, count


def unpin_is_causal(module: cst.Module, class_name: str, site: tuple[str, str]) -> tuple[cst.Module, int]:
    """`Cls(..., is_causal=True)` assigned to the `(owner, attribute)` site passes `is_causal=False`; the count."""
    transformer = _PassCausal(class_name, frozenset({site[1]}), unpin=True)
    module = transform_named(module, {site[0]}, transformer)
    return module, transformer.count


class _PassCausal(cst.CSTTransformer):
    def __init__(self, class_name: str, attributes: frozenset[str], unpin: bool = False) -> None:
        self.class_name = class_name
        self.attributes = attributes
        self.unpin = unpin
        self.inside = 0
        self.count = 0

    def _site(self, target: cst.BaseExpression) -> bool:
        return m.matches(target, m.Attribute(value=m.Name("self"))) and (
            isinstance(target, cst.Attribute) and target.attr.value in self.attributes
        )

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and self._site(node.targets[0].target):
            self.inside += 1

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if len(original.targets) == 1 and self._site(original.targets[0].target):
            self.inside -= 1
        return updated

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if self._site(node.target):
            self.inside += 1

    def leave_AnnAssign(self, original: cst.AnnAssign, updated: cst.AnnAssign) -> cst.AnnAssign:
        if self._site(original.target):
            self.inside -= 1
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.inside or not m.matches(updated.func, m.Name(self.class_name)):
            return updated
        if self.unpin:
            pinned = m.Arg(keyword=m.Name("is_causal"), value=m.Name("True"))
            if not any(m.matches(a, pinned) for a in updated.args):
                return updated
            self.count += 1
            args = [a.with_changes(value=cst.Name("False")) if m.matches(a, pinned) else a for a in updated.args]
            return updated.with_changes(args=args)
        if any(a.keyword is not None and a.keyword.value == "is_causal" for a in updated.args):
            return updated
        self.count += 1
        return updated.with_changes(
            args=append_arguments(list(updated.args), [keyword_argument("is_causal", cst.Name("True"))])
        )


__all__ = ["pass_is_causal", "unpin_is_causal"]
