"""Whether every call of an attention class's modules throws away the probabilities its forward returns (read-only).

A forward that returns `(output, probs)` with no parameter asking for the probabilities can only be ported where no
caller reads them: the SDPA forward returns None in their place, as the maintainers' own ports do. The proof is the
file's (the evidence W401 and W407 read, `module_sites`): the class is built in this file, only as modules of its
classes, nothing else in the file names it, and each call of those modules unpacks the tuple into names never read
(`out, _ = self.attn(...)`), takes an element that is not the probabilities (`self.attn(...)[0]`), or drops the
result. A caller that keeps the tuple, hands the probabilities on or reads them, refuses the class.
"""

from __future__ import annotations

import ast

import libcst as cst

from sdpa_port.analyse.chain import OutputStmt
from sdpa_port.analyse.cstutil import assigned_names, code, walk_names
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.module_sites import ModuleCall, ModuleSites, module_sites
from sdpa_port.analyse.sdpa_path import SdpaPath

HOOKS = ("register_forward_hook", "register_module_forward_hook")


def weight_positions(path: SdpaPath) -> tuple[int, frozenset[int]] | str:
    """(length, positions): every `return` of the function is a tuple of `length` elements, and the probabilities
    (or a value made from them after the product with V) can appear only at `positions`; a string says why not."""
    returns = _Returns()
    path.function.body.visit(returns)
    lengths = set()
    for node in returns.found:
        value = node.value
        if not isinstance(value, cst.Tuple) or any(isinstance(e, cst.StarredElement) for e in value.elements):
            return "a `return` of forward gives no tuple of fixed length"
        lengths.add(len(value.elements))
    if len(lengths) != 1:
        return "the `return`s of forward give tuples of several lengths"
    held = _holders(path)
    stray = _StrayReads(held, path)
    path.function.body.visit(stray)
    if stray.found is not None:
        return f"`{stray.found}` reads the probabilities otherwise than to return them"
    positions: set[int] = set()
    for node in returns.found:
        assert isinstance(node.value, cst.Tuple)
        plan = path.plans.get(node)
        skipped = plan.output.node if isinstance(plan, OutputStmt) else None
        for index, element in enumerate(node.value.elements):
            if _reads(element.value, held, skipped):
                positions.add(index)
    return lengths.pop(), frozenset(positions)


def discarded_by_every_call(facts: ModuleFacts, class_name: str, length: int, positions: frozenset[int]) -> str | None:
    """None where the file builds `class_name` and every call of its modules discards the elements at `positions`
    of the `length`-tuple they return; otherwise why that is not proven."""
    sites = module_sites(facts)
    tree = sites.tree
    if sites.subclasses(class_name) - {class_name}:
        return "a subclass in the file inherits it"
    built = [c for c in sites.constructions() if c.class_name == class_name]
    if not built:
        return "no class of this file builds it, so its callers are elsewhere"
    loose = [c.line for c in built if c.site is None]
    if loose:
        return f"it is built at line {loose[0]} other than as a module of a class of this file"
    calls_at = {id(c.call.func) for c in built if c.call is not None}
    keys = {c.site.key for c in built if c.site is not None}
    attributes = {key[1] for key in keys}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == class_name and isinstance(node.ctx, ast.Load):
            if id(node) not in calls_at:
                return f"line {node.lineno} names it other than to build it"
        if isinstance(node, ast.Constant) and node.value in attributes | {class_name}:
            return f"line {node.lineno} spells `{node.value}` in a string (`__all__`, `getattr`, a registry)"
        if isinstance(node, ast.Attribute) and node.attr in HOOKS:
            return f"line {node.lineno} registers a forward hook, which sees what the modules return"
    for key in sorted(keys):
        escapes = sites.escapes(key)
        if escapes:
            return f"line {escapes[0]} hands the modules of `{key[0]}.{key[1]}` on, where their calls are not followed"
    why = _unfollowed(sites, keys, attributes) or _self_calls(sites, class_name)
    if why is not None:
        return why
    calls = [call for call in sites.uses if call.site in keys]
    for key in sorted(keys - {call.site for call in calls}):
        return f"no method of this file calls the modules of `{key[0]}.{key[1]}`, so their callers are elsewhere"
    for call in calls:
        why = _discards(sites, call, length, positions)
        if why is not None:
            return why
    return None


def _unfollowed(sites: ModuleSites, keys: set[tuple[str, str]], attributes: set[str]) -> str | None:
    """A read of an attribute holding the modules that `module_sites` does not follow: one not on `self` in a method
    of a class of the file (`block.attn(...)` in a function), or their `forward` taken without a call."""
    parents = {child: node for node in ast.walk(sites.tree) for child in ast.iter_child_nodes(node)}
    owners = {
        id(inner): owner
        for owner in sites.classes
        for item in sites.methods(owner)
        for inner in ast.walk(item)
    }
    for inner in ast.walk(sites.tree):
        if not isinstance(inner, ast.Attribute) or inner.attr not in attributes:
            continue
        owner = owners.get(id(inner))
        if owner is None or not (isinstance(inner.value, ast.Name) and inner.value.id == "self"):
            return f"line {inner.lineno} reads `.{inner.attr}` where the modules it holds are not followed"
        site = sites.holder(owner, inner.attr)
        if site is None or site.key not in keys:
            continue  # another class's attribute of the same name
        parent = parents.get(inner)
        if site.container and isinstance(parent, ast.Call) and parent.func is inner:
            return f"line {inner.lineno} calls the container of the modules, which hands each one's result on"
        if isinstance(parent, ast.Attribute) and parent.attr in ("forward", "__call__"):
            grand = parents.get(parent)
            if not (isinstance(grand, ast.Call) and grand.func is parent):
                return f"line {inner.lineno} takes the modules' `{parent.attr}` without calling it"
    return None


def _self_calls(sites: ModuleSites, class_name: str) -> str | None:
    """The class's own methods run its forward (`self(...)`, `self.forward(...)`): a caller not followed."""
    for item in sites.methods(class_name):
        for inner in ast.walk(item):
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "self":
                return f"line {inner.lineno}: the class calls its own modules"
            if isinstance(inner, ast.Attribute) and inner.attr in ("forward", "__call__"):
                if isinstance(inner.value, ast.Name) and inner.value.id == "self":
                    return f"line {inner.lineno}: the class calls its own forward"
    return None


def _discards(sites: ModuleSites, call: ModuleCall, length: int, positions: frozenset[int]) -> str | None:
    """None where this call's result is dropped, indexed away from `positions`, or unpacked into names at
    `positions` its method never reads."""
    found = sites.method(*call.context)
    assert found is not None
    function = found[1]
    parent = _parent(function, call.call)
    line = call.call.lineno
    if isinstance(parent, ast.Expr):
        return None
    if isinstance(parent, ast.Subscript) and parent.value is call.call:
        at = _index(parent.slice)
        at = at + length if at is not None and at < 0 else at
        if at is not None and 0 <= at < length and at not in positions:
            return None
        return f"line {line} takes an element of the result that may be the probabilities"
    if isinstance(parent, ast.Assign) and parent.value is call.call and len(parent.targets) == 1:
        target = parent.targets[0]
        starred = any(isinstance(element, ast.Starred) for element in getattr(target, "elts", ()))
        if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == length and not starred:
            for at in sorted(positions):
                element = target.elts[at]
                if not isinstance(element, ast.Name):
                    return f"line {line} stores the probabilities in `{ast.unparse(element)}`"
                if _read(function, element.id):
                    return f"line {line} unpacks the probabilities into `{element.id}`, which its method reads"
            return None
    return f"line {line} keeps the result whole, probabilities included"


def _index(node: ast.expr) -> int | None:
    """The integer a subscript's index spells (`0`, `-2`); None for any other index."""
    negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    value = node.operand if isinstance(node, ast.UnaryOp) and negative else node
    if isinstance(value, ast.Constant) and isinstance(value.value, int) and not isinstance(value.value, bool):
        return -value.value if negative else value.value
    return None


def _parent(function: ast.FunctionDef, node: ast.AST) -> ast.AST | None:
    for outer in ast.walk(function):
        if any(child is node for child in ast.iter_child_nodes(outer)):
            return outer
    return None


def _read(function: ast.FunctionDef, name: str) -> bool:
    """The method reads `name` anywhere (a nested function included), or shares it (`global`, `nonlocal`)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("locals", "vars"):
            return True
    return False


def _holders(path: SdpaPath) -> set[str]:
    """The names that may hold the probabilities after the product with V: those the tracer saw read, and every name
    bound from one of them (a binding of the product with V itself excepted)."""
    held = set(path.probs_after_output)
    bindings = _Bindings(path)
    path.function.body.visit(bindings)
    changed = True
    while changed:
        changed = False
        for node, value, names in bindings.found:
            plan = path.plans.get(node)
            skipped = plan.output.node if isinstance(plan, OutputStmt) else None
            if not set(names) <= held and _reads(value, held, skipped):
                held |= set(names)
                changed = True
    return held


def _reads(node: cst.CSTNode, names: set[str], skipped: cst.CSTNode | None) -> bool:
    """`node` reads one of `names` outside `skipped` (the product with V, whose value SDPA gives)."""
    if skipped is node:
        return False
    if skipped is not None:
        node = node.deep_replace(skipped, cst.Name("_"))
    return bool(walk_names(node) & names)


class _Returns(cst.CSTVisitor):
    """The function's own `return`s (not those of functions it defines)."""

    def __init__(self) -> None:
        self.found: list[cst.Return] = []

    def visit_Return(self, node: cst.Return) -> None:
        self.found.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


class _AfterOutput(cst.CSTVisitor):
    """Visits the function in order, knowing whether the product with V has been passed (`after`): before it, the
    names the probabilities end in may hold the scores, which the chain's own tracing governs."""

    def __init__(self, path: SdpaPath) -> None:
        self.path = path
        self.after = False

    def passes(self, node: cst.SimpleStatementLine) -> None:
        if any(isinstance(self.path.plans.get(small), OutputStmt) for small in node.body):
            self.after = True


class _StrayReads(_AfterOutput):
    """The first statement reading the probabilities (`held`) otherwise than binding them to plain names or returning
    them: stored on the module (`self.maps = probs`), handed to a call, tested, read by a function defined here."""

    def __init__(self, held: set[str], path: SdpaPath) -> None:
        super().__init__(path)
        self.held = held
        self.found: str | None = None

    def _check(self, node: cst.CSTNode, reads: cst.CSTNode | None = None) -> None:
        plan = self.path.plans.get(node)
        skipped = plan.output.node if isinstance(plan, OutputStmt) else None
        if self.after and self.found is None and _reads(reads if reads is not None else node, self.held, skipped):
            self.found = code(node).strip().splitlines()[0]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        self.passes(node)
        for small in node.body:
            if isinstance(small, cst.Return):
                continue
            targets: list[cst.BaseExpression] = []
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                targets = [small.target]
            if targets and all(_plain_target(t) for t in targets):
                continue  # names bound from them hold them too (`_holders`)
            self._check(small)
        return False

    def visit_If(self, node: cst.If) -> None:
        self._check(node, node.test)

    def visit_While(self, node: cst.While) -> None:
        self._check(node, node.test)

    def visit_For(self, node: cst.For) -> None:
        self._check(node, node.iter)

    def visit_With(self, node: cst.With) -> None:
        for item in node.items:
            self._check(node, item.item)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._check(node)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._check(node)
        return False


def _plain_target(target: cst.BaseExpression) -> bool:
    if isinstance(target, (cst.Tuple, cst.List)):
        return all(_plain_target(e.value) for e in target.elements)
    return isinstance(target, cst.Name)


class _Bindings(_AfterOutput):
    """Every binding in the function from the product with V on: (the statement or node, the value read, the names
    bound)."""

    def __init__(self, path: SdpaPath) -> None:
        super().__init__(path)
        self.found: list[tuple[cst.CSTNode, cst.CSTNode, list[str]]] = []

    def add(self, node: cst.CSTNode, value: cst.CSTNode, names: list[str]) -> None:
        if self.after:
            self.found.append((node, value, names))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.passes(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        self.add(node, node.value, [n for t in node.targets for n in assigned_names(t.target)])

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.add(node, node.value, assigned_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.add(node, node.value, assigned_names(node.target))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.add(node, node.value, assigned_names(node.target))

    def visit_For(self, node: cst.For) -> None:
        self.add(node, node.iter, assigned_names(node.target))

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.add(node, node.iter, assigned_names(node.target))

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self.add(node, node.item, assigned_names(node.asname.name))


__all__ = ["discarded_by_every_call", "weight_positions"]
