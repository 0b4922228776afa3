"""Composite models pass their attention implementation on to the sub-models they build (class style, 4.x).

In transformers 4.36-4.47 a PreTrainedModel picks its attention implementation when it is built. A sub-model built
from a sub-config (`AlignTextModel(text_config)`) picks SDPA on its own once its class supports it, whatever its
parent was asked for, so a model built with `attn_implementation="eager"` would run SDPA inside. The pass builds
such sub-models as transformers' own composite models do: `AlignTextModel._from_config(text_config,
attn_implementation=config._attn_implementation)`.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.rewrite.edit import IndentTracking, lay_out_call
from sdpa_port.rewrite.targeted import ScopedTransformer, transform_named

SELECTED = cst.Attribute(value=cst.Name("config"), attr=cst.Name("_attn_implementation"))


def pass_implementation(
    module: cst.Module, composites: frozenset[str], sub_models: frozenset[str]
) -> tuple[cst.Module, list[str]]:
    """In the `__init__` of each class in `composites`, build each of `sub_models` from a sub-config with the
    parent's implementation. Returns the module and one note per rewritten construction."""
    transformer = _PassImplementation(sub_models)
    return transform_named(module, composites, transformer), transformer.notes


class _PassImplementation(IndentTracking, ScopedTransformer):
    def __init__(self, sub_models: frozenset[str]) -> None:
        super().__init__()
        self.sub_models = sub_models
        self.notes: list[str] = []
        self.built: list[cst.Call] = []

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        statement: cst.SimpleStatementLine = updated
        for call in self.built:
            laid = lay_out_call(statement, call, indent=4 * self.depth)
            assert isinstance(laid, cst.SimpleStatementLine)
            statement = laid
        self.built.clear()
        return statement

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        func = updated.func
        if not (isinstance(func, cst.Name) and func.value in self.sub_models):
            return updated
        if not self.functions or self.functions[-1].name.value != "__init__" or not self.parameter_in_scope("config"):
            return updated
        positional = [a for a in updated.args if a.keyword is None]
        if len(positional) != 1 or any(a.star for a in updated.args) or positional[0] is not updated.args[0]:
            return updated
        if m.matches(positional[0].value, m.Name("config") | m.Attribute(value=m.Name("self"), attr=m.Name("config"))):
            return updated  # built from the parent's own config: the same implementation already
        self.notes.append(f"{self.owner} builds {func.value} with its own attention implementation")
        args = list(updated.args)
        last = args[-1]
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        args[-1] = last.with_changes(comma=separator)
        selected = cst.Arg(
            SELECTED,
            keyword=cst.Name("attn_implementation"),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
            ),
        )
        built = updated.with_changes(
            func=cst.Attribute(value=func, attr=cst.Name("_from_config")), args=[*args, selected]
        )
        self.built.append(built)
        return built
