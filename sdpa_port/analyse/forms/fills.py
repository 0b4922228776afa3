"""Masking fills: the scores set very negative where a condition says so, the probabilities zeroed where it did.

The probabilities are set to 0 after the softmax where the same mask masked the scores.

`scores.masked_fill(mask, value)`, `torch.masked_fill`, `torch.where(condition, scores, value)` either way round (and
the multiplicative masks of `forms/blends.py`, read as such fills). What is read: the condition
(negations undone), whether the fill absorbs the scores it replaces (-inf, finfo.min) or not (-1e4), whether a triangle
buffer makes it causal (bottom-right) or top-left, and whether it can mask every key of a real row. A fill with a value
that is not very negative is refused M201; a zeroing after the softmax is exact only where an absorbing fill masked the
same positions (M201 otherwise) and nothing else masks the row (M202 otherwise).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.booleans import BooleanReader, zero_one_threshold
from sdpa_port.analyse.chain import PROBS, AddTerm, Fill, Guard, Op, Poison, Softmax, ZeroRows, short
from sdpa_port.analyse.forms.common import Example, method_on_chain, scored, sdpa
from sdpa_port.analyse.forms.fill_helpers import helper_fill_values
from sdpa_port.analyse.forms.guard_pairs import MASKED_GUARDS, TWO_GUARDS, guarded_alike
from sdpa_port.analyse.forms.terms import always_applied
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def masked_fill_method(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    found = method_on_chain(tracer, node, {"masked_fill", "masked_fill_"})
    if found is None:
        return None
    call, receiver, _ = found
    base, ops = tracer.decompose(receiver, line)
    return base, [
        *ops,
        masking_fill(tracer, p.arg(call, 0, "mask"), p.arg(call, 1, "value"), False, line, base.cid, ops),
    ]


def masked_fill_function(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    if not isinstance(node, cst.Call) or len(node.args) != 3 or tracer.scope.qualify(node.func) != "torch.masked_fill":
        return None
    base, ops = tracer.decompose(node.args[0].value, line)
    return base, [*ops, masking_fill(tracer, node.args[1].value, node.args[2].value, False, line, base.cid, ops)]


def where(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    if (
        not isinstance(node, cst.Call)
        or len(node.args) != 3
        or tracer.scope.qualify(node.func) not in p.WHERE_FUNCTIONS
    ):
        return None
    condition, when_true, when_false = (a.value for a in node.args)
    if tracer.reads.chain_value_refs(condition):
        raise Poison(Code.SCORES_READ, "the scores decide their own mask", tracer.reads.chain_value_refs(condition))
    if tracer.chain_or_start(when_true) and not tracer.reads.chain_value_refs(when_false):
        base, ops = tracer.decompose(when_true, line)
        return base, [*ops, masking_fill(tracer, condition, when_false, True, line, base.cid, ops)]
    if tracer.chain_or_start(when_false) and not tracer.reads.chain_value_refs(when_true):
        base, ops = tracer.decompose(when_false, line)
        return base, [*ops, masking_fill(tracer, condition, when_true, False, line, base.cid, ops)]
    return None


def lower_ones(
    tracer: TracerView, node: cst.BaseExpression, depth: int = 0
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """A lower triangle of ones, `torch.tril(torch.ones(..., rows, keys))` on its diagonal, through casts, `bool()` and
    views keeping its last two sizes: its rows and keys. Each row keeps the first key, so no row loses every key.

    Views are followed only where they write the same last two sizes (`.view(1, 1, t, s)` of `ones((1, t, s))`).
    """
    if depth > 8:
        return None
    found = p.method_call(node, p.CAST_METHODS | {"bool"})
    if found is not None:
        return lower_ones(tracer, found[0], depth + 1)
    if isinstance(node, cst.Name):
        values = tracer.scope.local_values(node.value)
        read = [lower_ones(tracer, value, depth + 1) for value in values if node.value not in p.walk_names(value)]
        kept = [k for k in read if k is not None]
        if not values or len(kept) != len(values):
            return None
        same = all(k[0].deep_equals(kept[0][0]) and k[1].deep_equals(kept[0][1]) for k in kept)
        return kept[0] if same else None
    reshaped = p.reshape_args(node)
    if reshaped is not None:
        inner = lower_ones(tracer, reshaped[0], depth + 1)
        args = reshaped[1]
        if inner is None or len(args) < 2 or any(a.star or a.keyword for a in args):
            return None
        kept_sizes = inner[0].deep_equals(args[-2].value) and inner[1].deep_equals(args[-1].value)
        return inner if kept_sizes else None
    if not isinstance(node, cst.Call) or tracer.scope.qualify(node.func) != "torch.tril" or len(node.args) != 1:
        return None
    ones = node.args[0].value
    if not isinstance(ones, cst.Call) or tracer.scope.qualify(ones.func) != "torch.ones":
        return None
    sizes = [a.value for a in ones.args if a.keyword is None and not a.star]
    if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
        sizes = [e.value for e in sizes[0].elements]
    return (sizes[-2], sizes[-1]) if len(sizes) >= 2 else None


def masking_fill(
    tracer: TracerView,
    condition: cst.BaseExpression | None,
    fill: cst.BaseExpression | None,
    keep_where_true: bool,
    line: int,
    cid: int,
    pending: Sequence[Op] = (),
) -> Fill | ZeroRows:
    """A masking fill of the scores, or after the softmax a zeroing where an earlier fill masked them.

    `pending`, the ops of the expression so far, may hold the softmax.
    """
    if condition is None or fill is None:
        raise Poison(Code.FILL_VALUE, "a masking fill without a mask or a value", {cid})
    candidate = tracer.chains.candidates[cid]
    if candidate.stage == PROBS or any(isinstance(op, Softmax) for op in pending):
        return zero_rows(tracer, condition, fill, keep_where_true, cid, pending)
    values = helper_fill_values(tracer, fill)
    if values is None:
        values = (fill,), tracer.scope
    if not all(p.is_very_negative(value, values[1]) for value in values[0]):
        raise Poison(
            Code.FILL_VALUE, f"masked scores are set to `{short(fill)}`, not to a large negative value", {cid}
        )
    condition, keep_where_true = kept_condition(tracer, condition, keep_where_true)
    triangle = triangle_slice(tracer, condition) if keep_where_true else None
    diagonal = triangle[0] if triangle is not None and _bottom_right(triangle[1]) else None
    top_left = triangle is not None and _top_left(triangle[1])
    causal = diagonal is Diagonal.CAUSAL
    absorbing = all(p.is_absorbing(value, values[1]) for value in values[0])
    row_safe = diagonal is not None or is_padding_condition(tracer, condition) or lower_ones(tracer, condition) is not None
    detached = tracer.reads.detach(condition, cid)
    return Fill(
        detached,
        keep_where_true,
        tracer.reads.detach(fill, cid),
        causal,
        absorbing,
        row_safe,
        top_left,
        path=tuple(tracer.path),
        bindings=bindings_of(tracer, detached),
        with_chain=always_applied(tracer, condition, cid),
        rank=tracer.ranks.rank_of(condition),
    )


def bindings_of(tracer: TracerView, node: cst.BaseExpression) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((name, tracer.assignments.get(name, 0)) for name in p.walk_names(node)))


def zero_rows(
    tracer: TracerView,
    condition: cst.BaseExpression,
    fill: cst.BaseExpression,
    keep_where_true: bool,
    cid: int,
    pending: Sequence[Op],
) -> ZeroRows:
    """A zeroing of the probabilities where `mask` masks every key, exact on SDPA as zeroed output rows.

    `softmax(masked).masked_fill(mask, 0)` is exact when the scores were masked by `mask` with an absorbing value, in
    the same or an enclosing branch, with no name of it reassigned since, and nothing else masks the scores (another
    mask could empty the rest of a row, whose probabilities at `mask` would then not be 0 before the zeroing).
    """
    if p.fill_number(fill, tracer.scope) != 0:
        raise Poison(Code.FILL_VALUE, f"the probabilities are set to `{short(fill)}` after the softmax", {cid})
    condition, keep_where_true = kept_condition(tracer, condition, keep_where_true)  # as `fill` reads it
    detached = tracer.reads.detach(condition, cid)
    ops = [op for op, _, _ in tracer.chains.candidates[cid].ops] + list(pending)
    fills = [op for op in ops if isinstance(op, Fill)]
    masks = [op for op in ops if isinstance(op, Guard)] + [
        op for op in ops if isinstance(op, AddTerm) and any("mask" in n for n in p.walk_names(op.term))
    ]
    matched = [f for f in fills if f.keep_where_true == keep_where_true and f.condition.deep_equals(detached)]
    if not matched or not matched[0].absorbing:
        raise Poison(
            Code.FILL_VALUE,
            f"the probabilities are set to 0 where `{short(condition)}` holds, which is not where the scores were "
            "masked with a value that absorbs them",
            {cid},
        )
    first = matched[0]
    if not p.is_minus_infinity(first.fill, tracer.scope):
        # a finite fill (finfo.min) gives a masked key weight exp(-s) against keys another term pushed to about
        # finfo.min too: an additive term handed in as a parameter may carry such a mask (T5's position_bias)
        masks += [
            op
            for op in ops
            if isinstance(op, AddTerm) and isinstance(op.term, cst.Name) and op.term.value in tracer.params
        ]
    if len(fills) > 1 or masks:
        raise Poison(
            Code.MASKED_ROWS,
            f"the probabilities are set to 0 where `{short(condition)}` masked the scores, but other masks may "
            "mask the rest of a row, whose probabilities there would not be 0",
            {cid},
        )
    if first.bindings != bindings_of(tracer, detached) or not (
        tuple(tracer.path[: len(first.path)]) == first.path or guarded_alike(tracer, first.path, tuple(tracer.path))
    ):
        raise Poison(
            Code.FILL_VALUE,
            f"the probabilities are set to 0 where `{short(condition)}` holds, but that mask may differ from the "
            "one the scores were masked with (reassigned, or masked in another branch)",
            {cid},
        )
    return ZeroRows(detached, keep_where_true)


def is_padding_condition(tracer: TracerView, node: cst.BaseExpression) -> bool:
    """A condition read from the mask parameters only.

    `~attention_mask`, `mask == 0`, `mask.bool()`.
    """
    names = p.walk_names(node)
    masks = {n for n in names if n in tracer.params and "mask" in n and not n.endswith("head_mask")}
    return bool(masks) and names <= masks | {"torch"}


def triangle_slice(tracer: TracerView, node: cst.BaseExpression, depth: int = 0) -> tuple[Diagonal, cst.Subscript] | None:
    """A slice of a registered buffer built as a triangle of ones: what the buffer keeps, and the slice.

    Sliced anywhere, the entries 0 or 1, followed through locals and casts.
    """
    if depth > 4:
        return None
    if isinstance(node, cst.Name):
        local = tracer.scope.local_value(node.value)
        return None if local is None else triangle_slice(tracer, local, depth + 1)
    found = p.method_call(node, p.CAST_METHODS | {"bool"})  # a cast keeps the 0/1 entries
    if found is not None:
        return triangle_slice(tracer, found[0], depth + 1)
    threshold = zero_one_threshold(node)
    if threshold is not None and threshold[1]:  # `bias != 0`, `bias > 0.5`: true where the 0/1 buffer is 1
        return triangle_slice(tracer, threshold[0], depth + 1)
    if not isinstance(node, cst.Subscript):
        return None
    buffer = p.self_attribute_name(node.value)
    if buffer is None or tracer.class_name is None:
        return None
    registered = tracer.facts.find_buffer(tracer.class_name, buffer)
    if registered is None:
        return None
    kind = buffer_diagonal(registered, tracer.facts.find_buffer_locals(tracer.class_name, buffer), tracer.scope)
    return None if kind is None else (kind, node)


def kept_condition(
    tracer: TracerView, condition: cst.BaseExpression, keep_where_true: bool
) -> tuple[cst.BaseExpression, bool]:
    """A fill's condition read as where it keeps, when it can be.

    `masked_fill(bias == 0, f)` and `masked_fill(bias < 0.5, f)` over a 0/1 triangle keep where `bias != 0` (`bias`
    itself, when boolean).
    """
    negated = None if keep_where_true else negation_of(tracer, condition)
    if negated is not None:
        return negated, True
    threshold = _triangle_threshold(tracer, condition)
    if threshold is not None and threshold[1] == keep_where_true:  # true where the triangle keeps, or masks
        return threshold[0], True
    return condition, keep_where_true


def negation_of(tracer: TracerView, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The boolean a negation negates, kept as a comparison for a mask of any dtype.

    `~x` gives `x` (a valid mask only for a boolean `x`); `x == 0`, `x.eq(0)`, `x.logical_not()` and
    `torch.logical_not(x)` give `x` where it is proven boolean and `x != 0` otherwise.
    """
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return node.expression
    operand = _compared_with_zero(tracer, node)
    if operand is None:
        found = p.method_call(node, {"logical_not"})
        if found is not None and isinstance(node, cst.Call) and not node.args:
            operand = found[0]
        elif isinstance(node, cst.Call) and tracer.scope.qualify(node.func) == "torch.logical_not" and len(node.args) == 1:
            operand = node.args[0].value
    return None if operand is None else booleans(tracer).kept_where(operand)


def _compared_with_zero(tracer: TracerView, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The `x` of `x == 0`, `x.eq(0)` or `torch.eq(x, 0)`."""
    if (
        isinstance(node, cst.Comparison)
        and len(node.comparisons) == 1
        and isinstance(node.comparisons[0].operator, cst.Equal)
        and p.number(node.comparisons[0].comparator) == 0.0
    ):
        return node.left
    found = p.method_call(node, {"eq"})
    if found is not None and isinstance(node, cst.Call) and len(node.args) == 1 and p.number(node.args[0].value) == 0.0:
        return found[0]
    if (
        isinstance(node, cst.Call)
        and tracer.scope.qualify(node.func) == "torch.eq"
        and len(node.args) == 2
        and p.number(node.args[1].value) == 0.0
    ):
        return node.args[0].value
    return None


def booleans(tracer: TracerView) -> BooleanReader:
    """What the tracer's function proves boolean: its locals on every path, and the class's registered buffers."""

    def buffer(name: str) -> tuple[cst.BaseExpression, dict[str, list[cst.BaseExpression]]] | None:
        if tracer.class_name is None:
            return None
        registered = tracer.facts.find_buffer(tracer.class_name, name)
        if registered is None:
            return None
        return registered, tracer.facts.find_buffer_locals(tracer.class_name, name)

    return BooleanReader(tracer.scope, tracer.scope.local_values, buffer)


def _triangle_threshold(tracer: TracerView, node: cst.BaseExpression) -> tuple[cst.BaseExpression, bool] | None:
    """A triangle buffer's slice compared with a number between its 0s and 1s.

    `bias < 0.5`, `bias != 0`: the slice as a boolean, and whether the comparison holds where the buffer keeps (is 1).
    """
    found = zero_one_threshold(node)
    if found is None or triangle_slice(tracer, found[0]) is None:
        return None
    return booleans(tracer).kept_where(found[0]), found[1]


class Diagonal(enum.Enum):
    """What a boolean buffer keeps around its diagonal.

    Each query keeps at least itself in both.
    """

    CAUSAL = "causal"  # tril(ones): every key up to the query
    BANDED = "banded"  # tril(ones) minus tril(ones, -w): a sliding window ending at the query


def buffer_diagonal(
    node: cst.BaseExpression,
    locals_: dict[str, list[cst.BaseExpression]],
    scope: p.Scope,
    depth: int = 0,
    resolving: frozenset[str] = frozenset(),
) -> Diagonal | None:
    """Read a registered buffer built as a lower triangle of ones, perhaps less a band below it.

    `torch.tril(torch.ones(n, n))` (viewed, cast), or that XOR-ed with a tril shifted below the diagonal
    (`bitwise_xor(bias, tril(bias, -window))`), following the locals of the registering method.
    """
    if depth > 8:
        return None
    while True:
        found = p.method_call(node, {"view", "reshape", "bool", "to", "unsqueeze"})
        if found is not None:
            node = found[0]
        elif isinstance(node, cst.Subscript) and all(
            isinstance(e.slice, cst.Index) and m.matches(e.slice.value, m.Name("None")) for e in node.slice
        ):
            node = node.value  # `tril(...)[None, None]`
        else:
            break
    if isinstance(node, cst.Name):
        name = node.value
        values = locals_.get(name, [])
        if name in resolving:  # `bias = f(bias)`: inside it, `bias` is one of the assignments before it
            values = [value for value in values if name not in p.walk_names(value)]
        deeper = resolving | {name}
        kinds = [buffer_diagonal(value, locals_, scope, depth + 1, deeper) for value in values]
        if not kinds or any(kind is None for kind in kinds):
            return None
        return Diagonal.CAUSAL if all(kind is Diagonal.CAUSAL for kind in kinds) else Diagonal.BANDED
    if not isinstance(node, cst.Call):
        return None
    qualified = scope.qualify(node.func)
    if qualified == "torch.tril" and p.arg(node, 1, "diagonal") is None:
        inner = p.arg(node, 0, "input")
        return Diagonal.CAUSAL if isinstance(inner, cst.Call) and scope.qualify(inner.func) == "torch.ones" else None
    if qualified == "torch.bitwise_xor" and len(node.args) == 2:
        base, removed = node.args[0].value, node.args[1].value
        if buffer_diagonal(base, locals_, scope, depth + 1, resolving) is None or not isinstance(removed, cst.Call):
            return None
        if scope.qualify(removed.func) != "torch.tril":
            return None
        shift = p.arg(removed, 1, "diagonal")
        # a band: keys more than `window` before the query are removed; the diagonal stays when the shift is negative
        if shift is None or not _strictly_below(shift):
            return None
        return Diagonal.BANDED
    return None


def _strictly_below(shift: cst.BaseExpression) -> bool:
    """A diagonal offset below the diagonal: `-1`, or `-w` for a configured window.

    A window size is at least 1: the removed tril lies below the diagonal.
    """
    value = p.number(shift)
    if value is not None:
        return value <= -1
    if isinstance(shift, cst.UnaryOperation) and isinstance(shift.operator, cst.Minus):
        return isinstance(shift.expression, (cst.Attribute, cst.Name))
    return False


def _rows_and_columns(node: cst.Subscript) -> tuple[cst.Slice, cst.Slice] | None:
    """`[:, :, rows, columns]` with the batch and head dimensions whole, and both last slices without a step."""
    slices = [e.slice for e in node.slice if isinstance(e.slice, cst.Slice)]
    if len(node.slice) != 4 or len(slices) != 4:
        return None
    first, second, rows, cols = slices
    if any(part is not None for part in (first.lower, first.upper, second.lower, second.upper)):
        return None
    if rows.step is not None or cols.step is not None:
        return None
    return rows, cols


def _top_left(node: cst.Subscript) -> bool:
    """The slice `[:, :, :q, :k]`: the first q rows of the first k columns.

    Row i is position i; keys start at position 0.
    """
    found = _rows_and_columns(node)
    return found is not None and all(s.lower is None and s.upper is not None for s in found)


def _bottom_right(node: cst.Subscript) -> bool:
    """The slice `[:, :, k - q : k, :k]`: the last q rows of the first k columns.

    Each query sits at its own position.
    """
    found = _rows_and_columns(node)
    if found is None:
        return False
    rows, cols = found
    upper, lower = rows.upper, rows.lower
    if cols.lower is not None or upper is None or cols.upper is None or lower is None:
        return False
    if not upper.deep_equals(cols.upper):
        return False
    return (
        isinstance(lower, cst.BinaryOperation)
        and isinstance(lower.operator, cst.Subtract)
        and lower.left.deep_equals(upper)
    )


_CAUSAL = "causal = self.bias[:, :, key.size(-2) - query.size(-2) : key.size(-2), : key.size(-2)]\n"


def _causal_port(kept: str, fill: str, zero: str = "0.0") -> str:
    """What a causal fill becomes: SDPA's `is_causal` for square scores, else the fill as a mask kept where `kept`
    (`zero` where no mask is there: zeros of the query's dtype beside a `finfo` number, which float32 cannot hold)."""
    return (
        f"sdpa_is_causal = sdpa_mask is None and query.size(-2) == key.size(-2)\nif not sdpa_is_causal:\n"
        f"    sdpa_mask = torch.where({kept}, {zero} if sdpa_mask is None else sdpa_mask, {fill}).to(query.dtype)\n"
        + "return "
        + sdpa("attn_mask=sdpa_mask", "scale=1.0", "is_causal=sdpa_is_causal")
    )


def _padding_port(fill: str) -> str:
    """The SDPA call of scores filled with `fill` where `attention_mask == 0`: the fill as an additive mask."""
    mask = f"torch.where(attention_mask != 0, query.new_zeros(()), {fill}).to(query.dtype)"
    return sdpa(f"attn_mask={mask}", "scale=1.0")


_HELPER_FILL = scored("scores = scores.masked_fill(attention_mask == 0, self._get_mask_value())\nprobs = scores.softmax(-1)")


def _helper(body: str) -> str:
    return "def _get_mask_value(self):\n" + "\n".join("    " + line for line in body.splitlines())


_FINFO = "return torch.finfo(torch.float32).min"
_BOOL_MASK = "torch.where(attention_mask.bool(), query.new_zeros(()), mask_value).to(query.dtype)"
_CACHED_MASK_VALUE = """
def _get_mask_value(self, device, dtype):
    if self.mask_value is None or self.mask_value.dtype != dtype or self.mask_value.device != device:
        self.mask_value = torch.full([], torch.finfo(dtype).min, dtype=dtype, device=device)
    return self.mask_value
"""

EXAMPLES = {
    "masked_fill_method": (
        Example(
            scored(
                "scores = scores.masked_fill(attention_mask == 0, torch.finfo(scores.dtype).min)\n"
                "probs = scores.softmax(-1)"
            ),
            Fill,
            becomes=_padding_port("torch.finfo(query.dtype).min"),
        ),
        # zeroed after the softmax where an absorbing fill masked the same positions: the rows it masks whole are
        # zeroed in SDPA's output (which the product with V is assigned to)
        Example(
            "scores = torch.matmul(query, key.transpose(-1, -2))\n"
            "scores = scores.masked_fill(attention_mask == 0, float('-inf'))\n"
            "probs = scores.softmax(-1).masked_fill(attention_mask == 0, 0.0)\n"
            "output = torch.matmul(probs, value)\nreturn output",
            ZeroRows,
            becomes="sdpa_zero_rows = ~(attention_mask != 0).any(-1, keepdim=True)\noutput = "
            + _padding_port("float('-inf')")
            + "\noutput = output.masked_fill(sdpa_zero_rows, 0.0)",
        ),
        Example(
            scored("scores = scores.masked_fill(attention_mask == 0, 0.0)\nprobs = scores.softmax(-1)"),
            refused=Code.FILL_VALUE,
        ),
        # zeroed under a second `if` with the fill's test: the mask its first body reassigned is the one zeroed
        Example(
            TWO_GUARDS.format(between=""),
            ZeroRows,
            becomes="if attention_mask is not None:\nattention_mask = attention_mask.bool()\nsdpa_mask = "
            "torch.where(attention_mask, float('-inf'), query.new_zeros(())).to(query.dtype)\nsdpa_zero_rows = None\n"
            "if attention_mask is not None:\nsdpa_zero_rows = attention_mask.all(-1, keepdim=True)\noutput = "
            + sdpa("attn_mask=sdpa_mask", "scale=1.0")
            + "\nif sdpa_zero_rows is not None:\noutput = output.masked_fill(sdpa_zero_rows, 0.0)",
        ),
        # a binding between the two tests, or an `else` to the first, and the second test may hold where it did not
        Example(TWO_GUARDS.format(between="attention_mask = head_mask\n"), refused=Code.FILL_VALUE),
        Example(MASKED_GUARDS.format(between="attention_mask = torch.ones_like(value)\n"), refused=Code.FILL_VALUE),
        Example(
            MASKED_GUARDS.format(between="").replace(
                "probs = ", "else:\n    attention_mask = torch.ones_like(value)\nprobs = ", 1
            ),
            refused=Code.FILL_VALUE,
        ),
        # zeroed where nothing masked the scores
        Example(scored("probs = scores.softmax(-1).masked_fill(attention_mask == 0, 0.0)"), refused=Code.FILL_VALUE),
        # a fill value a method of the class returns: every value it may return is read
        Example(_HELPER_FILL, Fill, methods=_helper(_FINFO), becomes=_padding_port("self._get_mask_value()")),
        # 0, a value read from the configuration (anything), or one of two values not both masking
        Example(_HELPER_FILL, refused=Code.FILL_VALUE, methods=_helper("return 0.0")),
        Example(_HELPER_FILL, refused=Code.FILL_VALUE, methods=_helper("return self.config.mask_value")),
        Example(_HELPER_FILL, refused=Code.FILL_VALUE, methods=_helper("if self.training:\n    return -1e4\nreturn 0.0")),
    ),
    "masked_fill_function": (
        Example(
            scored(
                "scores = torch.masked_fill(scores, attention_mask == 0, float('-inf'))\nprobs = scores.softmax(-1)"
            ),
            Fill,
            becomes=_padding_port("float('-inf')"),
        ),
        Example(
            scored("scores = torch.masked_fill(scores, attention_mask == 0, 1.0)\nprobs = scores.softmax(-1)"),
            refused=Code.FILL_VALUE,
        ),
    ),
    "where": (
        Example(
            scored(
                "scores = torch.where(causal, scores, torch.finfo(scores.dtype).min)\nprobs = scores.softmax(-1)",
                _CAUSAL,
            ),
            Fill,
            becomes=_causal_port("causal", "torch.finfo(query.dtype).min", "query.new_zeros(())"),
        ),
        Example(
            scored("scores = torch.where(scores > 0, scores, -1e9)\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_READ,
        ),
        # GPTBigCode's cached fill: `self.mask_value` is None or `finfo(dtype).min`, and a fill of None raises
        Example(
            scored(
                "mask_value = self._get_mask_value(scores.device, scores.dtype)\n"
                "scores = torch.where(attention_mask.bool(), scores, mask_value)\nprobs = scores.softmax(-1)"
            ),
            Fill,
            init="self.mask_value = None",
            methods=_CACHED_MASK_VALUE,
            becomes="mask_value = self._get_mask_value(query.device, query.dtype)\nreturn "
            + sdpa(f"attn_mask={_BOOL_MASK}", "scale=1.0"),
        ),
    ),
}
