"""PNG plots of speed-up and peak memory against sequence length.

They need matplotlib, an optional dependency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from sdpa_port.bench.spec import BenchResult, Phase

MISSING = "matplotlib is not installed: no plot written (pip install 'sdpa-port[bench]' or pip install matplotlib)"


class PlotUnavailable(Exception):
    pass


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(MISSING) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def plot(results: Sequence[BenchResult], path: Path, title: str | None = None) -> Path:
    """Plot SDPA's speed-up and both implementations' peak memory against sequence length.

    Left: SDPA speed-up over eager per phase; right: peak forward memory of eager and SDPA. One line per result.
    """
    pyplot = _pyplot()
    figure, (speed, memory) = pyplot.subplots(1, 2, figsize=(11, 4.2))
    styles = {Phase.FORWARD: "-", Phase.PREFILL: "--", Phase.DECODE: ":"}
    for index, result in enumerate(results):
        colour = f"C{index}"
        name = result.target["model_class"] if len(results) > 1 else ""
        for device in result.settings.devices:
            for phase, style in styles.items():
                rows = sorted((r for r in result.rows if r.device == device and r.phase is phase), key=lambda r: r.length)
                if rows:
                    label = " ".join(x for x in (name, device if len(result.settings.devices) > 1 else "", phase.value) if x)
                    speed.plot([r.length for r in rows], [r.speedup for r in rows], style, marker="o", color=colour, label=label)
            rows = sorted(
                (r for r in result.rows if r.device == device and r.phase is Phase.FORWARD and r.sdpa_peak_bytes is not None),
                key=lambda r: r.length,
            )
            if rows:
                lengths = [r.length for r in rows]
                memory.plot(lengths, [r.eager_peak_bytes / 2**20 for r in rows], "--", marker="s", color=colour, label=f"{name} eager".strip())
                memory.plot(lengths, [r.sdpa_peak_bytes / 2**20 for r in rows], "-", marker="o", color=colour, label=f"{name} sdpa".strip())
    speed.axhline(1.0, color="grey", linewidth=0.8)
    speed.set(xscale="log", xlabel="sequence length", ylabel="eager time / SDPA time", title="SDPA speed-up")
    memory.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="MiB above baseline", title="Peak memory of one forward")
    for axis in (speed, memory):
        lengths = sorted({r.length for result in results for r in result.rows})
        axis.set_xticks(lengths, [str(x) for x in lengths])
        axis.minorticks_off()
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path
