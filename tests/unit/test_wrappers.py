"""Softmax wrappers the file defines, read as what they compute; modules that are the identity unless configured;
a row's maximum subtracted before the softmax. Before/after pairs and the look-alikes that must stay refused."""

from __future__ import annotations

import ast

import libcst as cst
import pytest

from helpers import HEADER, analyse

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.wrappers import identity_unless, inlined
from sdpa_port.discover.screen import screen

WRAPPERS = HEADER + '''

class MaskedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, mask, dim):
        ctx.dim = dim
        inverted = ~(mask.to(torch.bool))
        output = scores.masked_fill(inverted, torch.finfo(scores.dtype).min)
        output = torch.softmax(output, ctx.dim)
        output.masked_fill_(inverted, 0)
        ctx.save_for_backward(output)
        return output


class QuietDropout(nn.Module):
    def __init__(self, drop_prob):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if self.training and self.drop_prob > 0:
            return nn.functional.dropout(x, self.drop_prob) * 1.0
        return x


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dropout = QuietDropout(config.attention_probs_dropout_prob)
        self.proj = nn.Linear(4, 4)

    def relaxed(self, scores, alpha=32):
        scaled = scores / alpha
        top = scaled.amax(dim=-1).unsqueeze(-1)
        return nn.Softmax(dim=-1)((scaled - top) * alpha)

    def projected(self, scores):
        return torch.softmax(self.proj(scores), -1)

    def forward(self, query, key, value, attention_mask):
        pass
'''


@pytest.fixture(scope="module")
def facts() -> ModuleFacts:
    return ModuleFacts.of(cst.parse_module(WRAPPERS), ast.parse(WRAPPERS))


def _read(call: str, facts: ModuleFacts) -> str | None:
    found = inlined(cst.parse_expression(call), facts, "Attention", facts.imports.qualify)
    return None if found is None else cst.Module([]).code_for_node(found)


def test_an_autograd_function_reads_as_its_forward(facts: ModuleFacts) -> None:
    assert _read("MaskedSoftmax.apply(scores, attention_mask, -1)", facts) == (
        "torch.softmax(scores.masked_fill((~(attention_mask.to(torch.bool))), "
        "torch.finfo(scores.dtype).min), -1).masked_fill((~(attention_mask.to(torch.bool))), 0)"
    )


def test_a_method_reads_with_its_defaults(facts: ModuleFacts) -> None:
    assert _read("self.relaxed(scores)", facts) == (
        "nn.Softmax(dim=-1)(((scores / 32) - (scores / 32).amax(dim=-1).unsqueeze(-1)) * 32)"
    )


@pytest.mark.parametrize(
    "call",
    [
        "MaskedSoftmax.apply(scores + bias, attention_mask, -1)",  # an argument computed: it would be computed twice
        "self.projected(scores)",  # a module of self inside: state and parameters
        "self.relaxed(scores, *rest)",
    ],
)
def test_what_is_not_read_as_an_expression(call: str, facts: ModuleFacts) -> None:
    assert _read(call, facts) is None


def test_a_module_that_is_the_identity_unless_configured(facts: ModuleFacts) -> None:
    found = identity_unless(cst.parse_expression("self.dropout(probs)"), facts, "Attention")
    assert found is not None
    operand, settings = found
    assert cst.Module([]).code_for_node(operand) == "probs"
    assert cst.Module([]).code_for_node(settings) == "self.dropout.training and self.dropout.drop_prob > 0"
    assert identity_unless(cst.parse_expression("self.proj(probs)"), facts, "Attention") is None


def test_the_screen_follows_an_applied_autograd_function() -> None:
    source = WRAPPERS.replace("        pass\n", "        return MaskedSoftmax.apply(query @ key, attention_mask, -1) @ value\n")
    source = source.replace("    def projected(self, scores):\n        return torch.softmax(self.proj(scores), -1)\n", "")
    source = source.replace('''    def relaxed(self, scores, alpha=32):
        scaled = scores / alpha
        top = scaled.amax(dim=-1).unsqueeze(-1)
        return nn.Softmax(dim=-1)((scaled - top) * alpha)
''', "")
    assert "Attention" in screen(ast.parse(source)).softmax_classes


FORWARD = """
    def forward(self, query, key, value, attention_mask):
        scores = torch.matmul(query, key.transpose(-1, -2)) / 8.0
        probs = {softmax}
        probs = self.dropout(probs)
        return torch.matmul(probs, value), None
"""


@pytest.mark.parametrize(
    "softmax",
    ["MaskedSoftmax.apply(scores, attention_mask, -1)", "self.relaxed(scores)"],
    ids=["autograd-fill-softmax-zero", "pb-relax-shift"],
)
def test_attention_through_a_wrapper_is_a_site(softmax: str) -> None:
    source = WRAPPERS.replace("    def forward(self, query, key, value, attention_mask):\n        pass\n", FORWARD.format(softmax=softmax))
    analysis = analyse(source)
    assert analysis is not None and analysis.refusal is None, analysis and str(analysis.refusal)
    assert analysis.eager_only_flags == ("self.dropout.training and self.dropout.drop_prob > 0",)
    (site,) = analysis.sites
    assert [(s.expression, s.divide) for s in site.scaling] == [("8.0", True)]  # PB-Relax's `/ 32 ... * 32` cancel


def test_a_shift_by_anything_but_the_rows_maximum_stays_refused() -> None:
    relaxed = WRAPPERS.replace("top = scaled.amax(dim=-1).unsqueeze(-1)", "top = scaled.amax(dim=-2).unsqueeze(-2)")
    source = relaxed.replace(
        "    def forward(self, query, key, value, attention_mask):\n        pass\n",
        FORWARD.format(softmax="self.relaxed(scores)"),
    )
    analysis = analyse(source)
    assert analysis is None or analysis.refusal is not None  # not a site: the detector then refuses the file


def test_an_autograd_context_is_found_by_position_not_name() -> None:
    """transformers 4.x DeBERTa names its autograd context `self`."""
    source = WRAPPERS.replace("def forward(ctx, scores, mask, dim):", "def forward(self, scores, mask, dim):").replace(
        "ctx.", "self."
    )
    facts = ModuleFacts.of(cst.parse_module(source), ast.parse(source))
    assert _read("MaskedSoftmax.apply(scores, attention_mask, -1)", facts) is not None
