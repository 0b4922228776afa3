"""After ports written in place inside a Transformers checkout: keep the tree a pull request can pass.

The files a port changed are judged with the tree around them: `# Copied from` copies elsewhere follow the ported
code (or their files are ported with their family), markers the port removed come back where they hold, the
checkout's pinned ruff (when installed) reviews every changed and emitted file, and a generated modeling file's
edit is carried into its modular source. Everything written here goes through `atomic_write`.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from sdpa_port.api import port_source
from sdpa_port.discover.release import target_release
from sdpa_port.checkout.context import Checkout, find_checkout
from sdpa_port.checkout.family import FamilyResult, Ported, keep_consistent
from sdpa_port.checkout.markers import lost_markers, removed_markers
from sdpa_port.checkout.ruff import Ruff, RuffError, changed_lines, find_ruff
from sdpa_port.checkout.tree import Directory, Overlay
from sdpa_port.edge.files import atomic_write
from sdpa_port.edge.outcome import Outcome, RunOptions
from sdpa_port.edge.trust import COPIES, FAMILY
from sdpa_port.result import PortResult, Status


def in_checkout(outcome: Outcome) -> bool:
    return outcome.written is not None and outcome.written == outcome.path and find_checkout(outcome.path) is not None


def after_ports(outcomes: list[Outcome], options: RunOptions) -> list[Outcome]:
    """`outcomes` with what the checkout step found added, followed by outcomes for the other files it changed."""
    by_root: dict[Path, tuple[Checkout, list[int]]] = {}
    for index, outcome in enumerate(outcomes):
        if outcome.status is Status.PORTED and in_checkout(outcome):
            checkout = find_checkout(outcome.path)
            assert checkout is not None
            by_root.setdefault(checkout.root, (checkout, []))[1].append(index)
    result = list(outcomes)
    extra: list[Outcome] = []
    for checkout, indexes in by_root.values():
        extra.extend(_one_checkout(checkout, [result[i] for i in indexes], options, result, indexes))
    return result + extra


def _one_checkout(
    checkout: Checkout, ports: list[Outcome], options: RunOptions, result: list[Outcome], indexes: list[int]
) -> list[Outcome]:
    originals = {checkout.relative(o.path): o.original for o in ports}
    ported = {checkout.relative(o.path): o.result.source for o in ports}
    removed = {path: removed_markers(originals[path], ported[path], path) for path in ported}
    ruff = find_ruff(checkout.ruff, checkout.ruff_config, checkout.root)
    base = Overlay(Directory(checkout.root), originals)

    def port(path: str, source: str) -> Ported:
        answer = port_source(
            source, style=options.style, filename=str(checkout.root / path), release=target_release(checkout.root / path)
        )
        if answer.status is Status.PORTED:
            return Ported(answer.source, answer.detail)
        return Ported(None, "; ".join(answer.reasons) or answer.detail)

    family = keep_consistent(
        base, ported, port, ruff.format_modules if ruff else None, {p: r for p, r in removed.items() if r}
    )
    extra: list[Outcome] = []
    for path, text in family.edits.items():
        if ported.get(path) == text:
            continue
        destination = checkout.root / path
        atomic_write(destination, text)
        notes = tuple(family.notes.get(path, ()))
        if path in ported:
            continue  # a restored marker: reported on the port's outcome below
        original = base.read(path) or ""
        if path in family.family:
            extra.append(_family_outcome(destination, original, text, notes + _lost(original, text, path), options))
        else:
            result_here = PortResult(Status.PORTED, text, None, "copies follow their ported sources")
            extra.append(
                Outcome(
                    destination, result_here, written=destination, original=original, kind="copies", context=notes,
                    unverified=COPIES,
                )
            )
    warnings = _warnings(family)
    for position, (index, outcome) in enumerate(zip(indexes, ports)):
        path = checkout.relative(outcome.path)
        notes = tuple(family.notes.get(path, ()))
        final = family.edits.get(path, outcome.result.source)
        extra_warnings = _lost(originals[path], final, path) + (warnings if position == 0 else ())
        warned = replace(outcome.result, source=final, warnings=_engine_warnings(outcome.result) + extra_warnings)
        result[index] = replace(outcome, result=warned, context=outcome.context + notes)
    if checkout.converter is not None:
        for index in indexes:
            result[index] = _regenerated(checkout, result[index])
    if ruff is not None:
        for index in indexes:
            result[index] = _reviewed(ruff, checkout, _formatted(ruff, checkout, result[index]))
        extra = [_reviewed(ruff, checkout, _formatted(ruff, checkout, outcome)) for outcome in extra]
    elif checkout.ruff:
        message = f"ruff {checkout.ruff} (the checkout's pin) not found: install it to check the port's style"
        first = result[indexes[0]]
        result[indexes[0]] = replace(first, result=replace(first.result, warnings=first.result.warnings + (message,)))
    return extra


def _regenerated(checkout: Checkout, outcome: Outcome) -> Outcome:
    """The outcome after running the checkout's modular converter on the modular file the port was carried into.

    The converter must give back the ported generated file; a different file is put back to the port and reported.
    """
    if not outcome.companions or outcome.written is None:
        return outcome
    modular = outcome.companions[0][0]
    ported = outcome.written.read_text(encoding="utf-8")
    converter = checkout.converter
    assert converter is not None
    option = "--files_to_parse" if "--files_to_parse" in converter.read_text(encoding="utf-8") else "--files"
    command = [sys.executable, str(converter), option, checkout.relative(modular)]
    try:
        completed = subprocess.run(
            command, cwd=checkout.root, capture_output=True, text=True, timeout=600, check=False
        )
        regenerated = outcome.written.read_text(encoding="utf-8")
    except (OSError, subprocess.TimeoutExpired) as error:
        return _warn(outcome, f"could not run {converter.name}: {error}")
    if completed.returncode == 0 and regenerated == ported:
        return replace(
            outcome, context=outcome.context + (f"{converter.name} regenerates this port from {modular.name}",)
        )
    atomic_write(outcome.written, ported)
    if completed.returncode != 0:
        why = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no output"]
        return _warn(outcome, f"{converter.name} failed on {modular.name}: {why[0]}")
    lines = changed_lines(ported, regenerated)
    return _warn(
        outcome,
        f"{converter.name} regenerates a different file from {modular.name} (lines {lines[:8]}); the port was kept",
    )


def _warn(outcome: Outcome, warning: str) -> Outcome:
    return replace(outcome, result=replace(outcome.result, warnings=outcome.result.warnings + (warning,)))


def _family_outcome(path: Path, original: str, text: str, notes: tuple[str, ...], options: RunOptions) -> Outcome:
    answer = port_source(original, style=options.style, filename=str(path), release=target_release(path))
    result = replace(answer, source=text, warnings=_engine_warnings(answer))
    tests = None
    if options.tests:
        from sdpa_port.edge.after_port import write_parity_test

        tests = write_parity_test(path, path, result, options.tests_dir)
    return Outcome(
        path, result, written=path, tests=tests, original=original, kind="family", context=notes, unverified=FAMILY
    )


def _lost(original: str, final: str, path: str) -> tuple[str, ...]:
    return tuple(
        f"removed `{marker}`: the port changed the copy and its source was not ported alike"
        for marker in lost_markers(original, final, path)
    )


def _engine_warnings(result: PortResult) -> tuple[str, ...]:
    """The engine's warnings but its word on removed markers, which the whole tree decides here."""
    return tuple(w for w in result.warnings if not w.startswith("removed the `# Copied from"))


def _warnings(family: FamilyResult) -> tuple[str, ...]:
    return tuple(f"stale `# Copied from` marker: {item}" for item in family.stale)


def _formatted(ruff: Ruff, checkout: Checkout, outcome: Outcome) -> Outcome:
    """The outcome with its files formatted by the checkout's pinned ruff, where they were formatted before.

    The written file and its companions are formatted when the file was formatted with that ruff before the port: then
    formatting changes only lines the port wrote, as a contributor's `make style` would. A file that was not formatted
    before is left as written (the review reports what ruff would change).
    """
    files = [(outcome.written, outcome.original)] if outcome.written is not None else []
    files.extend(outcome.companions)
    for path, before in files:
        if path is None or before is None:
            continue
        try:
            relative = checkout.relative(path)
            if ruff.format(relative, before) != before:
                continue
            text = path.read_text(encoding="utf-8")
            formatted = ruff.format(relative, text)
        except (RuffError, OSError) as error:
            return _warn(outcome, f"could not format it with ruff {checkout.ruff}: {error}")
        if formatted != text:
            atomic_write(path, formatted)
            if path == outcome.written:
                outcome = replace(outcome, result=replace(outcome.result, source=formatted))
    return outcome


def _reviewed(ruff: Ruff, checkout: Checkout, outcome: Outcome) -> Outcome:
    """`outcome` warned of what the pinned ruff finds in its file and emitted test that it did not find before."""
    lines: list[str] = []
    try:
        text = outcome.written.read_text(encoding="utf-8") if outcome.written else outcome.result.source
        lines.extend(ruff.review(checkout.relative(outcome.path), outcome.original, text).lines(named=False))
        for companion, before in outcome.companions:
            after = companion.read_text(encoding="utf-8")
            lines.extend(ruff.review(checkout.relative(companion), before, after).lines())
        if outcome.tests is not None:
            test = outcome.tests.read_text(encoding="utf-8")
            lines.extend(ruff.review(checkout.relative(outcome.tests), None, test).lines())
    except (RuffError, OSError) as error:
        lines.append(f"could not review it: {error}")
    if not lines:
        return outcome
    warnings = tuple(f"ruff {checkout.ruff}: {line}" for line in lines)
    return replace(outcome, result=replace(outcome.result, warnings=outcome.result.warnings + warnings))
