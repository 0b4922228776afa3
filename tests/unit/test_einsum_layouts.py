"""Einsum products read in any dimension order: which spec is scores or the product with V, how each operand is
brought to SDPA's (batch, heads, length, dim) layout and the output back, and what the port then writes (torch-free;
the fuzzer's `length_first` axis, the length-first fixture and Funnel's acceptance test run them)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.patterns import EinsumRole, einsum_roles, inverse, permuted

SCORES, OUTPUT = EinsumRole.SCORES, EinsumRole.OUTPUT


@pytest.mark.parametrize(
    "spec,kind,orders",
    [
        ("bhqd,bhkd->bhqk", SCORES, (None, None, None)),
        ("bhqk,bhkd->bhqd", OUTPUT, (None, None, None)),
        # (batch, length, heads, dim): Funnel, the fuzzer's einsum_bthd
        ("bind,bjnd->bnij", SCORES, ((0, 2, 1, 3), (0, 2, 1, 3), None)),
        ("bnij,bjnd->bind", OUTPUT, (None, (0, 2, 1, 3), (0, 2, 1, 3))),
        # length first: XLNet, Transformer-XL
        ("ibnd,jbnd->bnij", SCORES, ((1, 2, 0, 3), (1, 2, 0, 3), None)),
        ("bnij,jbnd->ibnd", OUTPUT, (None, (1, 2, 0, 3), (2, 0, 1, 3))),
        # a key given as (..., dim, length)
        ("bhqd,bhdk->bhqk", SCORES, (None, (0, 1, 3, 2), None)),
        ("bqd,bkd->bqk", SCORES, (None, None, None)),
        # 3-D, length first (a flattened (length, batch * heads, dim) layout)
        ("qbd,kbd->bqk", SCORES, ((1, 0, 2), (1, 0, 2), None)),
        ("bqk,kbd->qbd", OUTPUT, (None, (1, 0, 2), (1, 0, 2))),
    ],
)
def test_roles_and_orders(spec: str, kind: EinsumRole, orders: tuple[object, object, object]) -> None:
    roles = einsum_roles(spec, kind)
    assert roles is not None and roles.kind is kind
    assert (roles.left, roles.right, roles.result) == orders
    assert roles.scores is None


@pytest.mark.parametrize(
    "spec,scores",
    [
        ("ibnd,jbnd->ijbn", (2, 3, 0, 1)),  # Transformer-XL: (query, key, batch, heads)
        ("bhqd,bhkd->bhkq", (0, 1, 3, 2)),  # (key, query): the softmax runs over dimension 2
        ("bhqd,bhkd->bqhk", (0, 2, 1, 3)),  # heads between the lengths
        ("bqd,bkd->bkq", (0, 2, 1)),  # 3-D, (key, query)
    ],
)
def test_scores_laid_out_otherwise(spec: str, scores: tuple[int, ...]) -> None:
    """The scores' own order is read too; a product with V of probabilities so laid out reads its first operand
    through it (Transformer-XL's `ijbn,jbnd->ibnd`), and not without it."""
    roles = einsum_roles(spec, SCORES)
    assert roles is not None and roles.scores == scores
    inputs, out = spec.split("->")
    value = inputs.split(",")[1]
    output = einsum_roles(f"{out},{value}->{inputs.split(',')[0]}", OUTPUT, scores)
    assert output is not None and output.kind is OUTPUT
    assert einsum_roles(f"{out},{value}->{inputs.split(',')[0]}", OUTPUT) is None


@pytest.mark.parametrize(
    "spec,kind",
    [
        ("bnij,bjnd->bjnd", OUTPUT),  # the key length survives: not a product with V
        ("bhqd,bhqd->bhqd", SCORES),  # nothing contracted
        ("bhqd,bhkd->bhqq", SCORES),  # a label twice
        ("bhqd,bhkd->bhk", SCORES),  # the query length dropped
        ("ijbs,ibns->bnij", SCORES),  # XLNet's segment term: operands laid out unalike, scores not SDPA's
    ],
)
def test_not_attention(spec: str, kind: EinsumRole) -> None:
    assert einsum_roles(spec, kind) is None


@pytest.mark.parametrize("order", [(0, 2, 1, 3), (1, 2, 0, 3), (2, 0, 1, 3), (0, 1, 3, 2), (3, 2, 1, 0)])
def test_permuted_and_its_inverse(order: tuple[int, ...]) -> None:
    assert tuple(order[i] for i in inverse(order)) == (0, 1, 2, 3)
    written = code(permuted(cst.parse_expression("x + y"), order))
    moved = [i for i, o in enumerate(order) if i != o]
    assert written == (f"(x + y).transpose({moved[0]}, {moved[1]})" if len(moved) == 2 else f"(x + y).permute{order}")
    assert code(permuted(cst.Name("x"), (0, 1, 2, 3))) == "x"


LENGTH_FIRST = textwrap.dedent(
    """
    import torch
    from torch import nn


    class TinyAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.scale = config.head_dim**-0.5
            self.bias = nn.Parameter(torch.zeros(config.heads, config.head_dim))

        def forward(self, query, key, value, attention_mask=None):
            scores = torch.einsum("ibnd,jbnd->bnij", query + self.bias, key) * self.scale
            if attention_mask is not None:
                scores = scores - 1e30 * attention_mask
            probs = nn.functional.softmax(scores, dim=3)
            return torch.einsum("bnij,jbnd->ibnd", probs, value)


    class TinyLayer(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.attention = TinyAttention(config)

        def forward(self, states, attention_mask=None):
            return self.attention(states, states, states, attention_mask)
    """
)


def test_the_port_hands_sdpa_permuted_operands_and_permutes_its_output_back() -> None:
    result = port_source(LENGTH_FIRST, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    ported = result.source
    assert "sdpa_query = (query + self.bias).permute(1, 2, 0, 3)" in ported
    assert "sdpa_key = key.permute(1, 2, 0, 3)" in ported
    assert "value.permute(1, 2, 0, 3)," in ported
    assert ").permute(2, 0, 1, 3)" in ported  # SDPA's (b, n, i, d) back to the einsum's (i, b, n, d)
    assert "sdpa_mask = -(1e30 * attention_mask)" in ported  # a subtracted mask, negated


FLAT_LENGTH_FIRST = textwrap.dedent(
    """
    import math

    import torch
    from torch import nn


    class TinyAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.heads = config.heads
            self.head_dim = config.head_dim

        def forward(self, query, key, value, attention_mask=None):
            # (length, batch * heads, dim), as fairseq-style code keeps its states
            batch = query.size(1) // self.heads
            scores = torch.einsum("qbd,kbd->bqk", query, key) / math.sqrt(self.head_dim)
            if attention_mask is not None:
                scores = scores.view(batch, self.heads, query.size(0), key.size(0)) + attention_mask
                scores = scores.view(batch * self.heads, query.size(0), key.size(0))
            probs = scores.softmax(dim=-1)
            return torch.einsum("bqk,kbd->qbd", probs, value)


    class TinyLayer(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.attention = TinyAttention(config)
    """
)


def test_a_flat_length_first_einsum_flattens_sdpa_output_before_its_own_order() -> None:
    """3-D einsums on (length, batch * heads, dim) states: each operand is transposed to (batch * heads, length,
    dim) and split into heads for SDPA; SDPA's output is flattened back first and only then put in the einsum's
    order (the other way round transposes heads with the batch: wrong by ~5 in the fuzzer, seeds 50037...)."""
    result = port_source(FLAT_LENGTH_FIRST, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    ported = result.source
    assert "sdpa_query = query.transpose(0, 1)" in ported
    assert ").flatten(0, 1).transpose(0, 1)" in ported, ported
