"""Register SDPA classes: add `"sdpa"` to an `XXX_ATTENTION_CLASSES` dict, or create the dict and select from it."""

from __future__ import annotations

from typing import NamedTuple

import libcst as cst
import libcst.matchers as m

from sdpa_port.rewrite.insert_classes import insert_after
from sdpa_port.rewrite.layout import append_arguments, keyword_argument, with_keyword_parameter
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
    threaded: frozenset[str] = frozenset(),
) -> tuple[cst.Module, int]:
    """`Cls(config, ...)` in `owners` becomes `DICT[config._attn_implementation](config, ...)`; in a method of a
    class in `configured` (it holds the model's config as `self.config`) without a `config` parameter, the key is
    `self.config._attn_implementation`; in the `__init__` of a class in `threaded`, its `attn_implementation`."""
    transformer = _Select(class_name, dict_name, skip_classes, configured, threaded)
    result = transform_named(module, owners - skip_classes, transformer)
    return result, transformer.replaced


def thread_implementation(
    module: cst.Module, threaded: frozenset[str], owners: set[str], configured: frozenset[str]
) -> cst.Module:
    """Each class in `threaded` (built where no config is in scope) takes `attn_implementation="eager"` in its
    `__init__`, and every construction of one in `owners` passes on the implementation in scope there."""
    module = transform_named(module, threaded, _AddImplementationParameter(threaded))
    return transform_named(module, owners, _PassImplementation(threaded, configured))


def construction_sites(
    module: cst.Module,
    class_name: str,
    skip_classes: frozenset[str],
    owners: set[str],
    configured: frozenset[str] = frozenset(),
) -> list[Construction]:
    """(enclosing class, a config is in scope) for every `Cls(...)` call in `owners` outside skip_classes: a
    `config` parameter, or `self.config` in a method of a class in `configured`."""
    finder = _Constructions(class_name, skip_classes, configured)
    transform_named(module, owners - skip_classes, finder)
    return finder.sites


IMPLEMENTATION = "attn_implementation"  # the parameter threaded classes receive the implementation's name in


def in_init_of(transformer: ScopedTransformer, class_name: str) -> bool:
    """Directly in `class_name.__init__` (not in a function nested there)."""
    return (
        transformer.classes == [class_name]
        and len(transformer.functions) == 1
        and transformer.functions[0].name.value == "__init__"
    )


class _ConfigScope(ScopedTransformer):
    def __init__(self, configured: frozenset[str], threaded: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.configured = configured
        self.threaded = threaded

    def config_in_scope(self) -> str | None:
        """The expression holding the config here: `config`, `self.config`, or None."""
        if self.parameter_in_scope("config"):
            return "config"
        if self.owner in self.configured and self.functions and self.parameter_in_scope("self"):
            return "self.config"
        return None

    def implementation_in_scope(self) -> cst.BaseExpression | None:
        """The expression naming the selected implementation here: the config's, or the parameter a threaded class
        receives it in."""
        config = self.config_in_scope()
        if config is not None:
            return cst.Attribute(cst.parse_expression(config), cst.Name("_attn_implementation"))
        if self.owner in self.threaded and in_init_of(self, self.owner):
            return cst.Name(IMPLEMENTATION)
        return None


class _Select(_ConfigScope):
    def __init__(
        self,
        class_name: str,
        dict_name: str,
        skip_classes: frozenset[str],
        configured: frozenset[str],
        threaded: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(configured, threaded)
        self.class_name = class_name
        self.dict_name = dict_name
        self.skip_classes = skip_classes
        self.replaced = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not m.matches(updated.func, m.Name(self.class_name)) or self.owner in self.skip_classes:
            return updated
        implementation = self.implementation_in_scope()
        if implementation is None:
            return updated
        self.replaced += 1
        selector = cst.Subscript(value=cst.Name(self.dict_name), slice=[cst.SubscriptElement(cst.Index(implementation))])
        return updated.with_changes(func=selector)


class _Constructions(_ConfigScope):
    """Collects (enclosing class, a config in scope) for each construction; changes nothing."""

    def __init__(self, class_name: str, skip_classes: frozenset[str], configured: frozenset[str]) -> None:
        super().__init__(configured)
        self.class_name = class_name
        self.skip_classes = skip_classes
        self.sites: list[Construction] = []

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if m.matches(original.func, m.Name(self.class_name)) and self.owner not in self.skip_classes:
            self.sites.append(Construction(self.owner, self.config_in_scope() is not None, in_init_of(self, self.owner)))
        return updated


class Construction(NamedTuple):
    """A `Cls(...)` call: the enclosing class, whether a config is in scope, whether it sits in that class's
    `__init__` itself (where a parameter could bring the implementation's name)."""

    owner: str
    has_config: bool
    in_init: bool


class _AddImplementationParameter(ScopedTransformer):
    def __init__(self, threaded: frozenset[str]) -> None:
        super().__init__()
        self.threaded = threaded

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        threaded_init = self.owner in self.threaded and in_init_of(self, self.owner)
        updated = super().leave_FunctionDef(original, updated)
        if not threaded_init:
            return updated
        return with_keyword_parameter(updated, IMPLEMENTATION, cst.SimpleString('"eager"'))


class _PassImplementation(_ConfigScope):
    def __init__(self, threaded: frozenset[str], configured: frozenset[str]) -> None:
        super().__init__(configured, threaded)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not isinstance(updated.func, cst.Name) or updated.func.value not in self.threaded:
            return updated
        implementation = self.implementation_in_scope()
        if implementation is None:
            return updated
        argument = keyword_argument(IMPLEMENTATION, implementation)
        return updated.with_changes(args=append_arguments(list(updated.args), [argument]))
