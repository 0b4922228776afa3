"""What the recognisers and the statement modules may read and change of the tracer: `TracerView`.

`trace.Tracer` walks a function's statements and hands each expression to the recognisers of `forms/` and each kind
of statement to its module (`assignments`, `branches`, `in_place`, `outputs`, `kept`). They take the tracer first.
They name it by this protocol, not by the class, so that they do not import the module that imports them: the
tracer depends on them, they depend on this view, and this view on the chain's parts only.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import libcst as cst

from sdpa_port.analyse.certain import Certain
from sdpa_port.analyse.chain import ChainVal, Op, Poison, Stage, StmtPlan, Value
from sdpa_port.analyse.chain_book import ChainBook
from sdpa_port.analyse.chain_reads import ChainReads
from sdpa_port.analyse.known import Known
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.ranks import Ranks
from sdpa_port.analyse.remakes import Branch
from sdpa_port.analyse.scope import FunctionScope
from sdpa_port.refusals import Code

LineOf = Callable[[cst.CSTNode], int]


class TracerView(Protocol):
    """The tracer's state and operations, as `trace.Tracer` documents them."""

    facts: ModuleFacts
    class_name: str | None
    function: cst.FunctionDef
    key_params: frozenset[str]
    known: Known
    certain: Certain
    line_of: LineOf
    selected_start: cst.CSTNode | None
    selected_members: frozenset[cst.CSTNode]
    env: dict[str, Value]
    scope: FunctionScope
    plans: dict[cst.CSTNode, StmtPlan]
    dropped_ifs: set[cst.If]
    returns: list[cst.Return]
    current_line: int
    tests: list[cst.BaseExpression]
    path: list[tuple[int, int]]
    branches: list[Branch]
    chains: ChainBook
    reads: ChainReads
    assignments: dict[str, int]
    ranks: Ranks
    output_seen: bool
    probs_after_output: set[str]
    fallbacks: list[str]
    params: tuple[str, ...]

    def block(self, statements: Sequence[cst.BaseStatement], depth: int) -> None: ...

    def statement(self, statement: cst.BaseStatement, depth: int) -> None: ...

    def decompose(self, node: cst.BaseExpression, line: int) -> tuple[ChainVal, list[Op]]: ...

    def chain_or_start(self, node: cst.CSTNode) -> set[int]: ...

    def may_start(self, node: cst.CSTNode) -> bool: ...

    def require(self, base: ChainVal, ops: list[Op], stage: Stage, what: str, line: int, code: Code) -> None: ...

    def module_guard(self, module: str | None) -> cst.BaseExpression | None: ...

    def setting_guard(self) -> cst.BaseExpression | None: ...

    def reads_settings(self, test: cst.BaseExpression) -> bool: ...

    def note_assignment(self, names: Sequence[str]) -> None: ...

    def poison_statement(self, poison: Poison, value: cst.BaseExpression, names: list[str], line: int) -> None: ...

    def poison_reads(self, node: cst.CSTNode, line: int, code: Code, reason: str) -> None: ...

    def poison_new(self, before: set[int], code: Code, reason: str, line: int) -> None: ...

    def value_is_scalar(self, value: Value) -> bool: ...
