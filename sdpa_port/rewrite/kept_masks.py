"""Make the causal mask builders on given lines always build their mask: `create_causal_mask(...)` gains
`allow_is_causal_skip=False`.

Under sdpa the builder returns None for a causal mask without padding and leaves the causality to the module's
`is_causal`; a module that is causal for some calls and not for others (`plan/causal_sites.py`, `kept_masks`) keeps
`is_causal = False` and takes its causality from the mask instead, so the mask must be there.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.mask_values import CAUSAL_BUILDER
from sdpa_port.rewrite.layout import append_arguments, keyword_argument

SKIP = "allow_is_causal_skip"


class _KeepMasks(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self, lines: frozenset[int]) -> None:
        super().__init__()
        self.lines = lines
        self.count = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        line = self.get_metadata(cst.metadata.PositionProvider, original).start.line
        builder = m.Name(CAUSAL_BUILDER) | m.Attribute(attr=m.Name(CAUSAL_BUILDER))
        if line not in self.lines or not m.matches(updated.func, builder):
            return updated
        if any(a.star for a in updated.args):  # `**kwargs` may carry the setting: not rewritten, not counted
            return updated
        given = [a for a in updated.args if a.keyword is not None and a.keyword.value == SKIP]
        if given:
            if m.matches(given[0].value, m.Name("False")):
                self.count += 1
            return updated
        self.count += 1
        kept = keyword_argument(SKIP, cst.Name("False"))
        return updated.with_changes(args=append_arguments(list(updated.args), [kept]))


def keep_causal_masks(module: cst.Module, lines: frozenset[int]) -> tuple[cst.Module, int]:
    """Each `create_causal_mask(...)` call starting on one of `lines` builds its mask under every implementation;
    the count of calls that do (rewritten, or already passing `allow_is_causal_skip=False`)."""
    transformer = _KeepMasks(lines)
    new = cst.metadata.MetadataWrapper(module).visit(transformer)
    return new, transformer.count


__all__ = ["SKIP", "keep_causal_masks"]
