"""Render the jinja2 templates in `templates/` and parse the result into CST, so template errors surface here."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import libcst as cst


class TemplateError(Exception):
    """A template rendered into text that is not valid Python."""


def _templates_dir() -> Path:
    """Installed wheels carry the templates inside the package; a source checkout has them at its root."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "class_style").is_dir():
            return candidate
    raise FileNotFoundError(f"sdpa-port templates not found next to {here}")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_text(template: str, /, **values: Any) -> str:
    return environment().get_template(template).render(**values)


def render_module(template: str, /, **values: Any) -> cst.Module:
    text = render_text(template, **values)
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as error:
        raise TemplateError(f"template {template} rendered invalid Python: {error.message} (line {error.raw_line})") from error


def render_statements(template: str, /, **values: Any) -> list[cst.BaseStatement]:
    return list(render_module(template, **values).body)
