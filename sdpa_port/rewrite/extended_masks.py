"""Give a mask extension its block in the format of the mask it extends (`analyse/mask_changes.py`, `zeros_block`).

`prompt_mask = torch.zeros(...)` then `attention_mask = torch.cat([prompt_mask, attention_mask], dim=-1)` keeps the
prompt keys for eager's additive mask; sdpa's boolean mask keeps where True, so before the concatenation the block
becomes `prompt_mask == 0` (all True) when the mask is boolean. Eager's path is unchanged.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m


def _extension(statement: cst.BaseStatement, mask: str, block: str) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    assign = statement.body[0]
    return (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and m.matches(assign.targets[0].target, m.Name(mask))
        and m.matches(
            assign.value,
            m.Call(args=[m.Arg(value=m.List() | m.Tuple()), m.ZeroOrMore()]),
        )
        and any(m.matches(e.value, m.Name(block)) for e in assign.value.args[0].value.elements)  # type: ignore[attr-defined]
    )


def _converted(mask: str, block: str) -> cst.If:
    test = cst.Comparison(
        cst.Attribute(cst.Name(mask), cst.Name("dtype")),
        [cst.ComparisonTarget(cst.Equal(), cst.Attribute(cst.Name("torch"), cst.Name("bool")))],
    )
    keep = cst.Assign(
        [cst.AssignTarget(cst.Name(block))],
        cst.Comparison(cst.Name(block), [cst.ComparisonTarget(cst.Equal(), cst.Integer("0"))]),
    )
    return cst.If(
        test,
        cst.IndentedBlock(
            [cst.SimpleStatementLine([keep])],
            header=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "),
                comment=cst.Comment("# a boolean mask keeps where True: the added keys are always kept"),
            ),
        ),
    )


class _Convert(cst.CSTTransformer):
    def __init__(self, mask: str, block: str) -> None:
        self.mask = mask
        self.block = block
        self.count = 0

    def _body(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for statement in body:
            if _extension(statement, self.mask, self.block):
                self.count += 1
                out.append(_converted(self.mask, self.block))
            out.append(statement)
        return out

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._body(updated.body))


def convert_block(function: cst.FunctionDef, mask: str, block: str) -> tuple[cst.FunctionDef, int]:
    """`function` with the block converted before each extension of `mask` by it; the count of extensions."""
    transformer = _Convert(mask, block)
    new = function.visit(transformer)
    assert isinstance(new, cst.FunctionDef)
    return new, transformer.count


__all__ = ["convert_block"]
