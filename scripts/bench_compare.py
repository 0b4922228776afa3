"""Hold sdpa-port's automatic ports against the SDPA ports written by hand in a later transformers release.

`run` benchmarks each model twice, with `python -m sdpa_port bench MODEL`: in an environment with the release the
tool ports (4.40.2: the file there has no SDPA, so the bench ports it) and in one with the release that ships a
hand-written SDPA port (4.47.1: the installed file is measured as it is). Both sides get the same config, inputs,
lengths, thread count and seeds. `summarise` reads the JSON files back and writes the ratios:

    speed-up ratio = (eager/SDPA time of the automatic port) / (eager/SDPA time of the hand port), at L=1024
    memory ratio   = SDPA peak memory of the automatic port / SDPA peak memory of the hand port, at L=4096

(peak memory: bytes above the process baseline during one forward, measured in a child process). The goal is a
speed-up ratio of at least 0.95 and a memory ratio of at most 1.10. `plot` draws auto against hand per model.

Examples:
    python scripts/bench_compare.py run --auto-python /work/venv440/bin/python --hand-python /work/venv447/bin/python
    python scripts/bench_compare.py summarise --data docs/bench-data
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sdpa_port.bench.report import read_json
from sdpa_port.bench.spec import BenchResult, Phase, Row

MODELS = ("bert", "distilbert", "gpt2", "opt", "mbart")
SPEED_LENGTH, MEMORY_LENGTH = 1024, 4096
SPEED_GOAL, MEMORY_GOAL = 0.95, 1.10
# the inputs of each case: the `sdpa-port bench` settings of that name, for `run` (arguments) and `lockstep` (settings)
CASE_SETTINGS = {"unpadded": {"batch": 1, "padding": "none"}, "padded": {"batch": 2, "padding": "auto"}}

# options shared by the commands that drive both environments
AutoPython = Annotated[str, typer.Option(help="python of the environment whose files are ported (4.40.2).")]
HandPython = Annotated[str, typer.Option(help="python of the environment with hand ports (4.47.1).")]
Models = Annotated[str, typer.Option(help="Comma-separated model names.")]
Cases = Annotated[str, typer.Option(help="Comma-separated: unpadded, padded.")]

app = typer.Typer(add_completion=False, no_args_is_help=True)


def bench_command(python: str, model: str, out: Path, case: str, common: list[str]) -> list[str]:
    settings = CASE_SETTINGS[case]
    inputs = ["--batch", str(settings["batch"]), "--padding", str(settings["padding"])]
    return [python, "-m", "sdpa_port", "bench", model, "--out", str(out), "--no-plot", *common, *inputs]


@app.command()
def run(
    auto_python: AutoPython,
    hand_python: HandPython,
    data: Annotated[Path, typer.Option(help="Where the JSON files go (auto/ and hand/ below it).")] = Path("docs/bench-data"),
    models: Models = ",".join(MODELS),
    cases: Cases = "unpadded,padded",
    lengths: Annotated[str, typer.Option(help="Lengths of the unpadded case.")] = "512,1024,2048,4096",
    padded_lengths: Annotated[str, typer.Option(help="Lengths of the padded case.")] = f"{SPEED_LENGTH},{MEMORY_LENGTH}",
    runs: Annotated[int, typer.Option(help="Timed runs per measurement.")] = 3,
    padded_phases: Annotated[str, typer.Option(help="Phases of the padded case.")] = "forward",
    threads: Annotated[int, typer.Option(help="torch threads on both sides.")] = 1,
    bench_args: Annotated[str, typer.Option(help="More `sdpa-port bench` arguments for both sides, space-separated.")] = "",
) -> None:
    """Benchmark every model on both sides, one after the other (never concurrently: they would share cores)."""
    for model in models.split(","):
        for case in cases.split(","):
            chosen = lengths if case == "unpadded" else padded_lengths
            phases = ["--phases", padded_phases] if case == "padded" else []
            common = ["--lengths", chosen, *phases, "--runs", str(runs), "--threads", str(threads), "--device", "cpu", *bench_args.split()]
            for side, python in (("auto", auto_python), ("hand", hand_python)):
                command = bench_command(python, model, data / side, case, common)
                typer.echo(f"$ {' '.join(command)}", err=True)
                done = subprocess.run(command, check=False)
                if done.returncode != 0:
                    typer.echo(f"bench_compare: {model} {case} {side} failed with exit {done.returncode}", err=True)
                    raise typer.Exit(2)


def load_side(directory: Path) -> dict[tuple[str, str], BenchResult]:
    """(model name, case) -> result, from the JSON files `sdpa-port bench` wrote."""
    found: dict[tuple[str, str], BenchResult] = {}
    for path in sorted(directory.glob("bench_*.json")):
        result = read_json(path)
        name = Path(result.target["source"]).stem.removeprefix("modeling_")
        case = "unpadded" if result.settings.padding == "none" else "padded"
        found[(name, case)] = result
    return found


def speedups(row: Row | None) -> tuple[float | None, float | None]:
    """(ratio of minima, paired median) of a row."""
    if row is None:
        return None, None
    return row.speedup, row.paired_speedup


def ratios(auto: BenchResult, hand: BenchResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "auto_transformers": auto.environment["transformers"],
        "hand_transformers": hand.environment["transformers"],
    }
    (a_min, a_paired), (h_min, h_paired) = (
        speedups(auto.row("cpu", Phase.FORWARD, SPEED_LENGTH)),
        speedups(hand.row("cpu", Phase.FORWARD, SPEED_LENGTH)),
    )
    if a_min and h_min:
        out |= {"auto_speedup_min": a_min, "hand_speedup_min": h_min, "speedup_ratio_min": a_min / h_min}
    if a_paired and h_paired:
        out |= {"auto_speedup": a_paired, "hand_speedup": h_paired, "speedup_ratio": a_paired / h_paired}
    elif "speedup_ratio_min" in out:
        out |= {"auto_speedup": a_min, "hand_speedup": h_min, "speedup_ratio": out["speedup_ratio_min"]}
    a, h = auto.row("cpu", Phase.FORWARD, MEMORY_LENGTH), hand.row("cpu", Phase.FORWARD, MEMORY_LENGTH)
    if a and h and a.sdpa_peak_bytes and h.sdpa_peak_bytes:
        out |= {
            "auto_sdpa_peak_bytes": a.sdpa_peak_bytes,
            "hand_sdpa_peak_bytes": h.sdpa_peak_bytes,
            "memory_ratio": a.sdpa_peak_bytes / h.sdpa_peak_bytes,
        }
    for phase in (Phase.PREFILL, Phase.DECODE):
        a, h = auto.row("cpu", phase, SPEED_LENGTH), hand.row("cpu", phase, SPEED_LENGTH)
        if a and h:
            a_value, h_value = a.paired_speedup or a.speedup, h.paired_speedup or h.speedup
            out[f"{phase.value}_speedup_ratio"] = a_value / h_value
    out["meets_goal"] = out.get("speedup_ratio", 0) >= SPEED_GOAL and out.get("memory_ratio", 9) <= MEMORY_GOAL
    return out


def compare(data: Path) -> dict[str, dict[str, Any]]:
    auto, hand = load_side(data / "auto"), load_side(data / "hand")
    return {f"{name} {case}": ratios(auto[(name, case)], hand[(name, case)]) for (name, case) in auto if (name, case) in hand}


def _f(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(table: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"| model, inputs | auto speed-up @{SPEED_LENGTH} | hand speed-up @{SPEED_LENGTH} | **speed-up ratio** | "
        f"ratio of minima | auto SDPA MiB @{MEMORY_LENGTH} | hand SDPA MiB @{MEMORY_LENGTH} | **memory ratio** | "
        "prefill ratio | decode ratio | goal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, r in table.items():
        mib = lambda name: _f(r[name] / 2**20, 1) if name in r else "-"  # noqa: E731
        lines.append(
            f"| {key} | {_f(r.get('auto_speedup'))} | {_f(r.get('hand_speedup'))} | **{_f(r.get('speedup_ratio'))}** | "
            f"{_f(r.get('speedup_ratio_min'))} | {mib('auto_sdpa_peak_bytes')} | {mib('hand_sdpa_peak_bytes')} | "
            f"**{_f(r.get('memory_ratio'))}** | {_f(r.get('prefill_speedup_ratio'))} | "
            f"{_f(r.get('decode_speedup_ratio'))} | {'met' if r['meets_goal'] else 'missed'} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ lockstep timing at the speed length


class Remote:
    """A `sdpa_port.bench.worker` process in one environment, asked one JSON line at a time."""

    def __init__(self, python: str, threads: int, log: Path) -> None:
        env = dict(os.environ) | {"OMP_NUM_THREADS": str(threads)}
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "a", encoding="utf-8")
        self.process = subprocess.Popen(
            [python, "-m", "sdpa_port.bench.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env
        )

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited (see {self.log.name})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        try:
            assert self.process.stdin
            self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.close()
        finally:
            self.process.wait(timeout=60)
            self.log.close()


def lockstep_rounds(remotes: dict[str, Remote], rounds: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    """CPU seconds of every (side, implementation) per round; sides and implementations swap order every round."""
    samples: dict[str, dict[str, list[float]]] = {side: {"eager": [], "sdpa": []} for side in remotes}
    sides = list(remotes)
    for index in range(warmup + rounds):
        flip = index % 2 == 1
        for side in sides[::-1] if flip else sides:
            for implementation in ("sdpa", "eager") if flip else ("eager", "sdpa"):
                answer = remotes[side].ask({"op": "time", "implementation": implementation})
                if index >= warmup:
                    samples[side][implementation].append(answer["cpu"])
    return samples


def lockstep_summary(samples: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    auto, hand = samples["auto"], samples["hand"]
    per_round = [
        (ae / as_) / (he / hs) for ae, as_, he, hs in zip(auto["eager"], auto["sdpa"], hand["eager"], hand["sdpa"])
    ]
    quartiles = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else [per_round[0]] * 3
    auto_min = min(auto["eager"]) / min(auto["sdpa"])
    hand_min = min(hand["eager"]) / min(hand["sdpa"])
    return {
        "rounds": len(per_round),
        "speedup_ratio": statistics.median(per_round),
        "speedup_ratio_q1": quartiles[0],
        "speedup_ratio_q3": quartiles[2],
        "auto_speedup": statistics.median(e / s for e, s in zip(auto["eager"], auto["sdpa"])),
        "hand_speedup": statistics.median(e / s for e, s in zip(hand["eager"], hand["sdpa"])),
        "auto_speedup_min": auto_min,
        "hand_speedup_min": hand_min,
        "speedup_ratio_min": auto_min / hand_min,
        "sdpa_time_ratio": statistics.median(a / h for a, h in zip(auto["sdpa"], hand["sdpa"])),
        "eager_time_ratio": statistics.median(a / h for a, h in zip(auto["eager"], hand["eager"])),
        "min_ms": {side: {impl: min(values) * 1e3 for impl, values in found.items()} for side, found in samples.items()},
    }


@app.command()
def lockstep(
    auto_python: AutoPython,
    hand_python: HandPython,
    data: Annotated[Path, typer.Option(help="Results go to <data>/lockstep/.")] = Path("docs/bench-data"),
    models: Models = ",".join(MODELS),
    cases: Cases = "unpadded,padded",
    rounds: Annotated[int, typer.Option(help="Timed rounds; each times all four (side, implementation) pairs.")] = 40,
    warmup: Annotated[int, typer.Option(help="Untimed rounds first.")] = 2,
    threads: Annotated[int, typer.Option(help="torch threads on both sides.")] = 1,
    auto_target: Annotated[
        Optional[str], typer.Option(help="MODEL=FILE: measure FILE on the automatic side instead of the installed MODEL.")
    ] = None,
    label: Annotated[str, typer.Option(help="Suffix of the result names (for variants such as a patched port).")] = "",
) -> None:
    """Time the forward pass at L=1024 on both sides at once: one worker per environment, the four (side,
    implementation) pairs taking turns every round. The speed-up ratio is the median over rounds of
    (auto eager/auto SDPA) / (hand eager/hand SDPA); all four of a round met the same background load."""
    overrides = dict([auto_target.split("=", 1)]) if auto_target else {}
    for model in models.split(","):
        for case in cases.split(","):
            settings = {"lengths": [SPEED_LENGTH], "threads": threads, **CASE_SETTINGS[case]}
            name = f"{model}_{case}{'_' + slug(label) if label else ''}"
            remotes = {
                side: Remote(python, threads, data / "lockstep" / "logs" / f"{name}_{side}.log")
                for side, python in (("auto", auto_python), ("hand", hand_python))
            }
            try:
                facts = {}
                for side, remote in remotes.items():
                    target = overrides.get(model, model) if side == "auto" else model
                    request = {"op": "setup", "target": target, "settings": settings, "length": SPEED_LENGTH}
                    facts[side] = remote.ask(request | {"out_dir": str(data / "lockstep" / "ports" / side)})
                typer.echo(f"{name}: {rounds} rounds", err=True)
                samples = lockstep_rounds(remotes, rounds, warmup)
            finally:
                for remote in remotes.values():
                    remote.close()
            summary = lockstep_summary(samples)
            typer.echo(f"    speed-up ratio {summary['speedup_ratio']:.3f} (IQR {summary['speedup_ratio_q1']:.3f}-{summary['speedup_ratio_q3']:.3f})", err=True)
            record = {"model": model, "case": case, "label": label, "length": SPEED_LENGTH, "settings": settings}
            record |= {"sides": facts, "summary": summary, "samples_cpu_s": samples}
            out = data / "lockstep" / f"{name}.json"
            out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() or c == "." else " " for c in text.lower()).split())


def lockstep_table(data: Path) -> dict[str, dict[str, Any]]:
    table = {}
    for path in sorted((data / "lockstep").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        key = f"{record['model']} {record['case']}" + (f" ({record['label']})" if record.get("label") else "")
        table[key] = record["summary"]
    return table


def lockstep_markdown(table: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"| model, inputs | rounds | auto speed-up @{SPEED_LENGTH} | hand speed-up @{SPEED_LENGTH} | **speed-up ratio** (IQR) | "
        "ratio of minima | SDPA time auto/hand | eager time auto/hand |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in table.items():
        lines.append(
            f"| {key} | {r['rounds']} | {_f(r['auto_speedup'])} | {_f(r['hand_speedup'])} | **{_f(r['speedup_ratio'])}** "
            f"({_f(r['speedup_ratio_q1'])}-{_f(r['speedup_ratio_q3'])}) | {_f(r['speedup_ratio_min'])} | "
            f"{_f(r['sdpa_time_ratio'])} | {_f(r['eager_time_ratio'])} |"
        )
    return "\n".join(lines)


@app.command()
def summarise(
    data: Annotated[Path, typer.Option(help="The directory `run` wrote.")] = Path("docs/bench-data"),
    out: Annotated[Optional[Path], typer.Option(help="Also write the ratios as JSON here.")] = None,
) -> None:
    """Print the ratio table (Markdown) from the JSON files."""
    table = compare(data)
    focused = lockstep_table(data)
    if not table and not focused:
        typer.echo(f"bench_compare: no pairs of results under {data}/auto and {data}/hand", err=True)
        raise typer.Exit(2)
    if table:
        typer.echo(markdown(table))
    if focused:
        typer.echo("")
        typer.echo(lockstep_markdown(focused))
    if out is not None:
        out.write_text(json.dumps({"full": table, "lockstep": focused}, indent=2) + "\n", encoding="utf-8")


@app.command()
def plot(
    data: Annotated[Path, typer.Option(help="The directory `run` wrote.")] = Path("docs/bench-data"),
    out: Annotated[Path, typer.Option(help="Directory for the PNG files.")] = Path("docs/img"),
) -> None:
    """One PNG per model and case: speed-up and memory of the automatic port (C0) and the hand port (C1)."""
    from sdpa_port.bench.plot import PlotUnavailable, plot as draw

    auto, hand = load_side(data / "auto"), load_side(data / "hand")
    for key in sorted(auto):
        if key not in hand:
            continue
        name, case = key
        pair = [_relabel(auto[key], "auto"), _relabel(hand[key], "hand")]
        try:
            path = draw(pair, out / f"compare_{name}_{case}.png", title=f"{name} ({case}): automatic port vs hand port")
        except PlotUnavailable as error:
            typer.echo(f"bench_compare: {error}", err=True)
            raise typer.Exit(2)
        typer.echo(f"wrote {path}")


@app.command()
def tables(
    data: Annotated[Path, typer.Option(help="A directory of `sdpa-port bench` JSON files.")] = Path("docs/bench-data/auto"),
) -> None:
    """Markdown tables of every result in a directory, as they go into docs/benchmarks.md."""
    from sdpa_port.bench.report import table

    for (name, case), result in sorted(load_side(data).items()):
        check = result.checks.get("cpu", {})
        typer.echo(
            f"**{result.target['model_class']}** ({case}, batch {result.settings.batch}; transformers "
            f"{result.environment['transformers']}; max abs eager-SDPA difference {check.get('max_abs_diff', float('nan')):.1e} "
            f"at L={check.get('length')})\n"
        )
        typer.echo(table(result, markdown=True) + "\n")


@app.command()
def overview(
    data: Annotated[Path, typer.Option(help="The directory `run` wrote.")] = Path("docs/bench-data"),
    side: Annotated[str, typer.Option(help="auto or hand.")] = "auto",
    case: Annotated[str, typer.Option(help="unpadded or padded.")] = "unpadded",
    out: Annotated[Path, typer.Option(help="The PNG file.")] = Path("docs/img/overview_auto_unpadded.png"),
) -> None:
    """All models of one side and case in one PNG: SDPA speed-up per phase, peak forward memory."""
    from sdpa_port.bench.plot import PlotUnavailable, plot as draw

    results = [result for (name, kind), result in sorted(load_side(data / side).items()) if kind == case]
    if not results:
        typer.echo(f"bench_compare: no {case} results under {data / side}", err=True)
        raise typer.Exit(2)
    version = results[0].environment["transformers"]
    try:
        typer.echo(f"wrote {draw(results, out, title=f'{side} ports, transformers {version}, {case}')}")
    except PlotUnavailable as error:
        typer.echo(f"bench_compare: {error}", err=True)
        raise typer.Exit(2)


def _relabel(result: BenchResult, side: str) -> BenchResult:
    target = dict(result.target) | {"model_class": f"{side} {result.environment['transformers']}"}
    return BenchResult(target, result.environment, result.settings, result.model, result.rows, result.checks)


if __name__ == "__main__":
    sys.exit(app())
