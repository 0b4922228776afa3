"""Set sdpa-port's ports beside the SDPA ports Transformers' maintainers wrote by hand in a later 5.x release.

For each model the tool ports the file of the release before (with `--verify`, in that release's environment); the
hand port is the file of the release after, as installed there. Each side runs in its own release. Reported:

- flags: the implementation flags each side sets (`_supports_*`, `_can_compile_fullgraph`);
- parity: the tool's `--verify` verdict; for the hand port, its own eager against its SDPA (fp32, padded, and the
  bf16 rule of the emitted tests);
- speed: each side's SDPA-over-eager speed-up of one forward, fp32 and bf16, the two sides taking turns every round
  (`bench_compare.py lockstep`'s workers), and the median over rounds of their ratio;
- memory: SDPA peak memory of one forward in a fresh child process (`sdpa-port bench`), unpadded and on a padded
  batch of two.

    python scripts/compare_hand_ports.py run --model t5 --before .nox/tf510/bin/python --after .nox/tf517/bin/python
    python scripts/compare_hand_ports.py table --data docs/bench-data/hand5
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import Remote, lockstep_rounds, lockstep_summary  # noqa: E402

# the model, the release whose file the tool ports, the release with the maintainers' hand port
PAIRS = {"t5": ("5.10.4", "5.17.0"), "codegen": ("5.23.0", "5.25.0"), "gptj": ("5.23.0", "5.25.0")}
FLAG_PREFIXES = ("_supports_flash", "_supports_flex", "_supports_sdpa", "_supports_attention_backend")
COMPILE = "_can_compile_fullgraph"

app = typer.Typer(add_completion=False, no_args_is_help=True)

# the hand port's own parity in its release: eager against SDPA, fp32 padded and bf16, as --verify checks a port
PARITY = """
import importlib, json, sys
from sdpa_port.verify.auto import pick_targets
from sdpa_port.verify.configs import tiny_config
from sdpa_port.verify.parity import check_bf16, check_forward
module = importlib.import_module(f"transformers.models.{sys.argv[1]}.modeling_{sys.argv[1]}")
targets = pick_targets(module)
config = tiny_config(targets.config_class)
padding = "left" if targets.kind == "decoder" else "right"
checks = check_forward(targets.base, targets.base, config, padding, kind=targets.kind)
checks += check_bf16(targets.base, targets.base, config, padding, kind=targets.kind)
print(json.dumps({"file": module.__file__, "checks": [str(c) for c in checks], "passed": all(c.passed for c in checks)}))
"""


def flags(path: Path) -> list[str]:
    """The implementation flags a modeling file sets to True in a class body, sorted."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant):
                for target in statement.targets:
                    name = getattr(target, "id", "")
                    if statement.value.value is True and (name.startswith(FLAG_PREFIXES) or name == COMPILE):
                        found.add(name)
    return sorted(found)


def _json_line(command: list[str], timeout: int = 3600) -> dict[str, Any]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{' '.join(command[:4])}... exit {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(lines[-1])


def port_before(model: str, before: str, ports: Path) -> dict[str, Any]:
    """The tool's port of the earlier release's file, verified there; the record of `sdpa-port --json`."""
    ports.mkdir(parents=True, exist_ok=True)
    written = ports / f"modeling_{model}.py"
    command = [before, "-m", "sdpa_port", model, "-o", str(written), "--verify", "--json", "--no-tests"]
    record = _json_line(command)
    return {"written": str(written), "verified": record.get("verified"), "notes": record.get("notes", []),
            "warnings": record.get("warnings", []), "verification": record.get("verification", [])}


def speed(model: str, port: Path, before: str, after: str, dtype: str, length: int, rounds: int, logs: Path) -> dict[str, Any]:
    """Both sides' SDPA-over-eager speed-up of one forward, taking turns every round."""
    settings = {"lengths": [length], "threads": 1, "batch": 1, "padding": "none", "dtype": dtype}
    remotes = {side: Remote(python, 1, logs / f"{model}_{dtype}_{side}.log") for side, python in (("auto", before), ("hand", after))}
    try:
        for side, remote in remotes.items():
            target = {"target": str(port), "package": f"transformers.models.{model}"} if side == "auto" else {"target": model}
            remote.ask({"op": "setup", "settings": settings, "length": length, "out_dir": str(logs / side)} | target)
        samples = lockstep_rounds(remotes, rounds, warmup=1)
    finally:
        for remote in remotes.values():
            remote.close()
    return lockstep_summary(samples)


def memory(target: str, python: str, package: str | None, length: int, padded: bool, out: Path) -> int | None:
    """SDPA peak bytes of one forward at `length` (`sdpa-port bench` in a fresh child process)."""
    from sdpa_port.bench.report import read_json
    from sdpa_port.bench.spec import Phase

    out.mkdir(parents=True, exist_ok=True)
    inputs = ["--batch", "2", "--padding", "auto"] if padded else ["--batch", "1", "--padding", "none"]
    command = [python, "-m", "sdpa_port", "bench", target, "--lengths", str(length), "--runs", "1", "--warmup", "0",
               "--phases", "forward", "--threads", "1", "--device", "cpu", "--no-plot", "--quiet", "--out", str(out),
               *inputs, *(["--package", package] if package else [])]
    subprocess.run(command, check=True, capture_output=True, timeout=3600)
    [result] = [read_json(path) for path in sorted(out.glob("bench_*.json"))]
    row = result.row("cpu", Phase.FORWARD, length)
    return row.sdpa_peak_bytes if row else None


@app.command()
def run(
    model: Annotated[str, typer.Option(help=f"One of {', '.join(PAIRS)}.")],
    before: Annotated[str, typer.Option(help="python of the release whose file the tool ports.")],
    after: Annotated[str, typer.Option(help="python of the release with the hand port.")],
    data: Annotated[Path, typer.Option(help="Where the results go.")] = Path("docs/bench-data/hand5"),
    length: Annotated[int, typer.Option(help="Sequence length of the timed forward.")] = 512,
    memory_length: Annotated[int, typer.Option(help="Sequence length of the memory measurement.")] = 1024,
    rounds: Annotated[int, typer.Option(help="Timed rounds per dtype.")] = 12,
) -> None:
    """Port, check, time and measure one model on both sides; write <data>/<model>.json."""
    work = data / "work" / model
    auto = port_before(model, before, work / "ports")
    typer.echo(f"{model}: tool's port verified={auto['verified']}", err=True)
    hand = _json_line([after, "-c", PARITY, model])
    port = Path(auto["written"])
    record: dict[str, Any] = {
        "model": model, "releases": dict(zip(("before", "after"), PAIRS[model])),
        "flags": {"auto": flags(port), "hand": flags(Path(hand["file"]))},
        "parity": {"auto": auto, "hand": hand},
        "speed": {dtype: speed(model, port, before, after, dtype, length, rounds, work / "logs") for dtype in ("float32", "bfloat16")},
        "length": length, "memory_length": memory_length,
        "memory": {
            case: {
                "auto": memory(str(port), before, f"transformers.models.{model}", memory_length, padded, work / f"mem_auto_{case}"),
                "hand": memory(model, after, None, memory_length, padded, work / f"mem_hand_{case}"),
            }
            for case, padded in (("unpadded", False), ("padded", True))
        },
    }
    data.mkdir(parents=True, exist_ok=True)
    (data / f"{model}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    typer.echo(markdown([record]))


def markdown(records: list[dict[str, Any]]) -> str:
    """The side-by-side table: flags, parity, speed-up ratios and memory ratios."""
    lines = [
        "| model (tool's release → hand's) | flags only the hand port sets | flags only the tool's sets | parity tool / hand | "
        "fp32 speed-up tool / hand (ratio) | bf16 speed-up tool / hand (ratio) | SDPA memory tool/hand unpadded | padded |",
        "|---|---|---|---|---|---|---:|---:|",
    ]
    for r in records:
        auto, hand = set(r["flags"]["auto"]), set(r["flags"]["hand"])
        parity = f"{'ok' if r['parity']['auto']['verified'] else 'FAILED'} / {'ok' if r['parity']['hand']['passed'] else 'FAILED'}"
        cells = []
        for dtype in ("float32", "bfloat16"):
            s = r["speed"][dtype]
            cells.append(f"{s['auto_speedup']:.2f} / {s['hand_speedup']:.2f} (**{s['speedup_ratio']:.2f}**)")
        mem = []
        for case in ("unpadded", "padded"):
            m = r["memory"][case]
            mem.append(f"{m['auto'] / m['hand']:.2f}" if m["auto"] and m["hand"] else "-")
        releases = f"{r['model']} ({r['releases']['before']} → {r['releases']['after']})"
        only_hand = ", ".join(f"`{f}`" for f in sorted(hand - auto)) or "none"
        only_auto = ", ".join(f"`{f}`" for f in sorted(auto - hand)) or "none"
        lines.append(f"| {releases} | {only_hand} | {only_auto} | {parity} | {cells[0]} | {cells[1]} | {mem[0]} | {mem[1]} |")
    return "\n".join(lines)


@app.command()
def table(data: Annotated[Path, typer.Option(help="Where `run` wrote its JSON files.")] = Path("docs/bench-data/hand5")) -> None:
    """Print the side-by-side table of every model run."""
    records = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(data.glob("*.json"))]
    typer.echo(markdown(records))


if __name__ == "__main__":
    app()
