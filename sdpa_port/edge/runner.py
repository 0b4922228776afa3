"""Process files: port each one, decide what to write, and collect outcomes; no terminal output here."""

from __future__ import annotations

import difflib
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

from sdpa_port.api import NOT_MODELING, port_source
from sdpa_port.discover.release import target_release
from sdpa_port.edge.checkout_step import after_ports
from sdpa_port.edge.files import InputError, Target, atomic_write, read_source
from sdpa_port.edge.modular_step import carry_into_modular, generated_from_modular, modular_source_of
from sdpa_port.edge.outcome import Outcome, RunOptions, Summary, Writes
from sdpa_port.edge.pool import available_cores, run_here, run_in_processes
from sdpa_port.result import PortResult, Status, Style


def process(target: Target, options: RunOptions) -> Outcome:
    path = target.path
    # a modular file is ported through the file generated from it; a generated file's port is carried back into it
    generated = generated_from_modular(path)
    modular = path if generated is not None else None
    if generated is not None:
        path = generated
    try:
        source = read_source(path)
    except InputError as error:
        return Outcome(path, PortResult(Status.ERROR, "", None, "bad input", reasons=(str(error),)), error=str(error))
    if modular is None:
        modular = modular_source_of(path, source)
    try:
        result = port_source(source, style=options.style, filename=str(path), release=target_release(path))
    except RecursionError:
        result = PortResult(Status.ERROR, source, None, "internal error", reasons=(f"{path}: recursion limit reached",))
    except Exception as error:  # the edge turns any crash into an error outcome for this file only
        message = f"{path}: internal error: {type(error).__name__}: {error}"
        result = PortResult(Status.ERROR, source, None, "internal error", reasons=(message,))
    if target.explicit and result.status is Status.UNCHANGED and result.detail == NOT_MODELING:
        result = PortResult(Status.ERROR, source, None, "bad input", reasons=(f"{path}: {NOT_MODELING}",))
    carried: tuple[Path, str, str] | None = None  # (modular file, its text, its new text)
    context: tuple[str, ...] = ()
    if modular is not None and result.status is Status.PORTED:
        result, carried, context = carry_into_modular(modular, source, result, asked_for_modular=generated is not None)
    verification: tuple[str, ...] = ()
    unverified: str | None = None
    if result.status is Status.PORTED and not options.verify.run:
        unverified = options.verify.unverified
    elif result.status is Status.PORTED:
        from sdpa_port.edge.after_port import verify_port

        report = verify_port(path, source, result, claims=options.verify.claims)
        verification = report.lines
        if report.passed:
            result, carried = claim_flags(result, carried, report.claimed, report.not_claimed)
        if not report.passed and options.verify.by_default and report.undriven:
            # verifying by default, a port the checks cannot drive is written as an unverified one would be
            unverified = f"the checks could not drive it: {report.undriven}"
        elif not report.passed:
            diff = _diff(source, result, carried, str(path)) if options.want_diff else ""
            return Outcome(path, result, None, diff, verification=verification, verify_failed=True)
    diff = _diff(source, result, carried, str(path)) if options.want_diff else ""
    if options.write and result.status is Status.PORTED:
        # written by the parent (write_out): a worker that dies after its work leaves nothing half-recorded, and the
        # file is rerun from its original text
        writes = Writes(options.output or path, carried)
        return Outcome(
            path, result, None, diff, verification=verification, unverified=unverified, original=source,
            context=context, writes=writes,
        )
    return Outcome(path, result, None, diff, verification=verification, unverified=unverified, context=context)


CLAIMED = {
    "_supports_flex_attn": "flex attention ran and matched eager",
    "_can_compile_fullgraph": "torch.compile(fullgraph=True) ran and matched eager",
    "_supports_flash_attn": (
        "a plain masked attention, and transformers' flash path ran with a CPU stand-in for the flash-attn kernel, "
        "not flash-attn itself, and matched eager"
    ),
}


def claim_flags(
    result: PortResult,
    carried: tuple[Path, str, str] | None,
    claimed: tuple[tuple[str, tuple[str, ...]], ...],
    not_claimed: tuple[tuple[str, str], ...],
) -> tuple[PortResult, tuple[Path, str, str] | None]:
    """The port with each flag whose check matched set on its classes, and a warning for each flag that is not.

    A port carried into its modular file gets a flag there too, or not at all.
    """
    from sdpa_port.rewrite.flags import flag_source

    warnings = [f"{flag or 'flex, flash and compile'} not claimed: {why}" for flag, why in not_claimed]
    notes: list[str] = []
    for flag, classes in claimed:
        source = flag_source(result.source, classes, flag)
        modular = flag_source(carried[2], classes, flag) if carried is not None else None
        if source is None or (carried is not None and modular is None):
            warnings.append(f"{flag} not claimed: {', '.join(classes)} not all defined in the modular file")
            continue
        result = replace(result, source=source)
        if carried is not None and modular is not None:
            carried = (carried[0], carried[1], modular)
        notes += [f"{name}.{flag} = True ({CLAIMED.get(flag, 'its check matched eager')})" for name in classes]
    return replace(result, notes=result.notes + tuple(notes), warnings=result.warnings + tuple(warnings)), carried


def write_out(outcome: Outcome, options: RunOptions) -> Outcome:
    """Write what `process` left to write, in the parent process.

    The port, its modular source, its parity test.
    """
    writes = outcome.writes
    if writes is None:
        return outcome
    destination, carried, result = writes.destination, writes.carried, outcome.result
    tests: Path | None = None
    try:
        atomic_write(destination, result.source)
        if carried is not None and options.output is None:
            atomic_write(carried[0], carried[2])
        if options.tests:
            from sdpa_port.edge.after_port import write_parity_test

            tests = write_parity_test(outcome.path, destination, result, options.tests_dir)
            if tests is None:
                from sdpa_port.edge.after_port import NO_INLINE_PARITY_TEST, NO_PARITY_TEST

                why = NO_INLINE_PARITY_TEST if result.style is Style.INLINE else NO_PARITY_TEST
                result = replace(result, warnings=result.warnings + (why,))
    except OSError as error:
        message = f"{destination}: cannot write: {error.strerror or error}"
        failed = PortResult(Status.ERROR, outcome.original, result.style, "write failed", reasons=(message,))
        return Outcome(outcome.path, failed, error=message)
    return replace(
        outcome,
        result=result,
        written=destination,
        tests=tests,
        writes=None,
        companions=((carried[0], carried[1]),) if carried is not None else (),
    )


def _diff(source: str, result: PortResult, carried: tuple[Path, str, str] | None, name: str) -> str:
    """The port's diff, its modular file's after it; empty for a file not ported."""
    if result.status is not Status.PORTED:
        return ""
    diff = unified_diff(source, result.source, name)
    if carried is not None:
        diff += unified_diff(carried[1], carried[2], str(carried[0]))
    return diff


def unified_diff(before: str, after: str, name: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=f"a/{name.lstrip('/')}", tofile=f"b/{name.lstrip('/')}"
    )
    return "".join(lines)


def run(
    targets: Iterable[Target],
    options: RunOptions,
    jobs: int | None = None,
    progress: Callable[[Outcome], None] | None = None,
    advanced: Callable[[Outcome], None] | None = None,
) -> Summary:
    """Process every target, in parallel across `jobs` processes, every core by default.

    `progress` sees each outcome in input order, as soon as all earlier ones are done; `advanced` sees each one as it
    completes (for a progress bar). A crash while processing one file is an error outcome for that file.
    """
    targets = list(targets)
    workers = min(jobs or available_cores(), len(targets))
    checkout_step = options.write and options.output is None and _any_in_checkout(targets)
    in_order = _InOrder(None if checkout_step else progress)

    done: dict[int, Outcome] = {}

    def finished(index: int, outcome: Outcome) -> None:
        outcome = done[index] = write_out(outcome, options)
        if advanced:
            advanced(outcome)
        in_order.add(index, outcome)

    work = partial(process, options=options)
    if workers <= 1:
        run_here(work, targets, _crashed, finished)
    else:
        longest_first = sorted(range(len(targets)), key=lambda index: -_size(targets[index].path))
        run_in_processes(work, targets, workers, _crashed, finished, order=longest_first)
    outcomes = [done[index] for index in range(len(targets))]
    if checkout_step:
        # the tree around the ports is judged once every port is written; outcomes are reported after that
        try:
            outcomes = after_ports(outcomes, options)
        except Exception as error:  # the ports are written; the step around them must not hide that
            warning = f"the checkout step failed: {type(error).__name__}: {error}"
            outcomes = [_warned(o, warning) if o.written else o for o in outcomes]
        for outcome in outcomes:
            if progress:
                progress(outcome)
    return Summary(outcomes)


def _warned(outcome: Outcome, warning: str) -> Outcome:
    return replace(outcome, result=replace(outcome.result, warnings=outcome.result.warnings + (warning,)))


def _any_in_checkout(targets: list[Target]) -> bool:
    from sdpa_port.checkout.context import root_of

    return any(root_of(target.path) is not None for target in targets)


def _crashed(target: Target, why: str) -> Outcome:
    message = f"{target.path}: internal error: {why}"
    return Outcome(target.path, PortResult(Status.ERROR, "", None, "internal error", reasons=(message,)), error=message)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class _InOrder:
    """Hands outcomes on in input order, holding back those that finish before an earlier one."""

    def __init__(self, sink: Callable[[Outcome], None] | None) -> None:
        self.sink = sink
        self.next = 0
        self.waiting: dict[int, Outcome] = {}

    def add(self, index: int, outcome: Outcome) -> None:
        self.waiting[index] = outcome
        while self.next in self.waiting:
            ready = self.waiting.pop(self.next)
            self.next += 1
            if self.sink:
                self.sink(ready)
