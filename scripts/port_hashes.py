"""Hash the port of every modeling file of transformers releases, to show a change leaves ports as they were.

    python scripts/port_hashes.py --release 4.40.2 --release 5.23.0 --out /tmp/before.json
    python scripts/port_hashes.py --release 4.40.2 --release 5.23.0 --compare /tmp/before.json

Each release's wheel is downloaded (`pip download --no-deps`) into `--wheels` and read without installing it; every
`modeling_*.py` and `modular_*.py` of it is ported with `port_source` (the pure API, no file written, no torch) and
its status, reasons and ported source are hashed, ported for the release it belongs to (read from the
wheel's own sources). `--compare` prints each file whose hash differs and exits 1 if any
does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from sdpa_port import port_source
from sdpa_port.discover.release import target_release
from sdpa_port.edge.wheels import extract_tree, wheel_path

CACHE = Path(__file__).resolve().parents[1] / ".cache"


def _port(path: str) -> tuple[str, dict[str, str]]:
    source = Path(path).read_text(encoding="utf-8")
    result = port_source(source, filename=Path(path).name, release=target_release(Path(path)))
    digest = hashlib.sha256(result.source.encode()).hexdigest()[:16]
    reasons = hashlib.sha256("\n".join((*result.reasons, *result.warnings)).encode()).hexdigest()[:16]
    return path, {"status": result.status.value, "source": digest, "reasons": reasons}


def hashes(release: str, wheels: Path, jobs: int) -> dict[str, dict[str, str]]:
    wheel = wheel_path(wheels, release)
    if not wheel.is_file():
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), f"transformers=={release}"]
        subprocess.run(command, check=True)
    root = extract_tree(wheel, CACHE / "trees", modular=True)
    files = sorted(str(path) for path in (root / "transformers" / "models").rglob("*.py") if path.name.startswith(("modeling_", "modular_")))
    with ProcessPoolExecutor(jobs) as pool:
        results = dict(pool.map(_port, files, chunksize=4))
    return {f"{release}/{Path(path).relative_to(root)}": value for path, value in results.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", action="append", required=True, help="a transformers version (repeatable)")
    parser.add_argument("--wheels", type=Path, default=CACHE / "wheels")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the hashes here (JSON)")
    parser.add_argument("--compare", type=Path, help="compare with hashes written before")
    args = parser.parse_args(argv)
    found: dict[str, dict[str, str]] = {}
    for release in args.release:
        found.update(hashes(release, args.wheels, args.jobs))
    if args.out is not None:
        args.out.write_text(json.dumps(found, indent=1, sort_keys=True), encoding="utf-8")
    counts: dict[str, int] = {}
    for value in found.values():
        counts[value["status"]] = counts.get(value["status"], 0) + 1
    print(f"{len(found)} files: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text(encoding="utf-8"))
    differ = sorted(key for key in found.keys() | before.keys() if found.get(key) != before.get(key))
    for key in differ:
        print(f"{key}: {before.get(key)} -> {found.get(key)}")
    print(f"{len(differ)} of {len(found)} differ", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
