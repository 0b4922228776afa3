"""Command help that the terminal wraps at its own width, not at the docstring's line breaks.

Typer's rich help keeps the single line breaks of every paragraph after the first, so a docstring wrapped at 119
columns breaks in mid-sentence on an 80-column terminal. `Reflowed` joins each paragraph into one line before typer
sees it; paragraphs stay apart.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand


def reflowed(text: str | None) -> str | None:
    """The text with each paragraph on one line, paragraphs still separated by a blank line."""
    if text is None:
        return None
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in text.split("\n\n"))


class Reflowed(TyperCommand):
    """A typer command whose help paragraphs are reflowed; pass it as `cls` to `app.command`."""

    def __init__(self, *args: Any, help: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, help=reflowed(help), **kwargs)
