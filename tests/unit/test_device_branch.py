"""A branch of the score chain taken only on an XLA device (fairseq's TPU fill): the SDPA path holds off XLA, and the
port runs the eager forward on an XLA device (`analyse/optional_facts.device_tests`)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.known import Known, holding
from sdpa_port.analyse.optional_facts import device_tests, is_device_test
from sdpa_port.rewrite.specialise import specialise

SOURCE = '''
import math

import torch
from torch import nn


class TinyAttention(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, key_padding_mask=None):
{before}        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if key_padding_mask is not None:
            if {test}:
                scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
            else:
                scores = scores.transpose(0, 2)
                scores = scores.masked_fill(key_padding_mask, float("-inf"))
                scores = scores.transpose(0, 2)
        probs = scores.softmax(dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, n, c)
'''

ALIAS = '        is_tpu = x.device.type == "xla"\n'


def source(before: str = ALIAS, test: str = "not is_tpu") -> str:
    return SOURCE.format(before=before, test=test)


def sdpa_forward(ported: str) -> str:
    """The port's forward, up to the kept eager forward."""
    return ported.split("    def forward(", 1)[1].split("    def _eager_forward(", 1)[0]


@pytest.mark.parametrize(
    "before,test",
    [
        (ALIAS, "not is_tpu"),  # fairseq's form: the test bound to a name first
        ("", 'x.device.type != "xla"'),
        ("", 'not x.device.type == "xla"'),
    ],
)
def test_the_branch_off_xla_is_ported_and_xla_runs_the_eager_forward(before: str, test: str) -> None:
    result = port_source(source(before, test), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    forward = sdpa_forward(result.source)
    assert 'if x.device.type == "xla":\n' in forward
    assert "return self._eager_forward(x, key_padding_mask=key_padding_mask)" in forward
    assert "inputs on an XLA device take the original's own branch" in forward
    # the test's name and the XLA branch are gone from the SDPA forward; the eager forward keeps them
    assert "is_tpu" not in forward and ".transpose(0, 2)" not in forward
    assert result.source.count(".transpose(0, 2)") == 2
    assert any("inputs on an XLA device" in warning for warning in result.warnings)


@pytest.mark.parametrize(
    "before,test",
    [
        ('        is_tpu = x.device.type == "cuda"\n', "not is_tpu"),  # another device: a branch SDPA must take
        ('        x = x * 1\n        is_tpu = x.device.type == "xla"\n', "not is_tpu"),  # a rebound input
        (ALIAS + "        is_tpu = False\n", "not is_tpu"),  # a name bound twice
        ("", "key_padding_mask.dtype == torch.bool"),  # a test of something else
    ],
)
def test_look_alikes_keep_the_transposed_fill_and_refuse(before: str, test: str) -> None:
    result = port_source(source(before, test), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result.source
    assert "`.transpose()` is applied to the scores" in result.reasons[0]


def _forward(text: str) -> cst.FunctionDef:
    node = cst.parse_module(textwrap.dedent(text)).body[0]
    assert isinstance(node, cst.FunctionDef)
    return node


def test_device_tests_are_of_parameters_forward_never_rebinds() -> None:
    forward = _forward(
        """
        def forward(self, query, key, value=None):
            key = key.float()
            a = query.device.type == "xla"
            b = key.device.type == "xla"
            c = value.device.type == "cuda"
            d = "xla" == query.device.type
        """
    )
    assert device_tests(forward) == ['query.device.type == "xla"']
    assert is_device_test('query.device.type == "xla"') and not is_device_test("query.device.type")


def test_a_name_bound_once_to_a_test_known_false_is_known_false() -> None:
    body = _forward(
        """
        def forward(self, x):
            is_tpu = x.device.type == "xla"
            if is_tpu:
                y = 1
        """
    ).body.body
    known = Known(falsy=frozenset({'x.device.type == "xla"'}))
    assert "is_tpu" in holding(known, body).falsy
    assert "is_tpu" not in holding(Known(falsy=frozenset({"other"})), body).falsy


def test_the_binding_goes_only_where_nothing_reads_it_any_more() -> None:
    known = Known(falsy=frozenset({'x.device.type == "xla"'}))
    folded = specialise(
        _forward(
            """
            def forward(self, x):
                is_tpu = x.device.type == "xla"
                if is_tpu:
                    x = x + 1
                return x
            """
        ),
        known,
    )
    assert "is_tpu" not in cst.Module(body=[folded]).code
    kept = specialise(
        _forward(
            """
            def forward(self, x):
                is_tpu = x.device.type == "xla"
                if is_tpu:
                    x = x + 1
                return x, is_tpu
            """
        ),
        known,
    )
    assert 'is_tpu = x.device.type == "xla"' in cst.Module(body=[kept]).code


def test_a_refusal_names_the_stop_on_the_path_the_port_would_take() -> None:
    """Where the XLA branch is left to eager, the reading that stops later (a softmax of another package) is the one
    the F601 refusal names, with the facts it holds under; not the transposes of the XLA branch."""
    text = source().replace("probs = scores.softmax(dim=-1)", "probs = utils.softmax(scores, dim=-1)")
    text = text.replace("from torch import nn\n", "from torch import nn\nfrom fairseq import utils\n")
    result = port_source(text, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED
    reason = result.reasons[0]
    assert "[F601]" in reason
    said = "the scores are passed to `utils.softmax`, a function of `fairseq.utils`, another package"
    assert f'where `x.device.type != "xla"`: {said}, whose computation this file does not show' in reason
    assert ".transpose()" not in reason


@pytest.mark.parametrize(
    "callee,said",
    [
        ("utils.rescale", "`utils.rescale`, a function of `fairseq.utils`, another package, whose computation"),
        ("rescale", "`rescale`, a function of `.helpers`, another file of this package, whose computation"),
        ("norm", "`norm` [S101]"),  # bound in forward, not imported
    ],
)
def test_only_an_imported_callee_is_said_to_be_another_package_s(callee: str, said: str) -> None:
    text = source(before="        norm = self.norm\n", test="True").replace(
        "probs = scores.softmax(dim=-1)", f"probs = {callee}(scores).softmax(dim=-1)"
    )
    imports = "from torch import nn\nfrom fairseq import utils\nfrom .helpers import rescale\n"
    text = text.replace("from torch import nn\n", imports)
    result = port_source(text, filename="modeling_tiny.py")
    assert f"the scores are passed to {said}" in result.reasons[0], result.reasons
