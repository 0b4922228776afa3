"""Carry a port of a generated modeling file into the `modular_<m>.py` it is generated from.

Transformers 5 generates `modeling_<m>.py` from `modular_<m>.py` with `utils/modular_model_converter.py`: a change
made only to the generated file is undone by the next regeneration. The engine ports the generated file (it holds
the whole attention code); what the port changed is then written into the modular file in the form the converter
reads back: a changed class gets the changed or added statements of its body (an attribute such as
`_supports_sdpa = True`, or a method, which then overrides the inherited one), a new top-level definition goes after
the definition it follows in the generated file, and the names it imports are imported. Anything that cannot be
placed that way is a reason, and nothing is carried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from sdpa_port.rewrite.imports import add_import_from

Named = cst.ClassDef | cst.FunctionDef | cst.SimpleStatementLine


@dataclass
class Carried:
    source: str | None  # the new modular text, None when the port could not be carried
    notes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def carry(modular: str, before: str, after: str) -> Carried:
    """The modular text with the changes between `before` and `after`, the generated file and its port."""
    module = cst.parse_module(modular)
    old = _top_level(cst.parse_module(before))
    new_module = cst.parse_module(after)
    new = _top_level(new_module)
    code = new_module.code_for_node
    carried = Carried(None)
    order = list(new)
    for index, (name, node) in enumerate(new.items()):
        previous = old.get(name)
        if previous is not None and code(previous) == code(node):
            continue
        if name.startswith("import "):
            continue
        here = _top_level(module)
        if previous is None:
            anchor = next((n for n in reversed(order[:index]) if n in here and not n.startswith("import ")), None)
            module = _insert_after(module, anchor, node)
            carried.notes.append(f"added {name} to the modular file")
        elif name not in here:
            carried.reasons.append(f"{name} changed but the modular file does not define it")
        elif isinstance(node, cst.ClassDef) and isinstance(previous, cst.ClassDef):
            updated = _carry_class(here[name], previous, node, code)
            if isinstance(updated, str):
                carried.reasons.append(updated)
            else:
                module = _replace(module, name, updated)
                carried.notes.append(f"carried the changes of {name} into the modular file")
        elif code(here[name]) == code(previous):
            module = _replace(module, name, node)
            carried.notes.append(f"replaced {name} in the modular file")
        else:
            carried.reasons.append(f"{name} differs between the modular and the generated file")
    if carried.reasons:
        return carried
    for level, dotted, imported in _new_imports(cst.parse_module(before), new_module):
        module = add_import_from(module, level, dotted, imported)
    carried.source = module.code
    return carried


def _top_level(module: cst.Module) -> dict[str, Named]:
    """Top-level classes, functions and single-target assignments by name; imports keyed by their code."""
    out: dict[str, Named] = {}
    for statement in module.body:
        if isinstance(statement, (cst.ClassDef, cst.FunctionDef)):
            out[statement.name.value] = statement
        elif isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
            ):
                out[small.targets[0].target.value] = statement
            elif isinstance(small, (cst.Import, cst.ImportFrom)):
                out["import " + module.code_for_node(small)] = statement
    return out


def _members(body: cst.BaseSuite) -> list[tuple[str, cst.BaseStatement]]:
    """A class body's statements keyed by what they define, a method or an assigned name, or by their code."""
    if not isinstance(body, cst.IndentedBlock):
        return []
    out = []
    for statement in body.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            out.append((statement.name.value, statement))
        elif isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, (cst.Assign, cst.AnnAssign)):
                target = small.targets[0].target if isinstance(small, cst.Assign) else small.target
                key = target.value if isinstance(target, cst.Name) else cst.Module([]).code_for_node(statement)
                out.append((key, statement))
            else:
                out.append((cst.Module([]).code_for_node(statement).strip(), statement))
        else:
            out.append((cst.Module([]).code_for_node(statement).strip(), statement))
    return out


def _carry_class(modular: Named, before: cst.ClassDef, after: cst.ClassDef, code) -> cst.ClassDef | str:  # type: ignore[no-untyped-def]
    if not isinstance(modular, cst.ClassDef) or not isinstance(modular.body, cst.IndentedBlock):
        return f"{after.name.value} is not a class in the modular file"
    old = dict(_members(before.body))
    new = _members(after.body)
    body = list(modular.body.body)
    if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Pass):
        body = []  # `class X(Parent): pass` gains members
    keys = [key for key, _ in _members(modular.body.with_changes(body=body))]
    for position, (key, statement) in enumerate(new):
        previous = old.get(key)
        if previous is not None and code(previous) == code(statement):
            continue
        if key in keys:
            index = keys.index(key)
            if previous is None or code(body[index]) != code(previous):
                return f"{after.name.value}.{key} differs between the modular and the generated file"
            body[index] = statement
            continue
        anchor = next((k for k, _ in reversed(new[:position]) if k in keys), None)
        index = keys.index(anchor) + 1 if anchor is not None else _after_attributes(body)
        body.insert(index, statement)
        keys.insert(index, key)
    if not body:
        return modular
    return modular.with_changes(body=modular.body.with_changes(body=body))


def _after_attributes(body: list[cst.BaseStatement]) -> int:
    index = 0
    while index < len(body) and isinstance(body[index], cst.SimpleStatementLine):
        index += 1
    return index


def _replace(module: cst.Module, name: str, node: cst.CSTNode) -> cst.Module:
    body = [node if _top_level(cst.Module(body=[s])).get(name) is not None else s for s in module.body]
    return module.with_changes(body=body)


def _insert_after(module: cst.Module, anchor: str | None, node: Named) -> cst.Module:
    body = list(module.body)
    index = len(body)
    if anchor is not None:
        for position, statement in enumerate(body):
            if anchor in _top_level(cst.Module(body=[statement])):
                index = position + 1
                break
    body.insert(index, node)
    return module.with_changes(body=body)


def _new_imports(before: cst.Module, after: cst.Module) -> list[tuple[int, str, str]]:
    """The level, module and name of each name that the port's top-level `from` imports added."""

    def imported(module: cst.Module) -> set[tuple[int, str, str]]:
        out = set()
        for statement in module.body:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if (
                        isinstance(small, cst.ImportFrom)
                        and small.module is not None
                        and not isinstance(small.names, cst.ImportStar)
                    ):
                        dotted = cst.Module([]).code_for_node(small.module)
                        out.update((len(small.relative), dotted, alias.evaluated_name) for alias in small.names)
        return out

    return sorted(imported(after) - imported(before))
