"""The inline style: when `auto` picks it, what it writes in place, and what refuses it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from sdpa_port import Status, port_source
from sdpa_port.result import Style

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

ATTENTION = '''
import math

import torch
from torch import nn


class TinyAttention(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, mask=None{extra_params}):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = {scores}
        if mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(b, n, c)
        return {returned}


class TinyBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.attn = TinyAttention(dim)
'''


def attention(scores: str = "q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", weights: bool = False) -> str:
    return ATTENTION.format(
        scores=scores,
        extra_params=", output_attentions=False" if weights else "",
        returned="(out, probs) if output_attentions else (out,)" if weights else "out",
    )


def test_auto_ports_in_place_only_what_the_class_style_cannot_wire() -> None:
    result = port_source(attention(), filename="modeling_tiny.py")
    assert result.status is Status.PORTED and result.style is Style.INLINE, result.reasons
    assert "whatever `config._attn_implementation` says" in result.warnings[0]
    assert "[W401]" in result.warnings[0]
    # the class style refuses it, naming the wiring
    refused = port_source(attention(), filename="modeling_tiny.py", style="class")
    assert refused.status is Status.REFUSED and [r.code.code for r in refused.refusals] == ["W401"]
    # a file the class style wires keeps the class style
    wired = (FIXTURES / "class_style" / "modeling_tiny_encoder.py").read_text(encoding="utf-8")
    assert port_source(wired, filename="modeling_tiny_encoder.py").style is Style.CLASS


def test_a_refusal_of_the_computation_is_not_turned_into_an_inline_port() -> None:
    result = port_source(attention(scores="torch.tanh(q @ k.transpose(-2, -1))"), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result
    assert [r.code.code for r in result.refusals] == ["S107"]


def test_no_eager_forward_is_kept_where_no_call_can_ask_for_weights() -> None:
    result = port_source(attention(), filename="modeling_tiny.py")
    assert "_eager_forward" not in result.source
    assert result.source.count("def forward(") == 1
    assert "scaled_dot_product_attention(" in result.source and ".softmax(" not in result.source


def test_the_eager_forward_is_kept_for_the_weights_under_a_free_name() -> None:
    source = attention(weights=True).replace(
        "        self.heads = heads\n", "        self.heads = heads\n        self._eager_forward = None\n"
    )
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "def __eager_forward(self, x, mask=None, output_attentions=False):" in result.source
    assert "return self.__eager_forward(x, mask=mask, output_attentions=output_attentions)" in result.source


def test_inline_can_be_asked_for_on_a_file_the_class_style_wires() -> None:
    name = "modeling_tiny_encoder.py"
    source = (FIXTURES / "class_style" / name).read_text(encoding="utf-8")
    result = port_source(source, filename=name, style="inline")
    assert result.status is Status.PORTED and result.style is Style.INLINE, result.reasons
    assert "SdpaSelfAttention" not in result.source and "_supports_sdpa" not in result.source
    assert "def _eager_forward(self, hidden_states, attention_mask=None, output_attentions=False):" in result.source


SUBCLASS = '''

class TinyCrossAttention(TinyAttention):
{body}
'''


def test_a_subclass_adding_only_an_init_inherits_the_port() -> None:
    body = textwrap.indent("def __init__(self, dim):\n    super().__init__(dim, heads=2)\n", "    ")
    result = port_source(attention() + SUBCLASS.format(body=body), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons


KERNEL_FORWARD = """\
def forward(self, x, mask=None):
    if not USE_KERNEL:
        return super().forward(x, mask=mask)
    return kernel(x)
"""


def test_a_subclass_falling_back_to_the_base_forward_inherits_the_port() -> None:
    """DINOv2's `MemEffAttention` form: its own forward runs a kernel, or the base class's forward without one."""
    kernel = "\nUSE_KERNEL = bool(int('0'))\n\n\ndef kernel(x):\n    return x\n"
    result = port_source(
        attention() + kernel + SUBCLASS.format(body=textwrap.indent(KERNEL_FORWARD, "    ")),
        filename="modeling_tiny.py",
        style="inline",
    )
    assert result.status is Status.PORTED, result.reasons
    assert "return super().forward(x, mask=mask)" in result.source
    # the same subclass setting an attribute of the base class again may need another SDPA forward
    body = KERNEL_FORWARD + "\ndef __init__(self, dim):\n    super().__init__(dim)\n    self.heads = 2\n"
    result = port_source(
        attention() + kernel + SUBCLASS.format(body=textwrap.indent(body, "    ")),
        filename="modeling_tiny.py",
        style="inline",
    )
    assert [r.code.code for r in result.refusals] == ["W410"], result
    assert "calls the base class's forward from its own and sets heads again" in result.reasons[0]


def test_a_subclass_changing_what_the_forward_reads_refuses_w410() -> None:
    body = textwrap.indent("def relative(self, x):\n    return x\n", "    ")
    result = port_source(attention() + SUBCLASS.format(body=body), filename="modeling_tiny.py", style="inline")
    assert result.status is Status.REFUSED, result
    assert [r.code.code for r in result.refusals] == ["W410"]
    assert "TinyCrossAttention defines relative" in result.reasons[0]
    # a scale the base class proves a number, set per head by the subclass
    source = attention(scores="q @ k.transpose(-2, -1) * self.scale").replace(
        "        self.heads = heads\n", "        self.heads = heads\n        self.scale = 0.125\n"
    )
    assert port_source(source, filename="modeling_tiny.py", style="inline").status is Status.PORTED
    body = textwrap.indent("def __init__(self, dim):\n    super().__init__(dim)\n    self.scale = torch.ones(4, 1, 1)\n", "    ")
    result = port_source(source + SUBCLASS.format(body=body), filename="modeling_tiny.py", style="inline")
    assert [r.code.code for r in result.refusals] == ["W410"], result
    assert "TinyCrossAttention" in result.reasons[0]


def test_porting_a_port_changes_nothing() -> None:
    once = port_source(attention(weights=True), filename="modeling_tiny.py")
    twice = port_source(once.source, filename="modeling_tiny.py")
    assert twice.status is Status.UNCHANGED and twice.detail == "already supports SDPA"


def test_remote_names_of_the_weights_request_keep_the_eager_forward() -> None:
    source = attention(weights=True).replace("output_attentions", "return_attention")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "if return_attention:" in result.source and "def _eager_forward(" in result.source


def test_weights_returned_with_no_request_refuse_the_inline_port() -> None:
    """Callers in other files may read the weights; with no parameter asking for them, nothing could fall back."""
    source = attention().replace("        return out\n", "        return out, probs\n")
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["S111"], result


def test_torch_is_imported_where_the_file_binds_only_its_submodules() -> None:
    source = attention().replace("import torch\nfrom torch import nn\n", "import torch.nn as nn\n")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "\nimport torch\nimport torch.nn as nn\n" in result.source
    compile(result.source, "port.py", "exec")
