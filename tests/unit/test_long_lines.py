"""Before/after pairs for `rewrite/long_lines.py`: the lines a port wrote past the line length, laid out as ruff
format lays them out; the original's own lines as they were."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from helpers import flat

from sdpa_port.rewrite.long_lines import lay_out_long_lines

ORIGINAL = """
class Attention:
    def forward(self, query, key, value, mask, causal):
        long_original_name = torch.where(causal, query.new_zeros(()) if mask is None else mask, torch.finfo(query.dtype).min)
        return long_original_name
"""

# a call chain: the arguments of the last bracket that lets every line fit, one line below, else one per line
CHAIN = """
class Attention:
    def forward(self, query, key, value, mask, causal):
        sdpa_mask = torch.where(causal_mask_of_the_model, sdpa_query.new_zeros(()) if sdpa_mask is None else sdpa_mask, torch.finfo(sdpa_query.dtype).min).to(sdpa_query.dtype)
        return sdpa_mask
"""
CHAIN_AFTER = """
class Attention:
    def forward(self, query, key, value, mask, causal):
        sdpa_mask = torch.where(
            causal_mask_of_the_model,
            sdpa_query.new_zeros(()) if sdpa_mask is None else sdpa_mask,
            torch.finfo(sdpa_query.dtype).min,
        ).to(sdpa_query.dtype)
        return sdpa_mask
"""
HUGGED = """
class Attention:
    def forward(self, query, key, value, mask, causal):
        sdpa_mask = mask.clamp(min=torch.tensor(torch.finfo(query_states.dtype).min, device=query_states.device), max=0)
        return sdpa_mask
"""
HUGGED_AFTER = """
class Attention:
    def forward(self, query, key, value, mask, causal):
        sdpa_mask = mask.clamp(
            min=torch.tensor(torch.finfo(query_states.dtype).min, device=query_states.device), max=0
        )
        return sdpa_mask
"""

# a value that is no call: in parentheses on a line of its own (a call inside it is not split)
VALUE = """
class Attention:
    def forward(self, query, key, value, mask, causal):
        sdpa_is_causal = sdpa_mask is None and self.is_causal and key_value_states is None and query_states.size(-2) > 1
        return sdpa_is_causal
"""
VALUE_AFTER = """
class Attention:
    def forward(self, query, key, value, mask, causal):
        sdpa_is_causal = (
            sdpa_mask is None and self.is_causal and key_value_states is None and query_states.size(-2) > 1
        )
        return sdpa_is_causal
"""

# a condition: in parentheses, one operand of its `and` per line where one line is too long
CONDITION = """
class Model:
    def forward(self, attention_mask, output_attentions, head_mask):
        if self.config._attn_implementation == "sdpa" and not output_attentions and head_mask is None and not is_torch_fx_proxy(attention_mask):
            return 1
        elif attention_mask is None:
            return 2
"""
CONDITION_AFTER = """
class Model:
    def forward(self, attention_mask, output_attentions, head_mask):
        if (
            self.config._attn_implementation == "sdpa"
            and not output_attentions
            and head_mask is None
            and not is_torch_fx_proxy(attention_mask)
        ):
            return 1
        elif attention_mask is None:
            return 2
"""

# what no layout brings within the line length stays, and so does a statement with a comment inside
STAYS = """
class Model:
    def forward(self):
        warn("a message long enough that no layout of this statement fits within the line length of the file, as is")
        value = f(
            a,  # the first
        ).g(b, cccccccccccccccccccccccccccccccccc, dddddddddddddddddddddddddddddd, eeeeeeeeeeeeeeeeeeeeeeeeeeeee, ffff)
"""

# an argument still too long on its own line is laid out in turn, one level deeper: its call's arguments, a list's
# elements one per line (a call already one argument per line keeps that layout)
NESTED = """
class Attention:
    def forward(self, q, k, v):
        x = torch.nn.functional.scaled_dot_product_attention(
            q,
            attn_mask=add_positions_past_cls(k.new_zeros(scores_shape), q, self.has_cls, (H, W), self.pos_h, self.pos_w).to(q.dtype),
            scale=1.0,
        ).transpose(1, 2)
        sdpa_query = torch.cat([torch.cat([token_query, token_query.new_zeros(token_query.shape[:-1] + memory_query.shape[-1:])], dim=-1), memory_query_of_the_block], dim=-2)
        return x
"""
NESTED_AFTER = """
class Attention:
    def forward(self, q, k, v):
        x = torch.nn.functional.scaled_dot_product_attention(
            q,
            attn_mask=add_positions_past_cls(
                k.new_zeros(scores_shape), q, self.has_cls, (H, W), self.pos_h, self.pos_w
            ).to(q.dtype),
            scale=1.0,
        ).transpose(1, 2)
        sdpa_query = torch.cat(
            [
                torch.cat(
                    [token_query, token_query.new_zeros(token_query.shape[:-1] + memory_query.shape[-1:])], dim=-1
                ),
                memory_query_of_the_block,
            ],
            dim=-2,
        )
        return x
"""

# one operator: its operands' own brackets split (the last operand's chain, else its parenthesized base, else a
# parenthesized first operand), an operand inside still too long one operand per line, the operator leading
OPERAND_BRACKETS = """
class Attention:
    def forward(self, q, mask):
        sdpa_mask = sdpa_mask + (q.new_zeros(scores_shape).view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1)).to(q.dtype)
        sdpa_mask = sdpa_mask + (q.new_zeros(scores_shape).view(batch_windows // windows, windows, self.num_attention_heads, length) + mask.unsqueeze(1)).to(q.dtype)
        sdpa_mask = (position.permute(2, 3, 0, 1) + self.head_bias[(None,) * (4 - self.head_bias.dim())].permute(2, 3, 0, 1)) * self.scale
        return sdpa_mask
"""
OPERAND_BRACKETS_AFTER = """
class Attention:
    def forward(self, q, mask):
        sdpa_mask = sdpa_mask + (
            q.new_zeros(scores_shape).view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1)
        ).to(q.dtype)
        sdpa_mask = sdpa_mask + (
            q.new_zeros(scores_shape).view(batch_windows // windows, windows, self.num_attention_heads, length)
            + mask.unsqueeze(1)
        ).to(q.dtype)
        sdpa_mask = (
            position.permute(2, 3, 0, 1) + self.head_bias[(None,) * (4 - self.head_bias.dim())].permute(2, 3, 0, 1)
        ) * self.scale
        return sdpa_mask
"""

# operators of one kind more than once: in parentheses, one operand per line, the operator leading (the last
# operand's brackets stay whole)
OPERANDS = """
class Attention:
    def forward(self, q, mask):
        sdpa_mask = relative_position_bias_of_layer + absolute_position_bias_of_layer + attention_mask_of(batch_of_inputs_with_its_padding)
        return sdpa_mask
"""
OPERANDS_AFTER = """
class Attention:
    def forward(self, q, mask):
        sdpa_mask = (
            relative_position_bias_of_layer
            + absolute_position_bias_of_layer
            + attention_mask_of(batch_of_inputs_with_its_padding)
        )
        return sdpa_mask
"""

# a conditional expression: `body` / `if test` / `else orelse` in parentheses, each part laid out in turn
CONDITIONAL = """
class Attention:
    def forward(self, query_layer, attention_mask, sdpa_mask):
        sdpa_mask = torch.where(attention_mask, query_layer.new_zeros(()), torch.finfo(query_layer.dtype).min).to(query_layer.dtype) if sdpa_mask is None else torch.where(attention_mask, sdpa_mask, torch.finfo(query_layer.dtype).min)
        return sdpa_mask
"""
CONDITIONAL_AFTER = """
class Attention:
    def forward(self, query_layer, attention_mask, sdpa_mask):
        sdpa_mask = (
            torch.where(attention_mask, query_layer.new_zeros(()), torch.finfo(query_layer.dtype).min).to(
                query_layer.dtype
            )
            if sdpa_mask is None
            else torch.where(attention_mask, sdpa_mask, torch.finfo(query_layer.dtype).min)
        )
        return sdpa_mask
"""

# a call laid out one argument per line already, inside another call's brackets: moved to a line of its own, its lines
# move one level deeper with it, and an argument still too long is laid out one level below its own call's lines
MOVED = """
class Attention:
    def forward(self, x, mask=None):
        return self.out(torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=torch.atleast_2d(torch.as_tensor((0.0 if mask is None else mask), dtype=q.dtype, device=q.device)),
            scale=1.0 / math.sqrt(self.head_dim),
        ).transpose(1, 2).reshape(b, n, c))
"""
MOVED_AFTER = """
class Attention:
    def forward(self, x, mask=None):
        return self.out(
            torch.nn.functional.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=torch.atleast_2d(
                    torch.as_tensor((0.0 if mask is None else mask), dtype=q.dtype, device=q.device)
                ),
                scale=1.0 / math.sqrt(self.head_dim),
            ).transpose(1, 2).reshape(b, n, c),
        )
"""


@pytest.mark.parametrize(
    ("ported", "after"),
    [
        (CHAIN, CHAIN_AFTER),
        (HUGGED, HUGGED_AFTER),
        (VALUE, VALUE_AFTER),
        (CONDITION, CONDITION_AFTER),
        (STAYS, STAYS),
        (NESTED, NESTED_AFTER),
        (OPERAND_BRACKETS, OPERAND_BRACKETS_AFTER),
        (OPERANDS, OPERANDS_AFTER),
        (CONDITIONAL, CONDITIONAL_AFTER),
        (MOVED, MOVED_AFTER),
    ],
    ids=[
        "chain", "hugged", "value", "condition", "stays", "nested", "operand-brackets", "operands", "conditional", "moved"
    ],
)
def test_written_lines_are_laid_out_within_the_line_length(ported: str, after: str) -> None:
    laid = lay_out_long_lines(_module("pass\n"), _module(ported))
    assert laid.code == _dedented(after)
    assert flat(laid.code) == flat(_dedented(ported))
    assert all(len(line) <= 119 for line in laid.code.splitlines()) or after == STAYS


def test_the_original_files_own_lines_stay_as_written() -> None:
    original = _module(ORIGINAL)
    assert lay_out_long_lines(original, original).code == original.code
    assert lay_out_long_lines(_module("pass\n"), original).code != original.code  # the same line, written by a port


def _module(text: str) -> cst.Module:
    return cst.parse_module(_dedented(text))


def _dedented(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")
