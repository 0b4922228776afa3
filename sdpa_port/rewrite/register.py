"""Register SDPA classes: add `"sdpa"` to an `XXX_ATTENTION_CLASSES` dict, or create the dict and select from it."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.rewrite.insert_classes import insert_after
from sdpa_port.rewrite.targeted import ScopedTransformer, transform_named


def add_dict_entry(module: cst.Module, dict_name: str, key: str, class_name: str) -> cst.Module:
    """`{"eager": X, ...}` gains `"<key>": <class_name>` as its last entry."""
    return transform_named(module, {dict_name}, _AddEntry(dict_name, key, class_name))


class _AddEntry(cst.CSTTransformer):
    def __init__(self, dict_name: str, key: str, class_name: str) -> None:
        self.dict_name = dict_name
        self.key = key
        self.class_name = class_name

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if not (
            len(updated.targets) == 1
            and m.matches(updated.targets[0].target, m.Name(self.dict_name))
            and isinstance(updated.value, cst.Dict)
        ):
            return updated
        literal = updated.value
        elements = list(literal.elements)
        entry = cst.DictElement(key=cst.SimpleString(f'"{self.key}"'), value=cst.Name(self.class_name))
        if elements:
            first, last = elements[0], elements[-1]
            if len(elements) > 1 and isinstance(first.comma, cst.Comma):
                separator = first.comma
            elif isinstance(literal.lbrace.whitespace_after, cst.ParenthesizedWhitespace):
                separator = cst.Comma(whitespace_after=literal.lbrace.whitespace_after)
            else:
                separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            entry = entry.with_changes(comma=last.comma)
            elements[-1] = last.with_changes(comma=separator)
        elements.append(entry)
        return updated.with_changes(value=literal.with_changes(elements=elements))


def dict_statement(dict_name: str, entries: list[tuple[str, str]]) -> cst.SimpleStatementLine:
    lines = "".join(f'    "{key}": {value},\n' for key, value in entries)
    module = cst.parse_module(f"{dict_name} = {{\n{lines}}}\n")
    statement = module.body[0]
    assert isinstance(statement, cst.SimpleStatementLine)
    return statement


def create_dict(module: cst.Module, after: str, dict_name: str, entries: list[tuple[str, str]]) -> cst.Module:
    return insert_after(module, after, [dict_statement(dict_name, entries)])


def select_from_dict(
    module: cst.Module,
    class_name: str,
    dict_name: str,
    skip_classes: frozenset[str],
    owners: set[str],
    configured: frozenset[str] = frozenset(),
) -> tuple[cst.Module, int]:
    """`Cls(config, ...)` in `owners` becomes `DICT[config._attn_implementation](config, ...)`; in a method of a
    class in `configured` (it holds the model's config as `self.config`) without a `config` parameter, the key is
    `self.config._attn_implementation`."""
    transformer = _Select(class_name, dict_name, skip_classes, configured)
    result = transform_named(module, owners - skip_classes, transformer)
    return result, transformer.replaced


def construction_sites(
    module: cst.Module,
    class_name: str,
    skip_classes: frozenset[str],
    owners: set[str],
    configured: frozenset[str] = frozenset(),
) -> list[tuple[str, bool]]:
    """(enclosing class, a config is in scope) for every `Cls(...)` call in `owners` outside skip_classes: a
    `config` parameter, or `self.config` in a method of a class in `configured`."""
    finder = _Constructions(class_name, skip_classes, configured)
    transform_named(module, owners - skip_classes, finder)
    return finder.sites


class _ConfigScope(ScopedTransformer):
    def __init__(self, configured: frozenset[str]) -> None:
        super().__init__()
        self.configured = configured

    def config_in_scope(self) -> str | None:
        """The expression holding the config here: `config`, `self.config`, or None."""
        if self.parameter_in_scope("config"):
            return "config"
        if self.owner in self.configured and self.functions and self.parameter_in_scope("self"):
            return "self.config"
        return None


class _Select(_ConfigScope):
    def __init__(self, class_name: str, dict_name: str, skip_classes: frozenset[str], configured: frozenset[str]) -> None:
        super().__init__(configured)
        self.class_name = class_name
        self.dict_name = dict_name
        self.skip_classes = skip_classes
        self.replaced = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not m.matches(updated.func, m.Name(self.class_name)) or self.owner in self.skip_classes:
            return updated
        config = self.config_in_scope()
        if config is None:
            return updated
        self.replaced += 1
        selector = cst.Subscript(
            value=cst.Name(self.dict_name),
            slice=[cst.SubscriptElement(cst.Index(cst.parse_expression(f"{config}._attn_implementation")))],
        )
        return updated.with_changes(func=selector)


class _Constructions(_ConfigScope):
    """Collects (enclosing class, a config in scope) for each construction; changes nothing."""

    def __init__(self, class_name: str, skip_classes: frozenset[str], configured: frozenset[str]) -> None:
        super().__init__(configured)
        self.class_name = class_name
        self.skip_classes = skip_classes
        self.sites: list[tuple[str, bool]] = []

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if m.matches(original.func, m.Name(self.class_name)) and self.owner not in self.skip_classes:
            self.sites.append((self.owner, self.config_in_scope() is not None))
        return updated
