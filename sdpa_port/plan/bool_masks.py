"""Masks a model converts to booleans for a masking fill: when to hand the builder's mask over unconverted.

MPT's model hands its layers `create_causal_mask(...).to(torch.bool)`, and its attention fills the scores where
that is True: `scores.masked_fill(attention_mask, torch.finfo(dtype).min)`. Under eager the builder's float mask
is 0 where a key is kept and `finfo.min` where it is masked, so the conversion marks the masked keys; under sdpa the
builder returns its own boolean mask (True where kept) or None, which the conversion cannot turn into that (None
fails, a kept key would be filled). So the port hands the builder's mask over unconverted, as every implementation
expects it, and the eager function adds it instead of filling: `scores + attention_mask`. That is exact: a kept key
adds 0, a masked one gives `score + finfo.min`, which rounds to `finfo.min` for any score below 2^103 in magnitude,
the value the fill wrote; a row with every key masked is uniform either way.

It applies only where the conversion is the whole story: every mask reaching the module is a converted builder
mask (or none); the module uses it only in that fill, with `finfo(...).min`; and every forward on the way hands it
on untouched (only as an argument of a call).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import libcst.matchers as m

from sdpa_port.analyse.mask_flow import MaskFlow
from sdpa_port.analyse.mask_values import Kind, Origin, none_comparison
from sdpa_port.analyse.chain import Fill
from sdpa_port.analyse.patterns import FINFO_MIN


@dataclass(frozen=True)
class Converted:
    """The conversions to drop (their lines) for one attention class whose fill becomes an addition."""

    lines: frozenset[int]


def converted_fill(flow: MaskFlow, class_name: str, mask_param: str, fill: Fill, forward: ast.FunctionDef) -> Converted | str | None:
    """`Converted` when the fill on `mask_param` can become an addition of the builder's own mask; a reason when
    converted masks reach the module but the rule does not apply; None when no converted mask reaches it. Every call
    counts, cross-attention included: the eager function adds whatever mask each call hands it. `forward` is the one
    traced, its helpers inlined; the fill must happen whenever the chain runs and the mask is given (the
    implementations receive it exactly then)."""
    origins: set[Origin] = set()
    for site in flow.modules.sites_of([class_name]):
        origins |= flow.site_masks(site, class_name, mask_param, ()).origins
    converted = {o for o in origins if o.to_bool}
    if not converted:
        return None
    others = [o for o in origins if not o.to_bool and o.kind is not Kind.NONE]
    if others:
        return f"it also receives {others[0].describe()}"
    if not (
        m.matches(fill.condition, m.Name(mask_param)) and not fill.keep_where_true and m.matches(fill.fill, FINFO_MIN)
    ):
        return "it is not filled with `torch.finfo(...).min` exactly where the converted mask is True"
    reads = [
        n for n in ast.walk(forward) if isinstance(n, ast.Name) and n.id == mask_param and isinstance(n.ctx, ast.Load)
    ]
    tested = [n for n in ast.walk(forward) if isinstance(n, ast.expr) and _tests(n, mask_param) is not None]
    if len(reads) != 1 + len(tested):
        return f"`{mask_param}` is read other than by the fill and `is None` tests"
    if not fill.with_chain:
        return "the fill happens only under a condition, but the implementations receive the mask whenever it is given"
    passing = _passed_on_only(flow, class_name)
    if passing is not None:
        return passing
    return Converted(frozenset(o.line for o in converted))


def _tests(test: ast.expr, name: str) -> bool | None:
    """True for `<name> is not None`, False for `<name> is None`, None for any other test."""
    compared = none_comparison(test)
    return compared[1] if compared is not None and compared[0] == name else None


def _passed_on_only(flow: MaskFlow, attention: str) -> str | None:
    """Why some forward that receives a converted mask (other than the attention's) does more than hand it on."""
    for class_name in flow.modules.classes:
        if class_name == attention:
            continue
        found = flow.modules.method(class_name, "forward")
        if found is None or found[0] != class_name:
            continue
        function = found[1]
        for arg in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs][1:]:
            if not any(o.to_bool for o in flow.param_origins(class_name, "forward", arg.arg)):
                continue
            if not _only_arguments(function, arg.arg):
                return f"`{class_name}.forward` uses the converted mask `{arg.arg}` other than by handing it on"
    return None


def _only_arguments(function: ast.FunctionDef, name: str) -> bool:
    """Every read of `name` is a whole argument of a call."""
    arguments: set[int] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            arguments |= {id(a) for a in node.args} | {id(k.value) for k in node.keywords}
    return all(
        id(n) in arguments
        for n in ast.walk(function)
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
    )

__all__ = ["Converted", "converted_fill"]
