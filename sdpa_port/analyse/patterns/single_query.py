"""Read an einsum equation as single-query attention: one query per head, with no length axis of its own.

Before (attention pooling, PoNet's): the query `q` is (batch, heads, dim), one row per head, and so are the scores
and the output, without a query axis:

    att = torch.einsum("bdh,bdlh->bdl", q, k)          # (batch, heads, key)
    v = torch.einsum("bdlh,bdl->bdh", value, att.softmax(-1))

After: SDPA is handed the query with a length axis of 1 (`q.unsqueeze(-2)`), and its output has that axis removed
(`.squeeze(-2)`), then laid out as the einsum lays out its own.

The subscripts prove it: the query holds the key's leading letters and the contracted one, never the key's length
letter; the scores hold the leads and the key's length letter, in that order (the key's length last, as a softmax
over the keys reads it), and nothing else. The product with V takes those scores (either operand), a value holding
the leads, the key's length and a width of its own, and gives the leads and that width.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdpa_port.analyse.patterns.layouts import Order


@dataclass(frozen=True)
class SingleQueryScores:
    """`a,b->out` read as single-query scores: `left` permutes the query (a) to (leads, dim), `right` the key (b) to
    (leads, length, dim); None where the operand already is so. `rank` is the scores' (leads and the key's length)."""

    rank: int
    left: Order | None
    right: Order | None


@dataclass(frozen=True)
class SingleQueryOutput:
    """The product with V of single-query probabilities: `probabilities_left` says which operand holds them; `value`
    permutes the value to (leads, length, width), `result` SDPA's output, its query axis squeezed, to the spec's."""

    probabilities_left: bool
    rank: int
    value: Order | None
    result: Order | None


def _split(spec: str) -> tuple[str, str, str] | None:
    if "->" not in spec or "." in spec:
        return None
    inputs, out = spec.split("->")
    parts = inputs.split(",")
    if len(parts) != 2 or any(len(set(x)) != len(x) for x in (*parts, out)):
        return None
    return parts[0], parts[1], out


def single_query_scores(spec: str) -> SingleQueryScores | None:
    """The spec read as single-query scores (`bhd,bhld->bhl`), None where it is not.

    The query has one letter less than the key (one or two leads, then the dimension), the output is exactly the
    leads in the query's order then the key's length letter."""
    split = _split(spec)
    if split is None:
        return None
    a, b, out = split
    if len(b) not in (3, 4) or len(a) != len(b) - 1 or len(out) != len(a):
        return None
    contracted = set(a) - set(out)
    key_length = [c for c in b if c not in a]
    if len(contracted) != 1 or len(key_length) != 1 or contracted - set(b):
        return None
    (d,), (k,) = contracted, key_length
    lead = "".join(c for c in a if c != d)
    if out != lead + k or set(b) != {*lead, k, d}:
        return None
    return SingleQueryScores(len(out), _order(a, lead + d), _order(b, lead + k + d))


def single_query_output(spec: str, rank: int) -> SingleQueryOutput | None:
    """The spec read as the product of single-query probabilities of that rank with V (`bhl,bhld->bhd` or
    `bdlh,bdl->bdh`), None where it is not.

    The probabilities' subscripts are positional: leads, then the key's length last. The value holds those leads,
    the key's length and one width letter; the output holds the leads and the width, never the key's length.
    """
    split = _split(spec)
    if split is None:
        return None
    a, b, out = split
    for probabilities_left, probs, value in ((True, a, b), (False, b, a)):
        if len(probs) != rank or len(value) != rank + 1:
            continue
        lead, k = probs[:-1], probs[-1]
        width = set(value) - set(probs)
        if len(width) != 1 or set(value) != {*lead, k, *width} or set(out) != {*lead, *width} or len(out) != rank:
            continue
        (d,) = width
        return SingleQueryOutput(probabilities_left, rank, _order(value, lead + k + d), _order(lead + d, out))
    return None


def _order(source: str, target: str) -> Order | None:
    order = tuple(source.index(c) for c in target)
    return None if order == tuple(range(len(order))) else order
