"""Tell self-attention calls from cross-attention calls of one module (read-only).

A module that serves both (GPT-2's `is_cross_attention`, BART's `key_value_states`) computes its keys from a
parameter the queries do not read. When every such parameter is None, the call attends to its own hidden states:
only then may a missing mask mean "causal". Caches also feed only the keys, but they extend the module's own keys
rather than replace them; they are told apart by their conventional names.
"""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from sdpa_port.analyse.patterns import walk_names
from sdpa_port.discover.values import is_cache_parameter, is_mask_parameter


def dependencies(function: cst.FunctionDef, params: set[str]) -> dict[str, set[str]]:
    """For each local, the parameters its value was computed from (in source order, control flow ignored)."""
    deps: dict[str, set[str]] = {p: {p} for p in params}

    class Walk(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            sources: set[str] = set()
            for name in walk_names(node.value):
                sources |= deps.get(name, set())
            for target in node.targets:
                for name in walk_names(target.target):
                    deps[name] = deps.get(name, set()) | sources

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            for name in walk_names(node.target):
                for source in walk_names(node.value):
                    deps[name] = deps.get(name, set()) | deps.get(source, set())

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    function.body.visit(Walk())
    return deps


def parameters_of(function: cst.FunctionDef) -> set[str]:
    params = function.params
    names = {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}
    return names - {"self"}


def _reached(names: Iterable[str], deps: dict[str, set[str]], params: set[str]) -> set[str]:
    out: set[str] = set()
    for name in names:
        out |= deps.get(name, {name} if name in params else set())
    return out


def key_only_parameters(
    function: cst.FunctionDef,
    key: cst.BaseExpression,
    query: cst.BaseExpression,
    helper: tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None = None,
) -> tuple[str, ...]:
    """Parameters that feed the keys and not the queries, caches and masks aside: all None means self-attention.

    With `helper` (the method computing the attention and the arguments `function` binds to its parameters), `key`
    and `query` are read in the helper and followed back through its locals and parameters into `function`.
    """
    extra = _key_side_parameters(function, key, query, helper)
    return tuple(sorted(p for p in extra if not is_cache_parameter(p) and not is_mask_parameter(p)))


def keys_aligned(
    function: cst.FunctionDef,
    key: cst.BaseExpression,
    query: cst.BaseExpression,
    helper: tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None = None,
) -> bool:
    """The keys read no parameter the queries do not, caches included (masks aside): self-attention over the call's
    own positions, key j at position j. (A module that shortened its keys, pooling them from the same input, would
    pass this test; none such also slices a causal buffer.)"""
    return all(is_mask_parameter(p) for p in _key_side_parameters(function, key, query, helper))


def _key_side_parameters(
    function: cst.FunctionDef,
    key: cst.BaseExpression,
    query: cst.BaseExpression,
    helper: tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None,
) -> set[str]:
    key_names, query_names = walk_names(key), walk_names(query)
    if helper is not None:
        inner, bound = helper
        inner_params = parameters_of(inner)
        inner_deps = dependencies(inner, inner_params)
        key_names = _argument_names(_reached(key_names, inner_deps, inner_params), bound)
        query_names = _argument_names(_reached(query_names, inner_deps, inner_params), bound)
    params = parameters_of(function)
    deps = dependencies(function, params)
    return _reached(key_names, deps, params) - _reached(query_names, deps, params)


def _argument_names(parameters: set[str], bound: dict[str, cst.BaseExpression]) -> set[str]:
    out: set[str] = set()
    for parameter in parameters:
        if parameter in bound:
            out |= walk_names(bound[parameter])
    return out


def self_attention_test(parameters: tuple[str, ...]) -> str:
    """Code that is true for self-attention calls: every key-only parameter is None ("True" when there is none)."""
    return " and ".join(f"{p} is None" for p in parameters) or "True"


__all__ = ["key_only_parameters", "keys_aligned", "self_attention_test", "dependencies", "is_cache_parameter", "is_mask_parameter"]
