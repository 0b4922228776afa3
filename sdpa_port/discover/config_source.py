"""Read a model's configuration class from source (no transformers import): its name and its size fields."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdpa_port.verify.configs import shrink_fields


@dataclass(frozen=True)
class ConfigSource:
    class_name: str
    fields: dict[str, Any]  # name -> default value (None when not a literal)
    aliases: dict[str, str]  # attribute_map: alias -> field

    def tiny_overrides(self) -> dict[str, Any]:
        values = shrink_fields(self.fields)
        return {name: value for name, value in values.items() if self.aliases.get(name) not in values}


def config_class_name(tree: ast.Module) -> str | None:
    """`config_class = XConfig` (4.x) or `config: XConfig` (5.x) on the PreTrainedModel subclass."""
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "config_class" for t in statement.targets
            ):
                if isinstance(statement.value, ast.Name):
                    return statement.value.id
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and statement.target.id == "config"
                and isinstance(statement.annotation, ast.Name)
            ):
                return statement.annotation.id
    return None


def config_module(tree: ast.Module, class_name: str) -> str | None:
    """The sibling module the modeling file imports the config class from (`configuration_bert`)."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(alias.name == class_name for alias in node.names):
            return (node.module or "").split(".")[-1] or None
    return None


def read_config(modeling_path: Path, tree: ast.Module) -> ConfigSource | None:
    class_name = config_class_name(tree)
    if class_name is None:
        return None
    module = config_module(tree, class_name)
    candidates = [modeling_path.with_name(f"{module}.py")] if module else []
    candidates.append(modeling_path)
    for path in candidates:
        if not path.exists():
            continue
        try:
            source_tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in source_tree.body:
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                return ConfigSource(class_name, _fields(node), _aliases(node))
    return ConfigSource(class_name, {}, {})


def _aliases(node: ast.ClassDef) -> dict[str, str]:
    for statement in node.body:
        if (
            isinstance(statement, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "attribute_map" for t in statement.targets)
            and isinstance(statement.value, ast.Dict)
        ):
            return {
                str(k.value): str(v.value)
                for k, v in zip(statement.value.keys, statement.value.values)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
    return {}


def _fields(node: ast.ClassDef) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            fields[statement.target.id] = _literal(statement.value)
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name) and target.id == "attribute_map" and isinstance(statement.value, ast.Dict):
                for key, value in zip(statement.value.keys, statement.value.values):
                    if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                        fields.setdefault(str(key.value), fields.get(str(value.value)))
        elif isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
            arguments = statement.args
            positional = arguments.args[len(arguments.args) - len(arguments.defaults):]
            for argument, default in zip(positional, arguments.defaults):
                fields[argument.arg] = _literal(default)
            for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
                fields[argument.arg] = _literal(default) if default is not None else None
    # names reached through attribute_map carry their target's default
    for statement in node.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Dict):
            for key, value in zip(statement.value.keys, statement.value.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    fields[str(key.value)] = fields.get(str(value.value))
    return fields


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
