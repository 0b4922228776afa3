"""A second, independent look for eager attention: a softmax over a product of two tensors, multiplied by a third.

The recogniser reads attention in the forms it knows and ports them; this detector knows no forms. It follows
names through each function (`ast`, flow-insensitive): a product (`matmul`, `@`, `bmm`, `baddbmm`, `einsum`)
feeds a softmax whose result feeds another product. A softmax is a softmax call, or a call of what the file defines
around one: a function or method whose body calls a softmax (`masked_softmax(x, mask)`, `self._softmax(x)`), or an
autograd Function whose `forward` does (`XSoftmax.apply(x, mask, -1)`), followed through wrappers of wrappers. When the recogniser finds nothing to port while this finds a
site, the file is refused naming the site instead of reported as having no attention: a miss is never silent.
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


def find_eager_attention(tree: ast.Module) -> list[EagerSite]:
    """Every function or method holding a product -> softmax -> product chain, with the softmax's line."""
    softmaxes = _softmax_wrappers(tree)
    return [site for where, function in _functions(tree) for site in _sites(function, where, softmaxes)]


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


def _softmax_wrappers(tree: ast.Module) -> frozenset[str]:
    """The names a call of which is a softmax: the torch ones, plus the file's functions and methods whose body calls
    a softmax and holds no product, and its classes whose `forward` does (an autograd Function called as `Class.apply(...)`), to a fixed
    point so that a wrapper of a wrapper counts."""
    names = set(SOFTMAX_NAMES)
    functions = _functions(tree)
    changed = True
    while changed:
        changed = False
        for where, function in functions:
            owner, _, method = where.rpartition(".")
            name = owner if owner and method == "forward" else method
            nodes = list(ast.walk(function))
            if name in names or any(map(_is_product, nodes)) or not any(_is_softmax(node, names) for node in nodes):
                continue  # a function holding a product is an attention site of its own, not a softmax
            names.add(name)
            changed = True
    return frozenset(names)


def undispatched_sites(tree: ast.Module) -> list[EagerSite]:
    """The eager attention of a file that is not an implementation it dispatches to: module-level functions handed
    around as values (`attention_interface = eager_attention_forward`, `get_interface(..., eager_attention_forward)`)
    are the eager implementation itself."""
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    handed = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in called
    }
    return [site for site in find_eager_attention(tree) if "." in site.where or site.where not in handed]


def _is_product(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in PRODUCT_FUNCTIONS
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
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _product_operands(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    assert isinstance(node, ast.Call)
    return list(node.args)


def _sites(function: ast.FunctionDef | ast.AsyncFunctionDef, where: str, names: frozenset[str]) -> list[EagerSite]:
    assignments: list[tuple[set[str], ast.AST]] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            targets = set().union(*(_names(t) for t in node.targets))
            assignments.append((targets, node.value))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            assignments.append((_names(node.target), node.value))
    # names holding scores (derived from a product) and probabilities (derived from a softmax of scores)
    scores: set[str] = set()
    probabilities: set[str] = set()
    softmaxes: dict[ast.Call, int] = {}  # softmax calls over scores -> their lines

    def holds_scores(node: ast.AST) -> bool:
        return any(_is_product(n) for n in ast.walk(node)) or bool(_names(node) & scores)

    def softmax_over_scores(node: ast.AST) -> list[ast.Call]:
        """Softmax calls inside `node` whose operand holds scores: the receiver (`x.softmax(-1)`) or an argument
        (`torch.softmax(x, -1)`, `self.softmax(x)`, `nn.Softmax(dim=-1)(x)`)."""
        found = []
        for inner in ast.walk(node):
            if not _is_softmax(inner, names):
                continue
            assert isinstance(inner, ast.Call)
            operands: list[ast.AST] = list(inner.args)
            if isinstance(inner.func, ast.Attribute):
                operands.append(inner.func.value)
            if any(holds_scores(operand) for operand in operands):
                found.append(inner)
        return found

    changed = True
    while changed:
        changed = False
        for targets, value in assignments:
            calls = softmax_over_scores(value)
            for call in calls:
                softmaxes.setdefault(call, call.lineno)
            if calls or _names(value) & probabilities:
                new = targets - probabilities
                if new:
                    probabilities |= new
                    changed = True
            elif holds_scores(value):
                new = targets - scores - probabilities
                if new:
                    scores |= new
                    changed = True
    lines: list[int] = []
    for node in ast.walk(function):
        if not _is_product(node):
            continue
        for operand in _product_operands(node):
            if _names(operand) & probabilities or softmax_over_scores(operand):
                inner_softmax = softmax_over_scores(operand)
                line = inner_softmax[0].lineno if inner_softmax else min(softmaxes.values(), default=_line(node))
                lines.append(line)
                break
    return [EagerSite(where, min(lines))] if lines else []
