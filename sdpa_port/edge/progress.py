"""A progress bar on stderr for batch runs, shown only on a terminal.

Rich is imported only when one is shown.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Protocol, TextIO

from sdpa_port.edge.outcome import Outcome
from sdpa_port.result import Status


class Bar(Protocol):
    def advance(self, outcome: Outcome) -> None: ...

    def close(self) -> None: ...


def progress_bar(total: int, stream: TextIO | None = None) -> Bar | None:
    """A bar for `total` files on `stream`, by default stderr, or None where none is shown.

    None when the stream is not a terminal or there is one file.
    """
    stream = stream if stream is not None else sys.stderr
    if total < 2 or not _is_terminal(stream):
        return None
    return _RichBar(total, stream)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


class _RichBar:
    """The bar, above which lines written to stdout and stderr appear while it runs.

    On a terminal, stdout goes through it.
    """

    def __init__(self, total: int, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.counts: Counter[Status] = Counter()
        self.progress = Progress(
            TextColumn("sdpa-port"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=Console(file=stream),
            transient=True,
            auto_refresh=False,  # refreshed on each file: no thread next to the worker processes
            redirect_stdout=_is_terminal(sys.stdout),
            redirect_stderr=True,
        )
        self.task = self.progress.add_task("port", total=total, counts="")
        self.progress.start()

    def advance(self, outcome: Outcome) -> None:
        self.counts[outcome.status] += 1
        counts = ", ".join(f"{self.counts[status]} {status.value}" for status in Status if self.counts[status])
        self.progress.update(self.task, advance=1, counts=counts)
        self.progress.refresh()

    def close(self) -> None:
        self.progress.stop()
