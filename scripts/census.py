"""Census of a transformers release: port every PyTorch modeling file with `--verify` and tabulate the outcomes.

    python scripts/census.py --release 4.40.2 [--jobs 2] [--out docs/census.md] [--only bert,vit]
    python scripts/census.py --package modelscope==1.40.2 [--jobs 2] [--out docs/census.md] [--only PREFIX,...]

`--package` censuses a registry package that ships Transformers-style modeling code instead: its wheel is fetched
with `pip download --no-deps`, the files holding a softmax and a product are ported and verified, and the package
gets a section of its own (scripts/census_package.py says how).

Run it with the Python of an environment that has that transformers release and torch installed. The modeling
files (`transformers/models/**/modeling_*.py`, without `modeling_tf_` and `modeling_flax_`) are copied into a
temporary tree, never touched where they are installed, and the tool's own batch mode runs over the copy:

    python -m sdpa_port <copy>/models --verify --check --json --jobs N

`--check` writes nothing; `--verify` loads each port beside its original inside the installed package and runs
the parity checks before deciding. The JSON records carry the verification lines, from which every ported file is
classed as verified, failed (a parity check failed, or the port raised), not verifiable (the harness could not
drive the model: the line says why, e.g. a missing package) or error (the checks could not run, or the worker
process died: a crash isolated by the batch pool, reported for that file while the batch goes on).

Each process gets a data-size limit (`--memory-gb`), so a model too large for the machine fails alone with a
memory error (reported as an error for that file) instead of inviting the kernel's OOM killer; nothing is
downloaded (HF_HUB_OFFLINE=1).

With `--out`, the release's section of that markdown file is replaced (or added), leaving other releases' sections.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_VERIFIED = "not verified: "
COULD_NOT_RUN = "could not run the checks"
WORKER_DIED = "the worker process died"


@dataclass(frozen=True)
class Entry:
    path: str  # relative to models/
    status: str  # ported, already supports SDPA, nothing to port, refused, error
    verification: str = ""  # verified, failed, not verifiable, error (ported files only)
    reason: str = ""
    record: dict | None = None


# ------------------------------------------------------------------ running


def installed_transformers() -> tuple[str, Path]:
    import transformers

    return transformers.__version__, Path(transformers.__file__).parent


def copy_tree(package: Path, destination: Path, only: set[str] | None) -> int:
    """Copy the PyTorch modeling files of `package/models` under `destination/models`, keeping folders."""
    count = 0
    for source in sorted((package / "models").rglob("modeling_*.py")):
        if source.name.startswith(("modeling_tf_", "modeling_flax_")):
            continue
        relative = source.relative_to(package)
        if only and relative.parent.name not in only:
            continue
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        count += 1
    return count


def _limit_memory(gigabytes: float) -> None:
    # the data limit (heap and private anonymous mappings, where tensors live), not the address space: torch's
    # libraries and thread stacks reserve address space a long-lived worker never uses
    limit = int(gigabytes * 1024**3)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def run_tool(targets: list[Path], jobs: int, memory_gb: float, log, verify: bool = True) -> list[dict]:  # type: ignore[no-untyped-def]
    """The tool's batch mode over the copied files or folders; one JSON record per file, in input order."""
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
    }
    flags = ["--verify"] if verify else []
    command = [sys.executable, "-m", "sdpa_port", *map(str, targets), *flags, "--check", "--json", "--jobs", str(jobs)]
    shown = command if len(targets) <= 3 else [*command[:3], f"<{len(targets)} files>", *command[3 + len(targets) :]]
    log(f"$ {' '.join(shown)}")
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=environment,
        preexec_fn=(lambda: _limit_memory(memory_gb)) if memory_gb > 0 else None,
    )
    records = []
    assert process.stdout is not None
    for line in process.stdout:
        line = line.strip()
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        records.append(record)
        log(f"  {len(records):4d} {_relative(record['path'])}: {record['status']}{_verdict_suffix(record)}")
    process.wait()
    log(f"exit status {process.returncode}")
    return records


def _verdict_suffix(record: dict) -> str:
    if record.get("verified") is None:
        return ""
    return " (verified)" if record["verified"] else " (not verified)"


def _relative(path: str) -> str:
    return path.split("/models/", 1)[-1]


# ------------------------------------------------------------------ classing


def classify(record: dict) -> Entry:
    path = _relative(record["path"])
    status = record["status"]
    if status == "unchanged":
        kind = "already supports SDPA" if "already supports SDPA" in record.get("detail", "") else "nothing to port"
        return Entry(path, kind, record=record)
    if status == "refused":
        return Entry(path, "refused", reason=_first(record.get("reasons")), record=record)
    if status == "error":
        reason = _first(record.get("reasons"))
        if WORKER_DIED in reason and _ports(record["path"]):
            return Entry(path, "ported", "error", "the worker process died while verifying (memory or a crash)", record)
        return Entry(path, "error", reason=reason, record=record)
    lines = list(record.get("verification") or [])
    if record.get("verified"):
        return Entry(path, "ported", "verified", _driven(lines), record)
    if lines and lines[0].startswith(COULD_NOT_RUN):
        return Entry(path, "ported", "error", lines[0], record)
    if not lines:
        return Entry(path, "ported", "error", "no verification lines in the record", record)
    unverified = [line[len(NOT_VERIFIED):] for line in lines if line.startswith(NOT_VERIFIED)]
    failed = [line for line in lines if ": FAILED" in line]
    if failed:  # a failing check outweighs what could not be checked
        return Entry(path, "ported", "failed", "; ".join(failed[:2] + [f"not verified: {u}" for u in unverified[:1]]), record)
    if unverified:
        return Entry(path, "ported", "not verifiable", unverified[0], record)
    return Entry(path, "ported", "failed", lines[0], record)


def _ports(path: str) -> bool:
    """Whether the tool ports the file (without verifying): for files whose verifying worker died."""
    from sdpa_port import Status, port_source

    try:
        return port_source(Path(path).read_text(encoding="utf-8"), filename=path).status is Status.PORTED
    except Exception:
        return False


def _first(reasons: list[str] | None) -> str:
    return (reasons or [""])[0]


ALONE = "attention modules checked on their own: ok "


def _alone(lines: list[str]) -> str:
    """The attention classes verified as modules (verify/alone.py, verify/inline.py), and why no model covered them."""
    classes = [line.partition(" alone: ok")[0].strip() for line in lines if " alone: ok" in line]
    classes += [line.partition(" in place: ok")[0].strip() for line in lines if " in place: ok" in line]
    why = next((line[len(ALONE) :] for line in lines if line.startswith(ALONE)), "")
    if not classes:
        return ""
    return f"{', '.join(classes)} checked alone as module(s)" + (f": {why[:200]}" if why else "")


def _driven(lines: list[str]) -> str:
    everything = [line.partition(" driven: ok")[0].strip() for line in lines if " driven: ok" in line]
    driven = next((line for line in lines if " driven: ok" in line), "")
    alone = _alone(lines)
    if driven:
        label, _, detail = driven.partition(" driven: ok")
        inputs = re.search(r"inputs: ([^;]*)", detail)
        level = re.search(r"config: ([^;]*)", detail)
        text = f"{label.strip()} on {inputs.group(1) if inputs else 'synthesised inputs'}"
        text += f" ({level.group(1)} config)" if level else ""
        # how the check reached SDPA, and what it could not cover, belong beside the verdict
        notes = [part.strip() for part in detail.split(";")[3:]]
        notes += [f"also {label}" for label in everything[1:]]  # classes driven for attention the first did not call
        return "; ".join([text] + notes + ([alone] if alone else []))
    if alone:
        return alone
    base = lines[0].split("[", 1)[0] if lines else ""
    return f"{base} on token ids" if base else ""


# ------------------------------------------------------------------ the table

STATUSES = ("ported", "already supports SDPA", "nothing to port", "refused", "error")
VERDICTS = ("verified", "failed", "not verifiable", "error")


def markdown(release: str, entries: list[Entry], command: str, seconds: float) -> str:
    statuses = collections.Counter(e.status for e in entries)
    verdicts = collections.Counter(e.verification for e in entries if e.status == "ported")
    ported = [e for e in entries if e.status == "ported"]
    out = [
        f"<!-- census {release} -->",
        f"## transformers {release}",
        "",
        f"{len(entries)} PyTorch modeling files, {datetime.date.today().isoformat()}, {seconds / 60:.0f} min: `{command}`",
        "",
        "| status | files |",
        "|---|---:|",
        *[f"| {status} | {statuses.get(status, 0)} |" for status in STATUSES],
        "",
        f"Of the {len(ported)} ported files:",
        "",
        "| verification | files |",
        "|---|---:|",
        *[f"| {verdict} | {verdicts.get(verdict, 0)} |" for verdict in VERDICTS],
        "",
    ]
    for verdict in ("failed", "not verifiable", "error"):
        chosen = [e for e in ported if e.verification == verdict]
        if not chosen:
            continue
        out += [f"### {verdict} ({len(chosen)})", "", "| file | why |", "|---|---|"]
        out += [f"| `{e.path}` | {_cell(e.reason)} |" for e in chosen]
        out.append("")
    chosen = [e for e in ported if e.verification == "verified"]
    out += [f"### verified ({len(chosen)})", "", "| file | driven as |", "|---|---|"]
    out += [f"| `{e.path}` | {_cell(e.reason)} |" for e in chosen]
    out.append("")
    out += _claims(chosen)
    refused = [e for e in entries if e.status == "refused"]
    if refused:
        codes = {e.path: _codes(e.record) for e in refused}
        per_code = collections.Counter(code for found in codes.values() for code in found)
        out += [f"### refused ({len(refused)})", "", "Files per refusal code (a file may have several; see "]
        out[-1] += "[refusals.md](refusals.md)):"
        out += ["", "| code | files |", "|---|---:|"]
        out += [f"| {code} | {count} |" for code, count in sorted(per_code.items())]
        out += ["", "| file | codes | first reason |", "|---|---|---|"]
        out += [f"| `{e.path}` | {', '.join(codes[e.path])} | {_cell(e.reason, 240)} |" for e in refused]
        out.append("")
    errors = [e for e in entries if e.status == "error"]
    if errors:
        out += [f"### errors while porting ({len(errors)})", "", "| file | why |", "|---|---|"]
        out += [f"| `{e.path}` | {_cell(e.reason)} |" for e in errors]
        out.append("")
    out.append(f"<!-- /census {release} -->")
    return "\n".join(out) + "\n"


CLAIMS = ("_supports_flex_attn", "_supports_flash_attn", "_can_compile_fullgraph")


def _claim(record: dict | None, flag: str) -> str:
    """What a verified port's record says of one claim flag: set, not set (and why), or nothing."""
    record = record or {}
    if any(f".{flag} = True (" in note for note in record.get("notes", [])):
        return "set"
    # the runner's warnings (`sdpa_port/edge/runner.py`): one flag's, or all of them at once when none was run
    for prefix in (f"{flag} not claimed: ", "flex, flash and compile not claimed: "):
        why = next((w for w in record.get("warnings", []) if w.startswith(prefix)), None)
        if why is not None:
            return "not set: " + why[len(prefix) :]
    return ""


def _claims(verified: list[Entry]) -> list[str]:
    """The flags the verified interface-style ports set after their checks, counted, and why each other one is not."""
    interface = [e for e in verified if (e.record or {}).get("style") == "interface"]
    if not interface:
        return []
    out = [
        f"#### flags set after their checks ({len(interface)} interface-style ports)",
        "",
        "| flag | set | not set | set by the file itself |",
        "|---|---:|---:|---:|",
    ]
    for flag in CLAIMS:
        found = [_claim(e.record, flag) for e in interface]
        set_, unset = found.count("set"), sum(1 for f in found if f.startswith("not set"))
        out.append(f"| `{flag}` | {set_} | {unset} | {len(found) - set_ - unset} |")
    out += ["", "| file | flag | why not set |", "|---|---|---|"]
    for entry in interface:
        for flag in CLAIMS:
            found = _claim(entry.record, flag)
            if found.startswith("not set"):
                out.append(f"| `{entry.path}` | `{flag}` | {_cell(found[len('not set: '):], 240)} |")
    return out + [""]


def _codes(record: dict | None) -> list[str]:
    """The refusal codes of a file's record, in order, each once."""
    found = [r.get("code", "") for r in (record or {}).get("refusals") or []]
    return list(dict.fromkeys(code for code in found if code)) or ["-"]


def _cell(text: str, limit: int = 400) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


HEADER = """# Census: `--verify` over every PyTorch modeling file

Written by `scripts/census.py` (one section per release; rerun it to refresh a section). For each file the tool
ports, `--verify` loads the original and the port inside the installed transformers and compares, on a tiny
random-init config with sharpened weights and inputs synthesised from the model's forward signature and config:
the port's eager outputs against the original's (1e-6), the port's SDPA outputs against the original's eager
outputs (1e-4, or 1e-5 of the output magnitude for large outputs), and that SDPA really ran. "not verifiable" means
the harness could not drive the model (the reason is given) and is never counted as a pass.

Sections named `package NAME==VERSION` (`scripts/census.py --package`) census registry packages that ship
Transformers-style modeling code: their files with a softmax and a product, ported and verified the same way
inside the installed transformers, where the package itself is not installed.

"""


def write_section(path: Path, release: str, section: str) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER
    pattern = re.compile(rf"<!-- census {re.escape(release)} -->.*?<!-- /census {re.escape(release)} -->\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="\n\n".join(__doc__.split("\n\n")[:3]), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--release", help="the transformers release installed here, e.g. 4.40.2")
    parser.add_argument(
        "--package",
        help=(
            "NAME==VERSION: census a registry package instead: fetch its wheel (pip download --no-deps), port and "
            "verify its .py files holding a softmax and a product, write a `package NAME==VERSION` section"
        ),
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="markdown file whose section for this release is (re)written")
    parser.add_argument("--json", type=Path, help="also write the classified records here (JSON lines)")
    parser.add_argument("--only", help="comma-separated model folders, or with --package path prefixes in the archive")
    parser.add_argument("--cache", type=Path, help="with --package: where archives are downloaded (~/.cache/sdpa-port/packages)")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="data-size limit per process (0: none)")
    arguments = parser.parse_args(argv)
    if arguments.package:
        from census_package import census_package

        return census_package(arguments)
    if not arguments.release:
        parser.error("give --release VERSION or --package NAME==VERSION")

    version, package = installed_transformers()
    if version != arguments.release:
        print(f"census: this Python has transformers {version}, not {arguments.release}", file=sys.stderr)
        return 2
    only = set(arguments.only.split(",")) if arguments.only else None

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"census-{version}-") as directory:
        tree = Path(directory) / "transformers"
        count = copy_tree(package, tree, only)
        log(f"copied {count} modeling files of transformers {version} to {tree}")
        # the workers run with --jobs >= 2 so that one killed by the kernel is isolated by the batch pool
        records = run_tool([tree / "models"], max(arguments.jobs, 2), arguments.memory_gb, log)
        entries = [classify(record) for record in records]
    seconds = time.monotonic() - started
    command = f"python scripts/census.py --release {arguments.release} --jobs {arguments.jobs}"
    section = markdown(version, entries, command, seconds)
    if arguments.out:
        write_section(arguments.out, version, section)
        log(f"wrote the {version} section of {arguments.out}")
    else:
        print(section)
    if arguments.json:
        with open(arguments.json, "w", encoding="utf-8") as stream:
            for entry in entries:
                stream.write(json.dumps({"path": entry.path, "status": entry.status, "verification": entry.verification, "reason": entry.reason}) + "\n")
    counts = collections.Counter(e.verification for e in entries if e.status == "ported")
    log(f"{len(entries)} files; ported {sum(counts.values())}: " + ", ".join(f"{v} {counts.get(v, 0)}" for v in VERDICTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
