"""Hand a builder's mask over unconverted: drop its `.to(torch.bool)`, and add it where eager filled with it.

`plan/bool_masks.py` decides where this is exact (MPT's form). Before and after, in the eager function:

    scores = scores.masked_fill(attention_mask, torch.finfo(scores.dtype).min)
    scores = scores + attention_mask

and in the model: `create_causal_mask(...).to(torch.bool)` becomes `create_causal_mask(...)`.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.patterns import FINFO_MIN


class AddInsteadOfFill(cst.CSTTransformer):
    """`x.masked_fill(<mask>, torch.finfo(...).min)` -> `x + <mask>` in the eager function."""

    def __init__(self, mask_param: str) -> None:
        self.mask_param = mask_param
        self.count = 0

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if (
            m.matches(updated_node.func, m.Attribute(attr=m.Name("masked_fill")))
            and len(updated_node.args) == 2
            and m.matches(updated_node.args[0].value, m.Name(self.mask_param))
            and m.matches(updated_node.args[1].value, FINFO_MIN)
        ):
            assert isinstance(updated_node.func, cst.Attribute)
            self.count += 1
            return cst.BinaryOperation(updated_node.func.value, cst.Add(), cst.Name(self.mask_param))
        return updated_node


class Unconvert(m.MatcherDecoratableTransformer):
    """Drops `.to(torch.bool)` / `.bool()` from the builder calls starting on `lines`."""

    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, lines: frozenset[int]) -> None:
        super().__init__()
        self.lines = lines
        self.count = 0

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        line = self.get_metadata(cst.metadata.PositionProvider, original_node).start.line
        if line not in self.lines or not isinstance(updated_node.func, cst.Attribute):
            return updated_node
        func = updated_node.func
        bool_call = m.matches(func.attr, m.Name("bool")) and not updated_node.args
        to_bool = (
            m.matches(func.attr, m.Name("to"))
            and len(updated_node.args) == 1
            and m.matches(updated_node.args[0].value, m.Attribute(value=m.Name("torch"), attr=m.Name("bool")))
        )
        if (bool_call or to_bool) and isinstance(func.value, cst.Call):
            self.count += 1
            return func.value
        return updated_node


def unconvert(module: cst.Module, lines: frozenset[int]) -> tuple[cst.Module, int]:
    transformer = Unconvert(lines)
    new = cst.metadata.MetadataWrapper(module).visit(transformer)
    return new, transformer.count


__all__ = ["AddInsteadOfFill", "unconvert"]
