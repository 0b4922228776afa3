"""Small CST helpers shared by analysis and rewriting (pure functions, no I/O)."""

from __future__ import annotations

from typing import Callable, Container, Iterable, Sequence, TypeVar

import libcst as cst

N = TypeVar("N", bound=cst.CSTNode)

_EMPTY_MODULE = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    """Source text of a node (as it would be rendered inside a module with default formatting)."""
    return _EMPTY_MODULE.code_for_node(node)


def expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def stmt(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text)


# ---------------------------------------------------------------- building expressions with the right parentheses

ATOM = 100
COMPARISON = 5  # `a < b`, `a != b`: binds more loosely than every binary operator
_BINARY_PRECEDENCE: dict[type, int] = {
    cst.BitOr: 6,
    cst.BitXor: 7,
    cst.BitAnd: 8,
    cst.LeftShift: 9,
    cst.RightShift: 9,
    cst.Add: 10,
    cst.Subtract: 10,
    cst.Multiply: 11,
    cst.Divide: 11,
    cst.FloorDivide: 11,
    cst.Modulo: 11,
    cst.MatrixMultiply: 11,
    cst.Power: 13,
}


def precedence(node: cst.BaseExpression) -> int:
    """How tightly an expression binds, as Python's grammar orders them (higher binds tighter)."""
    if node.lpar:
        return ATOM
    if isinstance(node, cst.NamedExpr):
        return -1
    if isinstance(node, cst.Lambda):
        return 0
    if isinstance(node, cst.IfExp):
        return 1
    if isinstance(node, cst.BooleanOperation):
        return 2 if isinstance(node.operator, cst.Or) else 3
    if isinstance(node, cst.UnaryOperation):
        return 4 if isinstance(node.operator, cst.Not) else 12
    if isinstance(node, cst.Comparison):
        return COMPARISON
    if isinstance(node, cst.BinaryOperation):
        return _BINARY_PRECEDENCE[type(node.operator)]
    if isinstance(node, cst.Await):
        return 14
    return ATOM


def parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    return node if node.lpar else node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def binary(left: cst.BaseExpression, operator: cst.BaseBinaryOp, right: cst.BaseExpression) -> cst.BinaryOperation:
    """`left <op> right`, parenthesising an operand that binds more loosely than the operator (or as loosely, on
    the side associativity does not group: the right of `-`, `/`, the left of `**`)."""
    level = _BINARY_PRECEDENCE[type(operator)]
    power = isinstance(operator, cst.Power)
    if precedence(left) < level or (power and precedence(left) == level):
        left = parenthesized(left)
    if precedence(right) < level or (not power and precedence(right) == level):
        right = parenthesized(right)
    return cst.BinaryOperation(left=left, operator=operator, right=right)


def assignment(name: str, value: cst.BaseExpression) -> cst.SimpleStatementLine:
    """The statement `name = value`, without parentheses around an operation or a primary: `x = q * s`, never
    `x = (q * s)`."""
    if isinstance(value, _BARE) and value.lpar:
        value = value.with_changes(lpar=[], rpar=[])
    return cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=value)])


_BARE = (cst.BinaryOperation, cst.UnaryOperation, cst.Call, cst.Attribute, cst.Subscript, cst.Name)


def plus(left: cst.BaseExpression, term: cst.BaseExpression) -> cst.BinaryOperation:
    """`left + term`, or `left - x` for a term `-x` (a term the source subtracted)."""
    if isinstance(term, cst.UnaryOperation) and isinstance(term.operator, cst.Minus):
        return binary(left, cst.Subtract(), term.expression.with_changes(lpar=[], rpar=[]))
    return binary(left, cst.Add(), term)


def primary(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` ready to have an attribute read or a method called on it (`(a + b).to(...)`, `(1).real`)."""
    if precedence(node) < ATOM or isinstance(node, (cst.Integer, cst.Float, cst.Imaginary)):
        return parenthesized(node)
    return node


def _broken_parentheses() -> tuple[cst.ParenthesizedWhitespace, cst.ParenthesizedWhitespace]:
    """The whitespace after `(` and before `)` of a call broken over lines: a newline, then one level deeper
    (after the opening) or back at the statement's indentation (before the closing)."""

    def line_then(indent: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(newline=cst.Newline()),
            indent=True,
            last_line=cst.SimpleWhitespace(indent),
        )

    return line_then("    "), line_then("")


def one_per_line(call: cst.Call) -> cst.Call:
    """`f(a, b=1)` laid out with one argument per line and a trailing comma (the "magic trailing comma" layout
    ruff and black keep), indented one level below the statement that holds the call."""
    if not call.args:
        return call
    opening, closing = _broken_parentheses()
    flat = [arg.with_changes(whitespace_after_arg=cst.SimpleWhitespace("")) for arg in call.args]
    args = [arg.with_changes(comma=cst.Comma(whitespace_after=opening)) for arg in flat[:-1]]
    args.append(flat[-1].with_changes(comma=cst.Comma(whitespace_after=closing)))
    return call.with_changes(whitespace_before_args=opening, args=args)


def hugged(call: cst.Call) -> cst.Call:
    """`f(a, b=1)` with its arguments on one line indented below the statement and the closing parenthesis on a
    line of its own: the layout ruff and black try before one argument per line."""
    if not call.args:
        return call
    opening, closing = _broken_parentheses()
    last = call.args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=closing)
    return call.with_changes(whitespace_before_args=opening, args=[*call.args[:-1], last])


LINE_LENGTH = 119  # transformers' ruff line length


def fits(statement: cst.BaseStatement, indent: int, limit: int = LINE_LENGTH) -> bool:
    """Every line of `statement`, placed `indent` columns in, stays within `limit` columns."""
    return all(indent + len(line) <= limit for line in code(statement).splitlines())


def assigned_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: list[str] = []
        for element in target.elements:
            out.extend(assigned_names(element.value))
        return out
    if isinstance(target, cst.StarredElement):
        return assigned_names(target.value)
    return []


def single_target(statement: cst.BaseStatement) -> str | None:
    """The name a line binds where it is one plain assignment to one name (`name = value`); None for any other."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return small.targets[0].target.value
    return None


def is_pass(statement: cst.BaseStatement | cst.BaseSmallStatement) -> bool:
    """A `pass` line (what a template leaves where generated statements go)."""
    return isinstance(statement, cst.SimpleStatementLine) and all(isinstance(s, cst.Pass) for s in statement.body)


def block_body(node: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    if isinstance(node, cst.IndentedBlock):
        return node.body
    assert isinstance(node, cst.SimpleStatementSuite)
    return [cst.SimpleStatementLine(body=node.body)]


def if_chain(node: cst.If) -> list[cst.If | cst.Else]:
    """The `if`, its `elif`s and its `else`, in order."""
    out: list[cst.If | cst.Else] = []
    current: cst.If | cst.Else | None = node
    while current is not None:
        out.append(current)
        current = current.orelse if isinstance(current, cst.If) else None
    return out


def if_branches(node: cst.If) -> list[tuple[cst.BaseExpression | None, Sequence[cst.BaseStatement]]]:
    """The (test, body) pairs of an if/elif/else chain; the else has test None."""
    return [
        (branch.test if isinstance(branch, cst.If) else None, block_body(branch.body)) for branch in if_chain(node)
    ]


class NodesIn(cst.CSTVisitor):
    """The nodes of a subtree that belong to a given collection (nodes compare by identity), in visiting order."""

    def __init__(self, wanted: Container[cst.CSTNode]) -> None:
        self.wanted = wanted
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node in self.wanted:
            self.found.append(node)
        return True


def nodes_of_type(tree: cst.CSTNode, kind: type[N], into_scopes: bool = False) -> list[N]:
    """Every node of type `kind` inside `tree`, not looking into nested functions, classes or lambdas unless
    `into_scopes`."""
    found: list[N] = []

    class _Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, kind):
                found.append(node)
            return into_scopes or node is tree or not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))

    tree.visit(_Collect())
    return found


def nodes_in(tree: cst.CSTNode, wanted: Container[cst.CSTNode]) -> list[cst.CSTNode]:
    finder = NodesIn(wanted)
    tree.visit(finder)
    return finder.found


def rebuild_if(
    branches: Sequence[tuple["cst.If | cst.Else", Sequence[cst.BaseStatement]]],
    test_of: "Callable[[cst.If], cst.BaseExpression] | None" = None,
) -> cst.If:
    """An if/elif/else chain from its branches and new bodies (an empty body becomes `pass`; an `else` left empty
    is dropped)."""
    rebuilt: cst.If | cst.Else | None = None
    if branches and isinstance(branches[-1][0], cst.Else) and not branches[-1][1]:
        branches = branches[:-1]
    for branch, body in reversed(branches):
        suite = branch.body.with_changes(body=list(body) or [cst.SimpleStatementLine(body=[cst.Pass()])])
        if isinstance(branch, cst.Else):
            rebuilt = branch.with_changes(body=suite)
        else:
            test = test_of(branch) if test_of is not None else branch.test
            rebuilt = branch.with_changes(body=suite, test=test, orelse=rebuilt)
    assert isinstance(rebuilt, cst.If)
    return rebuilt


def all_assigned_names(statements: Iterable[cst.CSTNode]) -> set[str]:
    return set(assigned_values(statements))


def assigned_values(statements: Iterable[cst.CSTNode]) -> dict[str, list[cst.BaseExpression | None]]:
    """Every name the statements bind (not inside nested functions or classes), with the value of each binding:
    the expression of a plain `name = value` (`a = b = value` included), None for any other binding (tuple
    unpacking, an augmented or annotated assignment, a `for` or `with` target, `:=`, a nested definition)."""
    collector = _Assigned()
    for statement in statements:
        statement.visit(collector)
    return collector.values


class _Assigned(cst.CSTVisitor):
    def __init__(self) -> None:
        self.values: dict[str, list[cst.BaseExpression | None]] = {}

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        plain = value if isinstance(target, cst.Name) else None
        for name in assigned_names(target):
            self.values.setdefault(name, []).append(plain)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target, None)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target, None)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target, None)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind(node.asname.name, None)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.values.setdefault(node.name.value, []).append(None)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.values.setdefault(node.name.value, []).append(None)
        return False

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target, None)


def is_docstring(statement: cst.CSTNode) -> bool:
    """A statement line holding only a string: a docstring where it opens a body."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def reads_only_self_attributes(test: cst.BaseExpression) -> bool:
    """Every name `test` reads is `self` or an attribute name after a dot: it reads the module's own settings and
    literals, nothing passed in or computed."""
    names = nodes_of_type(test, cst.Name, into_scopes=True)
    attributes = nodes_of_type(test, cst.Attribute, into_scopes=True)
    return all(n.value == "self" or any(n is a.attr for a in attributes) for n in names)


def function_names(function: cst.FunctionDef) -> set[str]:
    """Every name read or assigned in a function, parameters included."""
    names = walk_names(function.body) | all_assigned_names([function.body])
    names.update(param.name.value for param in function.params.params)
    names.update(param.name.value for param in function.params.kwonly_params)
    return names


def walk_names(node: cst.CSTNode) -> set[str]:
    """Every `Name` read in an expression (attribute names excluded)."""
    collector = _NameCollector()
    node.visit(collector)
    return collector.names


class _NameCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        return False


def assigned_between(function: cst.FunctionDef, nodes: Sequence[cst.CSTNode], ends: Sequence[cst.CSTNode]) -> set[str]:
    """The names bound from the statement holding all of `nodes` (the first in source order) to the first holding one of
    `ends` (to the end of the function without one), both included, in any branch; none where no statement holds
    `nodes`. A name read by `nodes` and bound there no longer holds what it held when `nodes` were written."""
    wanted = {id(node) for node in nodes}
    last = {id(node) for node in ends}
    names: set[str] = set()
    seen = done = False

    class _After(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal seen, done
            if done:
                return False
            if isinstance(node, (cst.SimpleStatementLine, cst.For, cst.With)):
                inside = {id(inner) for inner in _walk(node)}
                seen = seen or wanted <= inside
                if seen:
                    names.update(all_assigned_names([node]) if isinstance(node, cst.SimpleStatementLine) else _targets(node))
                    done = isinstance(node, cst.SimpleStatementLine) and bool(inside & last)
            return True

    function.body.visit(_After())
    return names


def _targets(node: cst.For | cst.With) -> set[str]:
    if isinstance(node, cst.For):
        return set(assigned_names(node.target))
    return {name for item in node.items if item.asname is not None for name in assigned_names(item.asname.name)}


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    out = [node]
    for current in out:
        out.extend(current.children)
    return out
