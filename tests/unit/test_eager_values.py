"""Before/after pairs for `plan/eager_values.py` and `analyse/shapes.py`: the eager function of the interface style
computes what it reads from forward where forward's text allows, and keeps a keyword-only parameter otherwise."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.shapes import Context, shape_of
from sdpa_port.plan.eager_values import computes_only

FIXTURE = (Path(__file__).resolve().parents[2] / "fixtures" / "interface_style" / "modeling_tiny_flat5.py").read_text(
    encoding="utf-8"
)

SHAPE_METHOD = "def _shape(self, t, s, b):\n    return t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2)\n"


@pytest.mark.parametrize(
    "statements,expression,shape",
    [
        # a tuple of sizes bound before, `-1` read off the viewed tensor's sizes
        (
            "shape = (b * self.num_heads, -1, self.head_dim)\nq = self._shape(x, n, b).view(*shape)\n",
            "q",
            ("b * self.num_heads", "n", "self.head_dim"),
        ),
        # the first size split again by unflatten
        (
            "q = self._shape(x, n, b).view(b * self.num_heads, -1, self.head_dim)\n",
            "q.unflatten(0, (b, self.num_heads))",
            ("b", "self.num_heads", "n", "self.head_dim"),
        ),
        # `-1` standing for two sizes: not read
        ("q = self._shape(x, n, b).view(b, -1)\n", "q", ("b", None)),
        # sizes that are not the viewed tensor's: `-1` not read
        ("q = self._shape(x, n, b).view(b * n, -1, self.head_dim)\n", "q", ("b * n", None, "self.head_dim")),
        # the tuple bound under a condition: not read
        ("if c:\n    shape = (b, -1)\nq = x.view(*shape)\n", "q", None),
    ],
)
def test_shape_of_reads_views_through_held_sizes_and_unflatten(
    statements: str, expression: str, shape: tuple[str | None, ...] | None
) -> None:
    methods = {"_shape": cst.ensure_type(cst.parse_module(SHAPE_METHOD).body[0], cst.FunctionDef)}
    body = list(cst.parse_module(statements).body)
    assert shape_of(cst.parse_expression(expression), Context(body), methods.get) == shape


def _eager(source: str) -> ast.FunctionDef:
    result = port_source(source, filename="modeling_tiny_flat5.py")
    assert result.status is Status.PORTED, result.reasons
    return next(
        n for n in ast.parse(result.source).body if isinstance(n, ast.FunctionDef) and n.name == "eager_attention_forward"
    )


def _first_lines(function: ast.FunctionDef, count: int) -> list[str]:
    return [ast.unparse(s) for s in function.body[1 : 1 + count]]  # after the docstring


def test_sizes_a_computed_value_and_a_flag_are_had_in_the_eager_function() -> None:
    eager = _eager(FIXTURE)
    assert not eager.args.kwonlyargs
    assert _first_lines(eager, 3) == [
        "bsz, _, tgt_len, _ = query.shape",
        "scale = float(module.head_dim) ** (-0.5)",
        "output_attentions = kwargs.get('output_attentions', False)",
    ]


@pytest.mark.parametrize(
    "change,kept",
    [
        # `tgt_len` bound twice: which value the query's view wrote cannot be told by name
        (("        proj_shape =", "        tgt_len = tgt_len + 0\n        proj_shape ="), ["tgt_len"]),
        # a size computed from the module's attribute and a size had from the query: computed again
        (("        src_len = key_states", "        limit = self.num_heads * bsz\n        src_len = key_states"), []),
        # ... by a method of the module, which may change its state: handed over
        (("        src_len = key_states", "        limit = self.heads() * bsz\n        src_len = key_states"), ["limit"]),
        # the scale read from a value forward was given
        (("scale = float(self.head_dim) ** -0.5", "scale = float(hidden_states.shape[-1]) ** -0.5"), ["scale"]),
        # the flag has no literal default
        (("output_attentions=False):\n        bsz", "output_attentions=NO):\n        bsz"), ["output_attentions"]),
    ],
)
def test_values_the_text_does_not_give_stay_keyword_only(change: tuple[str, str], kept: list[str]) -> None:
    assert change[0] in FIXTURE
    source = FIXTURE.replace(change[0], change[1], 1).replace("import torch\n", "import torch\nNO = False\n", 1)
    if "limit =" in source:
        source = source.replace("if attn_weights.size() != (bsz * self.num_heads,", "if attn_weights.size() != (limit,")
    eager = _eager(source)
    assert [a.arg for a in eager.args.kwonlyargs] == kept


PRODUCT = "        attn_weights = torch.bmm(query_states, key_states.transpose(1, 2)) * scale\n"
MASKED = "            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask\n"
FLOOR = "floor = torch.full((), torch.finfo(attn_weights.dtype).min, device=attn_weights.device)"


def test_values_computed_beside_the_chain_are_computed_in_the_eager_function_too() -> None:
    """XGLM's floor of the masked scores, named after the product (GPT-Neo's causal slice and fill value likewise):
    the statement stays where it stands in the eager function, which takes no `floor` by keyword."""
    assert PRODUCT in FIXTURE and MASKED in FIXTURE
    source = FIXTURE.replace(PRODUCT, f"{PRODUCT}        {FLOOR}\n").replace(
        MASKED, MASKED + "            attn_weights = torch.max(attn_weights, floor)\n"
    )
    eager = _eager(source)
    assert not eager.args.kwonlyargs
    assert FLOOR in [ast.unparse(s) for s in eager.body]


@pytest.mark.parametrize(
    "statement,pure",
    [
        ("n = query.size(-2)", True),
        ("m = torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)", True),
        ("c = self.bias[:, :, k - q : k, :k]", True),
        ("n = int(max(q, k))", True),
        ("m = self.mask_for(q)", False),  # a method of the module: it may keep state
        ("m = self.rotary(q).size(1)", False),
        ("r = torch.rand(())", False),  # a value differing between calls
        ("r = torch.nn.functional.dropout(x, 0.1)", False),
        ("m = torch._private(x)", False),
        ("m = helper(x)", False),  # a function of the file: not read
    ],
)
def test_only_statements_that_compute_are_copied(statement: str, pure: bool) -> None:
    assert computes_only(cst.parse_statement(statement)) is pure
