"""How the checks read an exception: one short line, the optional package it lacks, or memory running out."""

from __future__ import annotations

import re


_REQUIRES = re.compile(r"requires the (\S+?) library", re.IGNORECASE)


def missing_package(error: BaseException) -> str | None:
    """The optional package an ImportError is about.

    Read from transformers' `requires_backends` message, or the module's name.
    """
    if not isinstance(error, ImportError):
        return None
    match = _REQUIRES.search(str(error))
    if match:
        return match.group(1)
    name = getattr(error, "name", None)
    if name:
        return name.split(".")[0]
    return None


def short_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:200]}"


def out_of_memory(error: BaseException) -> bool:
    """Whether an error is the machine's, not the port's: memory ran out.

    The checks could not run; the edge reports an error.
    """
    return isinstance(error, MemoryError) or "can't allocate memory" in str(error) or "DefaultCPUAllocator" in str(error)
