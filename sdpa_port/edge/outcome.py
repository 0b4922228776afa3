"""What a run is asked to do, what each file's processing gave, and the run's exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sdpa_port.edge.trust import Verifying
from sdpa_port.result import PortResult, Status, Style


@dataclass(frozen=True)
class RunOptions:
    style: Style = Style.AUTO
    write: bool = True  # False under --check and --diff
    want_diff: bool = False
    output: Path | None = None
    tests: bool = True  # write test_sdpa_parity_<model>.py beside each written port
    tests_dir: Path | None = None
    verify: Verifying = Verifying()  # whether the parity checks run before writing (they execute the files)


@dataclass(frozen=True)
class Writes:
    destination: Path
    carried: tuple[Path, str, str] | None  # (modular file, its text, its new text)


@dataclass(frozen=True)
class Outcome:
    path: Path
    result: PortResult
    written: Path | None = None
    diff: str = ""
    error: str | None = None
    tests: Path | None = None
    verification: tuple[str, ...] = ()
    verify_failed: bool = False
    unverified: str | None = None  # why a port goes unverified (not checked, or checked only in part)
    original: str = field(default="", repr=False)  # the text before the port, when it was written
    # "port" (asked for), "family" (ported because it copies ported code), "copies" (copies follow ported code)
    kind: str = "port"
    context: tuple[str, ...] = ()  # what the checkout step did in this file
    companions: tuple[tuple[Path, str], ...] = ()  # other files written with it (a modular source), with their old text
    writes: Writes | None = field(default=None, repr=False)  # what is left to write (see write_out)

    @property
    def status(self) -> Status:
        return self.result.status

    @property
    def verified(self) -> bool | None:
        """True when the checks passed, False when one failed and nothing was written, None when they did not run."""
        if self.unverified is not None or not self.verification:
            return None
        return not self.verify_failed


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, status: Status) -> int:
        return sum(1 for o in self.outcomes if o.status is status)

    def exit_code(self, checking: bool) -> int:
        if any(o.status is Status.ERROR for o in self.outcomes):
            return 2
        if any(o.status is Status.REFUSED for o in self.outcomes):
            return 3
        if any(o.verify_failed for o in self.outcomes):
            return 1
        if checking and any(o.status is Status.PORTED for o in self.outcomes):
            return 1
        return 0
