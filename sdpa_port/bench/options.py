"""The options of `sdpa-port bench`: their choices, their parsers and their declarations for typer."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from sdpa_port.bench.spec import Kind


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
    """The clock that times a run with `threads` threads, when the choice is auto.

    Process CPU time measures a one-thread run without the time other processes took from it; with more threads it
    would add the threads up, so wall time is used.
    """
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


# each argument and option of the command, as `bench` declares it
Target = Annotated[str, typer.Argument(help="A modeling file (ported or not) or a model name such as `bert`.", show_default=False)]
Lengths = Annotated[str, typer.Option("--lengths", "-L", help="Comma-separated sequence lengths.")]
Runs = Annotated[int, typer.Option("--runs", "-r", min=1, help="Timed runs per measurement; the minimum is kept.")]
Warmup = Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs before the timed ones.")]
MinTime = Annotated[
    float, typer.Option("--min-time", min=0.0, help="Time more runs (up to 200) until this many seconds were timed.")
]
Threads = Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="torch CPU threads (default: all CPUs).")]
ClockChoice = Annotated[
    Clock, typer.Option("--clock", help="auto: process CPU time with one thread (robust to other load), wall otherwise.")
]
MallocChoice = Annotated[
    Malloc,
    typer.Option("--malloc", help="steady: glibc keeps freed blocks in its heap (no mmap, no trim), so timings do not vary with page faults."),
]
Out = Annotated[Path, typer.Option("--out", "-o", help="Directory for the JSON, the PNG and the port.")]
DeviceChoice = Annotated[Device, typer.Option("--device", help="cpu, cuda, or auto (cpu, and cuda when present).")]
Batch = Annotated[int, typer.Option("--batch", "-b", min=1, help="Examples per batch.")]
PaddingChoice = Annotated[
    Padding, typer.Option("--padding", help="Pad the last example (auto: left for decoders, right otherwise).")
]
Dtype = Annotated[str, typer.Option("--dtype", help="The models' dtype: float32 or bfloat16.")]
PadFraction = Annotated[float, typer.Option("--pad-fraction", min=0.0, max=0.9, help="Share of the last example that is padding.")]
DecodeTokens = Annotated[int, typer.Option("--decode-tokens", min=1, help="Tokens per timed decode run.")]
Phases = Annotated[
    str, typer.Option("--phases", help="Comma-separated: forward, prefill, decode (the last two for decoders only).")
]
Memory = Annotated[bool, typer.Option("--memory/--no-memory", help="Measure peak memory in child processes.")]
Executorch = Annotated[
    bool,
    typer.Option(
        "--executorch/--no-executorch",
        help="Decoders: also time prefill and decode of the SDPA model exported with a static cache and run by "
        "ExecuTorch (XNNPACK); needs executorch, --batch 1, no padding.",
    ),
]
Plot = Annotated[bool, typer.Option("--plot/--no-plot", help="Write a PNG plot (needs matplotlib).")]
Hidden = Annotated[int, typer.Option("--hidden", min=8, help="Hidden size of the random-init model.")]
Layers = Annotated[int, typer.Option("--layers", min=1, help="Layers (encoder and decoder each).")]
Heads = Annotated[int, typer.Option("--heads", min=1, help="Attention heads.")]
Ffn = Annotated[int, typer.Option("--ffn", min=8, help="Feed-forward size.")]
Vocab = Annotated[int, typer.Option("--vocab", min=16, help="Vocabulary size.")]
Package = Annotated[Optional[str], typer.Option("--package", help="transformers package to load a loose file in.")]
ModelClass = Annotated[Optional[str], typer.Option("--model-class", help="Model class to build (default: the base model).")]
KindChoice = Annotated[Optional[Kind], typer.Option("--kind", help="Override the detected kind.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")]
