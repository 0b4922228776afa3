"""Reshapes and casts of the scores, between the layouts SDPA can take.

`view`/`reshape` between the (b, h, q, k) and flat (b*h, q, k) layouts or to a 5-D grouping whose shape can be read,
and dtype casts (an upcast is noted). A view that keeps the rank, or one whose layout cannot be told, is refused S108;
an operation on the scores that is neither a view nor a cast, S101.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import Cast, Poison, View, short
from sdpa_port.analyse.chain_reads import type_name
from sdpa_port.analyse.cstutil import assigned_between
from sdpa_port.analyse.forms.common import GAP, Example, casts_to_float32, method_on_chain, scored, sdpa
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def reshape(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    found = method_on_chain(tracer, node, p.RESHAPE_METHODS)
    if found is None:
        return None
    call, receiver, _ = found
    base, ops = tracer.decompose(receiver, line)
    current = tracer.chains.advance(base, ops)
    after = tracer.ranks.view_rank(call.args)
    heads = None
    if current.rank == 3 and after == 4:
        heads = (call.args[0].value, call.args[1].value) if len(call.args) == 4 else _tuple_heads(tracer, call)
    if current.rank is None and after is not None and after != 4:
        raise Poison(Code.LAYOUT, "the scores are reshaped and their layout cannot be told", {base.cid})
    if after is not None and after == (current.rank or 4):
        # a view that keeps the rank may still regroup the entries (`view(b, q, h, k)` of (b, h, q, k))
        raise Poison(
            Code.LAYOUT,
            f"the scores are viewed as `{short(node)}`, a shape of the same rank that may regroup them",
            {base.cid},
        )
    if current.order is not None:
        raise Poison(Code.LAYOUT, "the regrouped scores are viewed back before they are permuted back", {base.cid})
    shape = None
    if (current.rank in (3, 4) and after in REGROUPED) or (current.rank in REGROUPED and after in (3, 4)):
        shape = tracer.ranks.view_shape(call.args)
        if shape is None:
            raise Poison(
                Code.LAYOUT, f"the scores are regrouped by `{short(node)}`, a shape that cannot be read", {base.cid}
            )
    return base, [*ops, View(current.rank, after if after is not None else current.rank, heads, shape)]


def permuted(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    """Regrouped scores permuted by literal dimensions (`.permute(0, 2, 1, 3, 4, 5)`), to add a term laid out
    otherwise; the view back must find them permuted back (`rewrite/sdpa_layout.outside_regroupings`)."""
    found = method_on_chain(tracer, node, frozenset({"permute"}))
    if found is None:
        return None
    call, receiver, _ = found
    base, ops = tracer.decompose(receiver, line)
    current = tracer.chains.advance(base, ops)
    if current.rank not in REGROUPED:
        return None  # the scores' own dimensions permuted: refused as any other method (S101)
    values = [arg.value for arg in call.args]
    if len(values) == 1 and isinstance(values[0], (cst.Tuple, cst.List)):
        values = [element.value for element in values[0].elements]
    order = tuple(int(v.value) if isinstance(v, cst.Integer) else -1 for v in values)
    if sorted(order) != list(range(current.rank)) or any(arg.keyword is not None or arg.star for arg in call.args):
        said = f"the regrouped scores are permuted by `{short(node)}`, an order not read"
        raise Poison(Code.LAYOUT, said, {base.cid})
    return base, [*ops, View(current.rank, current.rank, None, None, order)]


def _tuple_heads(
    tracer: TracerView, call: cst.Call
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The batch and head sizes of `view(*sizes)`, as readable where the view is.

    Sizes read from a tuple written earlier (`output_size = (q.size(1), q.size(2), ...)`) read its names as they were
    then. Where one is bound again since (`q = q.view(s, b * h, d)`) it holds something else at the view, and the sizes
    are read from the tuple itself (`output_size[0]`, `output_size[1]`), which holds them there.
    """
    heads = tracer.ranks.tuple_heads(call.args)
    if heads is None:
        return None
    read = p.walk_names(heads[0]) | p.walk_names(heads[1])
    if not read & assigned_between(tracer.function, heads, [call]):
        return heads
    held = call.args[0].value
    if not isinstance(held, cst.Name):
        return None
    return _item(held, 0), _item(held, 1)


def _item(node: cst.Name, index: int) -> cst.Subscript:
    return cst.Subscript(node, [cst.SubscriptElement(cst.Index(cst.Integer(str(index))))])


def cast(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    found = method_on_chain(tracer, node, p.CAST_METHODS)
    if found is None:
        return None
    call, receiver, name = found
    if type_name(call):
        return None  # `x.type()` names the tensor's type (a string): no cast
    base, ops = tracer.decompose(receiver, line)
    return base, [*ops, Cast(name in ("float", "double") or casts_to_float32(call, tracer.scope))]


# the ranks of scores regrouped to add a term (`view(b // w, w, h, q, k)`, and 6-D with frames apart)
REGROUPED = (5, 6)

_SHAPE = "b, h, s, d = query.shape\nquery = query.view(b, h, s, d)\n"
# BART's layout: 3-D products over `(b * h, s, d)` operands, the scores viewed 4-D to add the mask
_FLATTENED = (
    "b, h, s, d = query.shape\nquery = query.reshape(b * h, s, d)\nkey = key.reshape(b * h, s, d)\n"
    "value = value.reshape(b * h, s, d)\nscores = torch.bmm(query, key.transpose(1, 2))\n"
    "scores = scores.view(b, h, s, s) + attention_mask\nprobs = scores.view(b * h, s, s).softmax(-1)\n"
    "return torch.bmm(probs, value).view(b, h, s, d)"
)

# the sizes of the 4-D view held in a tuple first (Megatron's `output_size`), read where the tuple is written
_SIZES = (
    "b, h, s, d = query.shape\nsizes = ({first}, {second}, s, s)\nquery = query.reshape(b * h, s, d)\n"
    "key = key.reshape(b * h, s, d)\nvalue = value.reshape(b * h, s, d)\n"
    "scores = torch.bmm(query, key.transpose(1, 2))\nscores = scores.view(*sizes) + attention_mask\n"
    "probs = scores.view(b * h, s, s).softmax(-1)\nreturn torch.bmm(probs, value).view(b, h, s, d)"
)

# Megatron's seq-first layout: (s, b, h, d) operands flattened to (s, b * h, d), the product on them transposed, the
# scores viewed back through a tuple of sizes read before the flattening, a second tuple written after
_MEGATRON = (
    "s, b, h, d = query.shape\noutput_size = (query.size(1), query.size(2), query.size(0), key.size(0))\n"
    "query = query.reshape(s, b * h, d)\nkey = key.reshape(s, b * h, d)\nvalue = value.reshape(s, b * h, d)\n"
    "scores = torch.bmm(query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2))\n"
    "scores = scores.view(*output_size)\nscores = scores + attention_mask\n"
    "output_size = (value.size(1), query.size(0), value.size(2))\n"
    "probs = scores.view(b * h, s, s).softmax(-1)\ncontext = torch.bmm(probs, value.transpose(0, 1))\n"
    "return context.view(b, h, s, d)"
)

# scores regrouped by twos of the batch, the pairs put beside the heads to add a bias laid out that way, then back
_PAIRED = (
    "b, h, s, d = query.shape\nquery = query.view(b, h, s, d)\nscores = torch.matmul(query, key.transpose(-1, -2))\n"
    "scores = scores.view(b // 2, 2, h, s, s).permute(0, 2, 1, 3, 4) + self.pair_bias\n"
    "{back}\nprobs = scores.softmax(-1)\nreturn torch.matmul(probs, value)"
)
_PAIR_BIAS = "self.pair_bias = nn.Parameter(torch.zeros(4, 2, 8, 8))"

EXAMPLES = {
    "permuted": (
        Example(
            _PAIRED.format(back="scores = scores.permute(0, 2, 1, 3, 4).view(b, h, s, s)"),
            View,
            init=_PAIR_BIAS,
            # the zeros regrouped and permuted as the scores were, the sum permuted back to the scores' own order
            becomes="scores_shape = query.shape[:-1] + key.shape[-2:-1]\nreturn "
            + sdpa(
                "attn_mask=(query.new_zeros(scores_shape).view(b // 2, 2, h, s, s).permute(0, 2, 1, 3, 4)"
                " + self.pair_bias).permute(0, 2, 1, 3, 4).reshape(scores_shape)",
                "scale=1.0",
            ),
        ),
        # viewed back while still permuted: the entries would come back in another order
        Example(_PAIRED.format(back="scores = scores.view(b, h, s, s)"), init=_PAIR_BIAS, refused=Code.LAYOUT),
        # an order the file does not write out
        Example(
            _PAIRED.format(back="scores = scores.permute(*self.order).view(b, h, s, s)"),
            init=_PAIR_BIAS + "\nself.order = (0, 2, 1, 3, 4)",
            refused=Code.LAYOUT,
        ),
        # the scores' own dimensions permuted, not regrouped first: a method SDPA has no equivalent for
        Example(scored("probs = scores.permute(0, 1, 3, 2).softmax(-1)"), refused=Code.SCORES_TRANSFORMED),
    ),
    "reshape": (
        # SDPA gets the operands unflattened with the sizes the view names, and its output flattened back
        Example(
            _FLATTENED,
            View,
            becomes=sdpa(
                "attn_mask=attention_mask",
                "scale=1.0",
                operands="query.unflatten(0, (b, h)), key.unflatten(0, (b, h)), value.unflatten(0, (b, h))",
            )
            + ".flatten(0, 1).view(b, h, s, d)",
        ),
        # the sizes read from a tuple of names that keep their values up to the SDPA call
        Example(
            _SIZES.format(first="b", second="h"),
            View,
            becomes=sdpa(
                "attn_mask=attention_mask",
                "scale=1.0",
                operands="query.unflatten(0, (b, h)), key.unflatten(0, (b, h)), value.unflatten(0, (b, h))",
            )
            + ".flatten(0, 1).view(b, h, s, d)",
        ),
        # a view of the same rank may regroup the entries
        Example(scored("probs = scores.view(b, s, h, s).softmax(-1)", _SHAPE), refused=Code.LAYOUT),
        # the tuple's sizes read the query before it is flattened: read again there, they would be (b * h, s), so
        # they are read from the tuple, which nothing binds again
        Example(
            _SIZES.format(first="query.size(0)", second="query.size(1)"),
            View,
            becomes=sdpa(
                "attn_mask=attention_mask",
                "scale=1.0",
                operands="query.unflatten(0, (sizes[0], sizes[1])), key.unflatten(0, (sizes[0], sizes[1])), "
                "value.unflatten(0, (sizes[0], sizes[1]))",
            )
            + ".flatten(0, 1).view(b, h, s, d)",
        ),
        # Megatron's seq-first layout, the tuple bound again after the view: the sizes are bound where it reads them
        Example(
            _MEGATRON,
            View,
            becomes="sdpa_batch, sdpa_heads = output_size[0], output_size[1]"
            + GAP
            + "context = "
            + sdpa(
                "attn_mask=attention_mask",
                "scale=1.0",
                operands="query.transpose(0, 1).unflatten(0, (sdpa_batch, sdpa_heads)), "
                "key.transpose(0, 1).unflatten(0, (sdpa_batch, sdpa_heads)), "
                "value.transpose(0, 1).unflatten(0, (sdpa_batch, sdpa_heads))",
            )
            + ".flatten(0, 1)",
        ),
    ),
    "cast": (
        Example(scored("probs = scores.float().softmax(-1).type_as(value)"), Cast, becomes=sdpa("scale=1.0")),
        # cast to the value's dtype after the softmax with nothing upcast before it: query and key may be wider than
        # the value (float32 rotary tables in a bf16 model), so SDPA gets them in the value's dtype
        Example(
            scored("probs = scores.softmax(-1).to(value.dtype)"),
            Cast,
            becomes="sdpa_query = query.to(value.dtype)\nsdpa_key = key.to(value.dtype)\nreturn "
            + sdpa("scale=1.0", operands="sdpa_query, sdpa_key, value"),
        ),
        Example(scored("probs = scores.round().softmax(-1)"), refused=Code.SCORES_TRANSFORMED),  # no cast
    ),
}
