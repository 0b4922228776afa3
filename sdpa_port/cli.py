"""The `sdpa-port` command: a thin typer layer over `sdpa_port.edge.runner`.

Exit codes: 0 done or nothing to do, 1 changes needed (--check/--diff) or a failed verification, 2 bad input,
usage, --verify without torch or internal error, 3 refused. Diffs and reports go to stdout; progress and warnings to
stderr.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdpa_port.edge.command_help import Reflowed
from sdpa_port.result import Status, Style

port_app = typer.Typer(add_completion=False, context_settings={"help_option_names": ["-h", "--help"]})


def _fail(message: str) -> "typer.Exit":
    typer.echo(f"sdpa-port: {message}", err=True)
    return typer.Exit(2)


# the command's arguments and options, declared once here so that `port` reads as what it does
Paths = Annotated[
    list[Path],
    typer.Argument(help="Modeling files, directories, or model names of the installed transformers.", show_default=False),
]
Output = Annotated[
    Optional[Path],
    typer.Option("-o", "--output", help="Write the port of the single input here and leave the input untouched."),
]
Diff = Annotated[bool, typer.Option("--diff", help="Print a unified diff; write nothing. Exit 1 if a file would change.")]
CheckOnly = Annotated[bool, typer.Option("--check", help="Write nothing. Exit 1 if a file would change.")]
TargetStyle = Annotated[
    Style, typer.Option("--style", help="Target style; auto picks class style for 4.x files, interface for 5.x, inline where the class style cannot wire a module (no config in scope, built in another file).")
]
TestsDir = Annotated[
    Optional[Path],
    typer.Option(
        "--tests-dir",
        help="Where the emitted parity tests go (default: tests/models/<model>/ of the enclosing transformers "
        "checkout, else beside the output).",
    ),
]
NoTests = Annotated[bool, typer.Option("--no-tests", help="Do not emit parity tests.")]
Verify = Annotated[
    Optional[bool],
    typer.Option(
        "--verify/--no-verify",
        help="Before writing, import the original and the port (this executes the modeling code) and run the "
        "parity checks; write nothing and exit 1 if one fails. Default: on for one file of the installed "
        "transformers or of a Transformers checkout that is being written; off for any other file, a batch, "
        "--check and --diff.",
        show_default=False,
    ),
]
NoClaims = Annotated[
    bool,
    typer.Option(
        "--no-claims",
        help="When verifying an interface-style port, skip the flex attention, flash attention (a CPU stand-in "
        "kernel) and torch.compile(fullgraph=True) checks (flex and compile each compile, a minute or so on a CPU); "
        "the port then sets none of `_supports_flex_attn`, `_supports_flash_attn` and `_can_compile_fullgraph`.",
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON object per file on stdout instead of text lines.")]
Jobs = Annotated[Optional[int], typer.Option("--jobs", "-j", help="Files processed in parallel (default: all cores).")]


@port_app.command(cls=Reflowed)
def port(
    paths: Paths,
    output: Output = None,
    diff: Diff = False,
    check: CheckOnly = False,
    style: TargetStyle = Style.AUTO,
    tests_dir: TestsDir = None,
    no_tests: NoTests = False,
    verify: Verify = None,
    no_claims: NoClaims = False,
    as_json: AsJson = False,
    jobs: Jobs = None,
) -> None:
    """Port eager attention in modeling files to torch.nn.functional.scaled_dot_product_attention.

    PATH may be a modeling file, a directory (its PyTorch modeling_*.py and modular_*.py files), or a model name
    such as `bert` resolved in the installed transformers. Files are rewritten in place unless -o, --check or --diff
    is given. A file that cannot be ported exactly is refused with one line per reason and left untouched. Several
    files are ported in parallel, reported in input order, with a progress bar on a terminal and a summary on stderr.

    Verifying executes the modeling file: it runs by default only for a single file of the installed transformers
    (or a model name) or of a Transformers checkout, written in place or to -o; any other port is written
    unverified, with a line saying so, unless --verify is given. Verifying needs torch and transformers.

    Exit codes: 0 done or nothing to do, 1 changes needed (--check/--diff) or a failed verification, 2 bad input,
    missing torch for --verify or internal error, 3 refused. Benchmarks: `sdpa-port bench --help`.
    """
    from sdpa_port.edge.files import InputError, discover
    from sdpa_port.edge.outcome import RunOptions
    from sdpa_port.edge.progress import progress_bar
    from sdpa_port.edge.report import out, print_outcome, print_summary, print_unverified_beside
    from sdpa_port.edge.runner import run
    from sdpa_port.edge.trust import MissingDependency, decide

    try:
        targets = discover(list(paths))
    except InputError as error:
        raise _fail(str(error))
    if output is not None and (len(paths) != 1 or len(targets) != 1):
        raise _fail("-o/--output takes exactly one input file")
    writing = not (diff or check)
    if writing and output is None and any(t.model for t in targets):
        raise _fail("a model name resolves inside the installed transformers; give -o FILE, --diff or --check")
    try:
        verifying = decide(verify, targets, writing)
    except MissingDependency as error:
        raise _fail(str(error))
    if no_claims:
        verifying = replace(verifying, claims=False)
    options = RunOptions(
        style=style, write=writing, want_diff=diff, output=output, tests=not no_tests, tests_dir=tests_dir,
        verify=verifying,
    )
    many = len(targets) > 1

    def progress(outcome) -> None:  # type: ignore[no-untyped-def]
        if as_json:
            out(json.dumps(outcome_json(outcome)))
        else:
            # one file's run says why a port it writes is unverified, unless --no-verify said not to check it
            print_outcome(outcome, show_diff=diff, say_unverified=not many and verify is not False)

    bar = progress_bar(len(targets))
    try:
        summary = run(targets, options, jobs=jobs if many else 1, progress=progress, advanced=bar and bar.advance)
    finally:
        if bar:
            bar.close()
    if many:
        print_summary(summary)
    elif verify is not False and not as_json:
        print_unverified_beside(summary)
    raise typer.Exit(summary.exit_code(checking=not writing))


def outcome_json(outcome) -> dict:  # type: ignore[no-untyped-def]
    result = outcome.result
    return {
        "path": str(outcome.path),
        "status": result.status.value,
        "style": result.style.value if result.style else None,
        "detail": result.detail,
        "attention_classes": list(result.attention_classes),
        "reasons": list(result.reasons),
        "refusals": [
            {"code": r.code.code, "where": r.where, "line": r.line, "detail": r.detail} for r in result.refusals
        ],
        "warnings": list(result.warnings),
        "notes": list(result.notes),
        "written": str(outcome.written) if outcome.written else None,
        "tests": str(outcome.tests) if outcome.tests else None,
        "verification": list(outcome.verification),
        "verified": outcome.verified,  # null: the checks did not run, or not in full (`unverified` says why)
        "unverified": outcome.unverified,
    }


def main(argv: list[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] == "bench":
        from sdpa_port.bench.cli import bench_app

        bench_app(arguments[1:], prog_name="sdpa-port bench")
        return
    port_app(arguments, prog_name="sdpa-port")


__all__ = ["main", "port_app", "Status"]
