"""`sdpa-port bench TARGET`: a thin typer layer over `sdpa_port.bench.run`; torch is imported only when it runs."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sdpa_port.bench import options as option
from sdpa_port.bench.options import Clock, Device, Malloc, Padding, clock_for, devices_for, parse_lengths, parse_phases
from sdpa_port.bench.spec import DEFAULT_LENGTHS, BenchResult, Settings, Size
from sdpa_port.edge.command_help import Reflowed

bench_app = typer.Typer(add_completion=False, context_settings={"help_option_names": ["-h", "--help"]})


def _say(message: str) -> None:
    typer.echo(message, err=True)


@bench_app.command(cls=Reflowed)
def bench(
    target: option.Target,
    lengths: option.Lengths = ",".join(map(str, DEFAULT_LENGTHS)),
    runs: option.Runs = 5,
    warmup: option.Warmup = 1,
    min_time: option.MinTime = 0.0,
    threads: option.Threads = None,
    clock: option.ClockChoice = Clock.AUTO,
    malloc: option.MallocChoice = Malloc.STEADY,
    out: option.Out = Path("bench-results"),
    device: option.DeviceChoice = Device.AUTO,
    batch: option.Batch = 1,
    padding: option.PaddingChoice = Padding.NONE,
    pad_fraction: option.PadFraction = 0.25,
    dtype: option.Dtype = "float32",
    decode_tokens: option.DecodeTokens = 8,
    phases: option.Phases = "forward,prefill,decode",
    memory: option.Memory = True,
    executorch: option.Executorch = False,
    plot: option.Plot = True,
    hidden: option.Hidden = 256,
    layers: option.Layers = 4,
    heads: option.Heads = 4,
    ffn: option.Ffn = 1024,
    vocab: option.Vocab = 1000,
    package: option.Package = None,
    model_class: option.ModelClass = None,
    kind: option.KindChoice = None,
    quiet: option.Quiet = False,
) -> None:
    """Measure eager against SDPA attention: forward latency and peak memory per sequence length.

    TARGET is ported in memory when it does not support SDPA yet (the port is written to --out and loaded inside
    the installed transformers); a file that already supports SDPA is measured as it is. The model is random-init
    from a mid-sized config synthesised from the file's config class; nothing is downloaded. Decoders also get
    prefill and per-token decode with a cache. Prints a table, writes <out>/<name>.json and <out>/<name>.png.

    Exit codes: 0 done, 2 bad input or a failed measurement.
    """
    from sdpa_port.bench.run import BenchError, run_benchmark
    from sdpa_port.bench.target import TargetError

    if hidden % heads:
        raise typer.BadParameter(f"--hidden {hidden} is not a multiple of --heads {heads}")
    if dtype not in ("float32", "bfloat16"):
        raise typer.BadParameter(f"--dtype {dtype}: float32 or bfloat16")
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
        dtype=dtype,
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
    _report(result, out, plot)


def _report(result: BenchResult, out: Path, plot: bool) -> None:
    """Print the measurements, write their JSON and, when asked, their PNG plot under `out`."""
    from sdpa_port.bench.report import headline, stem_of, table, write_json

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
