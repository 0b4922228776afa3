"""`sdpa-port bench TARGET`: a thin typer layer over `sdpa_port.bench.run` (torch is imported only when it runs)."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdpa_port.bench.spec import DEFAULT_LENGTHS, Kind, Settings, Size

bench_app = typer.Typer(add_completion=False, context_settings={"help_option_names": ["-h", "--help"]})


class Device(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class Clock(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    WALL = "wall"


class Malloc(str, enum.Enum):
    STEADY = "steady"
    DEFAULT = "default"


class Padding(str, enum.Enum):
    NONE = "none"
    AUTO = "auto"
    LEFT = "left"
    RIGHT = "right"


def parse_lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(sorted({int(part) for part in text.replace(" ", "").split(",") if part}))
    except ValueError:
        raise typer.BadParameter(f"not a comma-separated list of integers: {text!r}") from None
    if not lengths or min(lengths) < 2:
        raise typer.BadParameter("lengths must be integers of at least 2")
    return lengths


def parse_phases(text: str) -> tuple[str, ...]:
    chosen = tuple(part for part in text.replace(" ", "").split(",") if part)
    unknown = [part for part in chosen if part not in ("forward", "prefill", "decode")]
    if unknown or not chosen:
        raise typer.BadParameter(f"phases are forward, prefill, decode; got {text!r}", param_hint="--phases")
    return chosen


def clock_for(choice: Clock, threads: int) -> str:
    """Process CPU time measures a one-thread run without the time other processes took from it; with more
    threads it would add the threads up, so wall time is used."""
    if choice is Clock.AUTO:
        return "cpu" if threads == 1 else "wall"
    return choice.value


def devices_for(choice: Device) -> tuple[str, ...]:
    import torch

    has_cuda = torch.cuda.is_available()
    if choice is Device.CUDA and not has_cuda:
        raise typer.BadParameter("CUDA is not available in this torch build or machine", param_hint="--device")
    if choice is Device.AUTO:
        return ("cpu", "cuda") if has_cuda else ("cpu",)
    return (choice.value,)


def _say(message: str) -> None:
    typer.echo(message, err=True)


@bench_app.command()
def bench(
    target: Annotated[str, typer.Argument(help="A modeling file (ported or not) or a model name such as `bert`.", show_default=False)],
    lengths: Annotated[str, typer.Option("--lengths", "-L", help="Comma-separated sequence lengths.")] = ",".join(map(str, DEFAULT_LENGTHS)),
    runs: Annotated[int, typer.Option("--runs", "-r", min=1, help="Timed runs per measurement; the minimum is kept.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs before the timed ones.")] = 1,
    min_time: Annotated[
        float, typer.Option("--min-time", min=0.0, help="Time more runs (up to 200) until this many seconds were timed.")
    ] = 0.0,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="torch CPU threads (default: all CPUs).")] = None,
    clock: Annotated[
        Clock, typer.Option("--clock", help="auto: process CPU time with one thread (robust to other load), wall otherwise.")
    ] = Clock.AUTO,
    malloc: Annotated[
        Malloc,
        typer.Option("--malloc", help="steady: glibc keeps freed blocks in its heap (no mmap, no trim), so timings do not vary with page faults."),
    ] = Malloc.STEADY,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the JSON, the PNG and the port.")] = Path("bench-results"),
    device: Annotated[Device, typer.Option("--device", help="cpu, cuda, or auto (cpu, and cuda when present).")] = Device.AUTO,
    batch: Annotated[int, typer.Option("--batch", "-b", min=1, help="Examples per batch.")] = 1,
    padding: Annotated[
        Padding, typer.Option("--padding", help="Pad the last example (auto: left for decoders, right otherwise).")
    ] = Padding.NONE,
    pad_fraction: Annotated[float, typer.Option("--pad-fraction", min=0.0, max=0.9, help="Share of the last example that is padding.")] = 0.25,
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", min=1, help="Tokens per timed decode run.")] = 8,
    phases: Annotated[
        str, typer.Option("--phases", help="Comma-separated: forward, prefill, decode (the last two for decoders only).")
    ] = "forward,prefill,decode",
    memory: Annotated[bool, typer.Option("--memory/--no-memory", help="Measure peak memory in child processes.")] = True,
    executorch: Annotated[
        bool,
        typer.Option(
            "--executorch/--no-executorch",
            help="Decoders: also time prefill and decode of the SDPA model exported with a static cache and run by "
            "ExecuTorch (XNNPACK); needs executorch, --batch 1, no padding.",
        ),
    ] = False,
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="Write a PNG plot (needs matplotlib).")] = True,
    hidden: Annotated[int, typer.Option("--hidden", min=8, help="Hidden size of the random-init model.")] = 256,
    layers: Annotated[int, typer.Option("--layers", min=1, help="Layers (encoder and decoder each).")] = 4,
    heads: Annotated[int, typer.Option("--heads", min=1, help="Attention heads.")] = 4,
    ffn: Annotated[int, typer.Option("--ffn", min=8, help="Feed-forward size.")] = 1024,
    vocab: Annotated[int, typer.Option("--vocab", min=16, help="Vocabulary size.")] = 1000,
    package: Annotated[Optional[str], typer.Option("--package", help="transformers package to load a loose file in.")] = None,
    model_class: Annotated[Optional[str], typer.Option("--model-class", help="Model class to build (default: the base model).")] = None,
    kind: Annotated[Optional[Kind], typer.Option("--kind", help="Override the detected kind.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
) -> None:
    """Measure eager against SDPA attention: forward latency and peak memory per sequence length.

    TARGET is ported in memory when it does not support SDPA yet (the port is written to --out and loaded inside
    the installed transformers); a file that already supports SDPA is measured as it is. The model is random-init
    from a mid-sized config synthesised from the file's config class; nothing is downloaded. Decoders also get
    prefill and per-token decode with a cache. Prints a table, writes <out>/<name>.json and <out>/<name>.png.

    Exit codes: 0 done, 2 bad input or a failed measurement.
    """
    from sdpa_port.bench.report import headline, stem_of, table, write_json
    from sdpa_port.bench.run import BenchError, run_benchmark
    from sdpa_port.bench.target import TargetError

    if hidden % heads:
        raise typer.BadParameter(f"--hidden {hidden} is not a multiple of --heads {heads}")
    chosen_threads = threads or os.cpu_count() or 1
    settings = Settings(
        lengths=parse_lengths(lengths),
        runs=runs,
        warmup=warmup,
        min_time=min_time,
        threads=chosen_threads,
        clock=clock_for(clock, chosen_threads),
        malloc=malloc.value,
        batch=batch,
        padding=padding.value,
        pad_fraction=pad_fraction,
        decode_tokens=decode_tokens,
        devices=devices_for(device),
        memory=memory,
        phases=parse_phases(phases),
        size=Size(hidden=hidden, layers=layers, heads=heads, ffn=ffn, vocab=vocab),
        executorch=executorch,
    )
    try:
        result = run_benchmark(
            target, out, settings, package=package, model_class=model_class, kind=kind, progress=(lambda m: None) if quiet else _say
        )
    except (TargetError, BenchError, LookupError) as error:
        typer.echo(f"sdpa-port bench: {error}", err=True)
        raise typer.Exit(2)
    typer.echo(headline(result))
    typer.echo(table(result))
    stem = stem_of(result)
    json_path = out / f"{stem}.json"
    write_json(result, json_path)
    typer.echo(f"wrote {json_path}")
    if plot:
        from sdpa_port.bench.plot import PlotUnavailable, plot as draw

        title = f"{result.target['model_class']}: eager vs SDPA (transformers {result.environment['transformers']})"
        try:
            typer.echo(f"wrote {draw([result], out / (stem + '.png'), title=title)}")
        except PlotUnavailable as error:
            typer.echo(f"sdpa-port bench: {error}", err=True)
