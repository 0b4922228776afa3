"""Run the differential fuzzer: `python tests/fuzz/run.py --seeds 0:300 [--family 440|523] [--jobs 2] [--shrink]`.

Needs torch and the family's transformers: 4.40.2 (tf440 environment) or 5.23.0 (tf523). Prints a count per verdict and, for each failure, the
spec and the verdict; with `--shrink`, a minimal failing spec and its file (written under `--out`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from judge import Tally, Verdict, judge  # noqa: E402
from render import render  # noqa: E402
from shrink import shrink  # noqa: E402
from spec import Spec, draw  # noqa: E402


def _init() -> None:
    import torch

    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")


def judge_seed(seed: int, family: str = "440") -> tuple[Spec, Verdict]:
    spec = draw(seed, family)
    return spec, judge(spec)


def seeds_from(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if ":" in part:
            start, stop = part.split(":")
            out.extend(range(int(start), int(stop)))
        else:
            out.append(int(part))
    return out


def run_seeds(
    seeds: list[int], jobs: int, progress: bool = True, family: str = "440", by: tuple[str, ...] = ()
) -> Tally:
    tally = Tally(by=by)
    started = time.monotonic()
    if jobs <= 1:
        _init()
        results = (judge_seed(seed, family) for seed in seeds)
        for index, (spec, verdict) in enumerate(results, 1):
            tally.add(spec, verdict)
            if progress:
                _progress(index, len(seeds), started, tally)
    else:
        with ProcessPoolExecutor(jobs, initializer=_init) as pool:
            futures = [pool.submit(judge_seed, seed, family) for seed in seeds]
            for index, future in enumerate(as_completed(futures), 1):
                spec, verdict = future.result()
                tally.add(spec, verdict)
                if progress:
                    _progress(index, len(seeds), started, tally)
    if progress:
        print(file=sys.stderr)
    return tally


def _progress(done: int, total: int, started: float, tally: Tally) -> None:
    rate = done / max(time.monotonic() - started, 1e-6)
    counts = " ".join(f"{k}={v}" for k, v in sorted(tally.counts.items()))
    print(f"\r{done}/{total} ({rate:.1f}/s) {counts}", end="", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="0:200", help="seeds as START:STOP or a comma list")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--family", choices=("440", "523", "inline"), default="440",
        help="440: class-style files run in transformers 4.40.2; 523: interface-style files run in 5.23.0; inline: "
        "4.40.2 files ported in place (--style inline) run in 4.40.2",
    )
    parser.add_argument("--shrink", action="store_true", help="reduce each failure to a minimal spec")
    parser.add_argument("--out", type=Path, default=None, help="write failing (shrunk) files here")
    parser.add_argument(
        "--by", choices=[f.name for f in fields(Spec) if f.name != "seed"], action="append", default=[],
        help="also count the verdicts per value of this spec field (an axis); repeat for more fields",
    )
    args = parser.parse_args(argv)
    tally = run_seeds(seeds_from(args.seeds), args.jobs, family=args.family, by=tuple(args.by))
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.counts.items())))
    print(f"comparisons: {tally.checks}; inputs not compared (the original rejects them or is NaN there): {tally.skipped}")
    for name, value in sorted({(name, value) for name, value, _ in tally.split}):
        counts = ", ".join(f"{kind} {n}" for (f, v, kind), n in sorted(tally.split.items()) if (f, v) == (name, value))
        print(f"  {name}={value}: {counts}")
    failed = 0
    for spec, verdict in sorted(tally.failures, key=lambda item: item[0].seed):
        if verdict.kind != "invalid":
            failed += 1
        print(f"\n[{verdict.kind}] {spec.describe()}\n    {verdict.detail[:400]}")
        if args.shrink and verdict.kind != "invalid":
            _init()
            small, small_verdict = shrink(spec, verdict)
            print(f"  shrunk: [{small_verdict.kind}] {small.describe()}\n    {small_verdict.detail[:400]}")
            spec = small
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"modeling_fuzz_{spec.seed}_{verdict.kind}.py").write_text(render(spec), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
