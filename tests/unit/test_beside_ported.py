"""A port names the eager attention a ported method keeps beside the computation it ported.

Before: a method computing a windowed attention and then a global one was reported as "ported" when the recogniser
read the first, and the second stayed eager unsaid. After: the report adds
`Cls.forward (line N) stays eager: eager attention beside the one ported there, ...`.
"""

from __future__ import annotations

import ast
import textwrap
from types import SimpleNamespace

from sdpa_port.api import _beside_ported_sites, _unported
from sdpa_port.discover.eager_sites import find_eager_attention
from sdpa_port.discover.screen import screen
from sdpa_port.result import PortResult, Status, Style

TWO_ATTENTIONS = textwrap.dedent(
    """
    import torch
    from torch import nn


    class TwoAttention(nn.Module):
        def forward(self, q, k, v, dq, dk, dv):
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            x = attn @ v
            det_attn = dq @ dk.transpose(-2, -1)
            det_attn = det_attn.softmax(dim=-1)
            det = det_attn @ dv
            unused = torch.softmax(attn, dim=0)
            return x, det
    """
)
FIRST = (8, 10)  # the first computation: its product with the key, its product with the value
SECOND_SOFTMAX = 12


def _site(line: int, output_line: int, more_values: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(
        class_name="TwoAttention",
        owner="TwoAttention",
        method="forward",
        line=line,
        output_line=output_line,
        more_values=more_values,
    )



def _ported(source: str, *sites: SimpleNamespace, classes: tuple[str, ...] = ()) -> PortResult:
    """A port of `source` whose sites are stand-ins with the fields the check reads."""
    stand_ins: tuple = sites  # the check reads only the fields `_site` gives
    return PortResult(Status.PORTED, source, Style.INLINE, attention_classes=classes, sites=stand_ins)

def test_every_softmax_reaching_a_product_is_a_site() -> None:
    tree = ast.parse(TWO_ATTENTIONS)
    assert [site.line for site in find_eager_attention(tree)] == [9]
    # the softmax over dim 0 feeds no product: no site
    assert [site.line for site in find_eager_attention(tree, every=True)] == [9, SECOND_SOFTMAX]


def test_the_attention_beside_the_ported_one_is_found() -> None:
    tree = ast.parse(TWO_ATTENTIONS)
    result = _ported(TWO_ATTENTIONS, _site(*FIRST))
    found = _beside_ported_sites(tree, result, {"TwoAttention.forward"})
    assert [(site.where, site.line) for site in found] == [("TwoAttention.forward", SECOND_SOFTMAX)]
    both = _ported(TWO_ATTENTIONS, _site(*FIRST), _site(11, 13))
    assert _beside_ported_sites(tree, both, {"TwoAttention.forward"}) == []


def test_a_site_read_from_elsewhere_leaves_its_class_unjudged() -> None:
    """Scores read from a helper written out at its call give a product line after the output's: no span to judge."""
    tree = ast.parse(TWO_ATTENTIONS)
    result = _ported(TWO_ATTENTIONS, _site(40, 10))
    assert _beside_ported_sites(tree, result, {"TwoAttention.forward"}) == []


def test_a_site_with_more_values_leaves_its_class_unjudged() -> None:
    """LiLT's text values take a second softmax of the same scores, ported as a second SDPA call of one site."""
    tree = ast.parse(TWO_ATTENTIONS)
    result = _ported(TWO_ATTENTIONS, _site(*FIRST, ("dv",)))
    assert _beside_ported_sites(tree, result, {"TwoAttention.forward"}) == []


def test_the_report_names_it() -> None:
    tree = ast.parse(TWO_ATTENTIONS)
    result = _ported(TWO_ATTENTIONS, _site(*FIRST), classes=("TwoAttention",))
    reported = _unported(TWO_ATTENTIONS, tree, tree, screen(tree), result)
    assert reported.warnings == (
        f"TwoAttention.forward (line {SECOND_SOFTMAX}) stays eager: eager attention beside the one ported there, "
        "which the port leaves as it is",
    )


def test_a_module_function_the_ported_classes_call_is_not_named() -> None:
    """`eager_attention_forward`, which interface-style classes dispatch to, is their eager implementation: kept."""
    source = TWO_ATTENTIONS.replace("class TwoAttention(nn.Module):\n    def forward(self,", "def forward(")
    source = "\n".join(line[4:] if line.startswith("        ") else line for line in source.splitlines())
    tree = ast.parse(source)
    assert [site.where for site in find_eager_attention(tree, every=True)] == ["forward", "forward"]
    result = _ported(source, _site(*FIRST))
    assert _beside_ported_sites(tree, result, {"forward"}) == []


def test_a_method_nothing_calls_is_not_named() -> None:
    """A helper the file never reads (GPT-2's twin kept by a copy, never called) leaves nothing eager on any path."""
    source = TWO_ATTENTIONS.replace("def forward(self,", "def _unused(self,")
    tree = ast.parse(source)
    holding = {"TwoAttention._unused"}
    site = SimpleNamespace(
        class_name="TwoAttention", owner="TwoAttention", method="_unused", line=8, output_line=10, more_values=()
    )
    result = _ported(source, site)
    assert _beside_ported_sites(tree, result, holding) == []
    called = source + "\n\ndef run(module):\n    return module._unused(1, 2, 3, 4, 5, 6)\n"
    assert [s.line for s in _beside_ported_sites(ast.parse(called), result, holding)] == [SECOND_SOFTMAX]


def test_a_function_outside_the_ported_classes_is_named_with_where_reading_stops() -> None:
    """Beside a ported class, a module function holding attention the recogniser does not read is named with where
    its reading stops (the warning next to the one above, from the same pass)."""
    source = TWO_ATTENTIONS + textwrap.dedent(
        """

        def odd(q, k, v):
            s = torch.matmul(q, k.transpose(-1, -2))
            s = s.permute(0, 1, 3, 2).softmax(-1).permute(0, 1, 3, 2)
            return torch.matmul(s, v)
        """
    )
    tree = ast.parse(source)
    result = _ported(source, _site(*FIRST), classes=("TwoAttention",))
    warnings = _unported(source, tree, tree, screen(tree), result).warnings
    assert warnings[0].startswith("odd (line ")
    assert "stays eager: eager attention in a form the tool does not recognise" in warnings[0]
    assert "`.permute()` is applied to the scores (S101)" in warnings[0]
    assert warnings[1].startswith(f"TwoAttention.forward (line {SECOND_SOFTMAX}) stays eager: eager attention beside")
