"""Run a benchmark: prepare the target, time both implementations in this process, measure memory in children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from sdpa_port.bench.config import bench_config_kwargs
from sdpa_port.bench.environment import describe, load_average
from sdpa_port.bench.spec import IMPLEMENTATIONS, BenchResult, Kind, ModelRef, Phase, Row, Settings, paired_speedup
from sdpa_port.bench.target import Prepared, prepare

Progress = Callable[[str], None]
# A fixed mmap threshold makes glibc return every large freed block to the system at once, so a child's peak RSS
# follows the tensors that are alive rather than what the heap happened to keep.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


class BenchError(Exception):
    """A benchmark that could not run, reported as one line."""


def phases_of(kind: Kind, wanted: tuple[str, ...] = ("forward", "prefill", "decode")) -> tuple[Phase, ...]:
    """The phases run for a kind: encoders have only `forward`; cache phases need a decoder."""
    possible = (Phase.FORWARD,) if kind is Kind.ENCODER else (Phase.FORWARD, Phase.PREFILL, Phase.DECODE)
    return tuple(phase for phase in possible if phase.value in wanted)


def describe_model(
    prepared: Prepared, settings: Settings, model_class: str | None, kind: Kind | None
) -> tuple[ModelRef, Any]:
    """Load the module, pick the model class, synthesise the config and decide the kind.

    Imports torch.
    """
    from sdpa_port.bench import measure

    probe = ModelRef(
        module=prepared.module,
        path=str(prepared.path) if prepared.path else None,
        package=prepared.package,
        model_class=model_class or "",
        config={},
        kind=kind or Kind.ENCODER,
    )
    module = measure.load_module(probe)
    chosen = measure.pick_model_class(module, model_class)
    kwargs = bench_config_kwargs(chosen.config_class(), settings.size, max(settings.lengths))
    config = measure.build_config(chosen, kwargs)
    decided = kind or measure.detect_kind(chosen, config)
    ref = ModelRef(probe.module, probe.path, probe.package, chosen.__name__, kwargs, decided)
    return ref, chosen


def peak_memory(ref: ModelRef, settings: Settings, implementation: str, length: int, device: str) -> dict[str, Any]:
    """Peak bytes above baseline of one forward pass, measured in a fresh child process."""
    request = {
        "model": ref.to_json(),
        "implementation": implementation,
        "length": length,
        "device": device,
        "threads": settings.threads,
        "batch": settings.batch,
        "padding": settings.padding_side(ref.kind),
        "pad_fraction": settings.pad_fraction,
        "dtype": settings.dtype,
        "seed": settings.seed,
    }
    env = dict(os.environ) | CHILD_ENV | {"OMP_NUM_THREADS": str(settings.threads)}
    done = subprocess.run(
        [sys.executable, "-m", "sdpa_port.bench.child"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise BenchError(f"memory child failed ({implementation}, L={length}): {tail[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class Steps:
    """Numbered progress lines, such as `[3/24] cpu forward L=1024`."""

    def __init__(self, total: int, say: Progress) -> None:
        self.total, self.done, self.say = total, 0, say

    def next(self, what: str) -> None:
        self.done += 1
        self.say(f"[{self.done}/{self.total}] {what}")


def measure_length(
    models: dict[str, Any], ref: ModelRef, config: Any, settings: Settings, device: str, length: int, steps: Steps
) -> list[Row]:
    """The rows of one device and length: every phase timed with eager and SDPA taking turns, then memory."""
    from sdpa_port.bench import measure

    clock = settings.clock if device == "cpu" else "wall"  # CPU time says nothing about a GPU's work
    phases = phases_of(ref.kind, settings.phases)
    inputs = measure.make_inputs(config, ref.kind, settings, length, device)
    timings: dict[Phase, dict[str, Any]] = {}
    for phase in phases:
        steps.next(f"{device} {phase.value} L={length}")
        timed = {name: measure.prepare_phase(model, inputs, ref.kind, phase, settings) for name, model in models.items()}
        found = measure.time_interleaved(timed, settings.runs, settings.warmup, device, settings.min_time)
        timings[phase] = found
        eager_s, sdpa_s = _pick(found["eager"], clock), _pick(found["sdpa"], clock)
        paired = paired_speedup(found["eager"], found["sdpa"], clock)
        steps.say(
            f"    eager {eager_s * 1e3:.2f} ms, sdpa {sdpa_s * 1e3:.2f} ms ({clock}, min of {len(found['eager'].cpu)}), "
            f"x{eager_s / sdpa_s:.2f} (paired median x{paired:.2f})"
        )
    executorch = executorch_times(models["sdpa"], ref, settings, device, length, steps, phases)
    peaks: dict[str, int | None] = {name: None for name in IMPLEMENTATIONS}
    if settings.memory and Phase.FORWARD in phases:
        steps.next(f"{device} peak memory L={length} (child processes)")
        for name in IMPLEMENTATIONS:
            peaks[name] = peak_memory(ref, settings, name, length, device)["extra_bytes"]
        steps.say(f"    eager {_mib(peaks['eager'])} MiB, sdpa {_mib(peaks['sdpa'])} MiB")
    rows = []
    for phase, found in timings.items():
        memory = phase is Phase.FORWARD
        rows.append(
            Row(
                device,
                phase,
                length,
                _pick(found["eager"], clock),
                _pick(found["sdpa"], clock),
                peaks["eager"] if memory else None,
                peaks["sdpa"] if memory else None,
                eager_wall_s=found["eager"].wall_s,
                sdpa_wall_s=found["sdpa"].wall_s,
                paired_speedup=paired_speedup(found["eager"], found["sdpa"], clock),
                rounds=len(found["eager"].cpu),
                executorch_s=executorch.get(phase),
            )
        )
    return rows


def executorch_times(
    model: Any, ref: ModelRef, settings: Settings, device: str, length: int, steps: Steps, phases: tuple[Phase, ...]
) -> dict[Phase, float]:
    """Prefill and decode of the SDPA model exported and run by ExecuTorch.

    Decoders on CPU, with --executorch.
    """
    if not settings.executorch or ref.kind is not Kind.DECODER or device != "cpu":
        return {}
    from sdpa_port.bench.executorch import ExecutorchUnavailable, executorch_latencies

    steps.say(f"    executorch L={length}: export, lower to XNNPACK, run the .pte")
    try:
        found = executorch_latencies(model, length, settings)
    except ExecutorchUnavailable as error:
        raise BenchError(f"executorch: {error}") from None
    steps.say("    " + ", ".join(f"executorch {p.value} {s * 1e3:.3f} ms" for p, s in found.items()))
    return {phase: seconds for phase, seconds in found.items() if phase in phases}


def run_benchmark(
    target: str,
    out_dir: Path,
    settings: Settings,
    *,
    package: str | None = None,
    model_class: str | None = None,
    kind: Kind | None = None,
    progress: Progress = lambda message: None,
) -> BenchResult:
    import torch

    from sdpa_port.bench import measure

    torch.set_num_threads(settings.threads)
    allocator = apply_malloc(settings.malloc)
    prepared = prepare(target, out_dir, package)
    progress(f"{prepared.source_path}: {prepared.detail}")
    ref, chosen = describe_model(prepared, settings, model_class, kind)
    config = measure.build_config(chosen, ref.config)
    progress(f"{ref.model_class} ({ref.kind.value}), threads={settings.threads}, lengths={list(settings.lengths)}")
    environment = describe(settings.threads) | {"malloc": allocator}
    phases = phases_of(ref.kind, settings.phases)
    per_length = len(phases) + (1 if settings.memory and Phase.FORWARD in phases else 0)
    steps = Steps(len(settings.devices) * len(settings.lengths) * per_length, progress)
    rows: list[Row] = []
    checks: dict[str, Any] = {}
    for device in settings.devices:
        eager = measure.build_model(chosen, config, "eager", device, settings.seed, settings.dtype)
        sdpa = measure.build_model(chosen, config, "sdpa", device, settings.seed, settings.dtype)
        sdpa.load_state_dict(eager.state_dict())
        shortest = min(settings.lengths)
        check_inputs = measure.make_inputs(config, ref.kind, settings, shortest, device)
        checks[device] = {"length": shortest, "max_abs_diff": measure.output_difference(eager, sdpa, check_inputs, ref.kind)}
        for length in settings.lengths:
            rows += measure_length({"eager": eager, "sdpa": sdpa}, ref, config, settings, device, length, steps)
        del eager, sdpa
    environment["load_average_at_end"] = load_average()
    target_facts: dict[str, Any] = prepared.describe() | {"model_class": ref.model_class, "kind": ref.kind.value}
    return BenchResult(target_facts, environment, settings, ref, tuple(rows), checks)


def apply_malloc(choice: str) -> str:
    """Set up the allocator of the timing process; returns what is in effect, for the record."""
    if choice != "steady":
        return "default"
    from sdpa_port.bench.malloc import steady_malloc

    return "steady" if steady_malloc() else "default (mallopt unavailable)"


def _pick(timing: Any, clock: str) -> float:
    return timing.cpu_s if clock == "cpu" else timing.wall_s


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"
