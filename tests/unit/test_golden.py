"""Whole-file ports of the fixtures against golden files, refusals, no-change cases and idempotence.

The interface-style fixtures are written as transformers 5 files; their eager computation moves into
`eager_attention_forward`, so only the class-style ports keep every input line.

Regenerate the golden files after an intended change with `python scripts/regen_golden.py` and review the diff of
fixtures/golden/; this test only compares.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sdpa_port import Status, port_source

ROOT = Path(__file__).resolve().parents[2] / "fixtures"
CLASS_STYLE = sorted((ROOT / "class_style").glob("modeling_*.py"))
INTERFACE_STYLE = sorted((ROOT / "interface_style").glob("modeling_*.py"))  # transformers 5 files
INLINE_STYLE = sorted((ROOT / "inline_style").glob("modeling_*.py"))  # remote code the class style cannot wire
PORTABLE = CLASS_STYLE + INTERFACE_STYLE + INLINE_STYLE
REFUSED = {
    "modeling_tiny_topk.py": ("TinyTopKAttention", 16, "`.topk()` is applied to the scores"),
    "modeling_tiny_value_relative.py": ("TinyRelativeAttention", 23, "the probabilities are used after the product with V"),
    "modeling_tiny_softcap.py": ("TinySoftcapAttention", 16, "the scores are passed to `torch.tanh`"),
    "modeling_tiny_kept_map.py": ("TinyKeptMapAttention", 17, "`.clone()` is applied to the probabilities"),
    "modeling_tiny_wrapped_product.py": (
        "TinyChannelsAttention",
        31,
        "come from `scores` (`self.matmul_qk(query, key)`, line 27, a product whose right operand is not seen as a key",
    ),
}
UNCHANGED = {
    "modeling_tiny_router.py": "no eager attention found",
    "modeling_tiny_supported.py": "already supports SDPA",
}


@pytest.mark.parametrize("path", PORTABLE, ids=lambda p: p.name)
def test_port_matches_golden(path: Path) -> None:
    result = port_source(path.read_text(encoding="utf-8"), filename=path.name)
    assert result.status is Status.PORTED, result.reasons
    assert result.style == path.parent.name.removesuffix("_style")
    golden = ROOT / "golden" / path.name
    assert result.source == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", PORTABLE, ids=lambda p: p.name)
def test_port_is_idempotent(path: Path) -> None:
    once = port_source(path.read_text(encoding="utf-8"))
    twice = port_source(once.source)
    assert twice.status is Status.UNCHANGED and twice.detail == "already supports SDPA"
    assert twice.source == once.source


@pytest.mark.parametrize("path", CLASS_STYLE + INLINE_STYLE, ids=lambda p: p.name)
def test_untouched_outside_edited_regions(path: Path) -> None:
    """Every line of the input survives, in order: the port only adds lines or replaces edited statements.

    An inline port that keeps no eager forward (no call can ask for what only eager gives) replaces the attention
    statements of the forward it rewrites: lines of those forwards may go, no others."""
    before = path.read_text(encoding="utf-8").splitlines()
    result = port_source("\n".join(before) + "\n")
    after = result.source.splitlines()
    import ast
    import difflib

    rewritten: set[int] = set()  # the lines of forwards rewritten in place with no eager forward kept
    keeping = {  # the classes whose port keeps an eager forward
        node.name
        for node in ast.walk(ast.parse(result.source))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(method, ast.FunctionDef) and method.name == "_eager_forward" for method in node.body)
    }
    for node in ast.walk(ast.parse("\n".join(before))):
        if isinstance(node, ast.ClassDef) and node.name in result.attention_classes and node.name not in keeping:
            for method in node.body:
                if isinstance(method, ast.FunctionDef) and method.name == "forward":
                    rewritten.update(range(method.lineno, (method.end_lineno or method.lineno) + 1))
    removed: list[str] = []
    number = 0
    for line in difflib.ndiff(before, after):
        if line.startswith(("- ", "  ")):
            number += 1
        if line.startswith("- ") and number not in rewritten:
            removed.append(line)
    # the only removed lines are the dict-free constructions, mask helper calls and imports that were rewritten
    for line in removed:
        assert any(token in line for token in ("(config", "_prepare_4d", "get_extended_attention_mask", "import ")), line


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refusals_have_class_line_and_reason(name: str) -> None:
    source = (ROOT / "refused" / name).read_text(encoding="utf-8")
    result = port_source(source)
    assert result.status is Status.REFUSED
    assert result.source == source
    class_name, line, reason = REFUSED[name]
    (message,) = result.reasons
    assert message.startswith(f"{class_name} (line {line}): ")
    assert reason in message


@pytest.mark.parametrize("name", sorted(UNCHANGED))
def test_unchanged_cases(name: str) -> None:
    source = (ROOT / "unchanged" / name).read_text(encoding="utf-8")
    result = port_source(source)
    assert result.status is Status.UNCHANGED and result.detail == UNCHANGED[name]
    assert result.source == source
