"""The inline style: when `auto` picks it, what it writes in place, and what refuses it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sdpa_port import Status, port_source
from sdpa_port.result import Style
from helpers import flat

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


def test_each_class_ported_in_place_says_why_the_class_style_could_not_wire_it() -> None:
    """A class the class style gave a reason for gets that reason alone; one it gave none for (built nowhere here)
    gets the file's."""
    other = "class OtherAttention" + attention().split("class TinyAttention", 1)[1].split("class TinyBlock", 1)[0]
    result = port_source(attention() + "\n\n" + other, filename="modeling_tiny.py")
    assert result.status is Status.PORTED and result.style is Style.INLINE, result.reasons
    by_class = {warning.split(" computes", 1)[0]: warning for warning in result.warnings}
    assert "(the class style cannot wire it: built in TinyBlock" in by_class["TinyAttention"], by_class
    assert "OtherAttention" not in by_class["TinyAttention"], by_class
    assert "(the class style cannot wire this file: TinyAttention: built in" in by_class["OtherAttention"], by_class


def test_a_query_computed_at_the_product_is_named_once_where_the_mask_reads_its_dtype() -> None:
    """`(q * self.heads) @ k^T` with a mask: `q * self.heads` is computed once, not again for the mask's dtype."""
    result = port_source(attention(scores="(q * self.heads) @ k.transpose(-2, -1)"), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert result.source.count("q * self.heads") == 1, result.source  # the one binding: computed once
    assert "sdpa_query = q * self.heads" in result.source and "mask.to(sdpa_query.dtype)" in result.source


def test_a_refusal_of_the_computation_is_not_turned_into_an_inline_port() -> None:
    result = port_source(attention(scores="torch.tanh(q @ k.transpose(-2, -1))"), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result
    assert [r.code.code for r in result.refusals] == ["S107"]


def test_what_refuses_the_inline_style_comes_before_the_wiring() -> None:
    """Unwired for the class style and refused in place too: the inline refusal is the one that tells why."""
    result = port_source(attention().replace("return out\n", "return out, probs\n"), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result
    assert [r.code.code for r in result.refusals] == ["S111", "W401"], result.reasons
    assert "the probabilities are returned" in result.reasons[0]


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
    assert "so their callers are elsewhere" in result.reasons[0]


# ------------------------------------------------------------------ weights returned that every caller discards

# `TinyAttention` returns `(out, probs)` with no parameter asking for them; `TinyBlock` builds and calls it
DISCARDING = """

class TinyBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        {build}

    def forward(self, x, mask=None):
        {body}
"""


def discarding(
    body: str, build: str = "self.attn = TinyAttention(dim)", returned: str = "out, probs", extra: str = ""
) -> str:
    """`TinyAttention` returning `returned`, built by `build` in `TinyBlock`, whose forward is `body`; then `extra`."""
    source = attention().replace("        return out\n", f"        return {returned}\n")
    source = source[: source.index("\n\nclass TinyBlock")] + "\n"
    indent = " " * 8
    block = DISCARDING.format(build=build, body=textwrap.indent(textwrap.dedent(body).strip(), indent).strip())
    return source + block + extra


DISCARDED = {
    "unpacked into `_`": "out, _ = self.attn(x, mask)\nreturn out",
    "unpacked into a name never read": "out, weights = self.attn(x, mask=mask)\nreturn out",
    "the output indexed": "return self.attn(x, mask)[0]",
    "the output indexed from the end": "return self.attn(x)[-2]",
    "the result dropped": "self.attn(x)\nreturn x",
    "through checkpoint": "return checkpoint(self.attn, x, mask, use_reentrant=False)[0]",
}


@pytest.mark.parametrize("body", DISCARDED.values(), ids=DISCARDED.keys())
def test_weights_every_caller_discards_are_returned_as_none(body: str) -> None:
    source = discarding(body).replace("import torch\n", "import torch\nfrom torch.utils.checkpoint import checkpoint\n")
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert result.status is Status.PORTED, result.reasons
    assert "probs = None\n        return out, probs" in result.source and ".softmax(" not in result.source
    assert "it returns None for the probabilities: every caller in this file discards them" in result.warnings[-1]
    assert port_source(result.source, filename="modeling_tiny.py").detail == "already supports SDPA"


def test_weights_discarded_by_each_module_of_a_list_are_returned_as_none() -> None:
    build = "self.layers = nn.ModuleList([TinyAttention(dim) for _ in range(2)])"
    body = "for layer in self.layers:\n    x, _ = layer(x, mask)\nreturn x"
    result = port_source(discarding(body, build), filename="modeling_tiny.py", style="inline")
    assert result.status is Status.PORTED, result.reasons
    # an alias of the weights returned is theirs too: the caller discards its place
    result = port_source(discarding(body, build, "out, weights").replace(
        "        return out, weights", "        weights = probs\n        return out, weights"
    ), filename="modeling_tiny.py", style="inline")
    assert result.status is Status.PORTED, result.reasons


HOOK = """
        self.attn.register_forward_hook(lambda module, args, output: None)
"""
# each refused S111: a caller reads or keeps the weights, or calls the file does not show may
READ = {
    "a caller returns them": ("out, weights = self.attn(x)\nreturn out, weights", "which its method reads"),
    "a caller appends them": ("out, w = self.attn(x)\nself.kept = [w]\nreturn out", "which its method reads"),
    "a caller stores them": ("out, self.weights = self.attn(x)\nreturn out", "stores the probabilities in `self."),
    "a caller indexes them": ("return self.attn(x)[1]", "takes an element of the result that may be the"),
    "a caller keeps the tuple": ("outputs = self.attn(x)\nreturn outputs[0]", "keeps the result whole"),
    "a caller unpacks a starred tuple": ("out, *rest = self.attn(x)\nreturn out", "keeps the result whole"),
    "the modules handed on": ("return nn.Sequential(self.attn)(x)[0]", "hands the modules"),
    "their forward taken": ("run = self.attn.forward\nreturn run(x)[0]", "without calling it"),
    "a forward hook": (HOOK.strip() + "\nreturn self.attn(x)[0]", "registers a forward hook"),
    "named by a string": ("return getattr(self, 'attn')(x)[0]", "in a string"),
    "their container called": ("return self.attn(x)", "calls the container of the modules"),
}


@pytest.mark.parametrize("body,why", READ.values(), ids=READ.keys())
def test_weights_a_caller_may_read_refuse_s111(body: str, why: str) -> None:
    built = "nn.ModuleList([TinyAttention(dim)])" if "container" in why else "TinyAttention(dim)"
    build = f"self.attn = {built}"
    result = port_source(discarding(body, build), filename="modeling_tiny.py", style="inline")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["S111"], result
    assert why in result.reasons[0], result.reasons


BUILT = {
    "listed in `__all__`": ('\n__all__ = ["TinyAttention"]\n', "in a string"),
    "named in a dict": ('\nCLASSES = {"plain": TinyAttention}\n', "names it other than to build it"),
    "built in a function": ("\n\ndef build(dim):\n    return TinyAttention(dim)\n", "other than as a module of"),
    "its modules called from a function": ("\n\ndef run(block, x):\n    return block.attn(x)\n", "are not followed"),
    "a subclass": ("\n\nclass TinyOther(TinyAttention):\n    pass\n", "a subclass in the file inherits it"),
}


@pytest.mark.parametrize("extra,why", BUILT.values(), ids=BUILT.keys())
def test_weights_callers_the_file_does_not_show_refuse_s111(extra: str, why: str) -> None:
    result = port_source(discarding("return self.attn(x)[0]", extra=extra), filename="modeling_tiny.py", style="inline")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["S111"], result
    assert why in result.reasons[0], result.reasons


STRAY = {
    "stored on the module": "self.maps = probs",
    "handed to a call": "self.maps.append(probs)",
    "tested": "if probs.sum() > 0:\n            pass",
    "read by a function defined here": "def kept():\n            return probs",
}


@pytest.mark.parametrize("line", STRAY.values(), ids=STRAY.keys())
def test_weights_read_in_forward_after_the_product_refuse_s111(line: str) -> None:
    returned = "        return out, probs\n"
    source = discarding("return self.attn(x)[0]").replace(returned, f"        {line}\n{returned}")
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["S111"], result
    assert "reads the probabilities otherwise than to return them" in result.reasons[0]


def test_weights_in_places_the_returns_do_not_show_refuse_s111() -> None:
    source = discarding("return self.attn(x)[0]", returned="[out, probs]")
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert [r.code.code for r in result.refusals] == ["S111"], result
    assert "gives no tuple of fixed length" in result.reasons[0]
    # the output's place reads a name bound from the weights: what the caller keeps may be them
    source = discarding("out, _ = self.attn(x)\nreturn out", returned="pair[0], pair[1]")
    source = source.replace("        return pair[0]", "        pair = (out, probs)\n        return pair[0]")
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert [r.code.code for r in result.refusals] == ["S111"], result
    assert "unpacks the probabilities into `out`, which its method reads" in result.reasons[0]


def test_torch_is_imported_where_the_file_binds_only_its_submodules() -> None:
    source = attention().replace("import torch\nfrom torch import nn\n", "import torch.nn as nn\n")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "\nimport torch\nimport torch.nn as nn\n" in result.source
    compile(result.source, "port.py", "exec")


# ------------------------------------------------------------------ a function forward defines (`analyse/closures.py`)

CLOSURE = '''
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class TinyAttention(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.temperature = nn.Parameter(torch.ones(1, 1, 1, 8))

    def forward(self, x, mask=None):
        b, n, c = x.shape
        scale = self.head_dim**-0.5
{body}

class TinyBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.attn = TinyAttention(dim)
'''

ATTEND = """
def attend(q, k, v):
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(dim=-1)
    return torch.matmul(probs, v)
"""
# a product the recogniser does not read (an ellipsis einsum), which the form-free detector still sees
UNREAD = """
def attend(q, k, v):
    scores = torch.einsum("...qd,...kd->...qk", q, k)
    probs = scores.softmax(dim=-1)
    return torch.einsum("...qk,...kd->...qd", probs, v)
"""
QKV = "q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)\n"


def closure(body: str) -> str:
    return CLOSURE.format(body=textwrap.indent(textwrap.dedent(body).strip() + "\n", " " * 8))


# each ported: the function keeps its place and its calls, its body one SDPA call reading what it read
CLOSURES_PORTED = {
    "called once": ATTEND + QKV + "return attend(q, k, v)",
    "called per chunk of queries": ATTEND + QKV + "return torch.cat([attend(c, k, v) for c in q.chunk(2, dim=2)], dim=2)",
    "through checkpoint": ATTEND + QKV + "return checkpoint(attend, q, k, v, use_reentrant=False)",
    "a mask passed in": ATTEND.replace("(q, k, v)", "(q, k, v, mask)") + QKV + "return attend(q, k, v, mask) + attend(q, k, v, None)",
    "a name it does not read bound again": ATTEND + QKV + "out = attend(q, k, v)\nx = None\nreturn out",
}


@pytest.mark.parametrize("body", CLOSURES_PORTED.values(), ids=CLOSURES_PORTED.keys())
def test_a_function_forward_defines_is_ported_where_it_stands(body: str) -> None:
    source = closure(body)
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED and result.style is Style.INLINE, result.reasons
    port = result.source
    definition = port[port.index("def attend(") : port.index(QKV.strip())]
    assert "torch.nn.functional.scaled_dot_product_attention(" in definition and "softmax" not in definition
    assert "scale=scale," in definition and "mask" in definition
    # forward's own lines, the calls among them, are as they were
    assert port[port.index(QKV.strip()) :] == source[source.index(QKV.strip()) :]
    assert port_source(port, filename="modeling_tiny.py").detail == "already supports SDPA"


# each refused with its code: what the function reads may change before a call, it gives what SDPA does not, or its
# computation is not one the recogniser proves
CLOSURES_REFUSED = {
    "W411 nonlocal write": ("count = 0\n" + ATTEND.replace("    scores =", "    nonlocal count\n    count += 1\n    scores =", 1) + QKV + "return attend(q, k, v)", "W411"),
    "W411 a read name bound again": (ATTEND + QKV + "scale = self.temperature\nreturn attend(q, k, v)", "W411"),
    "W411 a read name changed in place": (ATTEND + QKV + "if mask is not None:\n    mask.mul_(2)\nreturn attend(q, k, v)", "W411"),
    "W411 handed to another function": (ATTEND + QKV + "return torch.vmap(attend)(q, k, v)", "W411"),
    "W411 defined in a loop": ("for _ in range(1):\n" + textwrap.indent(ATTEND, "    ") + QKV + "return attend(q, k, v)", "W411"),
    "W411 decorated": ("@torch.no_grad()" + ATTEND + QKV + "return attend(q, k, v)", "W411"),
    "S111 the probabilities returned": (ATTEND.replace("return torch.matmul(probs, v)", "return torch.matmul(probs, v), probs") + QKV + "return attend(q, k, v)[0]", "S111"),
    "S102 a scale not provably a number": (ATTEND.replace("* scale", "* self.temperature") + QKV + "return attend(q, k, v)", "S102"),
    "S109 forward computes attention too": (ATTEND + QKV + "return attend(q, k, v) + torch.matmul((q @ k.transpose(-1, -2)).softmax(-1), v)", "S109"),
    "F601 a form not recognised": (UNREAD + QKV + "return attend(q, k, v)", "F601"),
}


@pytest.mark.parametrize("body,expected", CLOSURES_REFUSED.values(), ids=CLOSURES_REFUSED.keys())
def test_a_function_forward_defines_is_refused_with_a_code(body: str, expected: str) -> None:
    source = closure(body)
    compile(source, "modeling_tiny.py", "exec")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, (result.status, result.detail)
    assert [r.code.code for r in result.refusals] == [expected], result.reasons
    assert result.source == source


BESIDE = '''

class PlainAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 4, -1)).permute(2, 0, 3, 1, 4)
        probs = (q @ k.transpose(-1, -2) / 8.0).softmax(dim=-1)
        return probs @ v
'''


def test_eager_attention_in_a_function_defined_inside_is_never_passed_over_in_silence() -> None:
    """Beside a class the inline style ports, a class whose nested function holds attention the recogniser does not
    read (in forward, or in a helper method) stays eager, and the port says so with its code."""
    for source in (
        closure(UNREAD + QKV + "return attend(q, k, v)"),
        closure(QKV + "return self._attn(q, k, v)").replace(
            "\n\nclass TinyBlock", "\n    def _attn(self, q, k, v):\n" + textwrap.indent(UNREAD, " " * 8)
            + "        return attend(q, k, v)\n\n\nclass TinyBlock"
        ),
    ):
        compile(source, "modeling_tiny.py", "exec")
        alone = port_source(source, filename="modeling_tiny.py", style="inline")
        assert [r.code.code for r in alone.refusals] == ["F601"], alone.reasons
        assert "`attend`, a function `TinyAttention." in alone.reasons[0]
        result = port_source(source + BESIDE, filename="modeling_tiny.py", style="inline")
        assert result.status is Status.PORTED and result.attention_classes == ("PlainAttention",), result.reasons
        assert any(w.startswith("TinyAttention stays eager") and w.endswith("[F601]") for w in result.warnings), result.warnings


def test_a_head_mask_the_function_reads_from_forward_sends_forward_back_to_eager() -> None:
    """A head mask of forward's, tested against None in the function, is one only eager takes: the SDPA forward
    falls back where it is given, and its function leaves it out. The function's own parameter is no such mask."""
    masked = ATTEND.replace(
        "    return torch.matmul(probs, v)", "    if head_mask is not None:\n        probs = probs * head_mask\n    return torch.matmul(probs, v)"
    )
    source = closure(masked + QKV + "return attend(q, k, v)").replace("mask=None):", "mask=None, head_mask=None):", 1)
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    sdpa_forward = result.source[result.source.index("def forward(") : result.source.index("def _eager_forward(")]
    assert "if head_mask is not None:\n" in sdpa_forward and "return self._eager_forward(" in sdpa_forward
    function = sdpa_forward[sdpa_forward.index("def attend(") : sdpa_forward.index(QKV.strip())]
    assert "scaled_dot_product_attention(" in function and "head_mask" not in function and "probs" not in function
    own = closure(masked.replace("(q, k, v)", "(q, k, v, head_mask)") + QKV + "return attend(q, k, v, None)")
    assert [r.code.code for r in port_source(own, filename="modeling_tiny.py").refusals] == ["W411"]


def test_the_class_style_ports_a_function_forward_defines_in_its_sdpa_class() -> None:
    source = closure(ATTEND + QKV + "return attend(q, k, v)").replace(
        "    def __init__(self, dim):\n        super().__init__()\n        self.attn = TinyAttention(dim)",
        "    def __init__(self, config):\n        super().__init__()\n        self.attn = TinyAttention(config.hidden_size)",
    )
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED and result.style is Style.CLASS, result.reasons
    sdpa_class = result.source[result.source.index("class TinySdpaAttention(") :]
    assert "def attend(q, k, v):\n            return torch.nn.functional.scaled_dot_product_attention(" in sdpa_class


UNREAD_CLASS = '''

class TinySharedKeyAttention(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * (dim // heads))

    def forward(self, x):
        b, n, c = x.shape
        q = self.q(x).view(b, n, self.heads, -1).permute(0, 2, 1, 3)
        k, v = self.kv(x).chunk(2, dim=-1)
        sim = torch.einsum("b h i d, j d -> b h i j", q, k.mean(0))  # one key for the whole batch: not read
        out = torch.einsum("b h i j, j d -> b h i d", sim.softmax(dim=-1), v.mean(0))
        return out.permute(0, 2, 1, 3).reshape(b, n, c)
'''


@pytest.mark.parametrize("style", ["inline", "auto"])
def test_eager_attention_left_unread_beside_a_port_is_named(style: str) -> None:
    """A class whose eager attention the recogniser does not read stays eager beside the classes that port: the
    result says so, with where the reading stops, never nothing."""
    result = port_source(attention() + UNREAD_CLASS, filename="modeling_tiny.py", style=style)
    assert result.status is Status.PORTED, result.reasons
    named = [w for w in result.warnings if w.startswith("TinySharedKeyAttention.forward (line")]
    assert len(named) == 1 and "stays eager" in named[0] and "recogniser stops" in named[0], result.warnings
    # a class the port covers is not named
    assert not any(w.startswith("TinyAttention.forward") for w in result.warnings), result.warnings


# ------------------------------------------------------------------ sizes of scores of unknown rank

SIZED = (FIXTURES / "inline_style" / "modeling_tiny_sized_mask.py").read_text(encoding="utf-8")
PRODUCT_SHAPE = "(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + q.shape[-2:-1] + k.shape[-2:-1])"


def test_sizes_of_scores_of_unknown_rank_are_read_from_the_product() -> None:
    """A helper's scores, their rank unknown, expand a mask to their shape: the query and key give it at any rank."""
    result = port_source(SIZED, filename="modeling_tiny.py", style="inline")
    assert result.status is Status.PORTED, result.reasons
    assert ", ".join(f"{PRODUCT_SHAPE}[{index}]" for index in range(4)) in flat(result.source)


def test_sizes_of_scores_changed_since_the_product_refuse_s104() -> None:
    """A term added before the read may broadcast the scores to another shape than the product's."""
    source = SIZED.replace("    if mask is not None:\n", "    scores = scores + d_k\n    if mask is not None:\n", 1)
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert [r.code.code for r in result.refusals] == ["S104"], result.reasons
    assert "their rank unknown" in result.reasons[0]


# ------------------------------------------------------------------ a product of masks read as a mask

PAIRED = (FIXTURES / "inline_style" / "modeling_tiny_mask_product.py").read_text(encoding="utf-8")
PAIR = "pair = torch.matmul(mask, mask.transpose(-2, -1))"


def test_a_product_of_masks_read_by_a_fill_is_the_mask() -> None:
    """`m @ m^T` has a query-key product's shape; read by the scores' fill, it is an operand, not other scores."""
    result = port_source(PAIRED, filename="modeling_tiny.py", style="inline")
    assert result.status is Status.PORTED, result.reasons
    assert PAIR in result.source
    assert "torch.where(pair != 0, q.new_zeros(()), torch.finfo(q.dtype).min)" in result.source


def test_a_fill_reading_its_own_scores_still_refuses_s104() -> None:
    source = PAIRED.replace("masked_fill(pair == 0,", "masked_fill(scores == 0,", 1)
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert [r.code.code for r in result.refusals] == ["S104"], result.reasons
    assert "`scores != 0` reads the scores" in result.reasons[0]


def test_a_product_read_by_a_fill_and_then_attended_refuses_s104() -> None:
    """Where the product read by the fill is the one softmaxed and multiplied by V, its scores were read."""
    source = PAIRED.replace(
        "    scores = F.softmax(scores, dim=-1)\n", "    scores = F.softmax(pair, dim=-1)\n", 1
    )
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert [r.code.code for r in result.refusals] == ["S104"], result.reasons
    assert "`pair != 0` reads the scores" in result.reasons[0]


def test_probabilities_passed_to_a_callable_parameter_say_so() -> None:
    """`dropout(scores)` of a helper handed `self.dropout`: the reason names the stage and the parameter."""
    source = (
        PAIRED.replace("mask=None):\n    scores", "mask=None, dropout=None):\n    scores", 1)
        .replace(
            "    scores = F.softmax(scores, dim=-1)\n",
            "    scores = F.softmax(scores, dim=-1)\n    if dropout is not None:\n        scores = dropout(scores)\n",
        )
        .replace("attention(q, k, v, self.d_k, mask)", "attention(q, k, v, self.d_k, mask, nn.Dropout(0.1))")
    )
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    assert [r.code.code for r in result.refusals] == ["S101"], result.reasons
    assert (
        "the probabilities are passed to `dropout`, a parameter of `attention`, whose value the tool does not follow"
        in result.reasons[0]
    )


# ------------------------------------------------------------------ a class left eager beside the ported ones

LEFT_EAGER = (FIXTURES / "inline_style" / "modeling_tiny_beside.py").read_text(encoding="utf-8")
IN_TREE = LEFT_EAGER.replace(
    "from transformers import PretrainedConfig, PreTrainedModel",
    "from ...configuration_utils import PretrainedConfig\nfrom ...modeling_utils import PreTrainedModel",
)


def test_auto_ports_in_place_where_a_refused_class_cannot_stay_eager_beside_the_class_style() -> None:
    """Remote code: the class style refuses the file because a refused class cannot stay eager beside the ported
    ones (the masks it changes may reach it); the inline style changes no mask, ports the rest and leaves it eager."""
    assert port_source(LEFT_EAGER, filename="modeling_tiny.py", style="class").status is Status.REFUSED
    result = port_source(LEFT_EAGER, filename="modeling_tiny.py")
    assert result.status is Status.PORTED and result.style is Style.INLINE, result.reasons
    assert result.attention_classes == ("TinyAttention",)
    assert any(w.startswith("TinySquaredAttention stays eager") and w.endswith("[S103]") for w in result.warnings)


def test_inside_the_transformers_tree_the_class_style_refusal_stands() -> None:
    """A file importing from two packages up sits in the Transformers tree: ports there follow `_attn_implementation`
    through the class style, so its refusal stands rather than a port in place whatever the setting."""
    result = port_source(IN_TREE, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result.source
    assert any("it cannot stay eager: its forward takes `*states`" in reason for reason in result.reasons), result.reasons
