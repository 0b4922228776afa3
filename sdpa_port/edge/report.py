"""Human-readable lines for outcomes: reports and diffs to stdout, warnings and the summary to stderr."""

from __future__ import annotations

from collections import Counter

import typer

from sdpa_port.edge.runner import Outcome, Summary
from sdpa_port.result import Status


def print_outcome(outcome: Outcome, show_diff: bool = False) -> None:
    result = outcome.result
    path = str(outcome.path)
    if show_diff and outcome.diff:
        typer.echo(outcome.diff, nl=False)
    if outcome.verify_failed:
        typer.echo(f"verification failed: {path} (nothing written)")
        for line in outcome.verification:
            if "FAILED" in line or "could not" in line:
                typer.echo(f"  {line}")
    elif result.status is Status.PORTED:
        where = f" -> {outcome.written}" if outcome.written and outcome.written != outcome.path else ""
        verb = "ported" if outcome.written else "would port"
        verified = " (verified)" if outcome.verification else ""
        typer.echo(f"{verb}: {path}{where} ({', '.join(result.attention_classes)}){verified}")
        if outcome.tests:
            typer.echo(f"  parity tests: {outcome.tests}")
    elif result.status is Status.UNCHANGED:
        typer.echo(f"unchanged: {path} ({result.detail})")
    elif result.status is Status.REFUSED:
        for reason in result.reasons or ("refused",):
            typer.echo(f"refused: {path}: {reason}")
    else:
        for reason in result.reasons or (result.detail,):
            typer.echo(f"error: {reason}" if reason.startswith(path) else f"error: {path}: {reason}", err=True)
    for warning in result.warnings:
        typer.echo(f"warning: {path}: {warning}", err=True)


def print_summary(summary: Summary) -> None:
    counts = Counter(o.status for o in summary.outcomes)
    already = sum(1 for o in summary.outcomes if o.status is Status.UNCHANGED and "already" in o.result.detail)
    nothing = counts[Status.UNCHANGED] - already
    lines = [
        f"{len(summary.outcomes)} file(s): {counts[Status.PORTED]} ported, {already} already support SDPA, "
        f"{nothing} with nothing to port, {counts[Status.REFUSED]} refused, {counts[Status.ERROR]} error(s)"
    ]
    reasons = Counter(_reason_kind(r) for o in summary.outcomes if o.status is Status.REFUSED for r in o.result.reasons)
    for reason, count in reasons.most_common():
        lines.append(f"  {count:4d}  {reason}")
    typer.echo("\n".join(lines), err=True)


def _reason_kind(reason: str) -> str:
    """`Class (line 12): the scores are passed to `foo`` -> `the scores are passed to ...`."""
    text = reason.split("): ", 1)[-1]
    cut = text.find("`")
    return text if cut < 0 else text[:cut].rstrip() + " ..."
