"""A second, independent look for eager attention: a softmax over a product of two tensors, multiplied by a third.

The recogniser reads attention in the forms it knows and ports them; this detector knows no forms. It follows
names through each function (`ast`, flow-insensitive): a product (`matmul`, `@`, `bmm`, `baddbmm`, `einsum`)
feeds a softmax whose result feeds another product. A softmax is a softmax call, or a call of what the file defines
around one: a function or method whose body calls a softmax (`masked_softmax(x, mask)`, `self._softmax(x)`), an
autograd Function whose `forward` does (`XSoftmax.apply(x, mask, -1)`), or a module of such a class held by an
attribute (`self.scale_mask_softmax(scores, mask)`), followed through wrappers of wrappers. When the recogniser finds nothing to port while this finds a
site, the file is refused naming the site instead of reported as having no attention: a miss is never silent. A
product is likewise a product call, or a call of a function or method of the file that holds one and no softmax (a
helper returning the scores, `self._relative_scores(query, key)`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

PRODUCT_FUNCTIONS = frozenset({"matmul", "bmm", "baddbmm", "einsum"})
SOFTMAX_NAMES = frozenset({"softmax", "Softmax", "softmax_"})


@dataclass(frozen=True)
class EagerSite:
    where: str  # `Class.method` or `function`
    line: int  # line of the softmax


def find_eager_attention(tree: ast.Module, nested: bool = False, every: bool = False) -> list[EagerSite]:
    """Every function or method holding a product -> softmax -> product chain, with the softmax's line. With
    `nested`, every function defined inside one of them instead, on its own (`Class.forward.attend`): the chain a
    function defined in `forward` holds is also one of forward's, but only this look says where it is. With `every`,
    one site per softmax whose probabilities reach a product, so that a function holding two attentions (a windowed
    one and a global one) gives two sites."""
    top = _functions(tree)
    functions = [_Function.of(where, function) for where, function in top]
    softmaxes = _softmax_wrappers(functions)
    softmaxes |= _softmax_modules(tree, softmaxes)
    products = _product_wrappers(functions, softmaxes)
    if nested:
        functions = [
            _Function.of(f"{where}.{inner.name}", inner)
            for where, function in top
            for inner in _walk(function)[1:]
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
    if products:
        functions = [function.with_products(products) for function in functions]
    return [site for function in functions for site in _sites(function, softmaxes, products, every)]


@dataclass(frozen=True)
class _Function:
    """A function or method read once: its `Class.method` or `function` name, its nodes in `ast.walk`'s order, and
    those of them that are products."""

    where: str
    nodes: list[ast.AST]
    products: list[ast.AST]

    @classmethod
    def of(cls, where: str, function: ast.AST) -> _Function:
        nodes = _walk(function)
        return cls(where, nodes, [node for node in nodes if _is_product(node)])

    def with_products(self, wrappers: frozenset[str]) -> _Function:
        """The same function, the calls of the file's product helpers counted among its products."""
        return _Function(self.where, self.nodes, [node for node in self.nodes if _is_product(node, wrappers)])


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The file's module-level functions and methods, each with its `Class.method` or `function` name."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            out.extend(
                (f"{node.name}.{inner.name}", inner)
                for inner in node.body
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    return out


def _softmax_wrappers(functions: list[_Function]) -> frozenset[str]:
    """The names a call of which is a softmax: the torch ones, plus the file's functions and methods whose body calls
    a softmax and holds no product, and its classes whose `forward` does (an autograd Function called as `Class.apply(...)`), to a fixed
    point so that a wrapper of a wrapper counts."""
    names = set(SOFTMAX_NAMES)
    # a function holding a product is an attention site of its own, not a softmax: only the others can wrap one
    calls_of: dict[str, list[ast.Call]] = {}
    for function in functions:
        owner, _, method = function.where.rpartition(".")
        if not function.products:
            name = owner if owner and method == "forward" else method
            calls_of.setdefault(name, []).extend(node for node in function.nodes if isinstance(node, ast.Call))
    changed = True
    while changed:
        changed = False
        for name, calls in calls_of.items():
            if name not in names and any(_is_softmax(call, names) for call in calls):
                names.add(name)
                changed = True
    return frozenset(names)


def _softmax_modules(tree: ast.Module, softmaxes: frozenset[str]) -> frozenset[str]:
    """The attributes of the file's classes that hold a softmax module: `self.scale_mask_softmax =
    FusedScaleMaskSoftmax(...)`, where that class of the file has a `forward` that calls a softmax and returns one
    tensor, or is imported from another package with a softmax in its name (Megatron's fused softmax, of
    `megatron_util.model.fused_softmax`, called as `self.scale_mask_softmax(scores, mask)`)."""
    classes = {
        node.name for node in tree.body if isinstance(node, ast.ClassDef) and not _returns_several(node)
    } & softmaxes
    classes |= _imported_softmax_classes(tree)
    if not classes:
        return frozenset()
    out: set[str] = set()
    for node in _walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            if node.value.func.id in classes:
                out.update(target.attr for target in node.targets if isinstance(target, ast.Attribute))
    return frozenset(out)


def _imported_softmax_classes(tree: ast.Module) -> set[str]:
    """The names bound by `from <package> import <...Softmax...>` of a package other than torch: modules whose
    computation the file does not show, counted as a softmax so that a miss names them."""
    return {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] != "torch"
        for alias in node.names
        if "softmax" in alias.name.lower() and alias.name[:1].isupper()
    }


def _returns_several(klass: ast.ClassDef) -> bool:
    """Whether the class's `forward` returns a tuple: several outputs (a hyper-connection's `post, comb, states`
    weights, one of them a softmax's) are no probability tensor, so the class is no softmax module."""
    for inner in klass.body:
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner.name == "forward":
            return any(isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) for node in _walk(inner))
    return False


def _product_wrappers(functions: list[_Function], softmaxes: frozenset[str]) -> frozenset[str]:
    """The names a call of which is a product: the file's functions and methods (not a `forward`) whose body holds a
    product and calls no softmax, to a fixed point so that a helper of a helper counts."""
    called_by: dict[str, set[str]] = {}  # helper -> the names it calls (`x.f(...)`, `f(...)`)
    names: set[str] = set()
    for function in functions:
        method = function.where.rpartition(".")[2]
        if method == "forward" or not any(isinstance(node, (ast.Call, ast.BinOp)) for node in function.nodes):
            continue
        calls = [node for node in function.nodes if isinstance(node, ast.Call)]
        if any(_is_softmax(call, softmaxes) for call in calls):
            continue
        if function.products:
            names.add(method)
        called_by.setdefault(method, set()).update(_called_name(call) for call in calls)
    changed = True
    while changed:
        changed = False
        for name, called in called_by.items():
            if name not in names and called & names:
                names.add(name)
                changed = True
    return frozenset(names)


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def undispatched_sites(tree: ast.Module) -> list[EagerSite]:
    """The eager attention of a file that is not an implementation it dispatches to: module-level functions handed
    around as values (`attention_interface = eager_attention_forward`, `get_interface(..., eager_attention_forward)`)
    are the eager implementation itself."""
    nodes = _walk(tree)
    called = {id(node.func) for node in nodes if isinstance(node, ast.Call)}
    handed = {node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in called}
    return [site for site in find_eager_attention(tree) if "." in site.where or site.where not in handed]


def _walk(node: ast.AST) -> list[ast.AST]:
    """`ast.walk(node)` as a list, in the same (breadth-first) order, without its per-node generator overhead: the
    corpus batch scans every file of a release."""
    out = [node]
    for current in out:  # grows while read
        for field in current._fields:
            value = getattr(current, field, None)
            if isinstance(value, ast.AST):
                out.append(value)
            elif isinstance(value, list):
                out.extend(item for item in value if isinstance(item, ast.AST))
    return out


def _is_product(node: ast.AST, wrappers: frozenset[str] = frozenset()) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in PRODUCT_FUNCTIONS or name in wrappers
    return False


def _is_softmax(node: ast.AST, names: frozenset[str] | set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "apply" and isinstance(func.value, ast.Name):
        return func.value.id in names  # an autograd Function: `XSoftmax.apply(x, mask, dim)`
    if isinstance(func, ast.Attribute) and func.attr in names:
        return True
    if isinstance(func, ast.Name) and func.id in names:
        return True
    # `nn.Softmax(dim=-1)(x)`
    return isinstance(func, ast.Call) and _is_softmax(func, names)


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in _walk(node) if isinstance(n, ast.Name)}


def _product_operands(node: ast.AST) -> list[ast.AST]:
    """The operands of a product: both sides of `@`, a call's arguments, and the receiver of a method-call product
    (`probs.matmul(value)`, `torch.bmm(...)`'s `torch` reading no name of the chain)."""
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    assert isinstance(node, ast.Call)
    receiver = [node.func.value] if isinstance(node.func, ast.Attribute) else []
    return [*receiver, *node.args]


@dataclass(frozen=True)
class _Softmax:
    """A softmax call inside an expression, with what its operands (the receiver of `x.softmax(-1)`, the arguments of
    `torch.softmax(x, -1)`, `self.softmax(x)`, `nn.Softmax(dim=-1)(x)`) read and whether they hold a product."""

    call: ast.Call
    names: frozenset[str]
    product: bool


@dataclass(frozen=True)
class _Expression:
    """What the fixpoint needs of an expression, read once: its names, whether it holds a product, its softmaxes."""

    names: frozenset[str]
    product: bool
    softmaxes: tuple[_Softmax, ...]

    @classmethod
    def of(cls, node: ast.AST, softmax_names: frozenset[str], wrappers: frozenset[str] = frozenset()) -> _Expression:
        nodes = _walk(node)
        softmaxes = []
        for inner in nodes:
            if not _is_softmax(inner, softmax_names):
                continue
            assert isinstance(inner, ast.Call)
            operands: list[ast.AST] = list(inner.args)
            if isinstance(inner.func, ast.Attribute):
                operands.append(inner.func.value)
            read = frozenset().union(*map(_names, operands))
            product = any(_is_product(n, wrappers) for operand in operands for n in _walk(operand))
            softmaxes.append(_Softmax(inner, read, product))
        names = frozenset(n.id for n in nodes if isinstance(n, ast.Name))
        return cls(names, any(_is_product(n, wrappers) for n in nodes), tuple(softmaxes))

    def holds_scores(self, scores: set[str]) -> bool:
        return self.product or bool(self.names & scores)

    def softmaxes_over(self, scores: set[str]) -> list[ast.Call]:
        """The softmax calls whose operand holds scores."""
        return [s.call for s in self.softmaxes if s.product or s.names & scores]


def _sites(
    function: _Function, names: frozenset[str], wrappers: frozenset[str] = frozenset(), every: bool = False
) -> list[EagerSite]:
    """The function as a site, if it holds a product -> softmax -> product chain; with `every`, one site per softmax
    whose probabilities reach a product."""
    if len(function.products) < 2:
        return []  # the chain takes two products: most functions are done here
    assignments: list[tuple[set[str], _Expression]] = []
    for node in function.nodes:
        if isinstance(node, ast.Assign):
            targets = set().union(*(_names(t) for t in node.targets))
            assignments.append((targets, _Expression.of(node.value, names, wrappers)))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            assignments.append((_names(node.target), _Expression.of(node.value, names, wrappers)))
    # names holding scores (derived from a product), and names holding probabilities (derived from a softmax of
    # scores) with the lines of the softmaxes they may come from
    scores: set[str] = set()
    probabilities: dict[str, set[int]] = {}
    softmaxes: dict[ast.Call, int] = {}  # softmax calls over scores -> their lines
    changed = True
    while changed:
        changed = False
        for targets, value in assignments:
            calls = value.softmaxes_over(scores)
            for call in calls:
                softmaxes.setdefault(call, call.lineno)
            held = value.names & probabilities.keys()
            origins = {call.lineno for call in calls}.union(*(probabilities[name] for name in held))
            if origins:
                for target in targets:
                    if not origins <= probabilities.get(target, set()):
                        probabilities.setdefault(target, set()).update(origins)
                        changed = True
            elif value.holds_scores(scores):
                new = targets - scores - probabilities.keys()
                if new:
                    scores |= new
                    changed = True
    first: list[int] = []
    reached: set[int] = set()
    for node in function.products:
        for operand in (_Expression.of(o, names, wrappers) for o in _product_operands(node)):
            inner_softmax = operand.softmaxes_over(scores)
            held = operand.names & probabilities.keys()
            if held or inner_softmax:
                line = inner_softmax[0].lineno if inner_softmax else min(softmaxes.values(), default=_line(node))
                first.append(line)
                reached.update(call.lineno for call in inner_softmax)
                reached.update(*(probabilities[name] for name in held))
                break
    if not first:
        return []
    if every:
        return [EagerSite(function.where, line) for line in sorted(reached)]
    return [EagerSite(function.where, min(first))]
