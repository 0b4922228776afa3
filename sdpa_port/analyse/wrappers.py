"""Softmax wrappers the file defines, read as the expression they compute (read-only analysis).

DeBERTa's `XSoftmax.apply(scores, mask, -1)` (an autograd Function), LayoutLMv3's `self.cogview_attention(scores)`
(a method), or a module-level `masked_softmax(scores, mask)`: a call whose callee is a straight line of assignments
ending in `return <expression>` stands for that expression with the callee's parameters replaced by the call's
arguments, and the tracer reads it as if it were written at the call. Only where that is the same computation:

- every argument is a name, an attribute of one, or a number, so repeating it where the parameter was read
  evaluates nothing twice;
- every call in the body is a torch function or a method of a tensor (no module of `self`, no function of the file),
  so nothing in it has state or effects that reading it again would repeat;
- an autograd Function's `ctx` is only written (`ctx.dim = dim`, `ctx.save_for_backward(...)`) and read back as
  those attributes;
- an in-place `x.masked_fill_(m, v)` on a local is read as `x = x.masked_fill(m, v)`.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import is_docstring, nodes_of_type, parenthesized, reads_only_self_attributes
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.rewrite.edit import self_as, substitute

Qualify = Callable[[cst.CSTNode], "str | None"]

IN_PLACE = {"masked_fill_": "masked_fill", "mul_": "mul", "div_": "div", "add_": "add", "sub_": "sub"}


def inlined(call: cst.Call, facts: ModuleFacts, class_name: str | None, qualify: Qualify) -> cst.BaseExpression | None:
    """The expression a call of one of the file's softmax-sized helpers computes, in the caller's names; None when
    the callee is not such a straight line or the call's arguments are not simple."""
    callee = _callee(call, facts, class_name)
    if callee is None:
        return None
    function, skipped, applied = callee
    bound = bind_arguments(call, function, skipped)
    if bound is None:
        return None
    # an autograd Function's context, whatever its name (DeBERTa's 4.x XSoftmax calls it `self`)
    context = function.params.params[0].name.value if applied else None
    return _straight_line(function, bound, context, qualify, frozenset(facts.imports.aliases))


def bind_arguments(
    call: cst.Call, function: cst.FunctionDef, skipped: int, simple: bool = True
) -> dict[str, cst.BaseExpression] | None:
    """Each parameter of `function` after the first `skipped` (`self`, `ctx`) -> what `call` passes for it, or its
    default; None unless every one is bound, by position or keyword, and (with `simple`) to a simple expression (a
    name, an attribute of one, a number), which reading again wherever the parameter is read evaluates nothing
    twice."""
    params = function.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg is not None or params.kwonly_params:
        return None
    names = [param.name.value for param in (*params.posonly_params, *params.params)][skipped:]
    defaults = {param.name.value: param.default for param in (*params.posonly_params, *params.params) if param.default}
    bound: dict[str, cst.BaseExpression] = {}
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args) or len(positional) > len(names):
        return None
    bound.update((name, a.value) for name, a in zip(names, positional))
    for a in call.args:
        if a.keyword is not None:
            if a.keyword.value not in names or a.keyword.value in bound:
                return None
            bound[a.keyword.value] = a.value
    for name in names:
        if name not in bound and defaults.get(name) is not None:
            bound[name] = defaults[name]
    if set(bound) != set(names) or (simple and not all(is_simple(value) for value in bound.values())):
        return None
    return bound


def substituted_names(node: cst.BaseExpression, env: dict[str, cst.BaseExpression]) -> cst.BaseExpression:
    """`node` with each name read in `env` replaced by its expression (attribute names and keywords stay)."""
    result, _ = substitute(node, env, {}, None)
    return result


def _callee(call: cst.Call, facts: ModuleFacts, class_name: str | None) -> tuple[cst.FunctionDef, int, bool] | None:
    """The function a call runs, how many of its leading parameters the call does not pass (`self`, `ctx`), and
    whether it is an autograd Function's forward (its first parameter is the context)."""
    func = call.func
    if isinstance(func, cst.Name):
        function = facts.functions.get(func.value)
        return (function, 0, False) if function is not None else None
    if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Name):
        return None
    if func.value.value == "self" and class_name is not None:
        found = facts.find_method(class_name, func.attr.value)
        if found is None or _is_static(found[1]):
            return None
        return found[1], 1, False
    if func.attr.value == "apply":
        # an autograd Function of the file: its static forward takes `ctx` first
        found = facts.find_method(func.value.value, "forward")
        if found is None or not _is_static(found[1]) or not found[1].params.params:
            return None
        return found[1], 1, True
    return None


def _is_static(function: cst.FunctionDef) -> bool:
    return any(m.matches(d.decorator, m.Name("staticmethod")) for d in function.decorators)


def is_simple(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Name, cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return isinstance(node.expression, (cst.Integer, cst.Float))
    return isinstance(node, cst.Attribute) and is_simple(node.value)


def _straight_line(
    function: cst.FunctionDef,
    bound: dict[str, cst.BaseExpression],
    context: str | None,
    qualify: Qualify,
    imported: frozenset[str],
) -> cst.BaseExpression | None:
    if function.decorators and not _is_static(function):
        return None
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
    env: dict[str, cst.BaseExpression] = {name: _wrapped(value) for name, value in bound.items()}
    saved: dict[str, cst.BaseExpression] = {}  # ctx attributes
    statements = [s for s in body if not is_docstring(s)]
    for index, statement in enumerate(statements):
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        small = statement.body[0]
        last = index == len(statements) - 1
        if isinstance(small, cst.Return):
            if not last or small.value is None:
                return None
            return _substituted(small.value, env, saved, context, qualify, imported)
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            value = _substituted(small.value, env, saved, context, qualify, imported)
            if value is None:
                return None
            target = small.targets[0].target
            if isinstance(target, cst.Name):
                env[target.value] = _wrapped(value)
                continue
            if context is not None and m.matches(target, m.Attribute(value=m.Name(context))):
                assert isinstance(target, cst.Attribute)
                saved[target.attr.value] = _wrapped(value)
                continue
            return None
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            if context is not None and m.matches(call.func, m.Attribute(value=m.Name(context), attr=m.Name("save_for_backward"))):
                continue
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in IN_PLACE and isinstance(call.func.value, cst.Name):
                name = call.func.value.value
                if name not in env or name in bound:
                    return None  # in place on an argument: the caller's tensor changes
                out_of_place = call.with_changes(func=call.func.with_changes(attr=cst.Name(IN_PLACE[call.func.attr.value])))
                value = _substituted(out_of_place, env, saved, context, qualify, imported)
                if value is None:
                    return None
                env[name] = _wrapped(value)
                continue
        return None
    return None


def _substituted(
    node: cst.BaseExpression,
    env: dict[str, cst.BaseExpression],
    saved: dict[str, cst.BaseExpression],
    context: str | None,
    qualify: Qualify,
    imported: frozenset[str],
) -> cst.BaseExpression | None:
    """`node` with the locals and parameters replaced by what they hold; None where it reads `self` modules, calls
    what is not torch or a tensor method, or reads `ctx` beyond the attributes written."""
    for call in nodes_of_type(node, cst.Call, into_scopes=True):
        func = call.func
        qualified = qualify(func) or ""
        if qualified.startswith("torch."):
            continue
        if isinstance(func, cst.Call) and (qualify(func.func) or "").startswith("torch."):
            continue  # `nn.Softmax(dim=-1)(x)`
        if isinstance(func, cst.Attribute) and isinstance(
            func.value, (cst.Call, cst.Subscript, cst.BinaryOperation, cst.UnaryOperation)
        ):
            continue  # a method of what another call or an operation gives (`(x - m).softmax(d)`): its calls are checked
        if isinstance(func, cst.Attribute):
            root = _root_name(func)
            if root is not None and root not in imported and root not in ("self", context):
                continue  # a method of a tensor the body computes or receives
        return None
    result, failed = substitute(node, env, saved, context)
    return None if failed else result


def _root_name(node: cst.BaseExpression) -> str | None:
    """`a` of `a.b.c(...)`; None when the chain starts elsewhere (a call's result, a subscript)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def _wrapped(value: cst.BaseExpression) -> cst.BaseExpression:
    """The value as it replaces a name: parenthesised unless it is a name, a number or an attribute or call chain."""
    atomic = (cst.Name, cst.Integer, cst.Float, cst.Attribute, cst.Call, cst.Subscript)
    if isinstance(value, cst.UnaryOperation) and isinstance(value.expression, (cst.Integer, cst.Float)):
        return value  # `-1`
    return value if isinstance(value, atomic) else parenthesized(value)



def identity_unless(
    call: cst.Call, facts: ModuleFacts, class_name: str | None
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """`self.m(x)` where `self.m` is built from a module class of the file whose forward is `if <settings>: return
    ...` then `return x`: (x, the settings as the caller reads them, `self.m.training and self.m.drop_prob > 0`).
    The settings may read only the module's own attributes and literals."""
    if class_name is None or len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return None
    if not m.matches(call.func, m.Attribute(value=m.Name("self"))):
        return None
    assert isinstance(call.func, cst.Attribute)
    values = facts.find_attribute_values(class_name, call.func.attr.value)
    classes = {v.func.value for v in values if isinstance(v, cst.Call) and isinstance(v.func, cst.Name)}
    if len(values) != 1 or len(classes) != 1:
        return None
    found = facts.find_method(next(iter(classes)), "forward")
    if found is None:
        return None
    function = found[1]
    params = [param.name.value for param in function.params.params]
    if len(params) != 2 or params[0] != "self" or function.params.star_arg is not cst.MaybeSentinel.DEFAULT:
        return None
    body = [s for s in (function.body.body if isinstance(function.body, cst.IndentedBlock) else ()) if not is_docstring(s)]
    if len(body) != 2 or not isinstance(body[0], cst.If) or body[0].orelse is not None:
        return None
    test, last = body[0].test, body[1]
    if not (isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 and isinstance(last.body[0], cst.Return)):
        return None
    returned = last.body[0].value
    if returned is None or not m.matches(returned, m.Name(params[1])):
        return None
    if not reads_only_self_attributes(test):
        return None  # the test reads something besides the module's own settings
    module = cst.Attribute(value=cst.Name("self"), attr=call.func.attr)
    settings = self_as(test, module)
    return call.args[0].value, settings
