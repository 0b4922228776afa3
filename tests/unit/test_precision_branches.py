"""A query-key product taken on float32 copies of its operands in one branch of an `if` and in the model's dtype in
the other (`ChainBook.alternatives`, latent diffusion's `_ATTN_PRECISION` switch): what ports, on the precision
fixture, and the look-alikes refused."""

from __future__ import annotations

from pathlib import Path

from sdpa_port import Status, Style, port_source

ROOT = Path(__file__).resolve().parents[2] / "fixtures"
FIXTURE = ROOT / "inline_style" / "modeling_tiny_precision.py"
UPCAST = '            q, k = q.float(), k.float()\n            sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale\n'


def fixture() -> str:
    source = FIXTURE.read_text(encoding="utf-8")
    assert UPCAST in source
    return source


def codes(source: str, style: Style = Style.INLINE) -> list[str]:
    result = port_source(source, filename=FIXTURE.name, style=style)
    assert result.status is not Status.PORTED, result.source
    return [r.code.code for r in result.refusals]


def test_the_branches_are_one_product_run_in_the_dtype_of_the_branch_that_ran() -> None:
    ported = port_source(fixture(), filename=FIXTURE.name, style=Style.INLINE)
    assert ported.status is Status.PORTED, ported.reasons
    forward = ported.source[ported.source.index("    def forward(") : ported.source.index("    def _eager_forward(")]
    upcast, plain = forward.split("        else:\n")
    # each branch hands over its own operands: float32 copies in one, the model's dtype in the other
    assert "q, k = q.float(), k.float()\n            sdpa_query = q\n            sdpa_key = k\n" in upcast, forward
    assert "            sdpa_query = q\n            sdpa_key = k\n            sdpa_scale = sdpa_scale * self.scale\n" in plain
    # SDPA runs in the query's dtype, the value and mask cast to it, the output cast back: no-ops where nothing is
    # upcast, what eager computes where the copies are
    assert "v.to(sdpa_query.dtype)," in plain and ").to(v.dtype)" in plain, plain
    assert "sdpa_mask = sdpa_mask.to(sdpa_query.dtype)" in plain, plain
    assert "-torch.finfo(sdpa_query.dtype).max" in plain, plain


def test_a_cast_inside_the_product_of_one_branch_only_is_refused() -> None:
    """Casts written in the product itself (`einsum(..., q.float(), k.float())`) are not the copies the rule takes."""
    inside = '            sim = torch.einsum("b i d, b j d -> b i j", q.float(), k.float()) * self.scale\n'
    refused = port_source(fixture().replace(UPCAST, inside), filename=FIXTURE.name, style=Style.INLINE)
    # only the other branch could port, and the fixture builds the module upcast: SDPA would never run
    assert [r.code.code for r in refused.refusals] == ["W408"], refused.reasons
    assert "the scores are replaced under a condition [S110]" in refused.reasons[0]


def test_an_upcast_branch_that_also_caps_its_scores_is_refused() -> None:
    capped = UPCAST + "            sim = sim.clamp(-30.0, 30.0)\n"
    refused = port_source(fixture().replace(UPCAST, capped), filename=FIXTURE.name, style=Style.INLINE)
    assert [r.code.code for r in refused.refusals] == ["W408"], refused.reasons
    assert "[S101]" in refused.reasons[0], refused.reasons


def test_an_upcast_branch_that_takes_its_own_softmax_is_refused() -> None:
    source = fixture().replace(UPCAST, UPCAST + "            sim = sim.softmax(dim=-1)\n")
    source = source.replace("        if mask is not None:\n", "            sim = sim.softmax(dim=-1)\n        if mask is not None:\n")
    source = source.replace("        attn = sim.softmax(dim=-1)\n", "        attn = sim\n")
    assert codes(source) == ["S110"]


FIXTURE5 = ROOT / "interface_style" / "modeling_tiny_blocks5.py"
PLAIN = "            scores = torch.matmul(query, key.transpose(-1, -2))\n"


def test_the_interface_style_refuses_branches_in_different_dtypes() -> None:
    """The interface style moves the copies with the first product only: branches that disagree are refused."""
    source = FIXTURE5.read_text(encoding="utf-8")
    before = f"        else:\n            query = self.split(self.query(both))\n{PLAIN}"
    assert before in source
    upcast = source.replace(
        before,
        "        else:\n            query = self.split(self.query(both))\n"
        "            query, key = query.float(), key.float()\n" + PLAIN,
    )
    refused = port_source(upcast, filename=FIXTURE5.name, style=Style.INTERFACE)
    assert [r.code.code for r in refused.refusals] == ["S110"], refused.reasons
    assert "different dtypes" in refused.reasons[0]
    assert port_source(source, filename=FIXTURE5.name, style=Style.INTERFACE).status is Status.PORTED
