"""After a port in a checkout, copies elsewhere follow it, or their files are ported with their family."""

from __future__ import annotations

import textwrap

from sdpa_port.checkout import testers
from sdpa_port.checkout.copies import check_tree
from sdpa_port.checkout.family import Ported, keep_consistent
from sdpa_port.checkout.follow import dict_name
from sdpa_port.checkout.tree import Overlay, Texts

ALPHA = "src/transformers/models/alpha/modeling_alpha.py"
BETA = "src/transformers/models/beta/modeling_beta.py"
GAMMA = "src/transformers/models/gamma/modeling_gamma.py"


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


ALPHA_BEFORE = dedent(
    """
    from ...modeling_utils import PreTrainedModel


    class AlphaSelfAttention(nn.Module):
        pass


    class AlphaAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.self = AlphaSelfAttention(config)


    class AlphaPreTrainedModel(PreTrainedModel):
        base_model_prefix = "alpha"
    """
)

# what a class-style port of alpha looks like where it matters here
ALPHA_AFTER = dedent(
    """
    from ...modeling_attn_mask_utils import _prepare_4d_attention_mask_for_sdpa
    from ...modeling_utils import PreTrainedModel


    class AlphaSelfAttention(nn.Module):
        pass


    class AlphaSdpaSelfAttention(AlphaSelfAttention):
        pass


    ALPHA_SELF_ATTENTION_CLASSES = {
        "eager": AlphaSelfAttention,
        "sdpa": AlphaSdpaSelfAttention,
    }


    class AlphaAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.self = ALPHA_SELF_ATTENTION_CLASSES[config._attn_implementation](config)
            self.mask = _prepare_4d_attention_mask_for_sdpa


    class AlphaPreTrainedModel(PreTrainedModel):
        base_model_prefix = "alpha"
        _supports_sdpa = True
    """
)

BETA_TEXT = dedent(
    """
    from ...modeling_utils import PreTrainedModel


    class BetaSelfAttention(nn.Module):
        pass


    # Copied from transformers.models.alpha.modeling_alpha.AlphaAttention with Alpha->Beta
    class BetaAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.self = BetaSelfAttention(config)
    """
)

GAMMA_TEXT = dedent(
    """
    from ...modeling_utils import PreTrainedModel


    # Copied from transformers.models.alpha.modeling_alpha.AlphaPreTrainedModel with Alpha->Gamma,alpha->gamma
    class GammaPreTrainedModel(PreTrainedModel):
        base_model_prefix = "gamma"
    """
)


def refuse(path: str, source: str) -> Ported:
    return Ported(None, "refused for the test")


def test_copies_follow_with_the_casing_replacement_the_dict_and_the_import() -> None:
    base = Texts({ALPHA: ALPHA_BEFORE, BETA: BETA_TEXT})
    result = keep_consistent(base, {ALPHA: ALPHA_AFTER}, refuse)
    assert result.stale == [] and result.family == []
    beta = result.edits[BETA]
    assert (
        "# Copied from transformers.models.alpha.modeling_alpha.AlphaAttention with Alpha->Beta,ALPHA->BETA\n" in beta
    )
    assert 'BETA_SELF_ATTENTION_CLASSES = {\n    "eager": BetaSelfAttention,\n}\n' in beta  # no sdpa class here
    assert "self.self = BETA_SELF_ATTENTION_CLASSES[config._attn_implementation](config)" in beta
    assert "from ...modeling_attn_mask_utils import _prepare_4d_attention_mask_for_sdpa\n" in beta
    assert beta.index("BETA_SELF_ATTENTION_CLASSES = {") < beta.index("# Copied from")
    compile(beta, BETA, "exec")
    assert check_tree(Overlay(base, result.edits)) == []


def test_without_the_follow_step_the_copy_is_stale() -> None:
    base = Texts({ALPHA: ALPHA_BEFORE, BETA: BETA_TEXT})
    stale = check_tree(Overlay(base, {ALPHA: ALPHA_AFTER}))
    assert [item.marker.path for item in stale] == [BETA]


def test_a_copy_that_would_claim_sdpa_support_is_ported_with_its_family() -> None:
    base = Texts({ALPHA: ALPHA_BEFORE, GAMMA: GAMMA_TEXT})
    ported_gamma = GAMMA_TEXT.replace(
        '    base_model_prefix = "gamma"\n', '    base_model_prefix = "gamma"\n    _supports_sdpa = True\n'
    )
    calls: list[str] = []

    def port(path: str, source: str) -> Ported:
        calls.append(path)
        return Ported(ported_gamma, "ported")

    result = keep_consistent(base, {ALPHA: ALPHA_AFTER}, port)
    assert calls == [GAMMA] and result.family == [GAMMA] and result.stale == []
    assert result.edits[GAMMA] == ported_gamma


def test_what_cannot_follow_nor_be_ported_is_reported_stale() -> None:
    base = Texts({ALPHA: ALPHA_BEFORE, GAMMA: GAMMA_TEXT})
    result = keep_consistent(base, {ALPHA: ALPHA_AFTER}, refuse)
    assert GAMMA not in result.edits
    assert [item.marker.path for item in result.stale] == [GAMMA]
    assert result.notes[GAMMA] == ["could not port it with its upstream (refused for the test)"]


def test_stale_markers_from_before_the_port_are_not_blamed_on_it() -> None:
    drifted = BETA_TEXT.replace(
        "self.self = BetaSelfAttention(config)", "self.self = BetaSelfAttention(config)  # mine"
    )
    base = Texts({ALPHA: ALPHA_BEFORE, BETA: drifted})
    result = keep_consistent(base, {ALPHA: ALPHA_BEFORE}, refuse)
    assert result.stale == [] and len(result.preexisting) == 1


def test_dict_names_are_the_engines() -> None:
    assert dict_name("ClapTextSelfAttention") == "CLAP_TEXT_SELF_ATTENTION_CLASSES"
    assert dict_name("RoCBertSelfAttention") == "RO_C_BERT_SELF_ATTENTION_CLASSES"
    assert dict_name("T5Attention") == "T5_ATTENTION_CLASSES"


def test_tester_groups_read_from_a_test_module() -> None:
    source = dedent(
        """
        class T5ModelTester:
            pass


        class T5EncoderOnlyModelTester:
            pass


        class T5ModelTest(ModelTesterMixin, unittest.TestCase):
            all_model_classes = (T5Model, T5ForConditionalGeneration) if is_torch_available() else ()
            all_generative_model_classes = (T5ForConditionalGeneration,) if is_torch_available() else ()

            def setUp(self):
                self.model_tester = T5ModelTester(self)


        class T5EncoderOnlyModelTest(ModelTesterMixin, unittest.TestCase):
            all_model_classes = (T5EncoderModel,) if is_torch_available() else ()

            def setUp(self):
                self.model_tester = T5EncoderOnlyModelTester(self, is_training=False)


        class T5IntegrationTest(unittest.TestCase):
            pass
        """
    )
    groups = testers.tester_groups(source)
    assert [(g.tester, g.call, g.model_classes, g.generative) for g in groups] == [
        (
            "T5ModelTester",
            "T5ModelTester(self)",
            ("T5Model", "T5ForConditionalGeneration"),
            ("T5ForConditionalGeneration",),
        ),
        ("T5EncoderOnlyModelTester", "T5EncoderOnlyModelTester(self, is_training=False)", ("T5EncoderModel",), ()),
    ]


def test_a_marker_the_port_removed_comes_back_where_it_holds() -> None:
    marker = "# Copied from transformers.models.alpha.modeling_alpha.AlphaAttention with Alpha->Beta"
    beta_ported = (
        ALPHA_AFTER.replace("Alpha", "Beta").replace("ALPHA", "BETA").replace("alpha", "beta")
    )  # the engine ports beta alike, and drops the marker of the class it changed
    base = Texts({ALPHA: ALPHA_BEFORE, BETA: BETA_TEXT})
    result = keep_consistent(base, {ALPHA: ALPHA_AFTER, BETA: beta_ported}, refuse, originals_removed={BETA: [marker]})
    assert result.stale == []
    assert f"{marker},ALPHA->BETA\nclass BetaAttention" in result.edits[BETA]  # back, with the casing it needs
    assert check_tree(Overlay(base, result.edits)) == []


def test_a_removed_marker_that_does_not_hold_stays_removed() -> None:
    marker = "# Copied from transformers.models.alpha.modeling_alpha.AlphaAttention with Alpha->Beta"
    beta_ported = BETA_TEXT.replace(marker + "\n", "").replace(
        "BetaSelfAttention(config)", "BetaSelfAttention(config) * 2"
    )
    base = Texts({ALPHA: ALPHA_BEFORE, BETA: BETA_TEXT})
    result = keep_consistent(base, {BETA: beta_ported}, refuse, originals_removed={BETA: [marker]})
    assert result.stale == [] and marker not in result.edits[BETA]


def test_the_upstream_of_a_changed_copy_is_ported_so_the_marker_holds() -> None:
    """Porting beta alone changes its copy of AlphaAttention while alpha is not ported yet: alpha is ported too
    (codegen's blocks copy GPT-J's), and the marker the port removed comes back. Without a porter that can port
    alpha, the marker stays removed."""
    marker = "# Copied from transformers.models.alpha.modeling_alpha.AlphaAttention with Alpha->Beta"
    beta_ported = ALPHA_AFTER.replace("Alpha", "Beta").replace("ALPHA", "BETA").replace("alpha", "beta")
    base = Texts({ALPHA: ALPHA_BEFORE, BETA: BETA_TEXT})

    def port_alpha(path: str, source: str) -> Ported:
        return Ported(ALPHA_AFTER, "ported") if path == ALPHA else Ported(None, "refused for the test")

    result = keep_consistent(base, {BETA: beta_ported}, port_alpha, originals_removed={BETA: [marker]})
    assert result.edits[ALPHA] == ALPHA_AFTER and ALPHA in result.family
    assert f"{marker},ALPHA->BETA\nclass BetaAttention" in result.edits[BETA]
    assert check_tree(Overlay(base, result.edits)) == []
    alone = keep_consistent(base, {BETA: beta_ported}, refuse, originals_removed={BETA: [marker]})
    assert ALPHA not in alone.edits and "Copied from" not in alone.edits[BETA].split("class BetaAttention")[0]


def test_a_restored_marker_on_a_decorated_method_goes_after_the_decorators() -> None:
    """Data2VecTextModel.forward carries its marker between its decorators and `def` (the copy checker reads the
    definition from the line after the marker); put back above the decorators, the checker met a decorator line
    where it expects `def` and the checkout step failed."""
    marker = "# Copied from transformers.models.alpha.modeling_alpha.AlphaModel.forward"
    alpha = dedent(
        """
        class AlphaModel:
            @decorate
            def forward(self):
                return 1
        """
    )
    beta = dedent(
        f"""
        class BetaModel:
            @decorate
            {marker}
            def forward(self):
                return 1
        """
    )
    base = Texts({ALPHA: alpha, BETA: beta})
    result = keep_consistent(base, {BETA: beta.replace(f"    {marker}\n", "")}, refuse, originals_removed={BETA: [marker]})
    assert result.edits[BETA] == beta and result.stale == []
    assert check_tree(Overlay(base, result.edits)) == []
