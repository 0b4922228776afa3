"""The product with V written in each arm of one `if`, and the products that can both run (`analyse/outputs.py`).

`if self.use_final_linear: out = self.proj(probs @ v)` else `out = probs @ v` runs one of the two products: each
arm gets its own SDPA call, with the dropout draw they share. Two products that can both run stay refused.
"""

from __future__ import annotations

import pytest

from helpers import analyse, attention_module, flat

from sdpa_port import Status, port_source
from sdpa_port.analyse.forms.common import EXAMPLE_INIT

INIT = EXAMPLE_INIT + "self.use_proj = True\nself.proj = nn.Linear(8, 8)\n"

# the query's rank told by a view, for the value on the left of transposed probabilities
SCORES = """
b, h, s, d = query.shape
query = query.view(b, h, s, d)
scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
probs = self.dropout(nn.functional.softmax(scores, dim=-1))
"""


@pytest.mark.parametrize(
    "arms",
    [
        # a setting of the module chooses whether the output is projected
        "if self.use_proj:\n    out = self.proj(torch.matmul(probs, value))\n"
        "else:\n    out = torch.matmul(probs, value)",
        # three arms, each returning
        "if self.use_proj:\n    return self.proj(torch.matmul(probs, value))\nelif attention_mask is None:\n"
        "    return torch.matmul(probs, value)\nelse:\n    return torch.matmul(probs, value) * 2.0",
        # an argument decides
        "if attention_mask is None:\n    out = torch.matmul(probs, value)\n"
        "else:\n    out = torch.matmul(probs, value).flip(0)",
        # the first arm returns: the product after the `if` runs only where it did not
        "if self.use_proj:\n    return self.proj(torch.matmul(probs, value))\nreturn torch.matmul(probs, value)",
        "if self.use_proj:\n    out = self.proj(torch.matmul(probs, value))\n    return out\n"
        "out = torch.matmul(probs, value)",
        # the value on the left of the probabilities transposed before the `if` (a VAE's form), in each arm
        "probs = probs.transpose(-1, -2)\nif self.use_proj:\n"
        "    out = torch.matmul(value.transpose(-1, -2), probs).transpose(-1, -2)\n"
        "else:\n    out = -torch.matmul(value.transpose(-1, -2), probs).transpose(-1, -2)",
        # nested: the second product in an `if` inside the other arm
        "if self.use_proj:\n    out = torch.matmul(probs, value)\nelse:\n    if attention_mask is None:\n"
        "        out = torch.matmul(probs, value) + 1.0\n    else:\n        out = query",
    ],
)
def test_a_product_in_each_arm_of_one_if_is_one_computation(arms: str) -> None:
    body = SCORES + arms + ("\nreturn out" if "return" not in arms else "")
    analysis = analyse(attention_module(body, init=INIT))
    assert analysis is not None
    assert analysis.refusal is None, str(analysis.refusal)
    # not one side ported and the other left to eager (`settings_sides.py`): both arms are the one computation
    assert analysis.alternatives == () and analysis.eager_only_flags == ()
    (site,) = analysis.sites
    assert site.value.startswith("value")


@pytest.mark.parametrize(
    "products",
    [
        # two `if`s whose tests the tool does not compare: both may run, with one dropout draw
        "if attention_mask is None:\n    out = torch.matmul(probs, value)\n"
        "if attention_mask is not None:\n    out = torch.matmul(probs, value)",
        # one product inside an arm, one after the `if`
        "out = query\nif attention_mask is None:\n    out = torch.matmul(probs, value)\n"
        "out = out + torch.matmul(probs, value)",
        # two products in the same arm
        "out = query\nif attention_mask is None:\n    out = torch.matmul(probs, value) + torch.matmul(probs, value)",
        # the arm returns only under a further test: the product after the `if` may run after the first
        "if self.use_proj:\n    out = torch.matmul(probs, value)\n    if attention_mask is None:\n        return out\n"
        "out = torch.matmul(probs, value)",
        # other probabilities in the other arm
        "if attention_mask is None:\n    out = torch.matmul(probs, value)\nelse:\n"
        "    out = torch.matmul(nn.functional.softmax(scores, dim=-1), value)",
    ],
)
def test_products_that_can_both_run_stay_refused(products: str) -> None:
    analysis = analyse(attention_module(SCORES + products + "\nreturn out", init=INIT))
    assert analysis is not None
    assert analysis.refusal is not None and analysis.refusal.code.code == "S111", analysis.refusal


FILE = '''
import math

import torch
from torch import nn


class ArmsAttention(nn.Module):
    def __init__(self, dim, heads=4, use_final_linear=True):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.dropout = nn.Dropout(0.1)
        self.use_final_linear = use_final_linear
        self.final_linear = nn.Linear(dim, dim)

    def forward(self, x, mask=None, graph=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q / math.sqrt(c // self.heads), k.transpose(2, 3))
        attn = scores.softmax(dim=-1)
        if graph is not None:
            {transform}
        drop_attn = self.dropout(attn)
        if self.use_final_linear:
            return self.final_linear(torch.matmul(drop_attn, v).transpose(1, 2).reshape(b, n, c))
        return torch.matmul(drop_attn, v)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.attn = ArmsAttention(dim)

    def forward(self, x, graph=None):
        return x + self.attn(x, graph=graph)
'''

# the port's first statement: a graph given, the eager forward kept runs
FALLBACK = "if graph is not None:\n            return self._eager_forward(x, mask=mask, graph=graph)"
GRAPH = "attn = torch.cat([attn[:, :-1], (attn[:, -1] * graph).unsqueeze(1)], 1)"


def test_every_construction_taking_one_arm_still_runs_sdpa_and_an_optional_transform_falls_back() -> None:
    """Both arms are SDPA calls, so a file building the module only with `use_final_linear=True` ports (the arms once
    read as two computations left SDPA on the arm no construction takes: W408); the optional graph falls back."""
    result = port_source(FILE.format(transform=GRAPH), filename="modeling_tiny.py", style="inline")
    assert result.status is Status.PORTED, result.reasons
    assert result.source.count("torch.nn.functional.scaled_dot_product_attention(") == 2
    assert FALLBACK in flat(result.source)


@pytest.mark.parametrize(
    "transform,code",
    [
        # the if-body also stores on the module: it runs only in the eager forward, where a graph is given
        (GRAPH + "\n            self.last = attn", None),
        ("self.calls = 1\n            " + GRAPH, None),
        # the graph applied on every call: no path without it
        ("pass\n        " + GRAPH.replace("graph", "self.graph_weight"), "S104"),
        # under a test of a parameter every call passes (no default)
        ("<required>", "S104"),
        # under a test of a module attribute never None
        (GRAPH.replace("* graph", "* self.graph_weight"), "<attribute>"),
        # under a truth test of the tensor
        ("<truthy>", "S104"),
    ],
)
def test_an_optional_transform_of_the_probabilities_falls_back_only_under_an_optional_argument(
    transform: str, code: str | None
) -> None:
    source = FILE.format(transform=GRAPH if transform.startswith("<") else transform)
    weight = "nn.Linear(dim, dim)\n        self.graph_weight = torch.ones(4)\n"  # a tensor, never None
    source = source.replace("nn.Linear(dim, dim)\n", weight, 1)
    if transform == "<required>":
        source = source.replace("x, mask=None, graph=None)", "x, graph, mask=None)").replace("graph=graph", "graph")
    elif transform == "<truthy>":
        source = source.replace("if graph is not None:", "if graph:")
    elif code == "<attribute>":
        source = source.replace("if graph is not None:", "if self.graph_weight is not None:")
        code = "S104"
    result = port_source(source, filename="modeling_tiny.py", style="inline")
    if code is None:
        assert result.status is Status.PORTED, result.reasons
        assert FALLBACK in flat(result.source)
        return
    assert result.status is Status.REFUSED
    assert any(f"[{code}]" in reason for reason in result.reasons), result.reasons
