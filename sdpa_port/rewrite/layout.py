"""Layout-keeping edits of parameter and argument lists: add an item the way the list is already laid out."""

from __future__ import annotations

from typing import TypeVar

import libcst as cst

_Item = TypeVar("_Item", cst.Param, cst.Arg)


def fresh_name(name: str, taken: set[str] | frozenset[str]) -> str:
    while name in taken:
        name = "_" + name
    return name


def with_star_kwargs(function: cst.FunctionDef, name: str) -> cst.FunctionDef:
    """`def f(a, b)` -> `def f(a, b, **name)`, keeping the parameters' layout."""
    params = function.params
    star = cst.Param(name=cst.Name(name), star="**")
    if params.kwonly_params:
        kwonly, (star,) = separated([*params.kwonly_params], [star])
        return function.with_changes(params=params.with_changes(kwonly_params=kwonly, star_kwarg=star))
    if isinstance(params.star_arg, cst.Param):
        laid, (star,) = separated([*params.params, params.star_arg], [star])
        return function.with_changes(params=params.with_changes(params=laid[:-1], star_arg=laid[-1], star_kwarg=star))
    plain, (star,) = separated([*params.params], [star])
    return function.with_changes(params=params.with_changes(params=plain, star_kwarg=star))


def with_keyword_parameter(function: cst.FunctionDef, name: str, default: cst.BaseExpression) -> cst.FunctionDef:
    """`def f(a, b)` -> `def f(a, b, name=default)` (keyword-only after `*args`), keeping the parameters' layout."""
    params = function.params
    parameter = cst.Param(cst.Name(name), default=default, equal=tight_equal())
    if params.kwonly_params:
        kwonly, added = separated([*params.kwonly_params], [parameter])
        return function.with_changes(params=params.with_changes(kwonly_params=[*kwonly, *added]))
    if isinstance(params.star_arg, cst.Param):
        laid, added = separated([*params.params, params.star_arg], [parameter])
        return function.with_changes(params=params.with_changes(params=laid[:-1], star_arg=laid[-1], kwonly_params=added))
    plain, added = separated([*params.params], [parameter])
    return function.with_changes(params=params.with_changes(params=[*plain, *added]))


def tight_equal() -> cst.AssignEqual:
    """`=` without spaces, as keyword arguments and parameter defaults are written."""
    return cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def separated(items: list[_Item], added: list[_Item]) -> tuple[list[_Item], list[_Item]]:
    """`items` and `added` laid out as one list continuing `items`: the separators between items go between the
    added ones too, and a trailing comma (or none) stays at the end."""
    space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    last: cst.Comma | cst.MaybeSentinel = cst.MaybeSentinel.DEFAULT
    between: cst.Comma = space
    if items:
        if isinstance(items[-1].comma, cst.Comma):
            last = items[-1].comma
        previous = items[-2].comma if len(items) > 1 else None
        between = previous if isinstance(previous, cst.Comma) else space
    new = [_comma(a, between) for a in added]
    new[-1] = _comma(new[-1], last)
    kept = list(items)
    if kept:
        kept[-1] = _comma(kept[-1], between)
    return kept, new


def _comma(item: _Item, comma: cst.Comma | cst.MaybeSentinel) -> _Item:
    changed: _Item = item.with_changes(comma=comma)
    return changed


def keyword_argument(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name), equal=tight_equal())


def append_arguments(args: list[cst.Arg], added: list[cst.Arg]) -> list[cst.Arg]:
    """Insert arguments before a `**` one (or at the end), keeping the call's layout."""
    index = next((i for i, a in enumerate(args) if a.star == "**"), len(args))
    before, after = args[:index], args[index:]
    if after:
        space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        comma = before[-1].comma if before and isinstance(before[-1].comma, cst.Comma) else space
        return [*before, *(a.with_changes(comma=comma) for a in added), *after]
    before, new = separated(before, added)
    return [*before, *new]
