"""`is_causal` decided per construction of an attention class (transformers 5.x style), without torch: the plan
(`plan/causal_sites.py`) and the pass (`rewrite/causal_sites.py`) as before/after pairs."""

from __future__ import annotations

import ast

import libcst as cst
import pytest
from causal_sources import ATTENTION, HEADER, RUNTIME_FLAG, SEQ2SEQ, replaced, src

from sdpa_port import Status, port_source
from sdpa_port.rewrite.causal_sites import pass_is_causal

# ---------------------------------------------------------------- the port


def test_the_class_takes_is_causal_and_only_the_causal_site_passes_true() -> None:
    result = port_source(SEQ2SEQ, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    tree = ast.parse(result.source)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    init = next(n for n in classes["TinyAttention"].body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert [a.arg for a in init.args.args][-1] == "is_causal" and ast.unparse(init.args.defaults[-1]) == "False"
    assert "self.is_causal = is_causal" in ast.unparse(init)
    built = {
        f"{name}.{ast.unparse(node.targets[0])}": ast.unparse(node.value)
        for name in ("TinyEncoderLayer", "TinyDecoderLayer")
        for node in ast.walk(classes[name])
        if isinstance(node, ast.Assign) and ast.unparse(node.value).startswith("TinyAttention(")
    }
    assert built == {
        "TinyEncoderLayer.self.self_attn": "TinyAttention(config)",
        "TinyDecoderLayer.self.self_attn": "TinyAttention(config, layer_idx=layer_idx, is_causal=True)",
        "TinyDecoderLayer.self.encoder_attn": "TinyAttention(config, layer_idx=layer_idx)",
    }
    assert any("TinyDecoderLayer.self_attn (line" in note and "is_causal=True" in note for note in result.notes)


def test_the_port_is_idempotent() -> None:
    once = port_source(SEQ2SEQ, filename="modeling_tiny.py")
    twice = port_source(once.source, filename="modeling_tiny.py")
    assert twice.status is Status.UNCHANGED and twice.source == once.source


# ---------------------------------------------------------------- causality chosen per call


def _calls(source: str, name: str) -> list[str]:
    return [ast.unparse(node) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call) and ast.unparse(node.func) == name]


def test_a_site_receiving_both_kinds_per_call_keeps_is_causal_false_and_its_causal_masks_built() -> None:
    """TinyModel picks its builder by an `is_decoder` argument (BLIP's text model): no `is_causal` suits both
    calls, so the class stays False and every causal builder reaching it (TinyDecoderModel's too, which shares the
    class) always builds its mask, which then carries the causality under sdpa."""
    result = port_source(RUNTIME_FLAG, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    causal = _calls(result.source, "create_causal_mask")
    assert len(causal) == 2 and all(call.endswith("allow_is_causal_skip=False)") for call in causal), causal
    assert not any("allow_is" in call for call in _calls(result.source, "create_bidirectional_mask"))
    assert "self.is_causal = False" in result.source
    assert "_supports_attention_backend" not in result.source
    assert any("takes its causality from the masks" in w for w in result.warnings), result.warnings
    assert any(
        "`TinyModel.attention` (line" in note and "always built (`allow_is_causal_skip=False`)" in note
        for note in result.notes
    ), result.notes
    assert port_source(result.source, filename="modeling_tiny.py").status is Status.UNCHANGED


def test_a_site_receiving_both_kinds_is_refused_where_flash_attention_reads_is_causal() -> None:
    """Flash attention takes the causality from `is_causal` alone: a file claiming it keeps the C301 refusal, with
    the site and the builders named."""
    source = replaced(RUNTIME_FLAG, '    base_model_prefix = "model"\n', '    base_model_prefix = "model"\n    _supports_flash_attn = True\n')
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["C301"], result.reasons
    assert "`TinyModel.attention` (built at line" in result.reasons[0], result.reasons
    assert "`create_causal_mask`" in result.reasons[0] and "`create_bidirectional_mask`" in result.reasons[0]


PIN = ("        self.scaling = config.head_dim**-0.5\n", "        self.scaling = config.head_dim**-0.5\n        self.is_causal = True\n")


def test_a_pinned_flag_nothing_reads_is_set_from_the_masks_where_it_stands() -> None:
    """`self.is_causal = True` that nothing reads and only eager ran with has never changed a result: with masks of
    both kinds per call the class is decided as one without the flag (False, causal masks always built), the
    assignment taking the new value in place."""
    result = port_source(replaced(RUNTIME_FLAG, *PIN), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    init = next(
        node for node in ast.walk(ast.parse(result.source)) if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    assigned = [ast.unparse(node) for node in init.body if isinstance(node, ast.Assign)]
    assert assigned[1:3] == ["self.scaling = config.head_dim ** (-0.5)", "self.is_causal = False"], assigned
    assert sum(a.startswith("self.is_causal") for a in assigned) == 1
    assert all(call.endswith("allow_is_causal_skip=False)") for call in _calls(result.source, "create_causal_mask"))
    assert any("pinned `self.is_causal`" in note for note in result.notes), result.notes
    assert port_source(result.source, filename="modeling_tiny.py").status is Status.UNCHANGED


def test_a_pinned_flag_gives_way_to_a_constructor_parameter_where_constructions_differ() -> None:
    result = port_source(replaced(SEQ2SEQ, *PIN), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "self.is_causal = is_causal" in result.source and "self.is_causal = True" not in result.source
    assert "TinyAttention(config, layer_idx=layer_idx, is_causal=True)" in result.source


@pytest.mark.parametrize(
    "change",
    [
        # read by the file: the flag has changed what the module computes
        ("        self.is_causal = True\n", "        self.is_causal = True\n        self.flag = self.is_causal\n"),
        # flash attention claimed: it has run with the flag
        ('    base_model_prefix = "model"\n', '    base_model_prefix = "model"\n    _supports_flash_attn = True\n'),
    ],
)
def test_a_pinned_flag_that_may_have_mattered_keeps_the_refusal(change: tuple[str, str]) -> None:
    result = port_source(replaced(replaced(RUNTIME_FLAG, *PIN), *change), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["C301"], result.reasons


@pytest.mark.parametrize(
    "call",
    [
        "create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, **options)",
        "create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, allow_is_causal_skip=skip)",
    ],
)
def test_a_causal_builder_that_cannot_be_told_to_build_its_mask_is_refused(call: str) -> None:
    """TinyDecoderModel's causal mask reaches the class too, and must be built."""
    old = "        mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)\n        return"
    source = replaced(RUNTIME_FLAG, old, f"        options = {{}}\n        skip = True\n        mask = {call}\n        return")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["C301"], result.reasons
    assert "cannot be given `allow_is_causal_skip=False`" in result.reasons[0], result.reasons


def test_a_causal_site_built_through_an_alias_is_refused() -> None:
    source = replaced(
        SEQ2SEQ,
        "        self.self_attn = TinyAttention(config, layer_idx=layer_idx)",
        "        attention_class = TinyAttention\n        self.self_attn = attention_class(config, layer_idx=layer_idx)",
    )
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and "is_causal=True` cannot be passed there" in result.reasons[0]


# ---------------------------------------------------------------- a literal is_causal=True


PINNED = (
    HEADER
    + "\n\n"
    + replaced(
        ATTENTION,
        "    def __init__(self, config, layer_idx=None):\n        super().__init__()\n",
        "    def __init__(self, config, layer_idx=None, is_causal=False):\n        super().__init__()\n        self.is_causal = is_causal\n",
    )
    + "\n\n"
    + src(
        """
    class TinyBlock(nn.Module):
        def __init__(self, config, is_causal=False):
            super().__init__()
            self.attn = TinyAttention(config, is_causal=is_causal)

        def forward(self, hidden_states, attention_mask=None):
            return self.attn(hidden_states, attention_mask=attention_mask)


    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyCausalModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.blocks = nn.ModuleList([TinyBlock(config, is_causal=True) for _ in range(2)])

        def forward(self, inputs_embeds, attention_mask=None):
            mask = BUILDER(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            for block in self.blocks:
                inputs_embeds = block(inputs_embeds, mask)
            return inputs_embeds


    class TinyFullModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.blocks = nn.ModuleList([TinyBlock(config) for _ in range(2)])

        def forward(self, inputs_embeds, attention_mask=None):
            mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            for block in self.blocks:
                inputs_embeds = block(inputs_embeds, mask)
            return inputs_embeds
    """
    )
)


def test_a_literal_is_causal_true_stands_when_only_causal_masks_reach_it_through_that_construction() -> None:
    """TinyBlock is built causal by one model and not by the other; only the masks of the first count."""
    result = port_source(PINNED.replace("BUILDER", "create_causal_mask"), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons


def test_a_literal_is_causal_true_reached_only_by_bidirectional_masks_becomes_false() -> None:
    """BridgeTower's cross-modal layers: built with `is_causal=True`, given bidirectional masks. Eager never read the
    flag, and no other implementation was supported, so it never changed a result; SDPA would apply it where the
    mask is None: the port passes `is_causal=False` there, and says so."""
    result = port_source(PINNED.replace("BUILDER", "create_bidirectional_mask"), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "self.blocks = nn.ModuleList([TinyBlock(config, is_causal=False) for _ in range(2)])" in result.source
    assert any("TinyCausalModel.blocks" in note and "is_causal=False" in note for note in result.notes), result.notes


def test_a_literal_is_causal_true_that_already_matters_is_overridden_where_bidirectional_masks_reach_it() -> None:
    """A file that reads the flag, or already supports flash attention (which reads it), keeps its construction;
    since only bidirectional masks reach the module, eager was never causal there, and the dispatch passes
    `is_causal=False` (it was refused C302 before). With a causal mask among them, C302 stands."""
    bidirectional = PINNED.replace("BUILDER", "create_bidirectional_mask")
    reads = bidirectional.replace(
        "        self.attn = TinyAttention(config, is_causal=is_causal)\n",
        "        self.attn = TinyAttention(config, is_causal=is_causal)\n        self.causal = self.attn.is_causal\n",
    )
    flash = bidirectional.replace('    base_model_prefix = "model"\n', '    base_model_prefix = "model"\n    _supports_flash_attn = True\n')
    for source in (reads, flash):
        assert source != bidirectional
        result = port_source(source, filename="modeling_tiny.py")
        assert result.status is Status.PORTED, result.reasons
        assert "TinyBlock(config, is_causal=True) for _ in range(2)" in result.source  # the construction stands
        attention = result.source[result.source.index("class TinyAttention") : result.source.index("class TinyBlock")]
        assert attention.count("is_causal=False,") == 1, attention
    mixed = flash.replace(
        "mask = create_bidirectional_mask(", "mask = (create_causal_mask if self.config.is_decoder else create_bidirectional_mask)("
    )
    assert mixed != flash
    result = port_source(mixed, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result.source
    assert [r.code.code for r in result.refusals] == ["C302"], result.reasons


# ---------------------------------------------------------------- the pass


PASS = [
    (
        """
        class Layer(nn.Module):
            def __init__(self, config, i):
                super().__init__()
                self.self_attn = Attention(config, layer_idx=i)
                self.cross_attn = Attention(config, layer_idx=i)
                self.stack = nn.ModuleList([
                    Attention(
                        config,
                        layer_idx=j,
                    )
                    for j in range(2)
                ])
                other = Attention(config)
        """,
        """
        class Layer(nn.Module):
            def __init__(self, config, i):
                super().__init__()
                self.self_attn = Attention(config, layer_idx=i, is_causal=True)
                self.cross_attn = Attention(config, layer_idx=i)
                self.stack = nn.ModuleList([
                    Attention(
                        config,
                        layer_idx=j,
                        is_causal=True,
                    )
                    for j in range(2)
                ])
                other = Attention(config)
        """,
    ),
    (  # no change: already passed, or another class
        """
        class Layer(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.self_attn = Attention(config, is_causal=False)
                self.stack = Other(config)
        """,
        None,
    ),
]


@pytest.mark.parametrize("before,after", PASS)
def test_pass_is_causal(before: str, after: str | None) -> None:
    module, count = pass_is_causal(
        cst.parse_module(src(before)), "Attention", [("Layer", "self_attn"), ("Layer", "stack")]
    )
    assert module.code == src(after if after is not None else before)
    assert count == (2 if after is not None else 0)


INIT = [
    (
        """
        class Attention(nn.Module):
            def __init__(self, config, layer_idx=None):
                super().__init__()
                self.layer_idx = layer_idx
        """,
        """
        class Attention(nn.Module):
            def __init__(self, config, layer_idx=None, is_causal=False):
                super().__init__()
                self.is_causal = is_causal
                self.layer_idx = layer_idx
        """,
    ),
    (  # one parameter per line
        """
        class Attention(nn.Module):
            def __init__(
                self,
                config,
                layer_idx=None,
            ):
                super().__init__()
        """,
        """
        class Attention(nn.Module):
            def __init__(
                self,
                config,
                layer_idx=None,
                is_causal=False,
            ):
                super().__init__()
                self.is_causal = is_causal
        """,
    ),
]


@pytest.mark.parametrize("before,after", INIT)
def test_init_takes_is_causal(before: str, after: str) -> None:
    from sdpa_port.rewrite.interface_edits import InitAttributes

    module = cst.parse_module(src(before)).visit(InitAttributes(False, "is_causal", causal_parameter=True))
    assert module.code == src(after)


def test_a_class_whose_init_cannot_take_is_causal_is_refused() -> None:
    source = replaced(
        SEQ2SEQ,
        "    def __init__(self, config, layer_idx=None):\n        super().__init__()\n        self.scaling",
        "    def __init__(self, config, *args, layer_idx=None):\n        super().__init__()\n        self.scaling",
    )
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED and "that can take an `is_causal` keyword" in result.reasons[0], (
        result.reasons
    )


def test_towers_sharing_a_module_are_decided_per_construction() -> None:
    """Token and pixel towers in one file: the class holds no flag of its own, so each construction gets what its
    masks say (the text model's, causal, passes `is_causal=True`; the vision model's, given no mask, does not)."""
    from test_refusal_docs import source_of

    towers = source_of("C303").replace("        self.is_causal = True\n", "")
    result = port_source(towers, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    vision, text = result.source.split("class TinyModel(")
    assert "self.attention = TinyAttention(config)\n" in vision.split("class TinyVisionModel(")[1]
    assert "self.attention = TinyAttention(config, is_causal=True)" in text


def test_a_module_only_causal_masks_reach_is_causal_however_it_is_built() -> None:
    """Git: its text attention is built through a dict of classes (no keyword can be passed there), in a file that
    also holds a vision tower; every construction receives causal masks alone, so `self.is_causal = True` holds for
    all of them."""
    from test_refusal_docs import source_of

    towers = source_of("C303").replace("        self.is_causal = True\n", "")
    vision_start = towers.index("class TinyVisionModel(")
    model_start = towers.index("class TinyModel(")
    through_dict = (
        towers[:vision_start]
        + towers[model_start:].replace(
            "self.attention = TinyAttention(config)", "self.attention = TINY_CLASSES[config._attn_implementation](config)"
        )
        + "\n\nTINY_CLASSES = {\"eager\": TinyAttention}\n"
        + "\n\n" + towers[vision_start:model_start].replace("TinyAttention(config)", "nn.Identity()")
    )
    result = port_source(through_dict, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "self.is_causal = True" in result.source


KEEP = [
    (  # the calls starting on the given lines (2, 4 and 9) gain the keyword; line 7's does not
        """
        def forward(self):
            a = create_causal_mask(config=self.config, attention_mask=mask)
            b = masking_utils.create_causal_mask(
                config=self.config,
                attention_mask=mask,
            )
            c = create_causal_mask(config=self.config, attention_mask=mask)
            d = create_bidirectional_mask(config=self.config, attention_mask=mask)
            e = create_causal_mask(config=self.config, allow_is_causal_skip=False)
        """,
        """
        def forward(self):
            a = create_causal_mask(config=self.config, attention_mask=mask, allow_is_causal_skip=False)
            b = masking_utils.create_causal_mask(
                config=self.config,
                attention_mask=mask,
                allow_is_causal_skip=False,
            )
            c = create_causal_mask(config=self.config, attention_mask=mask)
            d = create_bidirectional_mask(config=self.config, attention_mask=mask)
            e = create_causal_mask(config=self.config, allow_is_causal_skip=False)
        """,
        3,
    ),
    (  # `**kwargs` may carry the setting, another value is the caller's: not rewritten, not counted
        """
        def forward(self):
            a = create_causal_mask(config=self.config, **kwargs)
            b = create_causal_mask(config=self.config, allow_is_causal_skip=skip)
        """,
        None,
        0,
    ),
]


@pytest.mark.parametrize("before,after,count", KEEP)
def test_causal_builders_on_the_lines_always_build_their_mask(before: str, after: str | None, count: int) -> None:
    from sdpa_port.rewrite.kept_masks import keep_causal_masks

    module, found = keep_causal_masks(cst.parse_module(src(before)), frozenset({2, 3, 4, 9}))
    assert module.code == src(after if after is not None else before)
    assert found == count
