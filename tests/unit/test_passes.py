"""Before/after pairs for each rewriting pass, each with a case it must leave alone."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from sdpa_port.rewrite.edit import lay_out_call
from sdpa_port.analyse.mask_helpers import MaskHelpers
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.names import ImportMap
from sdpa_port.rewrite import flags, imports, insert_classes, mask_helpers, register, sub_models
from sdpa_port.rewrite.cleanup import remove_dead
from sdpa_port.rewrite.specialise import Known, specialise


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def function(text: str) -> cst.FunctionDef:
    node = cst.parse_module(src(text)).body[0]
    assert isinstance(node, cst.FunctionDef)
    return node


def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[node]).code if isinstance(node, cst.BaseStatement) else cst.Module([]).code_for_node(node)


# ---------------------------------------------------------------- specialise


SPECIALISE = [
    (
        """
        def forward(self, x, output_attentions=False, head_mask=None):
            if output_attentions:
                y = 1
            else:
                y = 2
            if head_mask is not None:
                x = x * head_mask
            return (x, y) if output_attentions else (x,)
        """,
        """
        def forward(self, x, output_attentions=False, head_mask=None):
            y = 2
            return (x,)
        """,
    ),
    (
        """
        def forward(self, x, output_attentions=False):
            output_attentions = output_attentions or self.flag
            if output_attentions:
                x = x + 1
            return x
        """,
        None,  # rebound: nothing can be decided
    ),
    (
        """
        def forward(self, x, head_mask=None):
            if self.training and head_mask is not None:
                x = x + 1
            elif x is None:
                x = 2
            return x
        """,
        """
        def forward(self, x, head_mask=None):
            if x is None:
                x = 2
            return x
        """,
    ),
    (
        # a bracketed conditional keeps its brackets only where the chosen side may need them
        """
        def forward(self, x, y, output_attentions=False):
            return x, (y if output_attentions else None), (x if output_attentions else x + y) * 2
        """,
        """
        def forward(self, x, y, output_attentions=False):
            return x, None, (x + y) * 2
        """,
    ),
]


@pytest.mark.parametrize("before,after", SPECIALISE, ids=["fold", "rebound-no-change", "elif", "brackets"])
def test_specialise(before: str, after: str | None) -> None:
    result = specialise(function(before), Known(falsy=frozenset({"output_attentions"}), none=frozenset({"head_mask"})))
    assert code(result) == src(after if after is not None else before)


# ---------------------------------------------------------------- register


DICT_BEFORE = """
X_ATTENTION_CLASSES = {
    "eager": XAttention,
    "flash_attention_2": XFlashAttention2,
}
"""
DICT_AFTER = """
X_ATTENTION_CLASSES = {
    "eager": XAttention,
    "flash_attention_2": XFlashAttention2,
    "sdpa": XSdpaAttention,
}
"""


def test_add_dict_entry() -> None:
    module = cst.parse_module(src(DICT_BEFORE))
    assert register.add_dict_entry(module, "X_ATTENTION_CLASSES", "sdpa", "XSdpaAttention").code == src(DICT_AFTER)


def test_add_dict_entry_single_line_and_no_change() -> None:
    module = cst.parse_module('A = {"eager": XAttention}\nB = {"eager": Y}\n')
    result = register.add_dict_entry(module, "A", "sdpa", "S")
    assert result.code == 'A = {"eager": XAttention, "sdpa": S}\nB = {"eager": Y}\n'
    assert register.add_dict_entry(module, "MISSING", "sdpa", "S").code == module.code


SELECT_BEFORE = """
class Layer(nn.Module):
    def __init__(self, config):
        self.attention = XAttention(config, bias=True)


class Other(nn.Module):
    def __init__(self, dim):
        self.attention = XAttention(dim)
"""


def test_select_from_dict_only_where_config_is_in_scope() -> None:
    module = cst.parse_module(src(SELECT_BEFORE))
    owners = {"Layer", "Other"}
    sites = register.construction_sites(module, "XAttention", frozenset({"XAttention"}), owners)
    assert [(site.owner, site.has_config) for site in sites] == [("Layer", True), ("Other", False)]
    result, count = register.select_from_dict(module, "XAttention", "X_CLASSES", frozenset({"XAttention"}), {"Layer"})
    assert count == 1
    assert "self.attention = X_CLASSES[config._attn_implementation](config, bias=True)" in result.code
    assert "self.attention = XAttention(dim)" in result.code


def test_create_dict_after_class() -> None:
    module = cst.parse_module("class A:\n    pass\n\n\nclass B:\n    pass\n")
    result = register.create_dict(module, "A", "A_CLASSES", [("eager", "A"), ("sdpa", "ASdpa")])
    assert result.code == (
        'class A:\n    pass\n\n\nA_CLASSES = {\n    "eager": A,\n    "sdpa": ASdpa,\n}\n\n\nclass B:\n    pass\n'
    )


def test_insert_after_unknown_anchor_raises() -> None:
    with pytest.raises(KeyError):
        insert_classes.insert_after(cst.parse_module("x = 1\n"), "Missing", [])


# ---------------------------------------------------------------- mask helpers


MASKS_BEFORE = """
from ...modeling_attn_mask_utils import _prepare_4d_attention_mask, _prepare_4d_causal_attention_mask
from ...modeling_utils import PreTrainedModel


class Decoder(PreTrainedModel):
    def forward(self, input_ids, attention_mask, head_mask=None, output_attentions=None):
        attention_mask = _prepare_4d_causal_attention_mask(attention_mask, input_shape, embeds, 0)
        encoder_mask = _prepare_4d_attention_mask(encoder_mask, embeds.dtype, tgt_len=3)
        extended: torch.Tensor = self.get_extended_attention_mask(attention_mask, input_shape)
        other = _prepare_4d_attention_mask(encoder_mask, embeds.dtype) + 1
"""


def helpers_of(module: cst.Module) -> MaskHelpers:
    return MaskHelpers.of(ModuleFacts.of(module, ast.parse(module.code)))


def test_swap_mask_helpers() -> None:
    module = cst.parse_module(src(MASKS_BEFORE))
    plan = mask_helpers.MaskSwapPlan(causal=True, plain=True, extended=True, classes=frozenset({"Decoder"}))
    result, report = mask_helpers.swap_mask_helpers(module, helpers_of(module), plan, {"Decoder"})
    text = result.code
    assert (
        'if self.config._attn_implementation == "sdpa" and not output_attentions and head_mask is None:\n'
        "            attention_mask = _prepare_4d_causal_attention_mask_for_sdpa(attention_mask, input_shape, embeds, 0)\n"
        "        else:\n"
        "            attention_mask = _prepare_4d_causal_attention_mask(attention_mask, input_shape, embeds, 0)\n"
    ) in text
    # the plain helper is not traceable by torch.fx (it asks `torch.all(mask == 1)`): a traced mask keeps the old one;
    # layers asked for the weights or given a head mask fall back to eager, which gets the full masks (it may add
    # the mask without a None check)
    assert (
        'if self.config._attn_implementation == "sdpa" and not output_attentions and head_mask is None and not '
        "is_torch_fx_proxy(encoder_mask):\n"
        "            encoder_mask = _prepare_4d_attention_mask_for_sdpa(encoder_mask, embeds.dtype, tgt_len=3)\n"
    ) in text
    assert (
        'if self.config._attn_implementation == "sdpa" and not output_attentions and head_mask is None and not '
        "self.config.is_decoder and attention_mask.dim() == 2 and not is_torch_fx_proxy(attention_mask):\n"
        "            extended: torch.Tensor = _prepare_4d_attention_mask_for_sdpa(attention_mask, self.dtype, tgt_len=1)"
    ) in text
    # a helper call inside a larger expression is left alone
    assert "other = _prepare_4d_attention_mask(encoder_mask, embeds.dtype) + 1" in text
    assert report.needed_imports == {"_prepare_4d_causal_attention_mask_for_sdpa", "_prepare_4d_attention_mask_for_sdpa"}
    assert report.needed_utils == {"is_torch_fx_proxy"}


def test_swap_mask_helpers_leaves_a_swap_already_made() -> None:
    """A model forward copied from a ported one (data2vec's text model follows BERT's port through its `# Copied
    from` marker) already keeps the plain helper on the eager side of the swap: porting the file must not wrap it
    again (that changed the copy, and the marker was lost)."""
    module = cst.parse_module(src(MASKS_BEFORE))
    plan = mask_helpers.MaskSwapPlan(causal=True, plain=True, extended=True, classes=frozenset({"Decoder"}))
    once, report = mask_helpers.swap_mask_helpers(module, helpers_of(module), plan, {"Decoder"})
    twice, again = mask_helpers.swap_mask_helpers(once, helpers_of(once), plan, {"Decoder"})
    assert len(report.swapped) == 3 and again.swapped == [] and twice.code == once.code


def test_swap_mask_helpers_respects_plan() -> None:
    module = cst.parse_module(src(MASKS_BEFORE))
    plan = mask_helpers.MaskSwapPlan(causal=False, plain=False, extended=False, classes=frozenset({"Decoder"}))
    result, report = mask_helpers.swap_mask_helpers(module, helpers_of(module), plan, {"Decoder"})
    assert result.code == module.code and not report.swapped


# ---------------------------------------------------------------- flags and imports


def test_set_class_flag_inserts_and_replaces() -> None:
    module = cst.parse_module(
        'class P(PreTrainedModel):\n    """Doc."""\n\n    base_model_prefix = "m"\n\n    def f(self):\n        pass\n\n\n'
        "class Q(PreTrainedModel):\n    _supports_sdpa = False\n"
    )
    result = flags.set_class_flag(module, ["P", "Q"], "_supports_sdpa")
    assert result.code == (
        'class P(PreTrainedModel):\n    """Doc."""\n\n    base_model_prefix = "m"\n    _supports_sdpa = True\n\n'
        "    def f(self):\n        pass\n\n\nclass Q(PreTrainedModel):\n    _supports_sdpa = True\n"
    )


def test_add_imports_extends_existing_line_or_adds_one() -> None:
    module = cst.parse_module(
        "import math\n\nimport torch\nfrom ...modeling_attn_mask_utils import _prepare_4d_attention_mask\n"
        "from ...modeling_utils import PreTrainedModel\n\nx = 1\n"
    )
    names = ImportMap.of(module)
    result = imports.add_imports(
        module, names, [("modeling_attn_mask_utils", "_prepare_4d_attention_mask_for_sdpa"), ("warnings", None)]
    )
    assert result.code == (
        "import math\nimport warnings\n\nimport torch\n"
        "from ...modeling_attn_mask_utils import _prepare_4d_attention_mask, _prepare_4d_attention_mask_for_sdpa\n"
        "from ...modeling_utils import PreTrainedModel\n\nx = 1\n"
    )
    # already imported: no change
    assert imports.add_imports(module, names, [("math", None), ("modeling_utils", "PreTrainedModel")]).code == module.code


def test_add_imports_new_relative_line() -> None:
    module = cst.parse_module("import torch\nfrom ...modeling_utils import PreTrainedModel\n")
    result = imports.add_imports(module, ImportMap.of(module), [("modeling_attn_mask_utils", "f")])
    assert result.code.endswith("from ...modeling_attn_mask_utils import f\nfrom ...modeling_utils import PreTrainedModel\n")


# ---------------------------------------------------------------- dead code


def test_remove_dead_pure_assignments_only() -> None:
    body = cst.parse_module(
        src(
            """
            scores = torch.zeros(2, 3)
            mask = torch.ones(2)
            log = logger.info("kept")
            query = query.view(2, 3)
            out = sdpa(query)
            """
        )
    ).body
    kept = remove_dead(body, {"scores", "mask", "log", "query"}, ImportMap.of(cst.parse_module("import torch\n")))
    assert cst.Module(body=kept).code == 'log = logger.info("kept")\nquery = query.view(2, 3)\nout = sdpa(query)\n'


def test_remove_dead_leaves_names_outside_the_removable_set() -> None:
    body = cst.parse_module("a = torch.zeros(1)\nb = 2\n").body
    assert cst.Module(body=remove_dead(body, set(), ImportMap.of(cst.parse_module("import torch\n")))).code == (
        "a = torch.zeros(1)\nb = 2\n"
    )


# ---------------------------------------------------------------- expressions built with the right parentheses


@pytest.mark.parametrize(
    "left,operator,right,expected",
    [
        ("a + b", cst.Divide(), "c", "(a + b) / c"),
        ("a", cst.Divide(), "b * c", "a / (b * c)"),
        ("a * b", cst.Multiply(), "c", "a * b * c"),
        ("a", cst.Subtract(), "b - c", "a - (b - c)"),
        ("a", cst.Add(), "b if c else d", "a + (b if c else d)"),
        ("a ** b", cst.Power(), "c", "(a ** b) ** c"),
        ("-a", cst.Multiply(), "math.sqrt(d)", "-a * math.sqrt(d)"),
    ],
)
def test_binary_keeps_the_meaning(left: str, operator: cst.BaseBinaryOp, right: str, expected: str) -> None:
    from sdpa_port.analyse.cstutil import binary

    built = binary(cst.parse_expression(left), operator, cst.parse_expression(right))
    assert code(built) == expected


@pytest.mark.parametrize("node,expected", [("a + b", "(a + b).to"), ("x", "x.to"), ("1", "(1).to"), ("f(x)[0]", "f(x)[0].to")])
def test_primary_receivers(node: str, expected: str) -> None:
    from sdpa_port.analyse.cstutil import primary

    assert code(cst.Attribute(value=primary(cst.parse_expression(node)), attr=cst.Name("to"))) == expected


# ---------------------------------------------------------------- sub-models


def test_sub_models_built_with_the_parents_implementation() -> None:
    module = cst.parse_module(
        src(
            """
            class Outer(PreTrainedModel):
                def __init__(self, config):
                    super().__init__(config)
                    self.text = TextModel(config.text_config)
                    self.same = TextModel(config)
                    self.own = TextModel(self.config)
                    self.other = Unknown(config.text_config)
                    if config.vision_config is not None:
                        self.a_much_longer_attribute_name_for_the_vision_tower = VisionModelWithAVeryLongName(config.vision_config)

                def forward(self, config):
                    return TextModel(config.text_config)

            class Plain(nn.Module):
                def __init__(self, config):
                    self.text = TextModel(config.text_config)
            """
        )
    )
    after, notes = sub_models.pass_implementation(
        module, frozenset({"Outer"}), frozenset({"TextModel", "VisionModelWithAVeryLongName"})
    )
    assert after.code == src(
        """
        class Outer(PreTrainedModel):
            def __init__(self, config):
                super().__init__(config)
                self.text = TextModel._from_config(config.text_config, attn_implementation=config._attn_implementation)
                self.same = TextModel(config)
                self.own = TextModel(self.config)
                self.other = Unknown(config.text_config)
                if config.vision_config is not None:
                    self.a_much_longer_attribute_name_for_the_vision_tower = VisionModelWithAVeryLongName._from_config(
                        config.vision_config, attn_implementation=config._attn_implementation
                    )

            def forward(self, config):
                return TextModel(config.text_config)

        class Plain(nn.Module):
            def __init__(self, config):
                self.text = TextModel(config.text_config)
        """
    )
    assert notes == ["Outer builds TextModel with its own attention implementation"] + [
        "Outer builds VisionModelWithAVeryLongName with its own attention implementation"
    ]


def test_lay_out_call_tries_one_line_then_hugged_then_one_per_line() -> None:
    def laid(width: int) -> str:
        statement = cst.parse_statement("x = f(alpha, beta=gamma)\n")
        assert isinstance(statement, cst.SimpleStatementLine)
        call = statement.body[0].value  # type: ignore[attr-defined]
        return code(lay_out_call(statement, call, indent=0, limit=width))

    assert laid(40) == "x = f(alpha, beta=gamma)\n"
    assert laid(21) == "x = f(\n    alpha, beta=gamma\n)\n"
    assert laid(20) == "x = f(\n    alpha,\n    beta=gamma,\n)\n"


SELECT_SELF_CONFIG = """
class Switching(nn.Module):
    def __init__(self, config):
        self.config = config
        self.attention = XAttention(config)

    def switch(self, value):
        self.attention = XAttention(self.config)


def build(dim):
    return XAttention(dim)
"""


def test_select_from_dict_through_self_config_in_a_configured_class() -> None:
    """A module rebuilt in a method without a `config` parameter selects with the config it stored (BigBird's
    `set_attention_type`); a class that does not store one is not configured, and nothing is selected there."""
    module = cst.parse_module(src(SELECT_SELF_CONFIG))
    configured = frozenset({"Switching"})
    sites = register.construction_sites(module, "XAttention", frozenset({"XAttention"}), {"Switching"}, configured)
    assert [(site.owner, site.has_config) for site in sites] == [("Switching", True), ("Switching", True)]
    unconfigured = register.construction_sites(module, "XAttention", frozenset({"XAttention"}), {"Switching"})
    assert [(site.owner, site.has_config) for site in unconfigured] == [("Switching", True), ("Switching", False)]
    result, count = register.select_from_dict(
        module, "XAttention", "X_CLASSES", frozenset({"XAttention"}), {"Switching"}, configured
    )
    assert count == 2
    assert "self.attention = X_CLASSES[config._attn_implementation](config)" in result.code
    assert "self.attention = X_CLASSES[self.config._attn_implementation](self.config)" in result.code
    assert "return XAttention(dim)" in result.code
