"""Transformers' own warnings held back while the checks run: they are about the tiny configs, not the port."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def transformers_quiet() -> Iterator[None]:
    """Transformers' logging held at errors while the checks run.

    Its warnings are about the tiny configs the checks build (`add is_decoder=True`), not the port.
    """
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
