"""Which sides of a file's branches can run (the live branch), and which run by default (the default path).

Read with `ast`, before libcst parses anything: what a file computes decides whether there is anything to port.

**Live.** An `if` whose test is certain runs one side only; the other cannot run. A test is certain when it is built
(`not`, `and`, `or`, `is`, `==`) from literals (`if False:`), module-level names assigned once, to a literal, and bound
nowhere else in the file (`USE_SDPA = True`), and `self.<attr>` where `<attr>` is assigned once in the whole file, to
a literal, in the `__init__` of the class or of a base class in the file (`self.fused_attn = True`). An attribute
assigned in several places, or from a parameter, or set by name (`setattr`), one the frameworks set from outside
(`training`, `gradient_checkpointing`), and a name bound again anywhere (assigned, imported, a parameter), are not
certain. `live_tree` drops the sides that cannot run, and the statements after a `return` or `raise` that always
runs.

**Default path.** What a module runs when built with its constructor's defaults, called without asking for the
attention weights, under torch 2 or later: besides the certain tests, `hasattr(F, "scaled_dot_product_attention")`
is true, a torch version check is read at torch 2.0 and 2.13 (decided where both agree), a weights request
(`output_attentions`, `need_weights`) is false, a parameter is its literal default (a default of None only for an
optional input, not a mask, cache or key/value states, which model calls pass), and `self.<attr>` is what the
constructor's `__init__` leaves in it with its parameters' defaults (open_clip's `self.logit_scale`, None unless
`scaled_cosine=True`). `sdpa_use` names the classes whose forward calls torch's `scaled_dot_product_attention` on
that path and no softmax: they already support SDPA, whatever eager code they keep for the other paths.

`bindings.py` reads what the file binds, `values.py` the tests.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from typing import Iterator

from sdpa_port.discover.bindings import Bindings, Definitions
from sdpa_port.discover.eager_sites import SOFTMAX_NAMES
from sdpa_port.discover.values import TORCH_VERSIONS, Evaluator, Scope


# ------------------------------------------------------------------ the live tree


def live_tree(tree: ast.Module, bindings: Bindings | None = None) -> ast.Module:
    """The tree without the sides of branches that cannot run (a copy; `tree` itself where every side can)."""
    bindings = bindings or Bindings.of(tree)
    evaluator = Evaluator(bindings)
    if not any(evaluator.truth(test, Scope(owner)) is not None for owner, test in bindings.tests):
        return tree
    pruned = _Pruner(evaluator).visit(copy.deepcopy(tree))
    assert isinstance(pruned, ast.Module)
    return pruned


class _Pruner(ast.NodeTransformer):
    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.owner: str | None = None
        self.depth = 0

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        saved = self.owner
        self.owner = node.name if self.depth == 0 else None
        self.depth += 1
        result = self.generic_visit(node)
        self.depth -= 1
        self.owner = saved
        return result

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.depth += 1
        result = self.generic_visit(node)
        self.depth -= 1
        return result

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self.depth += 1
        result = self.generic_visit(node)
        self.depth -= 1
        return result

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
        truth = self.evaluator.truth(node.test, Scope(self.owner))
        self.generic_visit(node)
        if truth is None:
            return node
        return node.body if truth else node.orelse

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        truth = self.evaluator.truth(node.test, Scope(self.owner))
        self.generic_visit(node)
        if truth is None:
            return node
        return node.body if truth else node.orelse

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            statements = getattr(node, name, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                setattr(node, name, ended(statements))
        if isinstance(getattr(node, "body", None), list) and not node.body and not isinstance(node, ast.Module):  # type: ignore[attr-defined]
            node.body = [ast.Pass()]  # type: ignore[attr-defined]
        return node


def ended(statements: list[ast.stmt]) -> list[ast.stmt]:
    """The statements up to the first that never lets the next run."""
    for index, statement in enumerate(statements):
        if _ends(statement):
            return statements[: index + 1]
    return statements


def _ends(statement: ast.stmt) -> bool:
    if isinstance(statement, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(statement, ast.If):
        return bool(statement.orelse) and _block_ends(statement.body) and _block_ends(statement.orelse)
    return False


def _block_ends(statements: list[ast.stmt]) -> bool:
    return any(_ends(statement) for statement in statements)


# ------------------------------------------------------------------ the default path


@dataclass(frozen=True)
class SdpaUse:
    """Which classes call SDPA: on their default path without any softmax (`default`), or anywhere they can run
    (`live`, the tree being live)."""

    default: frozenset[str] = frozenset()
    live: frozenset[str] = frozenset()


@dataclass
class _Reach:
    sdpa: bool = False
    softmax: bool = False
    seen: set[int] = field(default_factory=set)


def sdpa_use(tree: ast.Module, bindings: Bindings) -> SdpaUse:
    """The classes of the (live) tree whose forward calls SDPA, by default and at all."""
    if not bindings.calls_sdpa:
        return SdpaUse()
    evaluators = [Evaluator(bindings, default=True, torch_version=version) for version in TORCH_VERSIONS]
    default: set[str] = set()
    live: set[str] = set()
    definitions = Definitions.of(tree)
    for name in definitions.classes:
        found = definitions.method(name, "forward")
        if found is None or not _reach(bindings, definitions, name, found, None).sdpa:
            continue
        live.add(name)
        reached = [_reach(bindings, definitions, name, found, evaluator) for evaluator in evaluators]
        if all(reach.sdpa and not reach.softmax for reach in reached):
            default.add(name)
    return SdpaUse(frozenset(default), frozenset(live))


def _reach(
    bindings: Bindings,
    definitions: Definitions,
    class_name: str,
    start: tuple[str, ast.FunctionDef],
    evaluator: Evaluator | None,
) -> _Reach:
    """What forward reaches (itself, the methods it calls on `self` or `super()`, the file's functions it calls, the
    autograd Functions it applies), on the default path of `evaluator` (None: every side)."""
    reach = _Reach()
    queue: list[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]] = [start]
    while queue:
        owner, function = queue.pop()
        if id(function) in reach.seen:
            continue
        reach.seen.add(id(function))
        scope = Scope(class_name if owner is not None else None, function)
        for node in _reached_nodes(function, evaluator, scope):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if bindings.is_sdpa(func):
                reach.sdpa = True
            elif _is_softmax(func):
                reach.softmax = True
            if isinstance(func, ast.Attribute):
                receiver = func.value
                if isinstance(receiver, ast.Name) and receiver.id == "self":
                    found = definitions.method(class_name, func.attr)
                    if found is not None:
                        queue.append(found)
                elif isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
                    found = definitions.method(class_name, func.attr, after=owner)
                    if found is not None:
                        queue.append(found)
                elif func.attr == "apply" and isinstance(receiver, ast.Name) and receiver.id in definitions.classes:
                    found = definitions.method(receiver.id, "forward")
                    if found is not None:
                        queue.append((None, found[1]))
            elif isinstance(func, ast.Name) and func.id in definitions.functions:
                queue.append((None, definitions.functions[func.id]))
    return reach


def _reached_nodes(
    function: ast.FunctionDef | ast.AsyncFunctionDef, evaluator: Evaluator | None, scope: Scope
) -> Iterator[ast.AST]:
    """The nodes of the function's body that run on the default path (all of them without an evaluator)."""
    stack: list[ast.AST] = list(reversed(function.body))
    if evaluator is not None:
        stack = list(reversed(ended(list(function.body))))
    while stack:
        node = stack.pop()
        yield node
        if evaluator is not None and isinstance(node, (ast.If, ast.IfExp)):
            truth = evaluator.truth(node.test, scope)
            if truth is not None:
                side = node.body if truth else node.orelse
                stack.extend(reversed(ended(side)) if isinstance(side, list) else [side])
                continue
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                items = [item for item in value if isinstance(item, ast.AST)]
                statements = [item for item in items if isinstance(item, ast.stmt)]
                if evaluator is not None and statements and len(statements) == len(items):
                    items = list(ended(statements))
                stack.extend(reversed(items))


def _is_softmax(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr in SOFTMAX_NAMES
    if isinstance(func, ast.Name):
        return func.id in SOFTMAX_NAMES
    return isinstance(func, ast.Call) and _is_softmax(func.func)  # `nn.Softmax(dim=-1)(x)`
