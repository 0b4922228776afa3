"""What an expression reads of the chains: their values, or only their dtype, device or shape.

`ChainReads` answers, from the tracer's environment, which chains an expression reads (`chain_refs`,
`chain_value_refs`) and points an operand's `.dtype`/`.device` reads of the scores at the query (`detach`).
`ReadFinder` sorts the reads of chain names; `ProductFinder` and `contains_softmax` find products and softmaxes.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import HANDED_QUERY, OUT, PROBS, SCORES, ChainVal, Poison, Stage, Value, short
from sdpa_port.analyse.chain_book import ChainBook
from sdpa_port.analyse.cstutil import primary, walk_names
from sdpa_port.analyse.scope import FunctionScope
from sdpa_port.refusals import Code


class ChainReads:
    """The chains an expression reads, as the tracer's environment holds them."""

    def __init__(self, env: dict[str, Value], chains: ChainBook, line: Callable[[], int] = lambda: 0) -> None:
        self.env = env  # the tracer's, shared
        self.chains = chains
        self.line = line  # the line of the statement the tracer reads

    def stage_of(self, cid: int) -> Stage:
        stages = {v.stage for v in self.env.values() if isinstance(v, ChainVal) and v.cid == cid}
        return PROBS if PROBS in stages or OUT in stages else SCORES

    def live_cids(self) -> set[int]:
        return {value.cid for value in self.env.values() if isinstance(value, ChainVal)}

    def chain_refs(self, node: cst.CSTNode | None) -> set[int]:
        if node is None:
            return set()
        out: set[int] = set()
        for name in walk_names(node):
            value = self.env.get(name)
            if isinstance(value, ChainVal):
                out.add(self.chains.joined_into(value.cid))  # reading scores joined into others reads those
        return out

    def chain_value_refs(self, node: cst.CSTNode | None) -> set[int]:
        """Chains whose values an expression reads.

        Reads of `.dtype`, `.device`, shapes, `expand_as` and casts to the scores' type (`x.type_as(scores)`) are not
        reads of the values.
        """
        if node is None:
            return set()
        finder = ReadFinder(self.env, None)
        node.visit(finder)
        return {self.chains.joined_into(self.env[n.value].cid) for n in finder.plain}  # type: ignore[union-attr]

    def detach(self, node: cst.BaseExpression, cid: int) -> cst.BaseExpression:
        """An operand of a chain op with its `.dtype`/`.device` reads of the scores pointed at the query.

        An operand reading the chain's own values refuses it (S104); one reading another chain's poisons that one.
        """
        finder = ReadFinder(self.env, None)
        node.visit(finder)
        names = finder.plain + finder.shapes
        read = {self.chains.joined_into(self.env[n.value].cid) for n in names}  # type: ignore[union-attr]
        if self.chains.joined_into(cid) in read:
            raise Poison(Code.SCORES_READ, f"`{short(node)}` reads the scores", {cid})
        for other in read:
            # another product read (`mask @ mask.T`, a product of masks): it is no attention, its values used
            # outside it; this chain goes on, and its re-trace alone reads that product as a plain tensor
            self.chains.candidates[other].poisoned(Code.SCORES_READ, f"`{short(node)}` reads the scores", self.line())
        start = self.chains.candidates[cid].start
        if start is None:
            return node
        mapping: dict[cst.CSTNode, cst.CSTNode] = {}
        query = primary(start.operands[0] if start.operands else start.query)  # its dtype and device, in any layout
        if self.chains.candidates[cid].built():
            query = cst.Name(HANDED_QUERY)
        for attribute in finder.attributes:
            mapping[attribute] = cst.Attribute(value=query, attr=attribute.attr)
        for call in finder.expands:
            mapping[call] = call.func.value  # type: ignore[attr-defined]
        for name in finder.typed:
            mapping[name] = query
        from sdpa_port.rewrite.edit import replace_nodes

        return replace_nodes(node, mapping) if mapping else node

    def chain_names_in(self, node: cst.CSTNode, exclude: cst.CSTNode | None = None) -> list[tuple[str, cst.Name]]:
        finder = ReadFinder(self.env, exclude)
        node.visit(finder)
        return [(n.value, n) for n in finder.values_read()]


def size_read(node: cst.CSTNode) -> tuple[cst.Name, int] | None:
    """The name and index of `x.size(i)` or `x.shape[i]` with a literal index."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "size"
        and isinstance(node.func.value, cst.Name)
        and len(node.args) == 1
        and node.args[0].keyword is None
    ):
        index = p.number(node.args[0].value)
        return (node.func.value, int(index)) if index is not None and index == int(index) else None
    if (
        isinstance(node, cst.Subscript)
        and isinstance(node.value, cst.Attribute)
        and node.value.attr.value == "shape"
        and isinstance(node.value.value, cst.Name)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
    ):
        index = p.number(node.slice[0].slice.value)
        return (node.value.value, int(index)) if index is not None and index == int(index) else None
    return None


def contains_softmax(node: cst.CSTNode, scope: p.Scope) -> bool:
    finder = _Softmaxes(scope)
    node.visit(finder)
    return finder.found


class _Softmaxes(cst.CSTVisitor):
    def __init__(self, scope: p.Scope) -> None:
        self.scope = scope
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        if p.softmax_call(node, self.scope) is not None:
            self.found = True


class ProductFinder(cst.CSTVisitor):
    def __init__(self, scope: FunctionScope) -> None:
        self.scope = scope
        self.found: list[tuple[cst.BaseExpression, p.Product]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseExpression):
            product = self.scope.product(node)
            if product is not None:
                self.found.append((node, product))
        return True


def type_name(node: cst.BaseExpression) -> bool:
    """`x.type()` with no argument: the name of x's type (a string), a read of its dtype, no cast."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "type"
        and not node.args
    )


class ReadFinder(cst.CSTVisitor):
    """Reads of chain names, sorted by what they read of the chain.

    `.dtype`/`.device` attributes (and `.type()`, the dtype's name), `expand_as(chain)`, `reshape_as(chain)`, sizes,
    other shape reads, and plain reads of the values.
    """

    def __init__(self, env: dict[str, Value], exclude: cst.CSTNode | None) -> None:
        self.env = env
        self.exclude = exclude
        self.attributes: list[cst.Attribute] = []
        self.expands: list[cst.Call] = []
        self.reshapes: list[tuple[cst.Call, cst.Name]] = []  # `x.reshape_as(scores)`, `x.view_as(scores)`
        self.shapes: list[cst.Name] = []
        self.sizes: list[tuple[cst.CSTNode, cst.Name, int]] = []  # `scores.size(i)`, `scores.shape[i]`
        self.plain: list[cst.Name] = []
        self.typed: list[cst.Name] = []  # the `scores` of `x.type_as(scores)`, `x.to(scores)`

    def is_chain(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Name) and isinstance(self.env.get(node.value), ChainVal)

    def cast_like(self, node: cst.Call) -> bool:
        """`x.type_as(scores)` or `x.to(scores)`: x cast to the scores' dtype and moved to their device, which are
        the query's, their values unread."""
        return (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("type_as", "to")
            and len(node.args) == 1
            and node.args[0].keyword is None
            and not node.args[0].star
            and self.is_chain(node.args[0].value)
        )

    def values_read(self) -> list[cst.Name]:
        """The chain names read for more than their dtype, device or shape, a cast to their type counted: only a
        chain operation's operand, detached (`ChainReads.detach`), may cast to the scores' type."""
        return [*self.plain, *self.typed]

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.exclude:
            return False
        size = size_read(node)
        if size is not None and self.is_chain(size[0]):
            self.sizes.append((node, size[0], size[1]))
            return False
        if isinstance(node, cst.Attribute) and self.is_chain(node.value):
            if node.attr.value in ("dtype", "device"):
                self.attributes.append(node)
                return False
            if node.attr.value in ("shape", "ndim"):
                self.shapes.append(node.value)  # type: ignore[arg-type]
                return False
            if node.attr.value in ("size", "dim"):
                self.shapes.append(node.value)  # type: ignore[arg-type]
                return False
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if type_name(node) and self.is_chain(node.func.value):
                self.attributes.append(node.func)  # `probs.type()` names their dtype (a string), as `.dtype` does
                return False
            if node.func.attr.value == "expand_as" and len(node.args) == 1 and self.is_chain(node.args[0].value):
                self.expands.append(node)
                node.func.value.visit(self)
                return False
            if self.cast_like(node):
                self.typed.append(node.args[0].value)  # type: ignore[arg-type]
                node.func.value.visit(self)
                return False
            if node.func.attr.value in ("reshape_as", "view_as") and len(node.args) == 1 and self.is_chain(node.args[0].value):
                target = node.args[0].value
                assert isinstance(target, cst.Name)
                self.reshapes.append((node, target))
                node.func.value.visit(self)
                return False
        if isinstance(node, cst.Name) and self.is_chain(node):
            self.plain.append(node)
        if isinstance(node, cst.Arg):
            node.value.visit(self)
            return False
        if isinstance(node, cst.Attribute):
            node.value.visit(self)
            return False
        return True
