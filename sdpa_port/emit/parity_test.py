"""Render `test_sdpa_parity_<model>.py` for a port: standalone pytest code that checks SDPA against eager.

The checks are the text of `sdpa_port/verify/checks.py`, copied in, so the emitted test, `--verify` and the project's
acceptance tests run one implementation. The tiny configuration is read statically from the config class.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from sdpa_port.discover.config_source import read_config
from sdpa_port.render import render_text

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

    model: str  # transformers model directory name (`bert`)
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


def checkout_root(path: Path) -> Path | None:
    """`<root>/src/transformers/models/<m>/modeling_<m>.py` -> `<root>` when `<root>/tests/models` exists."""
    parents = path.resolve().parents
    if len(parents) > 4 and parents[1].name == "models" and parents[2].name == "transformers" and parents[3].name == "src":
        root = parents[4]
        if (root / "tests" / "models").is_dir():
            return root
    return None


def target_for(input_path: Path, written: Path) -> TestTarget:
    model = model_name(input_path)
    package = f"transformers.models.{model}"
    resolved = input_path.resolve()
    in_package = resolved.parent.parent.name == "models" and resolved.parent.parent.parent.name == "transformers"
    if written.resolve() == resolved and in_package:
        return TestTarget(model, f"{package}.{resolved.stem}", None, package)
    return TestTarget(model, f"{package}.{written.stem}_sdpa_port", str(written.resolve()), package)


def default_tests_dir(input_path: Path, written: Path) -> Path:
    root = checkout_root(input_path)
    if root is not None:
        return root / "tests" / "models" / model_name(input_path)
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
    """The body of checks.py (its docstring dropped), ready to paste into a test module."""
    path = Path(__file__).resolve().parent.parent / "verify" / "checks.py"
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    body = list(module.body)
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr):
        body = body[1:]
    return module.with_changes(body=body, header=[]).code.strip()


def render_parity_test(
    ported_source: str, input_path: Path, written: Path, tests_dir: Path | None, style: str, version: str
) -> EmittedTest | None:
    models = tested_models(ported_source)
    config = read_config(input_path, ast.parse(ported_source))
    if not models or config is None:
        return None
    target = target_for(input_path, written)
    directory = tests_dir if tests_dir is not None else default_tests_dir(input_path, written)
    text = render_text(
        "emitted/test_sdpa_parity.py.jinja",
        version=version,
        target_label=f"`{target.module_name}`" if target.path is None else f"`{Path(target.path).name}`",
        style=style,
        model=target.model,
        checks_source=checks_source(),
        module_name=target.module_name,
        path=target.path,
        package=target.package,
        config_class=config.class_name,
        config=config.tiny_overrides(),
        models=list(models),
    )
    compile(text, "test_sdpa_parity.py", "exec")
    return EmittedTest(directory / f"test_sdpa_parity_{target.model}.py", text, models)
