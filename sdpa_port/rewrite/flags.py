"""Set a class attribute such as `_supports_sdpa = True` on the PreTrainedModel subclasses."""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from sdpa_port.rewrite.targeted import transform_named

# claimed only after `--verify` ran the port so and it matched eager (`verify/claims.py`)
FLEX_FLAG = "_supports_flex_attn"
COMPILE_FLAG = "_can_compile_fullgraph"


def flag_source(source: str, classes: Iterable[str], name: str) -> str | None:
    """`source` with `name = True` set on `classes`, or None when one of them is not defined at its top level."""
    module = cst.parse_module(source)
    defined = {s.name.value for s in module.body if isinstance(s, cst.ClassDef)}
    if not set(classes) <= defined:
        return None
    return set_class_flag(module, classes, name).code


def set_class_flag(module: cst.Module, classes: Iterable[str], name: str, value: str = "True") -> cst.Module:
    names = frozenset(classes)
    return transform_named(module, names, _SetFlag(names, name, value))


class _SetFlag(cst.CSTTransformer):
    def __init__(self, classes: frozenset[str], name: str, value: str) -> None:
        self.classes = classes
        self.name = name
        self.value = value
        self.depth = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.depth -= 1
        if self.depth or updated.name.value not in self.classes:
            return updated
        body = list(updated.body.body)
        new_line = cst.SimpleStatementLine(
            body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(self.name))], value=cst.parse_expression(self.value))]
        )
        # replace an existing assignment
        for index, statement in enumerate(body):
            if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
                small = statement.body[0]
                if (
                    isinstance(small, cst.Assign)
                    and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)
                    and small.targets[0].target.value == self.name
                ):
                    body[index] = statement.with_changes(body=[small.with_changes(value=cst.parse_expression(self.value))])
                    return updated.with_changes(body=updated.body.with_changes(body=body))
        # otherwise after the leading run of docstring and class attributes
        position = 0
        for index, statement in enumerate(body):
            if isinstance(statement, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Assign, cst.AnnAssign, cst.Expr)) for s in statement.body
            ):
                position = index + 1
            else:
                break
        body.insert(position, new_line)
        return updated.with_changes(body=updated.body.with_changes(body=body))
