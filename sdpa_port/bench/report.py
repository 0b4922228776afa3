"""Text table, JSON file and file names of a benchmark result.

No torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from sdpa_port.bench.spec import BenchResult, Row

HEADER = (
    "device",
    "phase",
    "L",
    "eager ms",
    "sdpa ms",
    "speed-up",
    "paired",
    "runs",
    "eager MiB",
    "sdpa MiB",
    "mem sdpa/eager",
)
EXECUTORCH_HEADER = ("executorch ms", "sdpa/executorch")


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def row_cells(row: Row) -> tuple[str, ...]:
    ratio = row.memory_ratio
    return (
        row.device,
        row.phase.value,
        str(row.length),
        f"{row.eager_s * 1e3:.2f}",
        f"{row.sdpa_s * 1e3:.2f}",
        f"{row.speedup:.2f}",
        "-" if row.paired_speedup is None else f"{row.paired_speedup:.2f}",
        "-" if row.rounds is None else str(row.rounds),
        _mib(row.eager_peak_bytes),
        _mib(row.sdpa_peak_bytes),
        "-" if ratio is None else f"{ratio:.2f}",
    )


def executorch_cells(row: Row) -> tuple[str, ...]:
    if row.executorch_s is None:
        return ("-", "-")
    return (f"{row.executorch_s * 1e3:.3f}", f"{row.sdpa_s / row.executorch_s:.2f}")


def table(result: BenchResult, markdown: bool = False) -> str:
    """The rows as aligned text or a Markdown table, ordered by device, phase and length.

    Runs with ExecuTorch add its latency and its speed-up over the SDPA model in PyTorch.
    """
    order = {"forward": 0, "prefill": 1, "decode": 2}
    rows = sorted(result.rows, key=lambda r: (r.device, order[r.phase.value], r.length))
    header = HEADER + (EXECUTORCH_HEADER if result.settings.executorch else ())
    cells = [header] + [row_cells(r) + (executorch_cells(r) if result.settings.executorch else ()) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
        lines += ["| " + " | ".join(c) + " |" for c in cells[1:]]
        return "\n".join(lines)
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    return "\n".join("  ".join(c[i].rjust(widths[i]) for i in range(len(header))) for c in cells)


def headline(result: BenchResult) -> str:
    target = result.target
    checks = ", ".join(f"{d}: max|eager-sdpa|={c['max_abs_diff']:.2e} at L={c['length']}" for d, c in result.checks.items())
    env = result.environment
    return (
        f"{target['model_class']} ({target['kind']}) from {target['source']}; {target['detail']}\n"
        f"torch {env['torch']}, transformers {env['transformers']}, {env['threads']} thread(s), "
        f"malloc {env.get('malloc', 'default')}, "
        f"batch {result.settings.batch}, padding {result.settings.padding}; {checks}\n"
        f"latency: minimum {'process CPU time' if result.settings.clock == 'cpu' else 'wall time'} of "
        f"{result.settings.runs}+ runs (>= {result.settings.min_time:g} s timed) after {result.settings.warmup} warm-up, "
        "eager and SDPA taking turns; speed-up: ratio of the minima; paired: median over runs of the ratio within a "
        "run; decode: per token; memory: peak RSS of one forward above the process baseline (child process)"
    )


def stem_of(result: BenchResult) -> str:
    source = Path(result.target["source"]).stem
    suffix = "" if result.settings.padding == "none" else f"_pad-{result.settings.padding}"
    return f"bench_{source}_tf{result.environment['transformers']}{suffix}"


def write_json(result: BenchResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")


def read_json(path: Path) -> BenchResult:
    return BenchResult.from_json(json.loads(path.read_text(encoding="utf-8")))
