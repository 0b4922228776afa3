"""One SDPA call where forward chooses between helpers making the same one (`plan/one_call.py`), and what tells it.

The fixture `modeling_tiny_twin.py` is GPT-2's shape: `_attn` beside `_upcast_and_reordered_attn`, chosen by a
setting. Each change below to its reordered helper makes another call, and the port keeps both branches.
"""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.shapes import Context, shape_of
from sdpa_port.analyse.views import reduced
from helpers import flat

FIXTURE = (Path(__file__).resolve().parents[2] / "fixtures" / "class_style" / "modeling_tiny_twin.py").read_text(
    encoding="utf-8"
)
REORDERED = FIXTURE[FIXTURE.index("    def _upcast_and_reordered_attn") : FIXTURE.index("    def _split_heads")]


def _sdpa_calls(source: str) -> int:
    result = port_source(source, filename="modeling_tiny_twin.py")
    assert result.status is Status.PORTED, result.reasons
    sdpa_class = result.source[result.source.index("class TinyTwinSdpaAttention") :].split("\nclass ", 1)[0]
    return sdpa_class.count("torch.nn.functional.scaled_dot_product_attention(")


def _reordered(old: str, new: str) -> str:
    """The fixture with one change to the reordered helper, whose text holds `old` once."""
    assert REORDERED.count(old) == 1, old
    return FIXTURE.replace(REORDERED, REORDERED.replace(old, new))


def test_helpers_making_the_same_call_make_one() -> None:
    assert _sdpa_calls(FIXTURE) == 1


def test_the_scale_in_another_order_of_statements_is_the_same_call() -> None:
    """`1.0 / float(d) ** 0.5` written at once, the `float` of a size changing no quotient."""
    changed = _reordered(
        "        scale_factor = 1.0\n        scale_factor /= float(value.size(-1)) ** 0.5\n",
        "        scale_factor = 1.0 / float(value.size(-1)) ** 0.5\n",
    )
    assert _sdpa_calls(changed) == 1


@pytest.mark.parametrize(
    "old,new",
    [
        # another scale: the size itself, not its square root
        ("scale_factor /= float(value.size(-1)) ** 0.5", "scale_factor /= float(value.size(-1))"),
        # the layer scale under no setting
        (
            "        if self.scale_by_layer:\n            scale_factor /= float(self.layer_idx + 1)\n",
            "        scale_factor /= float(self.layer_idx + 1)\n",
        ),
        # the layer scale under another setting
        ("        if self.scale_by_layer:\n", "        if self.reorder_and_upcast:\n"),
        # no padding mask added
        (
            "        if attention_mask is not None:\n            attn_weights = attn_weights + attention_mask\n",
            "",
        ),
        # causal from the top left (the slice of the first rows, not the last)
        ("self.bias[:, :, key_length - query_length : key_length, :key_length]", "self.bias[:, :, :query_length, :key_length]"),
        # not causal at all
        ("        attn_weights = torch.where(causal_mask, attn_weights, mask_value)\n", ""),
        # no dropout
        ("        attn_weights = self.attn_dropout(attn_weights)\n", ""),
        # another value
        ("return torch.matmul(attn_weights, value), attn_weights", "return torch.matmul(attn_weights, value.flip(-1)), attn_weights"),
        # another key: its heads in the other order
        ("key.transpose(-1, -2).reshape(-1, dk, k_seq_len)", "key.flip(1).transpose(-1, -2).reshape(-1, dk, k_seq_len)"),
    ],
    ids=["scale", "unguarded", "other-setting", "mask", "top-left", "not-causal", "dropout", "value", "key"],
)
def test_helpers_making_other_calls_keep_theirs(old: str, new: str) -> None:
    assert _sdpa_calls(_reordered(old, new)) == 2


def test_keys_whose_heads_forward_does_not_tell_keep_both_calls() -> None:
    """The reordered helper splits the flattened key again with the query's batch and heads: the same key only where
    forward's text shows the key's heads and last size are the query's."""
    changed = FIXTURE.replace(
        "        key = self._split_heads(key, self.num_heads, self.head_dim)\n",
        "        key = key.view(*key.shape[:2], -1, self.head_dim).permute(0, 2, 1, 3)\n",
    )
    assert _sdpa_calls(changed) == 2


def test_a_test_that_calls_something_keeps_both_calls() -> None:
    """Leaving out a test that calls a method would leave out the call."""
    changed = FIXTURE.replace("        if self.reorder_and_upcast:\n", "        if self.reorder_and_upcast and self.training_step():\n")
    assert _sdpa_calls(changed) == 2


def test_the_branch_kept_hands_the_operands_over_in_the_value_dtype() -> None:
    """The plain helper's port casts query and key to the value's dtype, the upcast one's hands them as they are: the
    first is kept (where the dtypes differ, the second's SDPA call would not run)."""
    result = port_source(FIXTURE, filename="modeling_tiny_twin.py")
    sdpa_class = result.source[result.source.index("class TinyTwinSdpaAttention") :].split("\nclass ", 1)[0]
    assert "sdpa_query = query.to(value.dtype)" in sdpa_class
    assert "baddbmm" not in sdpa_class and "reorder_and_upcast" not in sdpa_class


def test_the_fill_tensor_made_only_to_fill_goes() -> None:
    """`mask_value`, the least number of the scores' dtype in a 0-d tensor, is written as the number where it fills;
    its statements and their comment go."""
    result = port_source(FIXTURE, filename="modeling_tiny_twin.py")
    sdpa_class = result.source[result.source.index("class TinyTwinSdpaAttention") :].split("\nclass ", 1)[0]
    assert "mask_value" not in sdpa_class and "a 0-d tensor" not in sdpa_class
    assert "sdpa_query.new_zeros(()) if sdpa_mask is None else sdpa_mask, torch.finfo(sdpa_query.dtype).min)" in flat(sdpa_class)


def test_a_fill_tensor_of_another_dtype_stays() -> None:
    changed = FIXTURE.replace(
        "mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)",
        "mask_value = torch.full([], mask_value, dtype=torch.float32, device=attn_weights.device)",
    )
    result = port_source(changed, filename="modeling_tiny_twin.py")
    assert result.status is Status.PORTED, result.reasons
    sdpa_class = result.source[result.source.index("class TinyTwinSdpaAttention") :].split("\nclass ", 1)[0]
    assert "mask_value = torch.full([], mask_value, dtype=torch.float32" in sdpa_class


SPLIT_HEADS = (
    "def _split_heads(self, tensor, num_heads, size):\n"
    "    new_shape = tensor.size()[:-1] + (num_heads, size)\n"
    "    tensor = tensor.view(new_shape)\n"
    "    return tensor.permute(0, 2, 1, 3)\n"
)


@pytest.mark.parametrize(
    "statements,expression,shape",
    [
        # GPT-2's split: the leading sizes kept, the permute telling there are two of them
        ("q = self._split_heads(x, self.num_heads, self.head_dim)\n", "q", (None, "self.num_heads", None, "self.head_dim")),
        # through a cache joined along the length
        (
            "k = self._split_heads(x, self.num_heads, self.head_dim)\nk = torch.cat((past, k), dim=-2)\n",
            "k",
            (None, "self.num_heads", None, "self.head_dim"),
        ),
        # the leading sizes read where the viewed tensor's are known
        ("q = x.view(b, n, 8)\nq = q.view(q.size()[:-1] + (2, 4))\n", "q", ("b", "n", "2", "4")),
        # no permute: how many leading sizes there are is not told
        ("q = x.view(x.size()[:-1] + (2, 4))\n", "q", None),
    ],
)
def test_shape_of_reads_heads_split_after_the_leading_sizes(
    statements: str, expression: str, shape: tuple[str | None, ...] | None
) -> None:
    methods = {"_split_heads": cst.ensure_type(cst.parse_module(SPLIT_HEADS).body[0], cst.FunctionDef)}
    body = list(cst.parse_module(statements).body)
    assert shape_of(cst.parse_expression(expression), Context(body), methods.get) == shape


def _reduced(text: str, sizes: dict[str, str] | None = None) -> str:
    """`text` reduced, the tensors `q` and `k` of rank 4, `k`'s sizes in `sizes` known equal to `q`'s."""
    aliases = sizes or {}

    def size_key(node: ast.expr) -> str:
        written = ast.unparse(node)
        return aliases.get(written, written)

    return reduced(ast.parse(text, mode="eval").body, lambda base: 4 if ast.unparse(base) in "qk" else None, size_key)


@pytest.mark.parametrize(
    "text,sizes,result",
    [
        ("q.reshape(-1, q.size(2), q.size(3)).unflatten(0, (q.size(0), q.size(1)))", None, "q"),
        ("q.transpose(-1, -2).transpose(2, 3).contiguous()", None, "q"),
        # the key split with the query's sizes: the key where its heads and last size are the query's
        (
            "k.transpose(-1, -2).reshape(-1, q.size(3), k.size(2)).transpose(-1, -2).unflatten(0, (q.size(0), q.size(1)))",
            {"k.size(1)": "q.size(1)", "k.size(3)": "q.size(3)"},
            "k",
        ),
        # ... and not where only its heads are known to be
        (
            "k.transpose(-1, -2).reshape(-1, q.size(3), k.size(2)).transpose(-1, -2).unflatten(0, (q.size(0), q.size(1)))",
            {"k.size(1)": "q.size(1)"},
            None,
        ),
        # a merge split again with the sizes in the other order
        ("q.reshape(-1, q.size(2), q.size(3)).unflatten(0, (q.size(1), q.size(0)))", None, None),
        # the bytes viewed as another dtype first
        ("q.view(torch.float16).reshape(-1, q.size(2), q.size(3)).unflatten(0, (q.size(0), q.size(1)))", None, None),
    ],
)
def test_views_that_undo_each_other_go(text: str, sizes: dict[str, str] | None, result: str | None) -> None:
    got = _reduced(text, sizes)
    if result is None:
        assert got != ast.dump(ast.parse("q" if text.startswith("q") else "k", mode="eval").body)
    else:
        assert got == ast.dump(ast.parse(result, mode="eval").body)
