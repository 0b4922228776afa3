"""docs/refusals.md: every refusal code is documented, and every documented example gets exactly its code."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from sdpa_port import Status, port_source
from sdpa_port.refusals import Code

DOC = Path(__file__).resolve().parents[2] / "docs" / "refusals.md"
MARK = re.compile(r"<!-- (example|scaffold): (\S+)(?: (\S+))? -->\n```python\n(.*?)```", re.S)


def blocks() -> tuple[str, dict[str, tuple[str, str]]]:
    scaffold = ""
    examples: dict[str, tuple[str, str]] = {}
    for kind, first, second, body in MARK.findall(DOC.read_text(encoding="utf-8")):
        if kind == "scaffold":
            scaffold = body
        else:
            examples[first] = (second, body)
    return scaffold, examples


SCAFFOLD, EXAMPLES = blocks()


def source_of(code: str) -> str:
    form, body = EXAMPLES[code]
    if form != "forward":
        return body
    return SCAFFOLD.replace("        ...\n", textwrap.indent(body, " " * 8), 1)


def test_every_code_is_documented_with_an_example() -> None:
    text = DOC.read_text(encoding="utf-8")
    for code in Code:
        assert f"### {code.code}: {code.title}" in text, code
    assert sorted(EXAMPLES) == sorted(code.code for code in Code)


@pytest.mark.parametrize("code", sorted(EXAMPLES))
def test_example_gets_its_code(code: str) -> None:
    source = source_of(code)
    compile(source, f"{code}.py", "exec")
    result = port_source(source, filename=f"modeling_{code.lower()}.py")
    assert result.status is Status.REFUSED, (result.status, result.detail)
    assert {r.code.code for r in result.refusals} == {code}, result.reasons
    assert result.source == source
