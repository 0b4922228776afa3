"""Whether a run verifies its ports.

Verifying imports, and so executes, the modeling file: by default it runs only for one file of the installed
transformers or of a Transformers checkout, whose code the user runs already; any other file runs only with `--verify`,
the consent transformers asks for with `trust_remote_code=True`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from sdpa_port.checkout.context import root_of
from sdpa_port.edge.files import Target, installed_transformers

TORCH = "torch==2.13.0"  # the release the checks are tested with
TRANSFORMERS = "'transformers>=4.40'"  # the oldest release they support
EXTRA = "pip install 'sdpa-port[verify]'"

NOT_ASKED = "--no-verify"
BATCH = "a batch run verifies only with --verify (it executes each modeling file)"
NOT_WRITING = "--check and --diff verify only with --verify"
# neither the installed transformers nor a checkout: the file is someone's code, run only when asked to
UNTRUSTED = (
    "the file is neither in the installed transformers nor in a Transformers checkout, and verifying executes it: "
    "port the original with --verify to run the parity checks before writing"
)

# files the checkout step ports or updates because they copy ported code: the checks run only on the files named
FAMILY = "ported because it copies code the port changed; only the files named are verified"
COPIES = "copies updated to follow the ported code; only the files named are verified"


class MissingDependency(Exception):
    """`--verify` without torch or transformers importable: one line naming what to install, exit 2."""


@dataclass(frozen=True)
class Verifying:
    """What a run does about verification, decided once for all its files."""

    run: bool = False  # load the original and the port and run the parity checks before writing
    by_default: bool = False  # run although --verify was not given: a port the checks cannot drive is still written
    unverified: str | None = None  # why the run's ports go unverified, when they do
    # interface-style ports also run under flex, flash (a stand-in kernel) and compiled, and say so where matched
    claims: bool = True


def decide(asked: bool | None, targets: list[Target], writing: bool) -> Verifying:
    """`asked` is True for --verify, False for --no-verify, None for neither.

    Raises `MissingDependency` for --verify without torch or transformers."""
    if asked is False:
        return Verifying(unverified=NOT_ASKED)
    if asked:
        missing = missing_modules()
        if missing:
            root = root_of(targets[0].path) if len(targets) == 1 else None
            raise MissingDependency(f"--verify needs {' and '.join(missing)}: {install_hint(missing, root)}")
        return Verifying(run=True)
    if len(targets) != 1 or not targets[0].explicit:
        return Verifying(unverified=BATCH)
    if not writing:
        return Verifying(unverified=NOT_WRITING)
    target = targets[0]
    installed = target.model is not None or in_installed_transformers(target.path)
    checkout = root_of(target.path)
    if not installed and checkout is None:
        return Verifying(unverified=UNTRUSTED)
    missing = missing_modules()
    if missing:
        needed = " and ".join(missing)
        return Verifying(unverified=f"verifying needs {needed}, not installed here: {install_hint(missing, checkout)}")
    if not installed:  # a checkout whose transformers is not the one imported
        return Verifying(
            unverified=f"transformers is imported from {installed_transformers()}, not from this checkout: "
            f"pip install -e {checkout} to verify the port against it, or give --verify to verify it against the "
            "transformers imported"
        )
    return Verifying(run=True, by_default=True)


def missing_modules() -> list[str]:
    """Which of torch and transformers cannot be imported, found without importing them."""
    return [name for name in ("torch", "transformers") if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module in sys.modules without a spec
        return False


def in_installed_transformers(path: Path) -> bool:
    root = installed_transformers()
    return root is not None and path.resolve().is_relative_to(root.resolve())


def install_hint(missing: list[str], checkout: Path | None) -> str:
    """The command that installs what verifying lacks.

    `pip install torch==2.13.0 'transformers>=4.40'`, or `pip install 'sdpa-port[verify]'`, for what is missing; a
    checkout's transformers is the checkout itself, installed editable.
    """
    wanted = [TORCH] if "torch" in missing else []
    if "transformers" in missing and checkout is not None:
        command = f"pip install {' '.join(wanted)}; pip install -e {checkout}" if wanted else f"pip install -e {checkout}"
        return command
    wanted += [TRANSFORMERS] if "transformers" in missing else []
    return f"pip install {' '.join(wanted)} (or {EXTRA})"

