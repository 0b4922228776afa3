"""Build small modules around snippets and run the analysis on them."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst

from sdpa_port.analyse.lines import Lines, top_level_starts
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.recognise import ClassAnalysis, analyse_class

HEADER = """\
import math

import torch
from torch import nn
"""


def attention_module(body: str, init: str = "", helpers: str = "", signature: str = "query, key, value, attention_mask=None, head_mask=None, output_attentions=False") -> str:
    """A module with one `Attention(nn.Module)` whose forward runs `body`."""
    init_block = textwrap.indent(textwrap.dedent(init).strip() or "pass", " " * 8)
    body_block = textwrap.indent(textwrap.dedent(body).strip(), " " * 8)
    helper_block = textwrap.indent(textwrap.dedent(helpers).strip(), " " * 4) if helpers.strip() else ""
    return (
        f"{HEADER}\n\nclass Attention(nn.Module):\n"
        f"    def __init__(self, config):\n        super().__init__()\n{init_block}\n\n"
        f"    def forward(self, {signature}):\n{body_block}\n"
        + (f"\n{helper_block}\n" if helper_block else "")
    )


def analyse(source: str, class_name: str = "Attention") -> ClassAnalysis | None:
    module = cst.parse_module(source)
    tree = ast.parse(source)
    facts = ModuleFacts.of(module, tree)
    lines = Lines(module, top_level_starts(tree))
    lines.prepare([info.name for info in facts.mro(class_name)])
    return analyse_class(facts, class_name, lines)
