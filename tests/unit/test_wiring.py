"""How a class-style port is wired (issue 35): which mask helpers it swaps, where a None mask may mean causal, and
whether a model built with "sdpa" builds the SDPA class at all. Each group starts from a file of
`wiring_sources.py` that the tool once ported wrongly."""

from __future__ import annotations

import ast

import libcst as cst
import pytest
from wiring_sources import ALWAYS_CAUSAL, OVERRIDDEN, PER_CALL, QFORMER, replaced, src

from sdpa_port import Status, port_source
from sdpa_port.analyse.mask_helpers import MaskHelpers
from sdpa_port.analyse.mask_values import implementation_test
from sdpa_port.analyse.module_facts import ModuleFacts


def port(source: str) -> str:
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    return result.source


def refusal_codes(source: str) -> set[str]:
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, (result.status, result.detail)
    return {r.code.code for r in result.refusals}


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


# ---------------------------------------------------------------- 2. causality the caller chooses per call

LOOKUP = "        self.attention = TINY_ATTENTION_CLASSES[config._attn_implementation](config)\n"


def test_a_helper_chosen_by_a_call_argument_keeps_the_causal_masks() -> None:
    """PER_CALL's model picks the causal or the plain helper by its `is_decoder` argument, and its attention says
    `self.is_causal = True`: the plain helper's None for an unpadded bidirectional call was read as causal (wrong
    by 10.7 in tests/acceptance/test_wiring_440.py). The causal helper now keeps its full masks there; the plain
    one's None means no mask."""
    ported = port(PER_CALL)
    assert "_prepare_4d_causal_attention_mask_for_sdpa" not in ported and "sdpa_is_causal" not in ported
    assert "_prepare_4d_attention_mask_for_sdpa(attention_mask, hidden_states.dtype, tgt_len=shape[1])" in ported


def test_a_helper_chosen_by_the_config_is_the_same_question() -> None:
    by_config = replaced(PER_CALL, "        if is_decoder:\n", "        if self.config.is_decoder:\n")
    assert "sdpa_is_causal" not in port(by_config)


def test_a_module_marked_causal_where_causal_masks_reach_it_keeps_the_fast_path() -> None:
    assert "sdpa_is_causal = attention_mask is None and self.is_causal" in port(ALWAYS_CAUSAL)


def test_marks_are_read_per_construction() -> None:
    """`self.is_causal = is_causal` from `__init__`, read at each construction: every layer the causal helper's masks
    reach must pass `is_causal=True`. One built with the default False beside one passing True had the contract
    (some construction passed True), and read the None of an unpadded causal mask as no mask."""
    per_site = replaced(
        replaced(ALWAYS_CAUSAL, "    def __init__(self, config):\n        super().__init__()\n        self.num_heads",
                 "    def __init__(self, config, is_causal=False):\n        super().__init__()\n        self.num_heads"),
        "        self.is_causal = True\n", "        self.is_causal = is_causal\n",
    )
    two = replaced(
        replaced(per_site, LOOKUP, LOOKUP.replace("(config)", "(config, is_causal=True)")
                 + "        self.second = TINY_ATTENTION_CLASSES[config._attn_implementation](config{second})\n"),
        "        hidden_states = self.norm(hidden_states + self.attention(hidden_states, attention_mask))\n",
        "        hidden_states = self.norm(hidden_states + self.attention(hidden_states, attention_mask))\n"
        "        hidden_states = hidden_states + self.second(hidden_states, attention_mask)\n",
    )
    assert "sdpa_is_causal" in port(two.replace("{second}", ", is_causal=True"))
    assert "sdpa_is_causal" not in port(two.replace("{second}", ""))  # left at False, given causal masks
    assert "sdpa_is_causal" not in port(two.replace("{second}", ", True"))  # not read: a positional argument


def test_a_loop_zipping_the_layers_is_followed() -> None:
    """`for layer, layer_head_mask in zip(self.layers, head_mask)` (the fixtures' decoder): the masks reaching the
    layers are seen, so the causal contract can be shown."""
    zipped = replaced(
        replaced(ALWAYS_CAUSAL, "        for layer in self.layers:\n", "        for layer, scale in zip(self.layers, [1.0, 1.0]):\n"),
        "            hidden_states = layer(hidden_states, mask)\n", "            hidden_states = layer(hidden_states, mask) * scale\n",
    )
    assert "sdpa_is_causal" in port(zipped)
    unpacked = replaced(zipped, "for layer, scale in zip(", "for pair in zip(").replace(
        "layer(hidden_states, mask) * scale", "pair[0](hidden_states, mask) * pair[1]"
    )
    assert "sdpa_is_causal" not in port(unpacked)  # the layer is not a name the flow follows


def test_a_file_calling_the_causal_twin_itself_is_refused_where_none_cannot_mean_causal() -> None:
    """PLBart's model code (Bart's) calls `_prepare_4d_causal_attention_mask_for_sdpa` itself: its None reaches the
    layers whatever the port does, so an SDPA class not marked causal where it arrives would attend to every key."""
    twin = replaced(
        replaced(ALWAYS_CAUSAL, "_prepare_4d_attention_mask, _prepare_4d_causal_attention_mask\n",
                 "_prepare_4d_attention_mask, _prepare_4d_causal_attention_mask_for_sdpa\n"),
        "mask = _prepare_4d_causal_attention_mask(", "mask = _prepare_4d_causal_attention_mask_for_sdpa(",
    )
    assert "sdpa_is_causal = attention_mask is None and self.is_causal" in port(twin)
    unmarked = replaced(twin, "        self.is_causal = True\n", "")
    assert refusal_codes(unmarked) == {"C301"}


@pytest.mark.parametrize(
    "test,expected",
    [
        ('config._attn_implementation == "flash_attention_2"', False),
        ('self.config._attn_implementation != "eager"', True),
        ('config._attn_implementation in ("sdpa", "flash_attention_2")', True),
        ("self._use_flash_attention_2", False),
        ("not self._use_flash_attention_2 and x", None),
        ("self._use_flash_attention_2 and x", False),
        ("self.other", None),
        ("config._attn_implementation == name", None),
    ],
)
def test_tests_of_the_implementation_decided_on_the_sdpa_side(test: str, expected: bool | None) -> None:
    """The mask flow follows only the SDPA side of such tests (OPT's flash branch passes the 2-D mask on)."""
    flags = {"_use_flash_attention_2": [ast.parse('config._attn_implementation == "flash_attention_2"', mode="eval").body]}
    assert implementation_test(ast.parse(test, mode="eval").body, flags.get) is expected


# ---------------------------------------------------------------- 3. a port is written only if sdpa reaches it


@pytest.mark.parametrize(
    "before",
    [
        '        config._attn_implementation = "eager"\n',
        '        config._attn_implementation = "flash_attention_2"\n',
        '        setattr(config, "_attn_implementation", "eager")\n',
        '        config.update({"_attn_implementation": "eager"})\n',
        '        TINY_ATTENTION_CLASSES["flash_attention_2"] = TinyAttention\n',
    ],
)
def test_a_selection_the_file_overrides_is_refused(before: str) -> None:
    """OVERRIDDEN's layer sets the implementation before its lookup: a model built with "sdpa" kept building the
    eager class while the port claimed `_supports_sdpa = True`."""
    source = replaced(ALWAYS_CAUSAL, LOOKUP, before + LOOKUP)
    assert refusal_codes(source) == {"W409"}


def test_the_overridden_layer_is_refused() -> None:
    assert refusal_codes(OVERRIDDEN) == {"W409"}


def test_handing_on_the_implementation_chosen_is_no_override() -> None:
    """A sub-config or a module attribute given the parent's choice (IDEFICS2, Bark, Mistral) selects as the model
    does."""
    handed = replaced(ALWAYS_CAUSAL, LOOKUP, "        config.text_config._attn_implementation = config._attn_implementation\n"
                      "        self._attn_implementation = config._attn_implementation\n" + LOOKUP)
    assert "class TinySdpaAttention" in port(handed)
