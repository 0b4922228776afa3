"""The README stays a short first page, its links and the docs' links resolve, and its option list is the CLI's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from sdpa_port.cli import port_app
from sdpa_port.result import Style

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_WORDS = 1500

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without code: fenced blocks and inline spans (`D[k](x)` in code is no link)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = INLINE_CODE.sub(lambda found: found.group(0).strip("`"), heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M)
    return {slug(heading) for heading in headings}


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page.read_text(encoding="utf-8")))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # https:, mailto:
    ]


def test_readme_is_short() -> None:
    words = len(README.read_text(encoding="utf-8").split())
    assert words <= MAX_WORDS, f"README.md has {words} words (at most {MAX_WORDS}); move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_link_finder_sees_links_and_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "[a](gone.md) [b](https://example.com) `D[k](x)`\n```python\nX[y](z)\n```\n[c](page.md#top)\n# Top\n",
        encoding="utf-8",
    )
    assert relative_links(page) == ["gone.md", "page.md#top"]
    assert anchors(page) == {"top"}


def usage_block() -> str:
    """The README's command summary: the code block of its "Using it" section."""
    section = README.read_text(encoding="utf-8").split("## Using it", 1)[1]
    found = re.search(r"^```\n(.*?)^```", section, re.S | re.M)
    assert found, "README's Using it section has no command block"
    return found.group(1)


def test_readme_lists_the_options_of_sdpa_port_help() -> None:
    command = typer.main.get_command(port_app)
    block = usage_block()
    listed = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", block))
    known = {"-h", "--help"}
    for param in command.params:
        if param.param_type_name != "option":
            continue
        names = {*param.opts, *param.secondary_opts}
        known |= names
        assert names & listed, f"README's Using it block does not list {'/'.join(sorted(names))}"
    assert listed <= known, f"README lists options sdpa-port does not have: {sorted(listed - known)}"
    styles = re.search(r"--style (\S+)", block)
    assert styles and set(styles.group(1).split("|")) == {style.value for style in Style}
