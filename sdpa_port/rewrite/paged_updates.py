"""Cache updates pass the forward's kwargs (`cache.update(k, v, self.layer_idx, kwargs=kwargs)`), as the models of a
release whose paged cache the model updates itself call it (5.25.0's `PagedAttentionCache.update` takes the kwargs
and fills in what the implementation then reads); other caches take the keyword in their `**kwargs`."""

from __future__ import annotations

import libcst as cst

from sdpa_port.rewrite.layout import append_arguments, keyword_argument

KEYWORD = "kwargs"


def is_cache_update(call: cst.Call) -> bool:
    """`x.update(keys, values, layer_idx, ...)`: three positional arguments, or a `layer_idx=` (a dict's or a set's
    `update` takes its items alone)."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "update"):
        return False
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return len(positional) >= 3 or any(a.keyword is not None and a.keyword.value == "layer_idx" for a in call.args)


def passes_kwargs(call: cst.Call) -> bool:
    return any(a.keyword is not None and a.keyword.value == KEYWORD or a.star == "**" for a in call.args)


class PassKwargs(cst.CSTTransformer):
    """Every cache update of the function gets `kwargs=<its **kwargs>`; `count` says how many."""

    def __init__(self, kwargs: str) -> None:
        self.kwargs = kwargs
        self.count = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not is_cache_update(updated) or passes_kwargs(updated):
            return updated
        self.count += 1
        return updated.with_changes(args=append_arguments(list(updated.args), [keyword_argument(KEYWORD, cst.Name(self.kwargs))]))


def pass_kwargs_to_updates(function: cst.FunctionDef, kwargs: str) -> tuple[cst.FunctionDef, int]:
    transformer = PassKwargs(kwargs)
    new = function.visit(transformer)
    assert isinstance(new, cst.FunctionDef)
    return new, transformer.count
