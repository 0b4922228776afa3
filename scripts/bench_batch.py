"""Time one batch run of `sdpa-port` over every PyTorch modeling file of a transformers release.

    python scripts/bench_batch.py --version 5.23.0 --runs 3 [--wheels .cache/wheels] [-- --no-tests]

The tree is read out of the cached wheel (`pip download --no-deps -d .cache/wheels transformers==X`), copied afresh
for each run, and ported in place by `python -m sdpa_port TREE --json` in a subprocess. Each run prints its wall
time, the CPU time of the run (its processes together), files per second and the status counts; the last lines give
the median and the best wall time and the refusal reasons with their counts.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdpa_port.refusals import Code
from sdpa_port.edge.wheels import MODELS, WheelError, copy_tree, extract_tree, wheel_path

app = typer.Typer(add_completion=False)
ROOT = Path(__file__).resolve().parents[1]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    context: typer.Context,
    version: Annotated[str, typer.Option(help="transformers release whose wheel is in --wheels.")] = "5.23.0",
    runs: Annotated[int, typer.Option(help="Runs, each on a fresh copy of the tree.")] = 3,
    wheels: Annotated[Path, typer.Option(help="Folder holding the downloaded wheels.")] = ROOT / ".cache" / "wheels",
    trees: Annotated[Optional[Path], typer.Option(help="Cache of extracted trees (default: beside --wheels).")] = None,
) -> None:
    """Extra arguments after `--` are passed to sdpa-port (for example --no-tests or --jobs 1)."""
    try:
        pristine = extract_tree(wheel_path(wheels, version), trees or wheels.parent / "trees")
    except WheelError as error:
        typer.echo(f"bench_batch: {error}", err=True)
        raise typer.Exit(2)
    walls: list[float] = []
    for run in range(1, runs + 1):
        with tempfile.TemporaryDirectory(prefix="sdpa-port-bench-") as scratch:
            tree = copy_tree(pristine, Path(scratch))
            # the models' folder alone: the release's own sources beside it are read, not ported
            wall, cpu, records, code = _run(tree / MODELS, list(context.args))
        walls.append(wall)
        counts = Counter(record["status"] for record in records)
        typer.echo(
            f"run {run}: {len(records)} files in {wall:.1f} s wall, {cpu:.1f} s CPU, {len(records) / wall:.1f} files/s, "
            f"exit {code}; " + ", ".join(f"{status} {count}" for status, count in sorted(counts.items()))
        )
    typer.echo(f"transformers {version}: wall median {statistics.median(walls):.1f} s, best {min(walls):.1f} s over {runs} run(s)")
    codes = Counter(
        code for record in records if record["status"] == "refused" for code in {r["code"] for r in record["refusals"]}
    )
    for code, count in sorted(codes.items(), key=lambda item: (-item[1], item[0])):
        typer.echo(f"  {count:4d}  {code} {Code.by_code(code).title}")
    errors = [reason for record in records if record["status"] == "error" for reason in record["reasons"]]
    for reason in errors:
        typer.echo(f"  error: {reason}")


def _run(tree: Path, extra: list[str]) -> tuple[float, float, list[dict], int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "sdpa_port", str(tree), "--json", *extra], capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    return wall, cpu, records, completed.returncode


if __name__ == "__main__":
    app()
