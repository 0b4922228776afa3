"""How a class-style port is wired (issue 35): which mask helpers it swaps. Each group starts from a file of
`wiring_sources.py` that the tool once ported wrongly."""

from __future__ import annotations

import ast

import libcst as cst
import pytest
from wiring_sources import ALWAYS_CAUSAL, QFORMER, replaced, src

from sdpa_port import Status, port_source
from sdpa_port.analyse.mask_helpers import MaskHelpers
from sdpa_port.analyse.module_facts import ModuleFacts


def port(source: str) -> str:
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    return result.source


def helpers(source: str) -> MaskHelpers:
    return MaskHelpers.of(ModuleFacts.of(cst.parse_module(source), ast.parse(source)))


# ---------------------------------------------------------------- 1. only Transformers' own helpers are rewritten

TRANSFORMERS_MODEL = "from transformers.modeling_utils import PreTrainedModel\n"


@pytest.mark.parametrize(
    "imports,expected",
    [
        # imported from transformers, absolutely, renamed, or relatively from the package its PreTrainedModel is in
        ("from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask\n" + TRANSFORMERS_MODEL,
         {"_prepare_4d_attention_mask": "_prepare_4d_attention_mask"}),
        ("from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask as plain\n" + TRANSFORMERS_MODEL,
         {"plain": "_prepare_4d_attention_mask"}),
        ("from ...modeling_attn_mask_utils import _prepare_4d_causal_attention_mask\n"
         "from ...modeling_utils import PreTrainedModel\n",
         {"_prepare_4d_causal_attention_mask": "_prepare_4d_causal_attention_mask"}),
        # a remote repository's own copy, beside transformers' PreTrainedModel
        ("from .modeling_attn_mask_utils import _prepare_4d_causal_attention_mask\n" + TRANSFORMERS_MODEL, {}),
        # a relative import at another level than the file's transformers imports
        ("from ..modeling_attn_mask_utils import _prepare_4d_attention_mask\n"
         "from ...modeling_utils import PreTrainedModel\n", {}),
        # another library's function of the same name
        ("from lavis.models.masks import _prepare_4d_attention_mask\n" + TRANSFORMERS_MODEL, {}),
        # transformers' function, bound again by the file itself
        ("from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask\n" + TRANSFORMERS_MODEL
         + "\n\ndef _prepare_4d_attention_mask(mask, is_decoder, dtype):\n    return mask\n", {}),
    ],
)
def test_a_helper_is_transformers_own_only_through_the_imports(imports: str, expected: dict[str, str]) -> None:
    assert helpers(imports).functions == expected


METHODS = TRANSFORMERS_MODEL + src(
    """
    from lavis.models.base_model import BaseEncoder


    class Base(PreTrainedModel):
        pass


    class Inherits(Base):
        pass


    class Overrides(Base):
        def get_extended_attention_mask(self, attention_mask, input_shape, device, is_decoder, has_query=False):
            return attention_mask


    class BelowOverride(Overrides):
        pass


    class Overridden(Base):
        pass


    class OverridesBelow(Overridden):
        def get_extended_attention_mask(self, attention_mask, input_shape):
            return attention_mask


    class Mixed(Base, BaseEncoder):
        pass


    class Module:
        pass
    """
)


def test_the_extended_helper_is_transformers_own_only_up_the_in_file_classes() -> None:
    """Inherited through in-file classes from transformers' PreTrainedModel, overridden nowhere on the way or below
    (a subclass's override is what its instances call through the inherited method), and no base of another
    library that could define it. `Base` is out: the instances of its subclass `Overrides` call their own."""
    assert helpers(METHODS).extended == {"Inherits"}


def test_a_models_own_extended_helper_keeps_its_call() -> None:
    """LAVIS's Q-Former defines `get_extended_attention_mask(self, attention_mask, input_shape, device, is_decoder,
    has_query=False)`: it was rewritten as `_prepare_4d_attention_mask_for_sdpa(attention_mask, is_decoder,
    tgt_len=1)` (the caller's `is_decoder` taken for a dtype: every padded input raised), under a guard reading
    `self.config.is_decoder` where the helper reads the caller's argument (a decoder call lost its causal mask)."""
    ported = port(QFORMER)
    assert "_for_sdpa" not in ported
    assert "extended = self.get_extended_attention_mask(attention_mask, input_ids.shape, input_ids.device, is_decoder)" in ported
    assert "class TinySdpaAttention(TinyAttention)" in ported  # the attention itself is ported, fed the full mask


def test_the_inherited_extended_helper_is_still_swapped() -> None:
    inherited = replaced(
        QFORMER,
        "self.get_extended_attention_mask(attention_mask, input_ids.shape, input_ids.device, is_decoder)",
        "self.get_extended_attention_mask(attention_mask, input_ids.shape)",
    )
    inherited = inherited[: inherited.index("    def get_extended_attention_mask")] + inherited[
        inherited.index("    def forward(self, input_ids") :
    ]
    assert "_prepare_4d_attention_mask_for_sdpa(attention_mask, self.dtype, tgt_len=1)" in port(inherited)


def test_a_remote_copy_of_the_causal_helper_is_no_causal_contract() -> None:
    """A repository's own `modeling_attn_mask_utils.py` may return anything for an unpadded batch; only transformers'
    helper has a `_for_sdpa` twin whose None means causal."""
    own = replaced(
        ALWAYS_CAUSAL,
        "from transformers.modeling_attn_mask_utils import _prepare_4d_attention_mask, _prepare_4d_causal_attention_mask\n",
        "from .modeling_attn_mask_utils import _prepare_4d_attention_mask, _prepare_4d_causal_attention_mask\n",
    )
    ported = port(own)
    assert "_for_sdpa" not in ported and "sdpa_is_causal" not in ported
    assert "_for_sdpa" in port(ALWAYS_CAUSAL) and "sdpa_is_causal" in port(ALWAYS_CAUSAL)
