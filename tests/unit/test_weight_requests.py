"""Calls that ask the attention for weights they read only under the caller's own `output_attentions` pass that
flag on instead (Mask2Former), so the SDPA class runs; weights read otherwise keep the literal True."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.rewrite.weight_requests import relax_weight_requests

LAYER = """
import torch
from torch import nn


class Attention(nn.Module):
    def forward(self, hidden_states, output_attentions=False):
        scores = torch.softmax(hidden_states @ hidden_states.transpose(-1, -2), -1)
        return scores @ hidden_states, scores if output_attentions else None


class Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = Attention()

    def forward(self, hidden_states, output_attentions=False):
        weights = None
        hidden_states, weights = self.self_attn(hidden_states, output_attentions=True)
        outputs = (hidden_states,)
        {use}
        return outputs
"""


def _relaxed(use: str) -> tuple[str, list[str]]:
    source = textwrap.dedent(LAYER).replace("{use}", use)
    module = cst.parse_module(source)
    changed, notes = relax_weight_requests(module, ModuleFacts.of(module, ast.parse(source)), frozenset({"Attention"}))
    return changed.code, notes


def test_weights_read_only_under_the_flag_pass_it_on() -> None:
    code, notes = _relaxed("if output_attentions:\n            outputs += (weights,)")
    assert "self.self_attn(hidden_states, output_attentions=output_attentions)" in code
    assert len(notes) == 1 and "Layer.forward" in notes[0]


@pytest.mark.parametrize(
    "use",
    [
        "outputs += (weights,)",  # returned whatever the flag
        "if hidden_states.sum() > 0:\n            outputs += (weights.mean(),)",  # another test
        "if output_attentions:\n            outputs += (weights,)\n        output_attentions = True",  # rebound
    ],
    ids=["unguarded", "other-test", "flag-rebound"],
)
def test_weights_read_otherwise_keep_the_request(use: str) -> None:
    code, notes = _relaxed(use)
    assert "output_attentions=True)" in code and not notes


def test_an_attention_returning_fewer_values_without_the_flag_keeps_the_request() -> None:
    """Grounding DINO's attention returns `(out,)` unless asked: the caller's `a, w = ...` would fail to unpack."""
    source = textwrap.dedent(LAYER).replace("{use}", "if output_attentions:\n            outputs += (weights,)")
    source = source.replace(
        "return scores @ hidden_states, scores if output_attentions else None",
        "return (scores @ hidden_states, scores) if output_attentions else (scores @ hidden_states,)",
    )
    module = cst.parse_module(source)
    changed, notes = relax_weight_requests(module, ModuleFacts.of(module, ast.parse(source)), frozenset({"Attention"}))
    assert changed.code == source and not notes
