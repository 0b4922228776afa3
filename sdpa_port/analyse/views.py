"""A tensor read through views, with the views that undo each other taken out.

Before (GPT-2's `_upcast_and_reordered_attn`, as the SDPA call reads its key; `b, h, _, d` are the query's sizes, `n`
the key's length):

    key.transpose(-1, -2).reshape(-1, d, n).transpose(-1, -2).unflatten(0, (b, h))

What `reduced` makes of it, where the key's heads and last size are known to be the query's (`size_key` gives equal
sizes one key): the reshape merges the first two dimensions (its other sizes are the key's), a transpose of the last
two moves before that merge, two such transposes cancel, and the unflatten splits the merged dimension into its own
sizes again: `key`. The one size not known equal (the batch) is forced by the element count, where the others are
not zero.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Union

VIEW_METHODS = frozenset({"reshape", "view", "transpose", "unflatten", "flatten", "contiguous"})

Size = str | None  # a size as its key (equal sizes, one key); None where nothing tells it


@dataclass(frozen=True)
class Transpose:
    first: int
    second: int


@dataclass(frozen=True)
class Flatten:
    start: int
    end: int


@dataclass(frozen=True)
class Unflatten:
    dim: int
    sizes: tuple[Size, ...]


@dataclass(frozen=True)
class Reshape:
    sizes: tuple[Size, ...]  # None for the one `-1`


Step = Union[Transpose, Flatten, Unflatten, Reshape]
SizeKey = Callable[[ast.expr], Size]  # the key of a size written as an expression; None where it tells nothing


def reduced(node: ast.expr, rank: Callable[[ast.expr], int | None], size_key: SizeKey) -> str:
    """`node`, a tensor read through views, with the views that undo each other taken out (as a dump of its base
    and its steps); `node` as it is where its base's rank is not known or a view's arguments are not read."""
    base, calls = _views(node)
    base_rank = rank(base) if calls else None
    if base_rank is None:
        return ast.dump(node)
    steps = _steps(calls, base_rank, size_key)
    if steps is None:
        return ast.dump(node)
    base_key = ast.dump(base)
    shape: tuple[Size, ...] = tuple(size_key(_size_of(base, i)) for i in range(base_rank))
    steps = _simplified(steps, shape)
    return base_key + "".join(f".{step}" for step in steps)


def _size_of(base: ast.expr, index: int) -> ast.expr:
    return ast.Call(func=ast.Attribute(value=base, attr="size", ctx=ast.Load()), args=[ast.Constant(index)], keywords=[])


def _views(node: ast.expr) -> tuple[ast.expr, list[ast.Call]]:
    """The tensor read and the view calls on it, innermost first."""
    calls: list[ast.Call] = []
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in VIEW_METHODS
        and not node.keywords
        and not any(isinstance(a, ast.Starred) for a in node.args)
    ):
        calls.append(node)
        node = node.func.value
    return node, calls[::-1]


def dtype_view(call: ast.Call) -> bool:
    """`x.view(torch.float16)`, `x.view(y.dtype)`: a view of the bytes as another dtype, or one not told from it
    (`x.view(self.shape)`)."""
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    return method == "view" and len(call.args) == 1 and isinstance(call.args[0], ast.Attribute)


def _steps(calls: list[ast.Call], rank: int, size_key: SizeKey) -> list[Step] | None:
    """Each view as a step, its dimensions counted from the front; None where one is not read."""
    steps: list[Step] = []
    for call in calls:
        method = call.func.attr  # type: ignore[attr-defined]
        args = call.args
        step: Step | None
        if dtype_view(call):
            return None
        if method == "contiguous" and not args:
            continue
        if method == "transpose" and len(args) == 2:
            dims = [d for d in (_dim(a, rank) for a in args) if d is not None]
            step = Transpose(min(dims), max(dims)) if len(dims) == 2 else None
        elif method == "flatten" and len(args) <= 2:
            ends = [d for d in (_dim(a, rank) for a in args) if d is not None] + [0, rank - 1][len(args) :]
            step = Flatten(ends[0], ends[1]) if len(ends) == 2 and ends[0] <= ends[1] else None
        elif method == "unflatten" and len(args) == 2 and isinstance(args[1], (ast.Tuple, ast.List)):
            dim = _dim(args[0], rank)
            sizes = tuple(size_key(e) for e in args[1].elts)
            step = Unflatten(dim, sizes) if dim is not None and -1 not in integers(args[1].elts) else None
        elif method in ("reshape", "view") and args:
            written = list(args[0].elts) if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)) else list(args)
            unknown = [i for i, value in enumerate(integers(written)) if value == -1]
            step = Reshape(tuple(None if i in unknown else size_key(e) for i, e in enumerate(written)))
            step = step if len(unknown) <= 1 else None
        else:
            step = None
        if step is None:
            return None
        steps.append(step)
        rank = _rank_after(step, rank)
    return steps


def integers(values: list[ast.expr]) -> list[int | None]:
    """The integer each expression writes (`3`, `-1`), None for others."""
    out: list[int | None] = []
    for value in values:
        negative = isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub)
        written = value.operand if isinstance(value, ast.UnaryOp) and negative else value
        number = written.value if isinstance(written, ast.Constant) else None
        out.append((-number if negative else number) if isinstance(number, int) and not isinstance(number, bool) else None)
    return out


def _dim(node: ast.expr, rank: int) -> int | None:
    (value,) = integers([node])
    if value is None or not -rank <= value < rank:
        return None
    return value + rank if value < 0 else value


def _rank_after(step: Step, rank: int) -> int:
    if isinstance(step, Flatten):
        return rank - (step.end - step.start)
    if isinstance(step, Unflatten):
        return rank + len(step.sizes) - 1
    if isinstance(step, Reshape):
        return len(step.sizes)
    return rank


def _shape_after(step: Step, shape: tuple[Size, ...]) -> tuple[Size, ...]:
    if isinstance(step, Transpose):
        swapped = list(shape)
        swapped[step.first], swapped[step.second] = shape[step.second], shape[step.first]
        return tuple(swapped)
    if isinstance(step, Flatten):
        return (*shape[: step.start], None, *shape[step.end + 1 :])
    if isinstance(step, Unflatten):
        return (*shape[: step.dim], *step.sizes, *shape[step.dim + 1 :])
    return step.sizes


def _same(a: Size, b: Size) -> bool:
    return a is not None and a == b


def _simplified(steps: list[Step], shape: tuple[Size, ...]) -> list[Step]:
    """The steps with pairs that undo each other taken out, until none is left."""
    changed = True
    while changed:
        changed = False
        shapes = [shape]
        for step in steps:
            shapes.append(_shape_after(step, shapes[-1]))
        for i, step in enumerate(steps):
            replacement = _rewritten(step, steps[i + 1] if i + 1 < len(steps) else None, shapes[i])
            if replacement is not None:
                steps = [*steps[:i], *replacement[0], *steps[i + replacement[1] :]]
                changed = True
                break
    return steps


def _rewritten(step: Step, after: Step | None, shape: tuple[Size, ...]) -> tuple[list[Step], int] | None:
    """What `step` (and the step after it) become, with how many steps that replaces; None where they stay."""
    rank = len(shape)
    if isinstance(step, Reshape) and None in step.sizes and step.sizes.index(None) == 0:
        # `x.reshape(-1, *x.shape[k:])`: the first k dimensions merged
        kept = step.sizes[1:]
        if len(kept) < rank and all(_same(a, b) for a, b in zip(kept, shape[rank - len(kept) :])):
            last = rank - len(kept) - 1
            return ([Flatten(0, last)] if last else []), 1
    if isinstance(step, Flatten) and step.start == step.end:
        return [], 1
    if isinstance(step, Transpose) and after == step:
        return [], 2
    if isinstance(step, Flatten) and step.start == 0 and isinstance(after, Transpose) and after.first >= 1:
        # a transpose of dimensions after the merged ones commutes with the merge
        span = step.end - step.start
        return [Transpose(after.first + span, after.second + span), step], 2
    if isinstance(step, Flatten) and isinstance(after, Unflatten) and after.dim == step.start:
        flattened = shape[step.start : step.end + 1]
        unknown = sum(not _same(a, b) for a, b in zip(after.sizes, flattened))
        if len(after.sizes) == len(flattened) and unknown <= 1:
            # the element count fixes the one size not known equal
            return [], 2
    return None
