"""Build small modules around snippets and run the analysis on them."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst

from sdpa_port.analyse.lines import Lines, top_level_starts
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.recognise import ClassAnalysis, analyse_class
from sdpa_port.discover.release import Release

# a release whose sdpa and flex apply `position_bias` (5.17.0 on) and whose implementations update continuous
# batching's paged cache (5.23.0's facts, as tests/unit/test_release.py reads them from sources of that shape)
POSITION_BIAS = Release(
    "5.23.0",
    sdpa_position_bias=True,
    flex_position_bias=True,
    model_updates_paged_cache=False,
    paged_update_parameters=("kwargs",),
    paged_cache_methods=frozenset({"__init__", "update"}),
)
# 5.25.0's: the model updates the paged cache itself, with its kwargs
MODEL_UPDATES = Release(
    "5.25.0",
    sdpa_position_bias=True,
    flex_position_bias=True,
    model_updates_paged_cache=True,
    paged_update_parameters=("kwargs",),
    paged_cache_methods=frozenset({"__init__", "update"}),
)

HEADER = """\
import math

import torch
from torch import nn
"""


def attention_module(
    body: str,
    init: str = "",
    helpers: str = "",
    signature: str = "query, key, value, attention_mask=None, head_mask=None, output_attentions=False",
    init_params: str = "",
) -> str:
    """A module with one `Attention(nn.Module)` whose forward runs `body`; `__init__(self, config, <init_params>)`."""
    init_block = textwrap.indent(textwrap.dedent(init).strip() or "pass", " " * 8)
    body_block = textwrap.indent(textwrap.dedent(body).strip(), " " * 8)
    helper_block = textwrap.indent(textwrap.dedent(helpers).strip(), " " * 4) if helpers.strip() else ""
    return (
        f"{HEADER}\n\nclass Attention(nn.Module):\n"
        f"    def __init__(self, config{', ' + init_params if init_params else ''}):\n"
        f"        super().__init__()\n{init_block}\n\n"
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


def flat(source: str) -> str:
    """`source` with every statement on one line (`ast.unparse`): what a test reads, whatever a long line's layout."""
    return ast.unparse(ast.parse(source))
