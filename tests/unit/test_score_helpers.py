"""Scores a helper method computes (`analyse/score_helpers.py`), written out in the class style's SDPA forward, and
a branch scaling its own product or adding a term before the branches meet (`ChainBook.alternatives`): what ports, on
the Conformer fixture, and the look-alikes whose relative side stays on eager, with the reason."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from sdpa_port import Status, Style, port_source
from sdpa_port.analyse.lines import Lines, top_level_starts
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.score_helpers import with_score_helpers

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "class_style" / "modeling_tiny_conformer.py"
CALL = "            scores = self._relative_scores(query, key, positions=hidden_states.size(1))\n"
HELPER = "    def _relative_scores(self, query, key, positions):\n"
RETURN = "        return (content + position) / math.sqrt(self.head_size)\n"


def fixture() -> str:
    source = FIXTURE.read_text(encoding="utf-8")
    assert source.count(CALL) == 1 and source.count(HELPER) == 1 and source.count(RETURN) == 1
    return source


def sdpa_forward(source: str) -> str:
    start = source.index("class TinyConformerSdpaSelfAttention")
    return source[start : source.index("\nTINY_CONFORMER_SELF_ATTENTION_CLASSES")]


def relative_branch(source: str) -> str:
    forward = sdpa_forward(source)
    return forward[forward.index('        if self.position_type == "relative":\n') : forward.index("        else:\n")]


def test_the_helper_is_written_out_in_the_sdpa_forward_and_the_eager_class_is_kept() -> None:
    ported = port_source(fixture(), style=Style.CLASS)
    assert ported.status is Status.PORTED and not ported.warnings, (ported.reasons, ported.warnings)
    assert any("TinyConformerSelfAttention._relative_scores" in note for note in ported.notes), ported.notes
    branch = relative_branch(ported.source)
    # the argument that is no plain name is evaluated once, first, under its parameter's name; the helper's own
    # comment comes along
    assert branch.index("positions = hidden_states.size(1)\n") < branch.index("steps = torch.arange(positions,")
    assert "# distances between every query and key position" in branch
    # the parameter the helper reassigns gets a name of its own: forward's `query` stays the query it was
    assert "            query_1 = query + self.position_bias\n" in branch
    assert "einsum(\"bhqd,hqkd->bhqk\", query_1, embedded)" in branch
    assert "            content_query = query + self.content_bias\n" in branch
    # the content product is SDPA's; the position term joins the mask; both branches scale by 1/sqrt(d)
    assert "            sdpa_query = content_query\n            sdpa_key = key\n" in branch
    # the position term, named only to be handed on, is the mask where it is computed (`rewrite/squeeze.py`)
    assert '            sdpa_mask = torch.einsum("bhqd,hqkd->bhqk", query_1, embedded)\n' in branch
    assert "torch.matmul(content_query" not in branch
    assert branch.count("sdpa_scale = sdpa_scale / math.sqrt(self.head_size)") == 1
    assert "return" not in branch and "_relative_scores" not in sdpa_forward(ported.source)
    # the eager class is as written
    assert CALL in ported.source and HELPER in ported.source and RETURN in ported.source


def test_the_inlined_forward_places_its_nodes_at_the_helpers_lines() -> None:
    source = fixture()
    module = cst.parse_module(source)
    import ast

    tree = ast.parse(source)
    facts, lines = ModuleFacts.of(module, tree), Lines(module, top_level_starts(tree))
    inlined, helpers = with_score_helpers(facts, lines)
    assert helpers == (("TinyConformerSelfAttention", "_relative_scores"),)
    assert facts.classes["TinyConformerSelfAttention"].methods["forward"] is not inlined.classes[
        "TinyConformerSelfAttention"
    ].methods["forward"]
    forward = inlined.classes["TinyConformerSelfAttention"].methods["forward"]
    numbered = source.splitlines()
    found: dict[str, int] = {}

    class _Statements(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            found[cst.Module([]).code_for_node(node).strip().splitlines()[-1]] = lines(node)  # past its comments

    forward.visit(_Statements())
    einsum = found['position = torch.einsum("bhqd,hqkd->bhqk", query_1, embedded)']
    assert "torch.einsum(" in numbered[einsum - 1]
    assert "hidden_states.size(1)" in numbered[found["positions = hidden_states.size(1)"] - 1]
    assert "self.query(hidden_states)" in numbered[found["query = self.split(self.query(hidden_states))"] - 1]


@pytest.mark.parametrize(
    "change,reason",
    [
        # the helper branches: no straight line of assignments
        (
            ("        content_query = query + self.content_bias\n", "        if positions > 1:\n            content_query = query + self.content_bias\n        else:\n            content_query = query\n"),
            "[S107]",
        ),
        # a statement that is no assignment (a change in place of a module's state)
        (("        content_query = query + self.content_bias\n", "        content_query = query + self.content_bias\n        self.seen = positions\n"), "[S107]"),
        # decorated
        ((HELPER, "    @torch.no_grad()\n" + HELPER), "[S107]"),
        # a star parameter
        ((HELPER, HELPER.replace("positions):", "positions, *extra):")), "[S107]"),
        # a default that is no simple value, left in place
        (
            (HELPER, HELPER.replace("positions):", "positions, offset=torch.zeros(1)):")),
            "[S107]",
        ),
        # a softmax in the helper: the attention itself, which helper calls handle, not scores
        ((RETURN, RETURN.replace("return (", "return torch.softmax(").replace(") / math", ", -1) / math")), None),
        # a module-level name the helper reads (`math`) is a local of forward's: written out there, it would read that
        (
            ("        value = self.split(self.value(hidden_states))\n", "        value = self.split(self.value(hidden_states))\n        math = None\n"),
            "[S107]",
        ),
    ],
    ids=["branches", "statement", "decorated", "star", "default", "softmax", "shadowed"],
)
def test_look_alikes_are_not_written_out(change: tuple[str, str], reason: str | None) -> None:
    source = fixture()
    assert source.count(change[0]) == 1, change[0]
    ported = port_source(source.replace(*change), style=Style.CLASS)
    assert "_relative_scores" not in sdpa_forward(ported.source) if ported.status is Status.PORTED else True
    assert not any("_relative_scores" in note for note in ported.notes), ported.notes
    if reason is not None:
        assert ported.status is Status.PORTED, ported.reasons
        (warning,) = ported.warnings
        assert 'only where `self.position_type != "relative"`' in warning and reason in warning, warning


def test_a_helper_a_subclass_overrides_is_not_written_out() -> None:
    """`self._relative_scores` of a subclass defined in the file is another function: no one body to write out."""
    subclass = (
        "\n\nclass TinyConformerOtherAttention(TinyConformerSelfAttention):\n"
        + HELPER
        + "        return torch.matmul(query, key.transpose(-1, -2))\n"
    )
    source = fixture().replace("\n\nclass TinyConformerLayer(", subclass + "\n\nclass TinyConformerLayer(", 1)
    ported = port_source(source, style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert not any("_relative_scores" in note for note in ported.notes), ported.notes
    assert "[S107]" in ported.warnings[0], ported.warnings



def test_a_helper_that_only_returns_its_scores_is_written_out_too() -> None:
    """`return q @ kᵀ / sqrt(d)` alone: the branch's product and scale are read through the call."""
    plain = "            scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_size)\n"
    helper = (
        "    def _plain_scores(self, query, key):\n"
        "        return torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_size)\n\n"
    )
    source = fixture()
    assert source.count(plain) == 1
    source = source.replace(plain, "            scores = self._plain_scores(query, key)\n").replace(HELPER, helper + HELPER)
    ported = port_source(source, style=Style.CLASS)
    assert ported.status is Status.PORTED and not ported.warnings, (ported.reasons, ported.warnings)
    assert any("TinyConformerSelfAttention._plain_scores" in note for note in ported.notes), ported.notes
    forward = sdpa_forward(ported.source)
    other = forward[forward.index("        else:\n") :]
    assert other.startswith("        else:\n            sdpa_query = query\n            sdpa_key = key\n"), other
    assert "            sdpa_scale = sdpa_scale / math.sqrt(self.head_size)\n" in other
    assert "_plain_scores" not in forward
