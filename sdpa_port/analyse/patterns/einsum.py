"""Read an einsum equation as attention's scores or its product with V, in any layout."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import libcst as cst

from sdpa_port.analyse.patterns.calls import arg
from sdpa_port.analyse.patterns.layouts import Order


def einsum_spec(call: cst.Call) -> str | None:
    """The equation of `einsum("ibnd, jbnd -> ijbn", ...)` without its spaces.

    None where it is not a literal.
    """
    spec = arg(call, 0, "equation")
    return str(spec.evaluated_value).replace(" ", "") if isinstance(spec, cst.SimpleString) else None


class EinsumRole(enum.Enum):
    SCORES = "scores"  # ...qd,...kd->...qk
    OUTPUT = "output"  # ...qk,...kd->...qd


@dataclass(frozen=True)
class EinsumRoles:
    """How an einsum spec maps to attention: as the scores or as the output.

    Scores are `...qd,...kd->...qk`, output `...qk,...kd->...qd`. 4-D operands may hold their dimensions in any order
    (`bind,bjnd->bnij`, `ibnd,jbnd->bnij`), and so may the scores (`ibnd,jbnd->ijbn`: Transformer-XL's (query, key,
    batch, heads)); the orders say how to bring each operand to SDPA's layout. `left` and `right` permute the operands
    to (lead, lead, length, dim), `result` permutes SDPA's (lead, lead, query, dim) output to the spec's, `scores` the
    scores as the spec lays them out to SDPA's (lead, lead, query, key); None where the operand already is so.
    """

    kind: EinsumRole
    rank: int
    left: Order | None = None
    right: Order | None = None
    result: Order | None = None
    scores: Order | None = None
    shared: int | None = None


def einsum_roles(spec: str, kind: EinsumRole, scores: Order | None = None) -> EinsumRoles | None:
    """The spec read as the product of that kind, None where it is not one.

    An output product's first operand is the probabilities laid out as `scores` says the chain's scores are (SDPA's
    layout where None).
    """
    if "->" not in spec or "." in spec:
        return None
    inputs, out = spec.split("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        return None
    a, b = parts
    if any(len(set(x)) != len(x) for x in (a, b, out)):
        return None
    if len(a) == len(out) == 4 and len(b) == 3:
        return _shared(a, b, out, kind, scores)
    if not (len(a) == len(b) == len(out)) or len(a) not in (3, 4):
        return None
    if kind is EinsumRole.SCORES:
        return _einsum_scores(a, b, out)
    if scores is not None and len(scores) != len(a):
        return None
    return _einsum_output(a if scores is None else "".join(a[i] for i in scores), b, out)


def _einsum_scores(a: str, b: str, out: str) -> EinsumRoles | None:
    """The roles of scores `a,b->out`, 3-D or 4-D.

    `out` holds the leads (read by both operands), q (by a alone) and k (by b alone) in any order; a holds the leads, q
    and the contracted d; b the leads, k and d, each in any order.
    """
    q = "".join(c for c in out if c in a and c not in b)
    k = "".join(c for c in out if c in b and c not in a)
    lead = "".join(c for c in out if c in a and c in b)
    contracted = set(a) - set(out)
    if len(q) != 1 or len(k) != 1 or len(contracted) != 1:
        return None
    if set(a) != {*lead, q, *contracted} or set(b) != {*lead, k, *contracted}:
        return None
    (d,) = contracted
    left, right = _order(a, f"{lead}{q}{d}"), _order(b, f"{lead}{k}{d}")
    scores = _order(out, f"{lead}{q}{k}")
    if scores is not None and b != a.replace(q, k):
        # scores laid out otherwise are read only from operands laid out alike (`ibnd,jbnd`): XLNet's segment term
        # `ijbs,ibns->bnij` pairs a length with the heads, which no query-key product does
        return None
    return EinsumRoles(EinsumRole.SCORES, len(out), left, right, scores=scores)


def _einsum_output(a: str, b: str, out: str) -> EinsumRoles | None:
    """The roles of the product with V `a,b->out`, 3-D or 4-D.

    a = (leads, q, k) as SDPA lays out the scores; b holds the leads, k and the value's d, out the leads, q and d, each
    in any order.
    """
    lead, q, k = a[:-2], a[-2], a[-1]
    width = set(b) - set(a)
    if len(width) != 1 or k in out or set(b) != {*lead, k, *width} or set(out) != {*lead, q, *width}:
        return None
    (d,) = width
    return EinsumRoles(EinsumRole.OUTPUT, len(a), right=_order(b, f"{lead}{k}{d}"), result=_order(f"{lead}{q}{d}", out))


def _shared(a: str, b: str, out: str, kind: EinsumRole, scores: Order | None) -> EinsumRoles | None:
    """A 4-D product whose 3-D right operand lacks one lead of the left one: shared by every head.

    Scores only as SDPA lays them out, `...qk` (the query the length beside the key's, the lead the operand lacks the
    other); the product with V of scores so laid out."""
    if scores is not None:
        return None
    missing = [c for c in a if c not in b]
    if kind is EinsumRole.SCORES:
        q, k = out[-2], out[-1]
        lead = out[:-2]
        contracted = set(a) - set(out)
        if k in a or k not in b or q not in a or len(contracted) != 1 or set(a) != {*lead, q, *contracted}:
            return None
        (d,) = contracted
        shared = [c for c in missing if c in lead]
        if len(shared) != 1 or set(b) != {*lead, k, d} - set(shared):
            return None
        (h,) = shared
        left = _order(a, f"{lead}{q}{d}")
        return EinsumRoles(
            EinsumRole.SCORES, 4, left, _order(b, f"{lead.replace(h, '')}{k}{d}"), shared=lead.index(h)
        )
    lead, q, k = a[:-2], a[-2], a[-1]
    width = set(b) - set(a)
    shared = [c for c in missing if c in lead]
    if len(width) != 1 or len(shared) != 1 or k in out or set(out) != {*lead, q, *width}:
        return None
    (d,), (h,) = width, shared
    if set(b) != {*lead, k, d} - {h}:
        return None
    right = _order(b, f"{lead.replace(h, '')}{k}{d}")
    return EinsumRoles(EinsumRole.OUTPUT, 4, right=right, result=_order(f"{lead}{q}{d}", out), shared=lead.index(h))


def _order(source: str, target: str) -> Order | None:
    """The permutation taking dimensions labelled `source` to `target`, None where it keeps them in place."""
    order = tuple(source.index(c) for c in target)
    return None if order == tuple(range(len(order))) else order
