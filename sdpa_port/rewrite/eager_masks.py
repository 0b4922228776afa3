"""Give every mask the file builds eager's form under every implementation, for modules that read the mask
themselves (`analyse/built_masks.py` finds the builders, planning checks each one can be converted).

Before:

    attention_mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=mask)

After:

    attention_mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=mask)
    attention_mask = eager_attention_mask(attention_mask, inputs_embeds, getattr(self.config, "is_causal", True))

The function (`templates/interface_style/eager_attention_mask.py.jinja`) returns a float mask unchanged, so eager
runs as before; sdpa's booleans become the additive mask eager's builder makes, and its None for a causal mask
without padding becomes that causal mask.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.built_masks import CONFIG, INPUTS, builder_argument
from sdpa_port.analyse.mask_values import BIDIRECTIONAL_BUILDER, CAUSAL_BUILDER
from sdpa_port.plan.mask_readers import EagerMasks
from sdpa_port.render import render_module
from sdpa_port.rewrite.insert_classes import TWO_BLANK_LINES

# the keyword the causal builder reads from the config: False sends it to the bidirectional one (every 5.x release)
CONFIG_CAUSAL = "is_causal"


def _builder(name: str) -> m.BaseMatcherNode:
    return m.Call(func=m.Name(name) | m.Attribute(attr=m.Name(name)))


class _EagerMasks(cst.CSTTransformer):
    def __init__(self, function: str, owners: frozenset[str]) -> None:
        super().__init__()
        self.function = function
        self.owners = owners
        self.count = 0
        self.classes: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        return updated

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if not self.classes or self.classes[0] not in self.owners:
            return updated
        if len(updated.body) != 1 or not isinstance(assign := updated.body[0], cst.Assign):
            return updated
        causal = m.matches(assign.value, _builder(CAUSAL_BUILDER))
        if not causal and not m.matches(assign.value, _builder(BIDIRECTIONAL_BUILDER)):
            return updated
        if len(assign.targets) != 1 or not isinstance(target := assign.targets[0].target, cst.Name):
            return updated
        assert isinstance(assign.value, cst.Call)
        config, inputs = builder_argument(assign.value, *CONFIG), builder_argument(assign.value, *INPUTS)
        assert config is not None and inputs is not None, "planning checked every builder passes both"
        flag: cst.BaseExpression = cst.Name("False")
        if causal:
            flag = cst.Call(
                cst.Name("getattr"),
                [cst.Arg(config.deep_clone()), cst.Arg(cst.SimpleString(f'"{CONFIG_CAUSAL}"')), cst.Arg(cst.Name("True"))],
            )
        converted = cst.Call(cst.Name(self.function), [cst.Arg(target.deep_clone()), cst.Arg(inputs.deep_clone()), cst.Arg(flag)])
        line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target.deep_clone())], converted)])
        self.count += 1
        return cst.FlattenSentinel([updated, line])


def give_eager_form(module: cst.Module, masks: EagerMasks) -> cst.Module:
    """Each `name = create_causal_mask(...)` / `create_bidirectional_mask(...)` in the code of the classes
    `masks.owners` followed by `name = function(name, inputs_embeds, causal)`, and the function defined before the
    first class reading its mask."""
    transformer = _EagerMasks(masks.function, masks.owners)
    module = module.visit(transformer)
    assert transformer.count == len(masks.lines), "planning checked every builder call can be converted"
    function = render_module("interface_style/eager_attention_mask.py.jinja", name=masks.function).body[0]
    first = masks.readers[0][0]
    body: list[cst.BaseStatement] = []
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == first:
            body.append(function.with_changes(leading_lines=TWO_BLANK_LINES))
        body.append(statement)
    return module.with_changes(body=body)


__all__ = ["give_eager_form"]
