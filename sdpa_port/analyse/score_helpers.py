"""Score helpers: a method of the attention class that computes part of the scores (the Conformer's
`scores = self._apply_relative_embeddings(query=query, key=key, relative_position_embeddings=...)` returns
`(q_u @ kᵀ + shifted(q_v @ pᵀ)) / sqrt(d)`), read as if its statements were written at the call.

`with_score_helpers(facts, lines)` gives facts in which each such `forward` is that inlined copy: the analysis
reads it, and the class style's SDPA forward is made from it, while the eager class stays as written. A call is
inlined only where that is the same computation, statement for statement:

- the call is the whole value of an assignment to one name, `name = self.helper(...)`, binding every parameter
  (`wrappers.bind_arguments`); an argument that is a name, an attribute of one or a number is read where the
  parameter is read, any other is assigned to a name of its own first, in the order the call evaluates them, and
  a default left in place must be such a simple value too;
- the helper is a plain method of the class (no decorator, no `*args`, no keyword-only parameters), which no
  subclass in the file overrides, and its body is a straight line of assignments to names ending in
  `return <expression>` (no other statement, no nested function, lambda or comprehension);
- it computes a product of two tensors (`@`, `matmul`, `bmm`, `einsum`) and no softmax: the attention itself in a
  helper is `recognise`'s helper calls, not this;
- the module-level names it reads (`torch`, `math`) are not names forward binds, which would shadow them there.

Every name the helper assigns gets a name of its own in the caller (`query` becomes `query_1` where forward has a
`query`), and the `return` assigns the caller's name. Each inlined node is placed at its helper statement's line.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Sequence, cast

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import all_assigned_names, is_docstring, nodes_of_type
from sdpa_port.analyse.lines import Lines
from sdpa_port.analyse.module_facts import ClassInfo, ModuleFacts
from sdpa_port.analyse.patterns import walk_names
from sdpa_port.analyse.wrappers import bind_arguments, is_simple, substituted_names

PRODUCTS = frozenset({"matmul", "bmm", "einsum", "baddbmm"})


def with_score_helpers(facts: ModuleFacts, lines: Lines) -> tuple[ModuleFacts, tuple[tuple[str, str], ...]]:
    """`facts` with each class's own `forward` read with its score helpers inlined, and the (class, helper) pairs
    written out; the same facts where there are none."""
    classes = dict(facts.classes)
    inlined: list[tuple[str, str]] = []
    for name, info in facts.classes.items():
        forward = info.methods.get("forward")
        if forward is None:
            continue
        if not any(_helper_call(facts, name, line) for line in nodes_of_type(forward, cst.SimpleStatementLine)):
            continue  # most forwards call none: their lines (a metadata pass per class) are not computed
        lines.prepare(i.name for i in facts.mro(name))
        new, helpers = _inline(facts, name, forward, lines)
        if not helpers:
            continue
        copied = copy.copy(info)
        copied.methods = {**info.methods, "forward": new}
        classes[name] = copied
        inlined.extend((name, helper) for helper in helpers)
    if not inlined:
        return facts, ()
    return replace(facts, classes=classes), tuple(inlined)


def _inline(
    facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, lines: Lines
) -> tuple[cst.FunctionDef, list[str]]:
    bound_in_forward = _bound_names(forward)
    taken = walk_names(forward.body) | bound_in_forward  # every name forward reads or binds
    helpers: list[str] = []

    def block(statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement] | None:
        out: list[cst.BaseStatement] = []
        changed = False
        for statement in statements:
            replaced = one(statement)
            if replaced is None:
                out.append(statement)
            else:
                out.extend(replaced)
                changed = True
        return out if changed else None

    def one(statement: cst.BaseStatement) -> list[cst.BaseStatement] | None:
        if isinstance(statement, cst.SimpleStatementLine):
            found = _helper_call(facts, class_name, statement)
            if found is None:
                return None
            target, call, helper, bound, method = found
            if _free_names(helper, bound) & bound_in_forward:
                return None  # `torch` read by the helper is a local of forward's there
            body = _inlined_body(helper, call, bound, target, taken, lines, lines(statement))
            first = body[0]
            helpers.append(method)
            body[0] = cast(
                cst.SimpleStatementLine,
                _placed(first.with_changes(leading_lines=[*statement.leading_lines, *first.leading_lines]), first, lines),
            )
            return list(body)
        new = compound(statement)
        return None if new is None else [cast(cst.BaseStatement, new)]

    def compound(node: cst.CSTNode) -> cst.CSTNode | None:
        """`node` with the statements of its blocks (and of an `else`/`elif`) inlined; None when nothing changed."""
        changes: dict[str, cst.CSTNode] = {}
        body = getattr(node, "body", None)
        if isinstance(body, cst.IndentedBlock):
            statements = block(body.body)
            if statements is not None:
                changes["body"] = _placed(body.with_changes(body=statements), body, lines)
        orelse = getattr(node, "orelse", None)
        if isinstance(orelse, (cst.If, cst.Else)):
            new = compound(orelse)
            if new is not None:
                changes["orelse"] = new
        if not changes or not isinstance(node, (cst.If, cst.Else, cst.For, cst.While, cst.With, cst.Try)):
            return None
        return _placed(node.with_changes(**changes), node, lines)

    assert isinstance(forward.body, cst.IndentedBlock)
    statements = block(forward.body.body)
    if statements is None:
        return forward, []
    new_body = _placed(forward.body.with_changes(body=statements), forward.body, lines)
    return cast(cst.FunctionDef, _placed(forward.with_changes(body=new_body), forward, lines)), helpers


def _helper_call(
    facts: ModuleFacts, class_name: str, statement: cst.SimpleStatementLine
) -> tuple[cst.Name, cst.Call, cst.FunctionDef, dict[str, cst.BaseExpression], str] | None:
    """`name = self.helper(...)` calling a score helper with arguments it can bind: (name, call, helper, bound,
    method)."""
    if len(statement.body) != 1 or not isinstance(statement.body[0], cst.Assign):
        return None
    assign = statement.body[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return None
    call = assign.value
    if not m.matches(call, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name()))):
        return None
    assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
    method = call.func.attr.value
    found = facts.find_method(class_name, method)
    if found is None or _overridden(facts, found[0], method):
        return None
    helper = found[1]
    if helper.decorators or helper.asynchronous is not None or not _straight_line(helper) or not _computes_scores(helper):
        return None
    params = helper.params.params
    if not params or params[0].name.value != "self" or helper.params.posonly_params:
        return None
    bound = bind_arguments(call, helper, 1, simple=False)
    passed = {id(arg.value) for arg in call.args}
    if bound is None or not all(is_simple(v) for v in bound.values() if id(v) not in passed):
        return None
    return assign.targets[0].target, call, helper, bound, method


def _overridden(facts: ModuleFacts, owner: ClassInfo, method: str) -> bool:
    """A class of the file below `owner` defines `method` again: `self.method` is not one function."""
    return any(
        info is not owner and method in info.methods and owner in facts.mro(name) for name, info in facts.classes.items()
    )


def _statements(function: cst.FunctionDef) -> list[cst.BaseStatement]:
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
    return [s for s in body if not is_docstring(s)]


def _straight_line(function: cst.FunctionDef) -> bool:
    statements = _statements(function)
    if not statements:
        return False
    for index, statement in enumerate(statements):
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        if index == len(statements) - 1:
            if not isinstance(small, cst.Return) or small.value is None:
                return False
        elif not (
            isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
        ):
            return False
    scoped: tuple[type[cst.CSTNode], ...] = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
    return not any(nodes_of_type(s, kind, into_scopes=True) for s in statements for kind in scoped)


def _computes_scores(function: cst.FunctionDef) -> bool:
    """A product of two tensors and no softmax."""
    product = any(isinstance(n.operator, cst.MatrixMultiply) for n in nodes_of_type(function.body, cst.BinaryOperation))
    softmax = False
    for node in nodes_of_type(function.body, cst.Call):
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        product = product or name in PRODUCTS
        softmax = softmax or "softmax" in name.lower()
    return product and not softmax


def _inlined_body(
    helper: cst.FunctionDef,
    call: cst.Call,
    bound: dict[str, cst.BaseExpression],
    target: cst.Name,
    taken: set[str],
    lines: Lines,
    call_line: int,
) -> list[cst.SimpleStatementLine]:
    env: dict[str, cst.BaseExpression] = dict(bound)
    renamed: dict[str, cst.Name] = {}
    out: list[cst.SimpleStatementLine] = []
    parameter = {id(value): name for name, value in bound.items()}
    for arg in call.args:  # in the order the call evaluates them
        name = parameter.get(id(arg.value))
        if name is None or is_simple(arg.value):
            continue
        argument = renamed[name] = cst.Name(_fresh(name, taken))
        taken.add(argument.value)
        env[name] = argument
        evaluated = cst.SimpleStatementLine([cst.Assign(targets=[cst.AssignTarget(argument)], value=arg.value)])
        lines.place(evaluated, call_line)
        out.append(evaluated)
    for statement in _statements(helper):
        assert isinstance(statement, cst.SimpleStatementLine)
        small = statement.body[0]
        line = lines(statement)
        if isinstance(small, cst.Return):
            assert small.value is not None
            value = substituted_names(small.value, env)
            new_small: cst.BaseSmallStatement = cst.Assign(targets=[cst.AssignTarget(target)], value=value)
        else:
            assert isinstance(small, cst.Assign)
            value = substituted_names(small.value, env)
            local = small.targets[0].target
            assert isinstance(local, cst.Name)
            fresh = renamed.get(local.value)
            if fresh is None:
                fresh = renamed[local.value] = cst.Name(_fresh(local.value, taken))
                taken.add(fresh.value)
            env[local.value] = fresh
            new_small = small.with_changes(targets=[small.targets[0].with_changes(target=fresh)], value=value)
        new = statement.with_changes(body=[new_small])
        lines.place(new, line)
        out.append(new)
    return out


def _bound_names(function: cst.FunctionDef) -> set[str]:
    """The names `function` binds: its parameters and every binding in its body (`cstutil.all_assigned_names`)."""
    names = {param.name.value for param in (*function.params.posonly_params, *function.params.params, *function.params.kwonly_params)}
    for star in (function.params.star_arg, function.params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
    return names | all_assigned_names([function.body])


def _free_names(helper: cst.FunctionDef, bound: dict[str, cst.BaseExpression]) -> set[str]:
    """The names the helper reads that are neither its parameters nor its own locals (module-level names)."""
    local = set(bound) | {"self"} | _bound_names(helper)
    return {name for statement in _statements(helper) for name in walk_names(statement)} - local


def _fresh(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    index = 1
    while f"{name}_{index}" in taken:
        index += 1
    return f"{name}_{index}"


def _placed(new: cst.CSTNode, old: cst.CSTNode, lines: Lines) -> cst.CSTNode:
    lines.positions[new] = lines(old)
    return new
