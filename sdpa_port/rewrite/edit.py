"""Tree edits every stage uses: names or nodes replaced, `config` rebased, a call laid out over lines.

Analysis reads some trees through a substitution (a helper's body with its arguments bound, a wrapper module's
forward read at its call); the rewrite passes build the port with the same edits. Each is a small transformer here,
so that every CST transformer of the package lives in `rewrite/`.
"""

from __future__ import annotations

from typing import Mapping

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import LINE_LENGTH, code, fits, hugged, one_per_line, primary, walk_names


class ReplaceNames(cst.CSTTransformer):
    """Replace reads of names (not attribute names, not keywords) by expressions."""

    def __init__(self, mapping: Mapping[str, cst.BaseExpression]) -> None:
        self.mapping = mapping

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        # restore the attribute name, which the generic Name rule may have touched
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)

    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        return original

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        replacement = self.mapping.get(original.value)
        if replacement is None:
            return updated
        return primary(replacement)  # the name may stand anywhere: a compound replacement keeps its own grouping


def replace_names(node: cst.CSTNode, mapping: Mapping[str, cst.BaseExpression]):  # type: ignore[no-untyped-def]
    if not mapping:
        return node
    return node.visit(ReplaceNames(mapping))


class ReplaceNodes(cst.CSTTransformer):
    """Replace specific node objects (nodes compare by identity) with new nodes."""

    def __init__(self, mapping: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.mapping = mapping

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        replacement = self.mapping.get(original_node)
        return replacement if replacement is not None else updated_node


def replace_nodes(node: cst.CSTNode, mapping: dict[cst.CSTNode, cst.CSTNode]):  # type: ignore[no-untyped-def]
    if not mapping:
        return node
    return node.visit(ReplaceNodes(mapping))


class _RebaseConfig(cst.CSTTransformer):
    """Move the `config` at the root of attribute chains between `config` and `self.config`."""

    def __init__(self, to_self: bool) -> None:
        self.to_self = to_self

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if self.to_self and updated.value == "config":
            return cst.Attribute(value=cst.Name("self"), attr=cst.Name("config"))
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        # attribute names are `Name` nodes too: `x.config` keeps its name
        updated = updated.with_changes(attr=original.attr)
        if not self.to_self and m.matches(updated, m.Attribute(value=m.Name("self"), attr=m.Name("config"))):
            return cst.Name("config")
        return updated


def rebase_config(node: cst.BaseExpression, to_self: bool) -> cst.BaseExpression:
    """`config.x.y` -> `self.config.x.y` (to_self) or back: only the `config` at the root of a chain moves."""
    result = node.visit(_RebaseConfig(to_self))
    assert isinstance(result, cst.BaseExpression)
    return result


class IndentTracking:
    """Mixed into a transformer: how many indented blocks enclose the node being visited (`depth`), so a line can be
    laid out where it stands."""

    depth = 0

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.depth += 1

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        self.depth -= 1
        return updated


def lay_out_call(
    statement: cst.BaseStatement, call: cst.Call, indent: int, limit: int = LINE_LENGTH
) -> cst.BaseStatement:
    """`statement` with `call` (a node inside it) laid out as ruff format would: on one line when the statement
    fits, else its arguments on one indented line, else one argument per line."""
    for layout in (hugged, one_per_line):
        if fits(statement, indent, limit):
            break
        laid = layout(call)
        candidate = replace_nodes(statement, {call: laid})
        statement, call = candidate, laid
    return statement


class _Substitute(cst.CSTTransformer):
    def __init__(self, env: dict[str, cst.BaseExpression], saved: dict[str, cst.BaseExpression], context: str | None):
        self.env = env
        self.saved = saved
        self.context = context
        self.failed = False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return not (self.context is not None and m.matches(node.value, m.Name(self.context)))

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        updated = updated.with_changes(attr=original.attr)  # `x.dim` reads the attribute, not a local `dim`
        if self.context is not None and m.matches(original.value, m.Name(self.context)):
            value = self.saved.get(original.attr.value)
            if value is None:
                self.failed = True
                return updated
            return value
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if original.value == self.context:
            self.failed = True  # `ctx` other than an attribute written before (those are replaced whole)
            return updated
        value = self.env.get(original.value)
        return value if value is not None else updated

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        if original.keyword is not None and updated.keyword is not None and updated.keyword.value != original.keyword.value:
            return updated.with_changes(keyword=original.keyword)
        return updated


def substitute(
    node: cst.BaseExpression, env: dict[str, cst.BaseExpression], saved: dict[str, cst.BaseExpression], context: str | None
) -> tuple[cst.BaseExpression, bool]:
    """`node` with each name of `env` replaced by its expression and each `<context>.x` by `saved[x]`; whether some
    read of `context` had no saved value (the substitution then failed)."""
    transformer = _Substitute(env, saved, context)
    result = node.visit(transformer)
    assert isinstance(result, cst.BaseExpression)
    return result, transformer.failed


class _SelfAs(cst.CSTTransformer):
    """`self` read as another expression (the module's attribute in its owner)."""

    def __init__(self, replacement: cst.BaseExpression) -> None:
        self.replacement = replacement

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if m.matches(original.value, m.Name("self")):
            return updated.with_changes(value=self.replacement)
        return updated


def self_as(node: cst.BaseExpression, replacement: cst.BaseExpression) -> cst.BaseExpression:
    """`node` with each `self.x` read as `<replacement>.x`."""
    result = node.visit(_SelfAs(replacement))
    assert isinstance(result, cst.BaseExpression)
    return result


class _Ordered(cst.CSTTransformer):
    """The operands of each `+` and `*` that reads a chain value in one order: adding or multiplying tensors
    commutes exactly (the same rounding, the same broadcast shape)."""

    def __init__(self, chains: frozenset[str]) -> None:
        self.chains = chains

    def leave_BinaryOperation(
        self, original: cst.BinaryOperation, updated: cst.BinaryOperation
    ) -> cst.BaseExpression:
        if not isinstance(updated.operator, (cst.Add, cst.Multiply)):
            return updated
        if not (walk_names(updated.left) | walk_names(updated.right)) & self.chains:
            return updated
        left, right = code(updated.left), code(updated.right)
        return updated.with_changes(left=updated.right, right=updated.left) if right < left else updated


def commuted(node: cst.BaseExpression, chains: frozenset[str]) -> cst.BaseExpression:
    """`node` with the operands of each `+` and `*` reading one of `chains` in one order (see `_Ordered`)."""
    result = node.visit(_Ordered(chains))
    assert isinstance(result, cst.BaseExpression)
    return result
