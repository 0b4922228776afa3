"""Config changes that switch optional terms of the attention scores on, for the checks to run under again.

Boolean flags off by default (`config.use_rel_pos`, `getattr(config, "relative_attention", False)`), list fields whose
members the attention tests (`"c2p" in self.pos_att_type`), and switches named after an optional input of the attention
(`use_prompt` for MVP's `attn_prompt`). Read from the ported attention classes' source and signature; no torch needed.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import replace
from typing import Any, TypeVar

TERM_FLAGS_CHECKED = 2
SETTINGS_CHECKED = 3

C = TypeVar("C")  # a verifier `Check`


def term_flags(classes: list[type], config: Any) -> list[str]:
    """Boolean config fields, off in `config`, that the port's attention classes read.

    Such as `config.use_rel_pos`: they switch optional terms of the scores on, which the checks must see as well;
    `getattr(config, "x", d)` reads count too.
    """
    read: set[str] = set()
    for tree in _class_trees(classes):
        read |= {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "config"
        }
        read |= {name for name, _ in _getattr_config_reads(tree)}
    return sorted(flag for flag in read if getattr(config, flag, None) is False)[:TERM_FLAGS_CHECKED]


def term_lists(classes: list[type], config: Any) -> dict[str, list[str]]:
    """Config list fields, empty or None in `config`, whose members switch terms of the scores on.

    The attention classes test `"c2p" in self.pos_att_type` with `self.pos_att_type` read from `config.pos_att_type`
    (DeBERTa's disentangled terms). Each field maps to the strings tested.
    """
    out: dict[str, list[str]] = {}
    for tree in _class_trees(classes):
        fields = _config_fields(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In)):
                continue
            left, right = node.left, node.comparators[0]
            if not (isinstance(left, ast.Constant) and isinstance(left.value, str)):
                continue
            if isinstance(right, ast.Attribute) and isinstance(right.value, ast.Name) and right.value.id in ("self", "config"):
                field_name = fields.get(right.attr) if right.value.id == "self" else right.attr
                if field_name is not None and not getattr(config, field_name, None):
                    out.setdefault(field_name, [])
                    if left.value not in out[field_name]:
                        out[field_name].append(left.value)
    return {name: sorted(members) for name, members in out.items()}


def setting_values(classes: list[type], config: Any) -> dict[str, list[str | None]]:
    """String config fields that the attention classes compare with literals, and the other literals compared.

    Such as `self.position_embeddings_type == "relative"`, the attribute read from `config.position_embeddings_type`:
    each field maps to the other literals compared, then None. An SDPA class that falls back to eager under one setting
    is reached under another.
    """
    out: dict[str, list[str]] = {}
    trees = _class_trees(classes)
    fields = _all_config_fields(trees)  # an SDPA class compares what its eager base's `__init__` stored
    for tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq))):
                continue
            sides = (node.left, node.comparators[0])
            literal = next((s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)), None)
            read = next((s for s in sides if isinstance(s, ast.Attribute) and isinstance(s.value, ast.Name)), None)
            if literal is None or read is None or read.value.id not in ("self", "config"):
                continue
            field_name = fields.get(read.attr) if read.value.id == "self" else read.attr
            current = getattr(config, field_name, None) if field_name is not None else None
            if field_name is None or not isinstance(current, str) or literal == current:
                continue
            values = out.setdefault(field_name, [])
            if literal not in values:
                values.append(literal)
    return {name: [*sorted(values), None] for name, values in out.items()}


def eager_sides(classes: list[type], changes: dict[str, Any]) -> list[str]:
    """The settings through which `changes` send a ported attention class to the eager branch it keeps.

    The settings are read as `self.reorder_and_upcast_attn` or `self.config.x`. The branch is kept as written beside
    the port's dispatch: an `if` testing the setting alone (or its `not`), one branch of which calls the implementation
    looked up in `ALL_ATTENTION_FUNCTIONS` and the branch the change takes does not; or, in a class-style SDPA class, a
    part of the test that sends it back to the eager forward
    (`if output_attentions or self.position_type == "relative": return super().forward(...)`) which the change makes
    true. SDPA is not expected to run there.
    """
    out: list[str] = _fallback_sides(classes, changes)
    for tree in _class_trees(classes):
        fields = _config_fields(tree)
        forwards = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "forward"]
        for forward in forwards:
            dispatchers = {
                target.id
                for node in ast.walk(forward)
                if isinstance(node, ast.Assign) and _reads_registry(node.value)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            for node in ast.walk(forward):
                if not isinstance(node, ast.If):
                    continue
                negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
                read = node.test.operand if isinstance(node.test, ast.UnaryOp) and negated else node.test
                field_name = _setting_field(read, fields)
                if field_name is None or field_name not in changes:
                    continue
                taken = node.body if bool(changes[field_name]) != negated else node.orelse
                other = node.orelse if taken is node.body else node.body
                if _dispatches(other, dispatchers) and not _dispatches(taken, dispatchers):
                    out.append(ast.unparse(read))
    return sorted(set(out))


def _fallback_sides(classes: list[type], changes: dict[str, Any]) -> list[str]:
    trees = _class_trees(classes)
    fields = _all_config_fields(trees)
    out: list[str] = []
    for tree in trees:
        for forward in (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "forward"):
            for statement in forward.body:
                if not isinstance(statement, ast.If) or not any(returns_super_forward(s) for s in statement.body):
                    continue
                test = statement.test
                parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
                out.extend(ast.unparse(part) for part in parts if _true_under(part, fields, changes))
    return out


def returns_super_forward(statement: ast.stmt) -> bool:
    """Whether the statement is `return super().forward(...)`."""
    if not isinstance(statement, ast.Return) or not isinstance(statement.value, ast.Call):
        return False
    func = statement.value.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "forward"
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "super"
    )


def _true_under(part: ast.expr, fields: dict[str, str], changes: dict[str, Any]) -> bool:
    """Whether `changes` make a part of a fallback test true.

    A setting or its `not`, or a setting compared with a string by `==` or `!=`.
    """
    if isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not):
        field_name = _setting_field(part.operand, fields)
        return field_name is not None and field_name in changes and not changes[field_name]
    if isinstance(part, ast.Compare) and len(part.ops) == 1 and isinstance(part.ops[0], (ast.Eq, ast.NotEq)):
        sides = (part.left, part.comparators[0])
        literal = next((s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)), None)
        read = next((s for s in sides if s is not literal), None)
        field_name = _setting_field(read, fields) if read is not None and literal is not None else None
        if literal is None or field_name is None or field_name not in changes:
            return False
        return (changes[field_name] == literal.value) == isinstance(part.ops[0], ast.Eq)
    field_name = _setting_field(part, fields)
    return field_name is not None and field_name in changes and bool(changes[field_name])


def _setting_field(read: ast.expr, fields: dict[str, str]) -> str | None:
    """The config field a test reads, or None.

    `self.x` where `__init__` stores the field in `x`, or `self.config.x`.
    """
    if not isinstance(read, ast.Attribute):
        return None
    owner = read.value
    if _is_self(owner):
        return fields.get(read.attr)
    if isinstance(owner, ast.Attribute) and owner.attr == "config" and _is_self(owner.value):
        return read.attr
    return None


def _reads_registry(node: ast.expr) -> bool:
    """Whether the expression reads `ALL_ATTENTION_FUNCTIONS`.

    As `ALL_ATTENTION_FUNCTIONS.get_interface(...)` or `ALL_ATTENTION_FUNCTIONS[...]`.
    """
    return any(isinstance(n, ast.Name) and n.id == "ALL_ATTENTION_FUNCTIONS" for n in ast.walk(node))


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def expected_on_eager(checks: list[C], sides: list[str]) -> list[C]:
    """The checks of a run under a change that sends the port to eager, judged as such.

    For a change `eager_sides` found, SDPA executing nowhere is what the port was made to do, and the "sdpa executed"
    checks say so instead of failing; "sdpa == eager" still judges that side.
    """
    if not sides:
        return checks
    why = f"not expected: the port keeps {', '.join(f'`{side}`' for side in sides)} on eager, as written"
    return [
        replace(c, passed=True, detail=f"{c.detail}: {why}")
        if c.name.endswith("sdpa executed") and not c.passed and not c.skipped
        else c
        for c in checks
    ]


def _dispatches(body: list[ast.stmt], dispatchers: set[str]) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in dispatchers
        for statement in body
        for node in ast.walk(statement)
    )


def _config_fields(tree: Any) -> dict[str, str]:
    """The config field behind each self attribute of a class.

    `self.x = config.y`, or a `getattr(config, "y", ...)` read.
    """
    fields: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"):
            continue
        sources = {
            inner.attr
            for inner in ast.walk(node.value)
            if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "config"
        } | {name for name, _ in _getattr_config_reads(node.value)}
        if len(sources) == 1:
            fields[target.attr] = next(iter(sources))
    return fields


def _all_config_fields(trees: list[Any]) -> dict[str, str]:
    """`_config_fields` over a class and its bases: the SDPA class's `self.x` is what its eager base stored."""
    return {attribute: field for tree in trees for attribute, field in _config_fields(tree).items()}


def _class_trees(classes: list[type]) -> list[Any]:
    """The parsed source of each attention class and of its bases defined in the same file."""
    trees = []
    for attention in classes:
        for klass in attention.__mro__:
            if klass.__module__ != attention.__module__:
                continue
            try:
                trees.append(ast.parse(textwrap.dedent(inspect.getsource(klass))))
            except (OSError, TypeError, SyntaxError):
                continue
    return trees


def _getattr_config_reads(tree: Any) -> list[tuple[str, Any]]:
    """The `getattr(config, "name", default)` reads of a tree, each with its call."""
    return [
        (node.args[1].value, node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "config"
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ]


# parameters of an attention forward every model hands over or that only select what is returned: no config switch
# is needed to reach them
USUAL_INPUTS = frozenset(
    {
        "hidden_states", "attention_mask", "past_key_values", "past_key_value", "layer_past", "key_value_states",
        "encoder_hidden_states", "encoder_attention_mask", "position_ids", "position_embeddings", "cache_position",
        "head_mask", "layer_head_mask", "output_attentions", "use_cache", "position_bias",
    }
)
# words of parameter names too common to tie a config switch to one input
COMMON_WORDS = frozenset(
    {
        "attn", "attention", "self", "cross", "layer", "states", "hidden", "mask", "input", "inputs", "output",
        "outputs", "position", "positions", "embeddings", "embedding", "ids", "bias", "key", "value", "values",
        "query", "weights", "scores", "length", "lengths", "use", "is", "return",
    }
)


def input_flags(classes: list[type], config: Any) -> list[str]:
    """Boolean config fields, off in `config`, named after an optional input of the attention classes.

    Such as `use_prompt` for MVP's `attn_prompt`: the model hands that input over only when the switch is on, so the
    checks must run with it on as well. At most `TERM_FLAGS_CHECKED`.
    """
    words: set[str] = set()
    for attention in classes:
        try:
            parameters = inspect.signature(attention.forward).parameters.values()
        except (TypeError, ValueError):
            continue
        for parameter in parameters:
            if parameter.default is None and parameter.name not in USUAL_INPUTS:
                words |= set(parameter.name.split("_")) - COMMON_WORDS
    fields = sorted(name for name, value in vars(config).items() if value is False and not name.startswith("_"))
    return [name for name in fields if words & set(name.split("_"))][:TERM_FLAGS_CHECKED]


def term_trials(classes: list[type], config: Any) -> list[tuple[str, dict[str, Any]]]:
    """The config changes under which the checks run again, each with its label.

    Every term flag on its own, every switch of an optional input on its own (`input_flags`), then, where list fields
    switch terms on, every flag on with those lists filled (DeBERTa's c2p and p2c need both).
    """
    flags = term_flags(classes, config)
    switches = [flag for flag in input_flags(classes, config) if flag not in flags]
    trials: list[tuple[str, dict[str, Any]]] = [(f"{flag}=True", {flag: True}) for flag in [*flags, *switches]]
    lists = term_lists(classes, config)
    if lists:
        changes: dict[str, Any] = {flag: True for flag in flags}
        changes.update({name: list(members) for name, members in lists.items()})
        trials.append((", ".join(f"{name}={value}" for name, value in changes.items()), changes))
    # every other value a string setting is compared with: each branch of `if self.position_embeddings_type ==
    # "relative": ... else: ...` is a computation of its own, ported or kept on eager by design (`eager_sides`)
    settings = [
        (f"{name}={value!r}", {name: value})
        for name, values in setting_values(classes, config).items()
        for value in values
        if value is not None
    ]
    return trials + settings[:SETTINGS_CHECKED]
