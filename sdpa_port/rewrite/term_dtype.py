"""A caller's tensor added to the scores is handed to SDPA in the query's dtype.

Eager's `scores + mask` promotes: a bool mask adds 0 or 1, an integer mask adds its values, a float16 mask joins
float32 scores. SDPA reads a bool `attn_mask` as keep or drop, and raises on an integer mask and on a floating one
it cannot take beside the query. A term read from a name whose dtype the port does not prove (the forward's
parameters, where the plan does not follow its callers, and the names bound from them) is converted to the query's
dtype: eager's addition for those dtypes, and a no-op without a copy for a term already in that dtype.

Before:

    if mask is not None:
        attn = attn + mask

After (the branch kept, so that a None mask stays None):

    sdpa_mask = None
    if mask is not None:
        sdpa_mask = mask.to(q.dtype)

A term already cast to the query (`mask.type_as(query)`, `mask.to(query.dtype)`), and a term reading no such name
(a relative-position bias computed from the query, the module's own buffers), is handed over as it is.

A term that may be a Python number on some path (`bias = 0.0 if mask is None else mask`, a helper's `score = 0`)
is handed over as `torch.atleast_2d(torch.as_tensor(bias, dtype=q.dtype, device=q.device))` where it reads such a
name or may be the whole mask: SDPA takes neither a number nor a tensor of no dimensions as its mask, and a number
added to every score changes no probability. Added to a mask already a tensor on every path, it goes as it is.
"""

from __future__ import annotations

from typing import AbstractSet

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import code, primary, walk_names
from sdpa_port.rewrite.layout import keyword_argument
from sdpa_port.rewrite.sdpa_builders import query_root


def unproven(op: t.AddTerm, names: AbstractSet[str]) -> bool:
    """Whether the added term reads a name whose dtype the port does not prove."""
    return bool(walk_names(op.term) & names)


def in_query_dtype(
    op: t.AddTerm,
    term: cst.BaseExpression,
    names: AbstractSet[str],
    query: cst.BaseExpression | None,
    alone: bool,
) -> cst.BaseExpression:
    """`term.to(query.dtype)` where the added term reads an unproven name; a term that may be a Python number as a
    tensor of the query's dtype and at least two dimensions where it reads one, or may be the whole mask (`alone`:
    nothing joined the mask before it on some path); the term itself otherwise (a number added to a tensor mask)."""
    if op.may_be_number and (alone or unproven(op, names)):
        return number_as_tensor(term, query_root(query))
    if op.may_be_number or not unproven(op, names):
        return term
    query = query_root(query)
    if _cast_to(term, query):
        return term
    dtype = cst.Attribute(value=query, attr=cst.Name("dtype"))
    return cst.Call(func=cst.Attribute(value=primary(term), attr=cst.Name("to")), args=[cst.Arg(dtype)])


def number_as_tensor(term: cst.BaseExpression, query: cst.BaseExpression) -> cst.Call:
    """`torch.atleast_2d(torch.as_tensor(term, dtype=query.dtype, device=query.device))`.

    A term that is a number on some path (`bias = 0.0 if mask is None else mask`) adds the same to every score,
    which changes no probability, but SDPA takes no number as its mask, nor a tensor of no dimensions. As a tensor
    of the query's dtype with at least two dimensions it broadcasts over the scores; a tensor term is converted to
    the query's dtype as a caller's tensor is, and keeps its shape."""
    as_tensor = cst.Call(
        func=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("as_tensor")),
        args=[
            cst.Arg(term),
            keyword_argument("dtype", cst.Attribute(value=query, attr=cst.Name("dtype"))),
            keyword_argument("device", cst.Attribute(value=query, attr=cst.Name("device"))),
        ],
    )
    return cst.Call(func=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("atleast_2d")), args=[cst.Arg(as_tensor)])


def bound_from(small: cst.BaseSmallStatement, names: AbstractSet[str]) -> set[str]:
    """The names an assignment binds from a value reading an unproven name (`m = mask[:, None]`): unproven too,
    unless the value is sizes (`b, n, c = x.shape`)."""
    if isinstance(small, cst.Assign):
        targets = [target.target for target in small.targets]
        value: cst.BaseExpression | None = small.value
    elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
        targets, value = [small.target], small.value
    else:
        return set()
    if value is None or _sizes(value) or not walk_names(value) & names:
        return set()
    return {name for target in targets for name in walk_names(target) if _bound(target, name)}


def _sizes(value: cst.BaseExpression) -> bool:
    """`x.shape`, `x.shape[i]`, `x.size(i)`: sizes, which are no tensor of the caller's."""
    while isinstance(value, cst.Subscript):
        value = value.value
    if isinstance(value, cst.Attribute):
        return value.attr.value == "shape"
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "size"


def _bound(target: cst.BaseExpression, name: str) -> bool:
    """`name` is bound by the target (a name, or one inside a tuple or list), not read by it (`x[i] = ...`)."""
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_bound(element.value, name) for element in target.elements)
    if isinstance(target, cst.StarredElement):
        return _bound(target.value, name)
    return False


def _cast_to(term: cst.BaseExpression, query: cst.BaseExpression) -> bool:
    """`x.type_as(query)`, `x.to(query)` or `x.to(query.dtype)`: already in the query's dtype."""
    if not (isinstance(term, cst.Call) and isinstance(term.func, cst.Attribute) and len(term.args) == 1):
        return False
    if term.func.attr.value not in ("to", "type_as") or term.args[0].keyword is not None:
        return False
    target = term.args[0].value
    if isinstance(target, cst.Attribute) and target.attr.value == "dtype" and term.func.attr.value == "to":
        target = target.value
    return code(target) == code(query)
