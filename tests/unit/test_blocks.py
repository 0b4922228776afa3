"""Score matrices joined from blocks (`analyse/forms/blocks.py`), and a query-key product each branch of an `if`
computes its own way (`ChainBook.alternatives`): what ports, and the look-alikes refused, on the blocks fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdpa_port import Status, Style, port_source
from sdpa_port.analyse.chain_book import ChainBook
from helpers import flat

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "class_style" / "modeling_tiny_blocks.py"
JOINED = "            scores = torch.cat([token_rows, memory_rows], dim=2)\n"
PLAIN = "            scores = torch.matmul(query, key.transpose(-1, -2))\n"


def fixture() -> str:
    source = FIXTURE.read_text(encoding="utf-8")
    assert JOINED in source and PLAIN in source
    return source


def sdpa_forward(source: str) -> str:
    start = source.index("class TinyBlocksSdpaAttention")
    return source[start : source.index("\nTINY_BLOCKS_ATTENTION_CLASSES")]


def test_each_branch_names_the_operands_of_its_own_product() -> None:
    ported = port_source(fixture(), style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    forward = sdpa_forward(ported.source)
    assert forward.count("scaled_dot_product_attention(") == 1
    assert forward.count("sdpa_query = ") == 2 and forward.count("sdpa_key = ") == 2
    # the query, bound only to be named, is named where it is computed (`rewrite/squeeze.py`)
    assert "            sdpa_query = self.split(self.query(both))\n            sdpa_key = key\n" in forward
    # the blocks' products and their concatenations are gone; the operands they read stay
    assert "torch.matmul(" not in forward and "token_rows" not in forward and "memory_rows" not in forward
    assert "recall_key = self.split(self.recall_key(hidden_states))" in forward
    # the token rows read one key per block, the memory rows theirs: four slices, zeros beside each operand
    joined = flat(forward).split("sdpa_query = ")[1].split("\n")[0]  # the statement, whatever its layout
    assert joined.count("new_zeros(") == 4, joined
    # the zeros take their widths from operands of their own side: the joined query reads no key, the joined key no
    # query (what the keys read decides whether they are the queries' own positions; seed 210331)
    assert "key" not in joined.replace("sdpa_key", ""), joined
    keys = flat(forward).split("sdpa_key = ")[1].split("\n")[0]
    assert "query" not in keys, keys


@pytest.mark.parametrize(
    "change,code,reason",
    [
        # a branch whose scores change dtype before the branches meet: the branches' scores differ in more than
        # a scale or a term (one branch's product in float32, the other's not)
        ((PLAIN, PLAIN.replace("))\n", ")).float()\n")), "S110", "the scores are replaced under a condition"),
        # a block kept aside after it joined the matrix
        ((JOINED, JOINED + "            self.kept = remembered\n"), "S104", "`remembered` is used again after its scores joined"),
        # a block changed after it joined (its statement goes with the block's product)
        ((JOINED, JOINED + "            remembered += 1\n"), "S104", "joined into others at line 88 are changed again at line 90"),
        ((JOINED, JOINED + "            remembered.mul_(2)\n"), "S104", "are changed again at line 90"),
        # an operand changed in place between its block's product and the concatenation
        (
            ("            memory_rows = torch.cat(", "            memory_key.mul_(2)\n            memory_rows = torch.cat("),
            "S101",
            "`memory_key` changes between the product",
        ),
        # a block scaled on its own before it joins
        (("torch.cat([recalled, remembered], dim=3)", "torch.cat([recalled * 2, remembered], dim=3)"), "S101", "is changed before"),
        # concatenated along the heads
        (("torch.cat([recalled, remembered], dim=3)", "torch.cat([recalled, remembered], dim=1)"), "S101", "along dimension `1`"),
    ],
    ids=["cast-branch", "kept-block", "block-changed", "block-changed-in-place", "in-place", "scaled-block", "heads"],
)
def test_look_alikes_keep_the_blocks_on_eager(change: tuple[str, str], code: str, reason: str) -> None:
    """What the blocks' branch does that no joined product expresses leaves that branch (a test of the module's
    settings) on eager, said with the reason; the other branch's one product ports."""
    source = fixture()
    assert source.count(change[0]) == 1, change[0]
    ported = port_source(source.replace(*change), style=Style.CLASS)
    assert ported.status is Status.PORTED, ported.reasons
    assert "        if output_attentions or self.block_queries:\n" in sdpa_forward(ported.source)
    assert sdpa_forward(ported.source).count("sdpa_query") == 0  # one product, the plain branch's
    (warning,) = ported.warnings
    assert "only where `not self.block_queries`" in warning and f"[{code}]" in warning and reason in warning, warning


def test_a_branch_may_scale_its_own_product_or_add_a_term_before_the_branches_meet() -> None:
    """Each branch's own scale and terms become updates of the scale and the mask SDPA is handed, in that branch."""
    scaled = PLAIN.replace("))\n", ")) * 2\n")
    termed = "            scores = torch.cat([token_rows, memory_rows], dim=2) + self.block_bias\n"
    ported = port_source(fixture().replace(PLAIN, scaled).replace(JOINED, termed), style=Style.CLASS)
    assert ported.status is Status.PORTED and not ported.warnings, (ported.reasons, ported.warnings)
    forward = sdpa_forward(ported.source)
    assert forward.count("scaled_dot_product_attention(") == 1 and "scale=sdpa_scale" in forward
    assert "sdpa_scale = 1.0\n" in forward and "sdpa_mask = None\n" in forward
    blocks, plain = forward.split("        else:\n")[0], forward.split("        else:\n")[1]
    assert "            sdpa_mask = self.block_bias\n" in blocks and "sdpa_scale = sdpa_scale * 2" not in blocks
    assert "            sdpa_scale = sdpa_scale * 2\n" in plain and "block_bias" not in plain
    # the common scale after the branches scales both the scale and any mask a branch began
    tail = forward.split("        else:\n")[1].split("sdpa_scale = sdpa_scale * 2\n")[1]
    assert "sdpa_scale = sdpa_scale * self.scaling" in tail and "sdpa_mask * self.scaling" in tail, tail


def test_a_term_along_the_keys_only_is_handed_over_with_two_dimensions() -> None:
    """SDPA takes masks of two dimensions or more: a one-dimensional term (`torch.arange(k)`, fuzz seed 213873),
    which may be the whole mask, joins it as `torch.atleast_2d(term)`, the same broadcast."""
    ranged = PLAIN.replace("))\n", ")) + torch.arange(key.shape[-2], dtype=query.dtype)\n")
    ported = port_source(fixture().replace(PLAIN, ranged), style=Style.CLASS)
    assert ported.status is Status.PORTED and not ported.warnings, (ported.reasons, ported.warnings)
    plain = sdpa_forward(ported.source).split("        else:\n")[1]
    assert "            sdpa_mask = torch.atleast_2d(torch.arange(key.shape[-2], dtype=query.dtype))\n" in plain, plain


def test_a_product_replaced_in_one_branch_only_is_refused() -> None:
    """The plain product computed before the `if` and replaced by the blocks in one branch: not a product of each
    branch's own (the rule takes products new in the branches only)."""
    before = f"        else:\n            query = self.split(self.query(both))\n{PLAIN}"
    source = fixture().replace(before, "")
    source = source.replace(
        "        if self.block_queries:\n",
        f"        query = self.split(self.query(both))\n{PLAIN[4:]}        if self.block_queries:\n",
    )
    refused = port_source(source, style=Style.CLASS)
    assert [r.code.code for r in refused.refusals] == ["S110"], refused.reasons
    assert "the scores are replaced under a condition" in refused.reasons[0]


def test_without_the_alternatives_rule_the_blocks_stay_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """The blocks' branch ports because of the rule: without it, only the other branch does."""
    monkeypatch.setattr(ChainBook, "alternatives", lambda self, values, first_new, line: None)
    ported = port_source(fixture(), style=Style.CLASS)
    assert "        if output_attentions or self.block_queries:\n" in sdpa_forward(ported.source)


FIXTURE5 = Path(__file__).resolve().parents[2] / "fixtures" / "interface_style" / "modeling_tiny_blocks5.py"


def plain_in_both_branches() -> str:
    """The transformers 5 fixture with a plain product in each branch, the second's query doubled."""
    source = FIXTURE5.read_text(encoding="utf-8")
    start = source.index("            token_query = self.split(")
    end = source.index(JOINED) + len(JOINED)
    source = source[:start] + PLAIN + source[end:]
    return source.replace(f"        else:\n            query = self.split(self.query(both))\n{PLAIN}", (
        "        else:\n            query = self.split(self.query(both))\n"
        "            scores = torch.matmul(query * 2, key.transpose(-1, -2))\n"
    )).replace("        if self.block_queries:\n" + PLAIN, "        if self.block_queries:\n            query = self.split(self.query(both))\n" + PLAIN)


def test_the_eager_function_reads_the_handed_operands_only_in_the_product_that_took_them() -> None:
    """Each branch dispatches its own operands: the product of plain names reads the `query` and `key` handed over;
    the other branch's `query * 2` reads forward's own `query` (passed on as `query_`), not the handed one, which in
    that branch is already doubled."""
    ported = port_source(plain_in_both_branches(), style=Style.INTERFACE)
    assert ported.status is Status.PORTED, ported.reasons
    eager = ported.source[ported.source.index("def eager_attention_forward") :]
    eager = eager[: eager.index("\nclass ")]
    assert "        scores = torch.matmul(query, key.transpose(-1, -2))\n" in eager, eager
    assert "        scores = torch.matmul(query_ * 2, key_.transpose(-1, -2))\n" in eager, eager
    assert "query_=query," in ported.source and "key_=key," in ported.source


def test_where_the_keys_come_from_is_read_over_every_branch() -> None:
    """A branch reading keys from the encoder's states beside one reading the module's own: the site lists both
    branches' operands, so the checks of where keys come from (caches, cross-attention states) see the encoder's."""
    from helpers import analyse, attention_module

    body = """
    if self.flag:
        scores = query @ key.transpose(-1, -2)
    else:
        scores = query @ encoder_hidden_states.transpose(-1, -2)
    probs = scores.softmax(-1)
    return probs @ value
    """
    source = attention_module(body, init="self.flag = config.flag", signature="query, key, value, encoder_hidden_states=None")
    analysis = analyse(source)
    assert analysis is not None and analysis.refusal is None, analysis
    (site,) = analysis.sites
    assert (site.query, site.key) == ("(query, query)", "(key, encoder_hidden_states)")
