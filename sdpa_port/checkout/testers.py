"""The model testers a checkout's own test module pairs with model classes, read statically from its text.

`tests/models/t5/test_modeling_t5.py` builds tiny configs and inputs with `T5ModelTester` for the seq2seq classes
and `T5EncoderOnlyModelTester` for the encoder ones; an emitted test reuses exactly those pairs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class TesterGroup:
    tester: str  # the tester class (`T5ModelTester`)
    call: str  # how the test case builds it, `self` being the test case (`T5ModelTester(self)`)
    model_classes: tuple[str, ...]  # `all_model_classes` of that test case
    generative: tuple[str, ...]  # its `all_generative_model_classes`


def tester_groups(source: str) -> list[TesterGroup]:
    """One group per test case class that sets `all_model_classes` and builds `self.model_tester` in `setUp`."""
    tree = ast.parse(source)
    testers = {node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Tester")}
    groups: list[TesterGroup] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        classes = _names_assigned(node, "all_model_classes")
        call = _tester_call(node, source)
        if not classes or call is None or call[0] not in testers:
            continue
        groups.append(TesterGroup(call[0], call[1], classes, _names_assigned(node, "all_generative_model_classes")))
    return groups


def _names_assigned(node: ast.ClassDef, attribute: str) -> tuple[str, ...]:
    """The names a test case class assigns to `name`.

    `all_model_classes = (A, B) if is_torch_available() else ()` -> (A, B).
    """
    for statement in node.body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == attribute for t in statement.targets
        ):
            value = statement.value.body if isinstance(statement.value, ast.IfExp) else statement.value
            if isinstance(value, (ast.Tuple, ast.List)):
                return tuple(e.id for e in value.elts if isinstance(e, ast.Name))
    return ()


def _tester_call(node: ast.ClassDef, source: str) -> tuple[str, str] | None:
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef) and statement.name == "setUp":
            for inner in ast.walk(statement):
                if (
                    isinstance(inner, ast.Assign)
                    and len(inner.targets) == 1
                    and isinstance(inner.targets[0], ast.Attribute)
                    and inner.targets[0].attr == "model_tester"
                    and isinstance(inner.value, ast.Call)
                    and isinstance(inner.value.func, ast.Name)
                ):
                    text = ast.get_source_segment(source, inner.value)
                    if text is not None and "\n" not in text:
                        return inner.value.func.id, text
    return None
