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


def test_every_softmax_reaching_a_product_is_a_site() -> None:
    tree = ast.parse(TWO_ATTENTIONS)
    assert [site.line for site in find_eager_attention(tree)] == [9]
    # the softmax over dim 0 feeds no product: no site
    assert [site.line for site in find_eager_attention(tree, every=True)] == [9, SECOND_SOFTMAX]


def test_the_attention_beside_the_ported_one_is_found() -> None:
    tree = ast.parse(TWO_ATTENTIONS)
    result = PortResult(Status.PORTED, TWO_ATTENTIONS, Style.INLINE, sites=(_site(*FIRST),))  # type: ignore[arg-type]
    found = _beside_ported_sites(tree, result, {"TwoAttention.forward"})
    assert [(site.where, site.line) for site in found] == [("TwoAttention.forward", SECOND_SOFTMAX)]
    both = PortResult(Status.PORTED, TWO_ATTENTIONS, Style.INLINE, sites=(_site(*FIRST), _site(11, 13)))  # type: ignore[arg-type]
    assert _beside_ported_sites(tree, both, {"TwoAttention.forward"}) == []


def test_a_site_read_from_elsewhere_leaves_its_class_unjudged() -> None:
    """Scores read from a helper written out at its call give a product line after the output's: no span to judge."""
    tree = ast.parse(TWO_ATTENTIONS)
    result = PortResult(Status.PORTED, TWO_ATTENTIONS, Style.INLINE, sites=(_site(40, 10),))  # type: ignore[arg-type]
    assert _beside_ported_sites(tree, result, {"TwoAttention.forward"}) == []


def test_a_site_with_more_values_leaves_its_class_unjudged() -> None:
    """LiLT's text values take a second softmax of the same scores, ported as a second SDPA call of one site."""
    tree = ast.parse(TWO_ATTENTIONS)
    result = PortResult(Status.PORTED, TWO_ATTENTIONS, Style.CLASS, sites=(_site(*FIRST, ("dv",)),))  # type: ignore[arg-type]
    assert _beside_ported_sites(tree, result, {"TwoAttention.forward"}) == []


def test_the_report_names_it() -> None:
    tree = ast.parse(TWO_ATTENTIONS)
    result = PortResult(
        Status.PORTED,
        TWO_ATTENTIONS,
        Style.INLINE,
        attention_classes=("TwoAttention",),
        sites=(_site(*FIRST),),  # type: ignore[arg-type]
    )
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
    result = PortResult(Status.PORTED, source, Style.INTERFACE, sites=(_site(*FIRST),))  # type: ignore[arg-type]
    assert _beside_ported_sites(tree, result, {"forward"}) == []


def test_a_method_nothing_calls_is_not_named() -> None:
    """A helper the file never reads (GPT-2's twin kept by a copy, never called) leaves nothing eager on any path."""
    source = TWO_ATTENTIONS.replace("    def forward(self, q, k, v, dq, dk, dv):", "    def _unused(self, q, k, v, dq, dk, dv):")
    tree = ast.parse(source)
    holding = {"TwoAttention._unused"}
    site = SimpleNamespace(
        class_name="TwoAttention", owner="TwoAttention", method="_unused", line=8, output_line=10, more_values=()
    )
    result = PortResult(Status.PORTED, source, Style.CLASS, sites=(site,))  # type: ignore[arg-type]
    assert _beside_ported_sites(tree, result, holding) == []
    called = source + "\n\ndef run(module):\n    return module._unused(1, 2, 3, 4, 5, 6)\n"
    assert [s.line for s in _beside_ported_sites(ast.parse(called), result, holding)] == [SECOND_SOFTMAX]
