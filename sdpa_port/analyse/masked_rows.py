"""When folding masking fills into SDPA's additive mask is exact, and when a fully masked row would differ.

Eager code masks scores by replacing them (`masked_fill(mask, F)`, `torch.where(keep, scores, F)`); SDPA adds a
float mask. Replacing and adding differ only at the masked entries: F against s + F. After the softmax both give
those entries weight exactly 0 when the row keeps some entry at an ordinary value, since exp(F - max) underflows
for F <= -1e4. They differ in a row where every entry is masked: the replaced row is uniform, the added one is
the softmax of the scores. Two ways make the fold exact anyway:

- F absorbs the scores (-inf, finfo(dtype).min, <= -1e30): s + F == F, so adding is replacing;
- no real query row can lose every key: every masking condition in the chain is a padding mask the model built
  (each real token keeps at least itself and the other real tokens) or a bottom-right aligned causal slice (each
  token keeps itself).

A top-left causal slice (`bias[:, :, :q, :k]`) keeps each row's own position, and so the token itself, only when
the keys are the call's own positions (`aligned`: no cache, no other source); with a key/value cache a real token's
row may lose every key to left padding. A condition the tool cannot place may do anything. With a fill that does
not absorb, those refuse.
"""

from __future__ import annotations

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cstutil import code
from sdpa_port.refusals import Code, Reason


def row_safe(fill: t.Fill, aligned: bool) -> bool:
    """Every real query row keeps a key this fill leaves alone (`aligned`: the keys are the queries' positions)."""
    return fill.row_safe or (aligned and fill.top_left)


def masked_rows_reason(candidate: t.Candidate, aligned: bool) -> tuple[Reason, int] | None:
    """The reason (and line) folding this chain's fills into an additive mask is not exact, or None when it is."""
    fills = [(op, line) for op, _, line in candidate.ops if isinstance(op, t.Fill)]
    loose = [(op, line) for op, line in fills if not op.absorbing]
    if not loose:
        return None
    unsafe = [(op, line) for op, line in fills if not row_safe(op, aligned)]
    if not unsafe:
        return None
    fill, line = loose[0]
    condition = unsafe[0][0].condition
    detail = (
        f"masked scores are replaced by `{code(fill.fill)}`, which does not absorb the scores, while "
        f"`{code(condition)}` may mask every key of a real token's row; SDPA's additive mask gives such a row "
        "other weights than eager's replaced scores"
    )
    return Reason(Code.MASKED_ROWS, detail), line
