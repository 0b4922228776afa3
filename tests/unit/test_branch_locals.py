"""Names an `if` binds that nothing reads after it (`analyse/branch_locals.py`): a branch's temporaries, not the
scores replaced under a condition (S110).

Swin's window mask, added under `if mask is not None` through temporaries (modelscope's ViDT), is a float mask term:
the port folds it into SDPA's mask. A temporary read after the `if`, or an `if` inside a loop, is merged as before."""

from __future__ import annotations

import textwrap

import pytest

from sdpa_port import Status, port_source
from sdpa_port.result import Style

WINDOW = '''
import torch
from torch import nn


class WindowAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.scale = 0.125
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
{masking}
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(b, n, c)


class Block(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.attn = WindowAttention(dim, num_heads)

    def forward(self, x, mask=None):
        return self.attn(x, mask)
'''

TEMPORARIES = """
if mask is not None:
    nw = mask.shape[0]
    tmp0 = attn.view(b // nw, nw, self.num_heads, n, n)
    tmp1 = mask.unsqueeze(1).unsqueeze(0)
    attn = tmp0 + tmp1
    attn = attn.view(-1, self.num_heads, n, n)
"""


def port(masking: str) -> tuple[Status, str]:
    source = WINDOW.format(masking=textwrap.indent(textwrap.dedent(masking).strip(), " " * 8))
    result = port_source(source, filename="modeling_window.py", style=Style.INLINE)
    codes = ",".join(r.code.value[0] for r in result.refusals)
    return result.status, (result.source if result.status is Status.PORTED else codes)


def test_window_mask_through_temporaries_is_a_mask_term() -> None:
    status, out = port(TEMPORARIES)
    assert status is Status.PORTED, out
    assert "scaled_dot_product_attention" in out and "attn_mask=sdpa_mask" in out
    assert "tmp1" in out and ".softmax(" not in out


@pytest.mark.parametrize(
    "masking",
    [
        # the temporary read after the `if`: its value there is the branch's view of the scores, or nothing
        TEMPORARIES + "if mask is not None:\n    attn = tmp0.view(-1, self.num_heads, n, n) + 0.0",
        # inside a loop, a later pass reads what an earlier one bound
        "for _ in range(1):\n" + textwrap.indent(TEMPORARIES, "    "),
    ],
)
def test_a_temporary_read_again_stays_a_replacement(masking: str) -> None:
    status, out = port(masking)
    assert status is Status.REFUSED and "S110" in out.split(","), out
