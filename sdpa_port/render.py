"""Render the jinja2 templates in `templates/` and parse the result into CST, so template errors surface here."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import libcst as cst


class TemplateError(Exception):
    """A template rendered into text that is not valid Python."""


def _templates_dir() -> Path:
    # installed wheels carry the templates as the package `sdpa_port.templates`; a checkout has them at the root
    try:
        packaged = resources.files("sdpa_port.templates")
        if packaged.is_dir():
            return Path(str(packaged))
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent / "templates"


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
