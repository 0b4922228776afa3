"""The edits the interface style makes to the classes it moves onto the attention interface, as CST transformers.

`plan/interface_style.py` decides what each class needs; `interface_apply.py` runs these to make it so:

- `ReplaceMethods`: a class's `forward` becomes the dispatching one (or a method inlined into the eager function
  is dropped);
- `InitAttributes`: `__init__` stores `self.config` and sets `self.is_causal` (from an `is_causal` parameter where
  the sites decide it);
- `PassConfig`: the constructions of a class gain `config=config`;
- `DictLookup`: `CLASSES[name]` becomes `CLASSES.get(name, EagerClass)`.
"""

from __future__ import annotations

from typing import Mapping

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import block_body
from sdpa_port.rewrite.edit import rebase_config
from sdpa_port.rewrite.layout import separated
from sdpa_port.rewrite.targeted import ScopedTransformer

IS_CAUSAL = "is_causal"


class ReplaceMethods(cst.CSTTransformer):
    """In the outermost class transformed, replace each named method by its new definition, or drop it where the
    name maps to None."""

    def __init__(self, changes: Mapping[str, cst.FunctionDef | None]) -> None:
        self.changes = changes
        self.depth = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.depth -= 1
        if self.depth:
            return updated
        body: list[cst.BaseStatement | cst.BaseSmallStatement] = []
        for statement in updated.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value in self.changes:
                new = self.changes[statement.name.value]
                if new is not None:
                    body.append(new)
            else:
                body.append(statement)
        return updated.with_changes(body=updated.body.with_changes(body=body))


class InitAttributes(cst.CSTTransformer):
    """Give `__init__` a `config=None` parameter stored as `self.config`, and/or set `self.is_causal` (from an
    `is_causal=False` parameter added for it when `causal_parameter`)."""

    def __init__(
        self, add_config: bool, is_causal: str | None, causal_parameter: bool = False, replace: bool = False
    ) -> None:
        self.add_config = add_config
        self.is_causal = is_causal
        self.causal_parameter = causal_parameter
        self.replace = replace  # the `self.is_causal = <literal>` already there takes the value (`unread_pinned`)
        self.depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.depth -= 1
        if self.depth or updated.name.value != "__init__":
            return updated
        params = updated.params
        names = {p.name.value for p in [*params.params, *params.kwonly_params, *params.posonly_params]}
        added: list[cst.BaseStatement] = []
        if self.add_config:
            if "config" not in names:
                params = _with_parameter(params, "config", "None")
            added.append(cst.parse_statement("self.config = config"))
        if self.causal_parameter and "is_causal" not in names:
            params = _with_parameter(params, "is_causal", "False", keyword_only=isinstance(params.star_arg, cst.Param))
        if self.is_causal is not None:
            causal = self.is_causal
            value = cst.parse_expression(causal)
            if "config" not in names and not self.add_config:
                value = rebase_config(value, to_self=True)  # __init__ reads the config it stored
            target = cst.Attribute(value=cst.Name("self"), attr=cst.Name("is_causal"))
            added.append(cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(target)], value=value)]))
        body = list(block_body(updated.body))
        if self.replace and added:
            # the pinned assignment takes the new value where it stands
            index = next(i for i, statement in enumerate(body) if is_causal_assignment(statement))
            pinned = body[index]
            assert isinstance(pinned, cst.SimpleStatementLine)
            body[index] = added.pop().with_changes(leading_lines=pinned.leading_lines)
        position = next((index + 1 for index, statement in enumerate(body) if _is_super_init(statement)), None)
        if position is None:
            position = 0 if not body or not is_docstring(body[0]) else 1
        body[position:position] = added
        return updated.with_changes(params=params, body=updated.body.with_changes(body=body))


def _with_parameter(params: cst.Parameters, name: str, default: str, keyword_only: bool = False) -> cst.Parameters:
    """`name=default` added after the positional-or-keyword parameters, or after the keyword-only ones."""
    new_param = cst.Param(
        name=cst.Name(name),
        default=cst.parse_expression(default),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    if keyword_only:
        kwonly, (new_param,) = separated([*params.kwonly_params], [new_param])
        return params.with_changes(kwonly_params=[*kwonly, new_param])
    # laid out like the parameters before it: one per line stays one per line, a trailing comma stays last
    kept, (new_param,) = separated([*params.params], [new_param])
    return params.with_changes(params=[*kept, new_param])


def _is_super_init(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and m.matches(
        statement.body[0],
        m.Expr(value=m.Call(func=m.Attribute(value=m.Call(func=m.Name("super")), attr=m.Name("__init__")))),
    )


def is_docstring(statement: cst.BaseStatement) -> bool:
    """Whether a statement is a string alone (a docstring where it comes first)."""
    return isinstance(statement, cst.SimpleStatementLine) and m.matches(statement.body[0], m.Expr(value=m.SimpleString()))


class PassConfig(ScopedTransformer):
    """`Cls(...)` gains `config=config` where a `config` parameter is in scope."""

    def __init__(self, class_name: str) -> None:
        super().__init__()
        self.class_name = class_name
        self.count = 0
        self.missing: set[str] = set()

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not m.matches(updated.func, m.Name(self.class_name)):
            return updated
        if any(a.keyword is not None and a.keyword.value == "config" for a in updated.args):
            return updated
        if not self.parameter_in_scope("config"):
            self.missing.add(self.owner)
            return updated
        self.count += 1
        args = list(updated.args)
        new = cst.Arg(
            value=cst.Name("config"),
            keyword=cst.Name("config"),
            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
        )
        if args:
            last = args[-1]
            if isinstance(last.comma, cst.Comma):
                new = new.with_changes(comma=last.comma)
                if isinstance(args[0].comma, cst.Comma) and len(args) > 1:
                    args[-1] = last.with_changes(comma=args[0].comma)
            else:
                args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(args=[*args, new])


class DictLookup(cst.CSTTransformer):
    """`CLASSES[name]` -> `CLASSES.get(name, EagerClass)`: every implementation but the listed ones goes eager-side."""

    def __init__(self, dict_name: str, eager_class: str) -> None:
        self.dict_name = dict_name
        self.eager_class = eager_class

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if not m.matches(updated.value, m.Name(self.dict_name)) or len(updated.slice) != 1:
            return updated
        index = updated.slice[0].slice
        if not isinstance(index, cst.Index):
            return updated
        return cst.Call(
            func=cst.Attribute(value=cst.Name(self.dict_name), attr=cst.Name("get")),
            args=[
                cst.Arg(index.value, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(cst.Name(self.eager_class)),
            ],
        )


def is_causal_assignment(statement: cst.BaseStatement) -> bool:
    """Whether a statement is one `self.is_causal = <value>`."""
    return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and m.matches(
        statement.body[0],
        m.Assign(targets=[m.AssignTarget(m.Attribute(value=m.Name("self"), attr=m.Name(IS_CAUSAL)))]),
    )


__all__ = ["DictLookup", "InitAttributes", "PassConfig", "ReplaceMethods", "is_causal_assignment", "is_docstring"]
