"""Which values of a chain are the same computation made again (bookkeeping for the tracer, read-only).

Two statements that apply the same operations to values at one place on a chain, reading the same bindings of every
other name, under the same branch tests, make the same value. FLAVA computes its softmax twice in a row; LiLT sums
its text and layout scores in both orders and then adds the mask, takes the softmax and drops out once for each
stream. The later statement is a *remake*: a value of its own (a later step) standing at the place on the chain of the
first (its canonical step), with nothing recorded for the chain. A remade dropout is a draw of its own, which decides
whether the probabilities may reach several products with V: an SDPA call draws its own dropout, so each product
must have had its own draw in eager too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import ChainVal, Dropout, Op
from sdpa_port.analyse.cstutil import code
from sdpa_port.rewrite.edit import commuted, replace_names


@dataclass(frozen=True)
class Made:
    """How a value of a chain was made: the chain, the canonical step of the value it went on from, the expression
    (chain values named by their place, operands of `+` and `*` on them in one order), how often each other name it
    reads had been assigned, and the enclosing branches (each `if`'s tests, and which branch)."""

    cid: int
    base: int
    expression: str
    bindings: tuple[tuple[str, int], ...]
    branches: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Branch:
    """One enclosing branch, as a remake must match it: the `if`'s tests written out, the branch taken, and the names
    the tests read."""

    tests: str
    index: int
    names: frozenset[str]


class Remakes:
    def __init__(self) -> None:
        self._canonical: dict[int, int] = {}  # a remade value's step -> the step of the value first made so
        self._first: dict[Made, int] = {}  # how a value was made -> its step
        self._draws: dict[int, int] = {}  # a value's step -> the step of the last dropout it went through

    def canonical(self, step: int) -> int:
        return self._canonical.get(step, step)

    def key(
        self,
        base: ChainVal,
        value: cst.BaseExpression,
        env: Mapping[str, object],
        assignments: Mapping[str, int],
        branches: Sequence[Branch],
    ) -> Made:
        read = p.walk_names(value)
        chains = {
            name: cst.Name(f"chain_{held.cid}_{self.canonical(held.step)}")
            for name in read
            if isinstance(held := env.get(name), ChainVal)
        }
        placed = commuted(replace_names(value, chains), frozenset(n.value for n in chains.values()))
        names = (read - set(chains)).union(*(b.names for b in branches))
        return Made(
            base.cid,
            self.canonical(base.step),
            code(placed),
            tuple(sorted((n, assignments.get(n, 0)) for n in names)),
            tuple((b.tests, b.index) for b in branches),
        )

    def first(self, made: Made) -> int | None:
        """The step of the value an earlier statement made the same way."""
        return self._first.get(made)

    def note(self, base: ChainVal, step: int, ops: Sequence[Op], made: Made | None, remade: int | None) -> None:
        """A value made at `step` from `base` by `ops`; `remade` is the step of the value it makes again."""
        if remade is not None:
            self._canonical[step] = self.canonical(remade)
        elif made is not None:
            self._first.setdefault(made, step)
        draw = step if any(isinstance(op, Dropout) for op in ops) else self._draws.get(base.step)
        if draw is not None:
            self._draws[step] = draw

    def draw(self, step: int) -> int | None:
        """The dropout draw a value has gone through, None where none."""
        return self._draws.get(step)
