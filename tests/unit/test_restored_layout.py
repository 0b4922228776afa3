"""The interface style reads the dispatch's output straight where eager's next statement undoes the layout the
dispatch restores (rewrite/restored_layout.py): folded forms, and look-alikes left as they are (torch-free; the
interface-style acceptance tests run the ports)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from sdpa_port.rewrite.restored_layout import fold_restored_layouts


def fold(source: str) -> str:
    module = cst.parse_module(textwrap.dedent(source))
    return module.with_changes(body=fold_restored_layouts(module.body, {"attention_output"})).code


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (  # the restore undone at once: the output itself
            "out = attention_output.transpose(1, 2)\nout = out.transpose(1, 2).contiguous()\n",
            "out = attention_output.contiguous()\n",
        ),
        (  # undone by a permute, then reshaped
            "out = attention_output.transpose(1, 2)\nout = out.permute(0, 2, 1, 3).reshape(b, n, -1)\n",
            "out = attention_output.reshape(b, n, -1)\n",
        ),
        (  # negative dimensions
            "out = attention_output.transpose(1, 2)\nout = out.transpose(-3, -2)[:, :n]\n",
            "out = attention_output[:, :n]\n",
        ),
        (  # two permutations that do not cancel compose into one
            "out = attention_output.transpose(1, 2)\nout = out.transpose(2, 3)\n",
            "out = attention_output.permute(0, 2, 3, 1)\n",
        ),
        (  # inside a block
            "if flag:\n    out = attention_output.transpose(1, 2)\n    out = out.transpose(1, 2).flatten(2)\n",
            "if flag:\n    out = attention_output.flatten(2)\n",
        ),
    ],
)
def test_folded(before: str, after: str) -> None:
    assert fold(before) == after


@pytest.mark.parametrize(
    "source",
    [
        # another name assigned: the restored value stays visible
        "out = attention_output.transpose(1, 2)\nctx = out.transpose(1, 2)\n",
        # the restored value read twice
        "out = attention_output.transpose(1, 2)\nout = out.transpose(1, 2).reshape(out.shape)\n",
        # the permutation not at the root of the chain
        "out = attention_output.transpose(1, 2)\nout = out.contiguous().transpose(1, 2)\n",
        # not the dispatch's output
        "out = other.transpose(1, 2)\nout = out.transpose(1, 2)\n",
        # statements apart
        "out = attention_output.transpose(1, 2)\nx = 1\nout = out.transpose(1, 2)\n",
        # dimensions that are not literals
        "out = attention_output.transpose(1, 2)\nout = out.transpose(a, b)\n",
        # inside a call
        "out = attention_output.transpose(1, 2)\nout = torch.cat([out.transpose(1, 2)])\n",
    ],
)
def test_left_alone(source: str) -> None:
    assert fold(source) == textwrap.dedent(source)
