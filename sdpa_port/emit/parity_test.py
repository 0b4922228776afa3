"""Render `test_sdpa_parity_<model>.py` for a port: the tests a pull request carries to show SDPA equals eager.

Two forms. Inside a Transformers checkout, for a port written in place, the test belongs to the repository: a short
unittest module beside the model's own tests that takes its tiny configs and inputs from the model's testers
(`tests/models/<m>/test_modeling_<m>.py`) and adds what the common `test_eager_matches_sdpa_inference` lacks.
Anywhere else it is standalone pytest code carrying the text of `sdpa_port/verify/checks.py`, so the emitted test,
`--verify` and the project's acceptance tests run one implementation; its tiny configuration is read statically
from the config class. Both are laid out as ruff formats them (Transformers' configuration).
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from sdpa_port.checkout.testers import TesterGroup, tester_groups
from sdpa_port.discover.config_source import read_config
from sdpa_port.render import render_text
from sdpa_port.rewrite.imports import LINE_LENGTH, member_key

FAMILIES = (
    "ForCausalLM",
    "LMHeadModel",
    "ForConditionalGeneration",
    "MTModel",
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
)


@dataclass(frozen=True)
class TestTarget:
    """Where the port lives and how the test reaches it."""

    model: str  # the model the file is named after (`bert`; `blip_text` for blip/modeling_blip_text.py)
    module_name: str  # import name of the module under test
    path: str | None  # file to load inside `package` (None: import `module_name`)
    package: str


@dataclass(frozen=True)
class EmittedTest:
    path: Path
    source: str
    models: tuple[str, ...]


def model_name(path: Path) -> str:
    stem = path.stem
    for prefix in ("modeling_", "modular_"):
        if stem.startswith(prefix):
            return stem[len(prefix):]
    return path.parent.name


def model_folder(path: Path) -> str:
    """The folder under `transformers/models/` a modeling file belongs to, dotted (`bert`, `deprecated.mctct`).

    A model folder may hold several modeling files (blip/modeling_blip_text.py belongs to `blip`). The folder
    holding the file counts when it sits under `models/` (or `models/deprecated/`) or carries its model's
    configuration file (a copied model folder); else the file names its model (a lone copy, modeling_gpt2.py)."""
    folder = path.resolve().parent
    if folder.parent.name == "models":
        return folder.name
    if folder.parent.name == "deprecated" and folder.parent.parent.name == "models":
        return f"deprecated.{folder.name}"
    if (folder / f"configuration_{folder.name}.py").is_file():
        return folder.name
    return model_name(path)


def checkout_root(path: Path) -> Path | None:
    """`<root>/src/transformers/models/<m>/modeling_<m>.py` -> `<root>` when `<root>/tests/models` exists."""
    from sdpa_port.checkout.context import root_of

    return root_of(path)


def target_for(input_path: Path, written: Path) -> TestTarget:
    model = model_name(input_path)
    package = f"transformers.models.{model_folder(input_path)}"
    resolved = input_path.resolve()
    in_package = resolved.parent.parent.name == "models" and resolved.parent.parent.parent.name == "transformers"
    if written.resolve() == resolved and in_package:
        return TestTarget(model, f"{package}.{resolved.stem}", None, package)
    return TestTarget(model, f"{package}.{written.stem}_sdpa_port", str(written.resolve()), package)


def default_tests_dir(input_path: Path, written: Path) -> Path:
    from sdpa_port.checkout.context import model_tests_dir

    root = checkout_root(input_path)
    if root is not None:
        return model_tests_dir(root, model_folder(input_path))
    return written.resolve().parent


def tested_models(source: str) -> tuple[str, ...]:
    """The base model and one head per task family: PreTrainedModel classes whose forward takes input_ids."""
    tree = ast.parse(source)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    roots = {name for name, node in classes.items() if any(_base(b) == "PreTrainedModel" for b in node.bases)}
    derived: set[str] = set(roots)
    changed = True
    while changed:
        changed = False
        for name, node in classes.items():
            if name not in derived and any(_base(b) in derived for b in node.bases):
                derived.add(name)
                changed = True
    candidates = [
        name
        for name, node in classes.items()
        if name in derived and name not in roots and _forward_takes(node, "input_ids")
    ]
    chosen: list[str] = []
    base = next((n for n in candidates if n.endswith("Model") and not n.endswith(FAMILIES)), None)
    if base:
        chosen.append(base)
    for family in FAMILIES:
        match = next((n for n in candidates if n.endswith(family) and n not in chosen), None)
        if match and not any(c.endswith(family) for c in chosen):
            chosen.append(match)
    return tuple(chosen)


def _base(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _forward_takes(node: ast.ClassDef, name: str) -> bool:
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef) and statement.name == "forward":
            arguments = statement.args
            return name in {a.arg for a in arguments.args + arguments.kwonlyargs}
    return False


def checks_source() -> str:
    """The body of checks.py without its docstring and imports (the template imports what it needs first)."""
    path = Path(__file__).resolve().parent.parent / "verify" / "checks.py"
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    body = [statement for statement in module.body if not _is_import(statement)]
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr):
        body = body[1:]
    if body:
        body[0] = body[0].with_changes(leading_lines=[])
    return module.with_changes(body=body, header=[]).code.strip()


def _is_import(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def literal(value: Any) -> str:
    """A Python literal as ruff formats it (double-quoted strings)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return repr(value)


def render_parity_test(
    ported_source: str,
    input_path: Path,
    written: Path,
    tests_dir: Path | None,
    style: str,
    version: str,
    tester_source: str | None = None,
) -> EmittedTest | None:
    """The test for a port. `tester_source` is the checkout's own test module for the model, when there is one."""
    models = tested_models(ported_source)
    if not models:
        return None
    target = target_for(input_path, written)
    directory = tests_dir if tests_dir is not None else default_tests_dir(input_path, written)
    path = directory / f"test_sdpa_parity_{target.model}.py"
    text = None
    if tester_source is not None and target.path is None and checkout_root(input_path) is not None:
        text = render_checkout_test(ported_source, target, models, tester_source, style, version)
    if text is None:
        config = read_config(input_path, ast.parse(ported_source))
        if config is None:
            return None
        text = render_text(
            "emitted/standalone_test.py.jinja",
            version=version,
            target_label=f"`{target.module_name}`" if target.path is None else f"`{Path(target.path).name}`",
            style=style,
            model=target.model,
            checks_source=checks_source(),
            module_name=literal(target.module_name),
            path=None if target.path is None else literal(relative_path(Path(target.path), directory)),
            package=literal(target.package),
            config_class=literal(config.class_name),
            config={literal(k): literal(v) for k, v in config.tiny_overrides().items()},
            models=[literal(name) for name in models],
        )
    compile(text, path.name, "exec")
    return EmittedTest(path, text, models)


def relative_path(target: Path, directory: Path) -> str:
    """`target` as seen from `directory` (where the test is written), with `/` separators."""
    return Path(os.path.relpath(target.resolve(), directory.resolve())).as_posix()


def render_checkout_test(
    ported_source: str, target: TestTarget, models: tuple[str, ...], tester_source: str, style: str, version: str
) -> str | None:
    """The repository-style test, or None when the model's own tests pair none of the tested classes with a tester."""
    groups = [
        (group, [name for name in group.model_classes if name in models]) for group in tester_groups(tester_source)
    ]
    groups = [(group, names) for group, names in groups if names]
    if not groups:
        return None
    imported = sorted({name for _, names in groups for name in names}, key=member_key)
    testers = sorted({group.tester for group, _ in groups}, key=member_key)
    return render_text(
        "emitted/checkout_test.py.jinja",
        version=version,
        module_name=target.module_name,
        style=style,
        prefix=model_prefix(ported_source) or target.model.title(),
        test_module=f"test_modeling_{target.model}",
        testers=testers,
        imports=imported,
        groups=[group_lines(group, names) for group, names in groups],
    )


def group_lines(group: TesterGroup, names: list[str], indent: int = 12) -> list[str]:
    """`(Tester(self), [A, B]),` on one line when it fits, else spread as ruff would."""
    classes = "[" + ", ".join(names) + "]"
    one_line = f"({group.call}, {classes}),"
    if indent + len(one_line) <= LINE_LENGTH:
        return [one_line]
    if indent + 4 + len(classes) + 1 <= LINE_LENGTH:
        return ["(", f"    {group.call},", f"    {classes},", "),"]
    return ["(", f"    {group.call},", "    [", *[f"        {name}," for name in names], "    ],", "),"]


def model_prefix(source: str) -> str | None:
    """`Bert` from `class BertPreTrainedModel(PreTrainedModel)`."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("PreTrainedModel") and node.name != "PreTrainedModel":
            if any(_base(b) == "PreTrainedModel" for b in node.bases):
                return node.name[: -len("PreTrainedModel")] or None
    return None
