"""Human-readable lines for outcomes: reports and diffs to stdout, warnings and the summary to stderr."""

from __future__ import annotations

import sys
from collections import Counter

import typer

from sdpa_port.edge.outcome import Outcome, Summary
from sdpa_port.result import Status

# how the checks name a model they could not drive (verify/unverified.py, which needs torch)
NOT_VERIFIED = "not verified"


def out(text: str, nl: bool = True) -> None:
    """Print to stdout as it is at this moment.

    A progress bar may have put there a proxy that prints above it.
    """
    typer.echo(text, nl=nl, file=sys.stdout)


def err(text: str) -> None:
    typer.echo(text, file=sys.stderr)


def print_outcome(outcome: Outcome, show_diff: bool = False, say_unverified: bool = False) -> None:
    result = outcome.result
    path = str(outcome.path)
    if show_diff and outcome.diff:
        out(outcome.diff, nl=False)
    if outcome.kind == "copies":
        out(f"updated copies: {path}")
    elif outcome.verify_failed:
        out(f"verification failed: {path} (nothing written)")
        for line in outcome.verification:
            if "FAILED" in line or "could not" in line or line.startswith(NOT_VERIFIED):
                out(f"  {line}")
    elif result.status is Status.PORTED:
        where = f" -> {outcome.written}" if outcome.written and outcome.written != outcome.path else ""
        verb = "ported" if outcome.written else "would port"
        verified = " (verified)" if outcome.verified else ""
        family = " with its family" if outcome.kind == "family" else ""
        out(f"{verb}{family}: {path}{where} ({', '.join(result.attention_classes)}){verified}")
        if outcome.tests:
            out(f"  parity tests: {outcome.tests}")
    elif result.status is Status.UNCHANGED:
        out(f"unchanged: {path} ({result.detail})")
    elif result.status is Status.REFUSED:
        for reason in result.reasons or ("refused",):
            out(f"refused: {path}: {reason}")
    else:
        for reason in result.reasons or (result.detail,):
            err(f"error: {reason}" if reason.startswith(path) else f"error: {path}: {reason}")
    for note in outcome.context:
        out(f"  {note}")
    for warning in result.warnings:
        err(f"warning: {path}: {warning}")
    if say_unverified and outcome.kind == "port" and outcome.written and outcome.unverified:
        err(f"not verified: {path}: {outcome.unverified}")


def print_unverified_beside(summary: Summary) -> None:
    """One line for the files a one-file run changed beside its port.

    They are the copies of the ported code in a checkout.
    """
    others = [o for o in summary.outcomes if o.kind != "port" and o.written and o.unverified]
    if others:
        err(f"not verified: {len(others)} other file(s) changed to follow the port; only the files named are verified")


def print_summary(summary: Summary) -> None:
    """The batch summary table, on stderr."""
    err("\n".join(summary_lines(summary)))


def summary_lines(summary: Summary) -> list[str]:
    """The counts of a run's outcomes, with the reasons of refusals and unverified ports.

    Ported, how many of those verified and why the others not, already supported, nothing to port, refused with its
    reasons, errors.
    """
    counts = Counter(o.status for o in summary.outcomes if o.kind != "copies")
    ports = [o for o in summary.outcomes if o.status is Status.PORTED and o.kind != "copies"]
    unverified = Counter(o.unverified for o in ports if o.unverified)
    already = sum(1 for o in summary.outcomes if o.status is Status.UNCHANGED and "already" in o.result.detail)
    family = sum(1 for o in summary.outcomes if o.kind == "family")
    copies = sum(1 for o in summary.outcomes if o.kind == "copies")
    rows = [
        ("ported", counts[Status.PORTED] - family),
        *([("ported with their family", family), ("copies updated", copies)] if family or copies else []),
        ("verified", sum(1 for o in ports if o.verified)),
        *([("verification failed", sum(1 for o in ports if o.verify_failed))] if any(o.verify_failed for o in ports) else []),
        ("already support SDPA", already),
        ("nothing to port", counts[Status.UNCHANGED] - already),
        ("refused", counts[Status.REFUSED]),
        ("errors", counts[Status.ERROR]),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"sdpa-port: {len(summary.outcomes)} file(s)"]
    for label, count in rows:
        lines.append(f"  {label:<{width}}  {count:5d}")
        if label == "verified":
            lines.extend(
                f"  {'':<{width}}  {n:5d}  not verified: {why}"
                for why, n in sorted(unverified.items(), key=lambda item: (-item[1], item[0]))
            )
        if label == "refused":
            # each refused file counted once per code among its reasons
            codes = Counter(
                code
                for o in summary.outcomes
                if o.status is Status.REFUSED
                for code in sorted({r.code for r in o.result.refusals}, key=lambda c: c.code)
            )
            lines.extend(
                f"  {'':<{width}}  {n:5d}  {code.code} {code.title}"
                for code, n in sorted(codes.items(), key=lambda item: (-item[1], item[0].code))
            )
    return lines
