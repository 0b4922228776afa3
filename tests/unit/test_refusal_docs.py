"""docs/refusals.md: every refusal code is documented, and every documented example gets exactly its code.

Each code has one section, `### CODE: title`, under its family's heading (`## S: ...` for S101), with the same four
parts in order, as ruff's rule pages have: what it is, why no exact SDPA call expresses it, what would make it
portable, and the example (the tested block of that code).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from sdpa_port import Status, port_source
from sdpa_port.refusals import Code

DOC = Path(__file__).resolve().parents[2] / "docs" / "refusals.md"
# `<!-- example: CODE FORM [STYLE] -->`: FORM is `file` or `forward` (the body of the scaffold's forward); STYLE the
# `--style` the example is ported with, auto where none is given
MARK = re.compile(r"<!-- (example|scaffold): (\S+)(?: (\S+))?(?: (\S+))? -->\n```python\n(.*?)```", re.S)


def blocks() -> tuple[str, dict[str, tuple[str, str]], dict[str, str]]:
    scaffold = ""
    examples: dict[str, tuple[str, str]] = {}
    styles: dict[str, str] = {}
    for kind, first, second, style, body in MARK.findall(DOC.read_text(encoding="utf-8")):
        if kind == "scaffold":
            scaffold = body
        else:
            examples[first] = (second, body)
            styles[first] = style or "auto"
    return scaffold, examples, styles


SCAFFOLD, EXAMPLES, STYLES = blocks()


PARTS = ("What it is", "Why no exact SDPA call expresses it", "What would make it portable", "Example")
HEADING = re.compile(r"^(##|###) (\S+?): (.*)$", re.M)


def sections(text: str) -> dict[str, tuple[str, str, str]]:
    """Each `### CODE: title` section: (the family heading above it, its title, its text up to the next heading)."""
    found: dict[str, tuple[str, str, str]] = {}
    family = ""
    headings = list(HEADING.finditer(text))
    for index, heading in enumerate(headings):
        level, name, title = heading.groups()
        if level == "##":
            family = name
            continue
        end = headings[index + 1].start() if index + 1 < len(headings) else len(text)
        assert name not in found, f"{name} is documented twice"
        found[name] = (family, title, text[heading.end() : end])
    return found


def parts_of(body: str) -> list[tuple[str, str]]:
    """The `**Part.**` labels of a section, in order, each with the text it heads (up to the next label)."""
    labels = list(re.finditer(r"^\*\*(.+?)\.\*\*", body, re.M))
    return [
        (label.group(1), body[label.end() : labels[i + 1].start() if i + 1 < len(labels) else len(body)].strip())
        for i, label in enumerate(labels)
    ]


SECTIONS = sections(DOC.read_text(encoding="utf-8"))


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


def test_no_section_documents_a_code_that_does_not_exist() -> None:
    assert sorted(SECTIONS) == sorted(code.code for code in Code)
    for code in Code:
        assert SECTIONS[code.code][1] == code.title, (code.code, SECTIONS[code.code][1])


@pytest.mark.parametrize("code", sorted(SECTIONS))
def test_section_sits_under_its_family(code: str) -> None:
    assert SECTIONS[code][0] == code[0], f"{code} is documented under the heading of family {SECTIONS[code][0]}"


@pytest.mark.parametrize("code", sorted(SECTIONS))
def test_section_has_the_four_parts_in_order(code: str) -> None:
    parts = parts_of(SECTIONS[code][2])
    assert tuple(label for label, _ in parts) == PARTS, (code, [label for label, _ in parts])
    for label, text in parts:
        assert text, f"{code}: **{label}.** is empty"
    example = parts[-1][1]
    assert re.match(rf"<!-- example: {code}[ -]", example), f"{code}: **Example.** does not hold its tested block"
    assert example.endswith("```"), f"{code}: text after the example block"


@pytest.mark.parametrize("code", sorted(EXAMPLES))
def test_example_gets_its_code(code: str) -> None:
    source = source_of(code)
    compile(source, f"{code}.py", "exec")
    result = port_source(source, filename=f"modeling_{code.lower()}.py", style=STYLES[code])
    assert result.status is Status.REFUSED, (result.status, result.detail)
    assert {r.code.code for r in result.refusals} == {code}, result.reasons
    assert result.source == source
