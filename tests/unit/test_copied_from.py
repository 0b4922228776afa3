"""`# Copied from` markers and modular files: what a port reports about where code comes from, and stale markers."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from sdpa_port import port_source
from sdpa_port.discover.modular import CopiedFrom, find_markers, generated_from, parse_marker
from sdpa_port.result import Status
from sdpa_port.rewrite.copied_from import decide, remove_markers

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BERT = "transformers.models.bert.modeling_bert"


def _marked_encoder() -> str:
    """The tiny encoder with markers on classes the class-style port changes, keeps, and duplicates in-file."""
    source = (FIXTURES / "class_style" / "modeling_tiny_encoder.py").read_text()

    def mark(anchor: str, comment: str) -> None:
        nonlocal source
        assert anchor in source
        indent = anchor[: len(anchor) - len(anchor.lstrip())]
        source = source.replace(anchor, f"{indent}# Copied from {comment}\n{anchor}", 1)

    layer_forward = "    def forward(self, hidden_states, attention_mask=None):\n        return self.norm(hidden_states + self.attention("
    mark(layer_forward, f"{BERT}.BertLayer.forward")
    layer = source[source.index("class TinyEncoderLayer(") : source.index("class TinyEncoderPreTrainedModel")]
    source = source.replace("class TinyEncoderPreTrainedModel", layer.replace("TinyEncoderLayer", "TinyEncoderOtherLayer") + "class TinyEncoderPreTrainedModel")
    mark("class TinyEncoderConfig(", "transformers.models.bert.configuration_bert.BertConfig with Bert->TinyEncoder")
    mark("class TinyEncoderSelfAttention(", f"{BERT}.BertSelfAttention with Bert->TinyEncoder")
    mark("class TinyEncoderLayer(", f"{BERT}.BertLayer with Bert->TinyEncoder")
    mark("class TinyEncoderOtherLayer(", "transformers.models.tiny_encoder.modeling_tiny_encoder.TinyEncoderLayer with TinyEncoderLayer->TinyEncoderOtherLayer")
    mark("    def forward(self, input_ids, attention_mask=None):", f"{BERT}.BertModel.forward")
    return source


ENCODER = "/src/transformers/models/tiny_encoder/modeling_tiny_encoder.py"


@pytest.fixture(scope="module")
def ported() -> tuple[str, object]:
    source = _marked_encoder()
    return source, port_source(source, filename=ENCODER)


def _markers(source: str) -> set[tuple[str, str | None]]:
    return {(m.owner, m.method) for m in find_markers(ast.parse(source), source.splitlines())}


def test_markers_found_on_classes_and_methods() -> None:
    assert _markers(_marked_encoder()) == {
        ("TinyEncoderConfig", None),
        ("TinyEncoderSelfAttention", None),
        ("TinyEncoderLayer", None),
        ("TinyEncoderLayer", "forward"),
        ("TinyEncoderOtherLayer", None),
        ("TinyEncoderOtherLayer", "forward"),
        ("TinyEncoderModel", "forward"),
    }


def test_stale_markers_removed_the_rest_kept(ported) -> None:  # type: ignore[no-untyped-def]
    source, result = ported
    assert result.status is Status.PORTED
    assert _markers(source) - _markers(result.source) == {("TinyEncoderLayer", None), ("TinyEncoderModel", "forward")}
    notes = "\n".join(result.notes + result.warnings)
    warnings = "\n".join(result.warnings)
    assert f"removed the `# Copied from {BERT}.BertLayer` marker on TinyEncoderLayer" in warnings
    assert f"removed the `# Copied from {BERT}.BertModel.forward` marker on TinyEncoderModel.forward" in warnings
    # TinyEncoderLayer.forward and the config were not touched; the attention class itself is unchanged in class style
    assert "TinyEncoderLayer.forward" not in notes and "TinyEncoderConfig" not in notes


def test_in_file_copy_that_still_matches_keeps_its_marker(ported) -> None:  # type: ignore[no-untyped-def]
    _, result = ported
    assert ("TinyEncoderOtherLayer", None) in _markers(result.source)
    assert any(n.startswith("kept the `# Copied from` marker on TinyEncoderOtherLayer") for n in result.notes)


def test_in_file_copy_without_the_file_name_cannot_be_proved() -> None:
    result = port_source(_marked_encoder())
    assert ("TinyEncoderOtherLayer", None) not in _markers(result.source)


def test_upstream_of_each_ported_class_is_reported(ported) -> None:  # type: ignore[no-untyped-def]
    _, result = ported
    assert f"TinyEncoderSelfAttention is copied from {BERT}.BertSelfAttention with Bert->TinyEncoder: port the upstream class as well" in result.notes


def test_the_port_of_the_port_changes_nothing(ported) -> None:  # type: ignore[no-untyped-def]
    _, result = ported
    again = port_source(result.source, filename=ENCODER)
    assert again.status is Status.UNCHANGED and again.source == result.source


BEFORE = '''\
# Copied from transformers.models.a.modeling_a.AAttention with A->B
class BAttention:
    def forward(self, x):
        return x


class BLayer:
    # Copied from transformers.models.a.modeling_a.ALayer.forward with A->B
    @staticmethod
    def forward(x):
        return x
'''


@pytest.mark.parametrize(
    "after,stale",
    [
        (BEFORE, set()),  # nothing changed: no marker is touched
        (BEFORE.replace("return x\n\n\nclass", "return x + 1\n\n\nclass"), {("BAttention", None)}),
        (BEFORE.replace("def forward(x):\n        return x", "def forward(x):\n        return -x"), {("BLayer", "forward")}),
    ],
    ids=["unchanged", "class-changed", "method-changed"],
)
def test_decide_and_remove(after: str, stale: set[tuple[str, str | None]]) -> None:
    decisions = decide(ast.parse(BEFORE), ast.parse(after), after, "modeling_b")
    assert {(d.marker.owner, d.marker.method) for d in decisions if not d.kept} == stale
    cleaned = remove_markers(cst.parse_module(after), [d.marker for d in decisions]).code
    assert _markers(cleaned) == _markers(after) - stale
    assert [line for line in cleaned.splitlines() if "Copied from" not in line] == [
        line for line in after.splitlines() if "Copied from" not in line
    ]


MARKED = "# Copied from transformers.models.x.modeling_x.XAttention"


@pytest.mark.parametrize(
    "comment,replacements",
    [
        (MARKED, ()),
        (f"    {MARKED} with X->Y, x->y", (("X", "Y", False), ("x", "y", False))),
        (f"{MARKED} with X->Y all-casing, Self->Cross", (("X", "Y", True), ("Self", "Cross", False))),
        (f"{MARKED} but shorter", ()),
        ("# Copied from https://github.com/facebookresearch/detr/blob/master/models/detr.py", None),
        ("# copies of this are elsewhere", None),
    ],
    ids=["plain", "replacements", "all-casing", "free-text", "not-transformers", "not-a-marker"],
)
def test_parse_marker(comment: str, replacements: tuple[tuple[str, str, bool], ...] | None) -> None:
    copied = parse_marker(comment)
    if replacements is None:
        assert copied is None
    else:
        assert copied == CopiedFrom("models.x.modeling_x.XAttention", replacements, comment.strip())


def test_replacements_apply_in_order_with_their_own_casing_option() -> None:
    copied = parse_marker(f"{MARKED} with Bert->Ernie all-casing, Self->Cross")
    assert copied is not None
    assert copied.apply("BERT_SELF SelfBert bert") == "ERNIE_SELF CrossErnie ernie"


BANNER = """\
#                🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨
#           This file was automatically generated from src/transformers/models/tiny_decoder/modular_tiny_decoder.py.
#               Do NOT edit this file manually as any edits will be overwritten by the generation of
#             the file from the modular. If any change should be done, please apply the change to the
#                          modular_tiny_decoder.py file directly. One of our CI enforces this.
#                🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨🚨
"""


def test_generated_modeling_file_warns_that_the_change_belongs_in_the_modular_file() -> None:
    source = BANNER + (FIXTURES / "class_style" / "modeling_tiny_decoder.py").read_text()
    result = port_source(source, filename="modeling_tiny_decoder.py")
    assert result.status is Status.PORTED
    assert any("generated from src/transformers/models/tiny_decoder/modular_tiny_decoder.py" in w for w in result.warnings)
    plain = port_source((FIXTURES / "class_style" / "modeling_tiny_decoder.py").read_text(), filename="modeling_tiny_decoder.py")
    assert not any("modular" in w for w in plain.warnings)


def test_banner_only_counts_in_the_leading_comments() -> None:
    assert generated_from(BANNER + "import torch\n") == "src/transformers/models/tiny_decoder/modular_tiny_decoder.py"
    assert generated_from("import torch\n" + BANNER) is None


def test_modular_file_with_the_attention_code_is_ported() -> None:
    source = (FIXTURES / "class_style" / "modeling_tiny_decoder.py").read_text()
    result = port_source(source, filename="models/tiny_decoder/modular_tiny_decoder.py")
    assert result.status is Status.PORTED
    assert "ported a modular file: regenerate modeling_tiny_decoder.py from it (utils/modular_model_converter.py)" in result.notes


def test_modular_file_building_on_modeling_classes_is_a_modeling_file() -> None:
    source = textwrap.dedent(
        """\
        from ..llama.modeling_llama import LlamaMLP


        class TinyMLP(LlamaMLP):
            pass
        """
    )
    assert port_source(source).detail == "no eager attention found"
    assert port_source("class Plain:\n    pass\n").detail.startswith("not a modeling file")
