"""A term built where none is given and returned for the next layer is laid out once (`rewrite/reused_terms.py`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import libcst as cst

from sdpa_port import Status, port_source
from sdpa_port.rewrite.reused_terms import COMMENT, laid_out_once

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "inline_style" / "modeling_tiny_relpos.py"
LAID_OUT = "position_bias = position_bias.contiguous()"


def _class(source: str, name: str) -> str:
    start = source.index(f"class {name}(")
    end = source.find("\nclass ", start + 1)
    return source[start:] if end < 0 else source[start:end]


def _ported(source: str) -> str:
    result = port_source(source, filename="modeling_reused.py")
    assert result.status is Status.PORTED, result.reasons
    return _class(result.source, "ReusedBiasAttention")


def test_a_bias_built_where_none_is_given_and_returned_is_laid_out_before_the_mask_joins_it() -> None:
    ported = _ported(FIXTURE.read_text(encoding="utf-8"))
    block = ported[ported.index("if position_bias is None:") : ported.index("scaled_dot_product_attention")]
    # after it is built, before the optional mask joins it (a sum of contiguous operands is contiguous), with the
    # reason above it
    built, joined = block.index(".permute(2, 0, 1)"), block.index("if attention_mask is not None")
    assert built < block.index(LAID_OUT) < joined, block
    assert f"{COMMENT}\n            {LAID_OUT}\n            if attention_mask" in block, block
    assert ported.count(LAID_OUT) == 1


def test_a_bias_not_returned_or_built_at_every_call_is_left_as_it_is() -> None:
    source = FIXTURE.read_text(encoding="utf-8")
    reused = _class(source, "ReusedBiasAttention")
    # the next layer never sees it: a copy at every call gains nothing
    unreturned = reused.replace("return self.proj(x), position_bias", "return self.proj(x)")
    assert LAID_OUT not in _ported(source.replace(reused, unreturned))
    # built at every call, not only where none is given
    always = reused.replace("if position_bias is None:", "if True:")
    assert LAID_OUT not in _ported(source.replace(reused, always))


SPLIT = '''
class Attention(nn.Module):
    def forward(self, x, position_bias=None):
        if position_bias is None:
            position_bias = self.bias(x)
        return self.eager(x, position_bias), position_bias


class SdpaAttention(Attention):
    def forward(self, x, position_bias=None):
        if position_bias is None:
            position_bias = self.bias(x)
        bias = position_bias
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=bias), position_bias


class Other(nn.Module):
    def forward(self, x, position_bias=None):
        if position_bias is None:
            position_bias = self.bias(x)
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=position_bias), position_bias
'''


def test_only_the_method_calling_sdpa_in_the_sites_class_or_its_subclass_is_edited() -> None:
    """A class-style port's eager class keeps its code; a term read through a name bound from it (`bias =
    position_bias`) is followed; a class the sites do not name is left alone."""
    site = SimpleNamespace(owner="Attention", method="forward", terms=[SimpleNamespace(expression="bias")])
    new = laid_out_once(cst.parse_module(SPLIT), [site]).code  # type: ignore[list-item]
    assert LAID_OUT not in _class(new, "Attention") and LAID_OUT not in _class(new, "Other")
    assert _class(new, "SdpaAttention").count(LAID_OUT) == 1
    # laid out once: a second pass adds nothing
    assert laid_out_once(cst.parse_module(new), [site]).code == new  # type: ignore[list-item]


CACHED = '''
class Attention(nn.Module):
    def forward(self, x, position_bias=None, past=None, mask=None):
        if position_bias is None:
            position_bias = self.bias(x)
            if past is not None:
                position_bias = position_bias[:, :, -x.size(1) :, :]
            if mask is not None:
                position_bias += mask
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=position_bias), position_bias
'''


def test_the_rows_of_a_cached_step_are_laid_out_after_they_are_sliced_and_before_the_additions() -> None:
    """T5's 4.x block: the bias of every position, then the last rows where a cache is given, then the mask. Laid out
    after the slice, a decoding step copies one row per head, not the whole square."""
    site = SimpleNamespace(owner="Attention", method="forward", terms=[SimpleNamespace(expression="position_bias")])
    new = laid_out_once(cst.parse_module(CACHED), [site]).code  # type: ignore[list-item]
    assert new.index("-x.size(1) :") < new.index(LAID_OUT) < new.index("if mask is not None"), new


NUMBERS = '''
class Attention(nn.Module):
    def bias(self, x):
        return 0.0 if self.table is None else self.table(x)

    def forward(self, x, position_bias=None, mask=None):
        if position_bias is None:
            position_bias = BUILT
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=position_bias), position_bias
'''


def test_a_term_that_may_be_a_number_is_left_as_it_is() -> None:
    """A number has no `.contiguous()`: a literal, a conditional with a number arm, a name, or a method returning a
    number on some path leave the block as it is; a method returning only tensors does not."""
    site = SimpleNamespace(owner="Attention", method="forward", terms=[SimpleNamespace(expression="position_bias")])
    for built in ("0.0", "0.0 if mask is None else mask", "mask", "self.bias(x)", "self.bias(x)[:, None]"):
        source = NUMBERS.replace("BUILT", built)
        assert LAID_OUT not in laid_out_once(cst.parse_module(source), [site]).code, built  # type: ignore[list-item]
    tensors = cst.parse_module(NUMBERS.replace("BUILT", "self.table(x).permute(2, 0, 1)"))
    assert LAID_OUT in laid_out_once(tensors, [site]).code  # type: ignore[list-item]
