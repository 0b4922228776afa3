"""Census of a registry package that ships Transformers-style modeling code (`scripts/census.py --package`).

    python scripts/census.py --package modelscope==1.40.2 [--jobs 2] [--out docs/census.md] [--only models/nlp]

The package's wheel (or sdist) is fetched at run time, without its dependencies, into a cache
(`pip download --no-deps NAME==VERSION -d ~/.cache/sdpa-port/packages/NAME==VERSION`; `--cache` moves it); none of
its code is kept anywhere else. Every `.py` file of the archive that holds an attention's ingredients, a softmax call
and a product (`matmul`, `bmm`, `baddbmm`, `einsum`, `@`), is copied into a temporary tree under its path in the
archive (`--only` keeps the paths starting with one of the given prefixes), and the tool runs over those files:

    python -m sdpa_port <the selected files> --verify --check --json --jobs N

`--verify` is left out when this Python lacks torch or transformers (every port is then "not verifiable"). Each file
is classed as ported and verified, ported and failed, ported and not verifiable (with why), ported with a
verification error, already supporting SDPA, refused (with its refusal codes), no eager attention found, or error.

Verifying loads the original and the port inside the installed transformers. A file that imports its own package
(`from modelscope.models.base import ...`, `from .configuration import ...`) cannot be loaded there unless that package
and its dependencies are installed; nothing is checked then, not even the attention modules on their own
(`sdpa_port/verify/alone.py` builds the classes of the loaded modules), and the file is "not verifiable" with the
import that failed. Files that import only torch and transformers are loaded and checked as release files are.

With `--out`, the package's section (`<!-- census package NAME==VERSION -->`) of that markdown file is replaced or
added, leaving the other sections.
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import census

sys.path.insert(0, str(census.ROOT))
from sdpa_port.discover.eager_sites import PRODUCT_FUNCTIONS, SOFTMAX_NAMES  # noqa: E402
from sdpa_port.verify.stubs import imported_tops  # noqa: E402

CACHE = Path.home() / ".cache" / "sdpa-port" / "packages"
CLASSES = (
    "ported, verified",
    "ported, failed",
    "ported, not verifiable",
    "ported, verification error",
    "already supports SDPA",
    "refused",
    "no eager attention found",
    "error",
)
_IMPORT_FAILURE = re.compile(r"^could not run the checks: (ModuleNotFoundError|ImportError|NoPackage): (.*)$", re.S)


@dataclass(frozen=True)
class Row:
    path: str  # inside the archive
    kind: str  # one of CLASSES
    why: str = ""  # refusal codes, or the reason
    codes: tuple[str, ...] = field(default=())
    style: str = ""  # a port's style: class, interface or inline


# ------------------------------------------------------------------ fetching and screening


def fetch(spec: str, cache: Path, log) -> Path:  # type: ignore[no-untyped-def]
    """The package's wheel or sdist, downloaded once into `cache/spec` (`pip download --no-deps`)."""
    folder = cache / spec
    found = archives(folder)
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", spec, "-d", str(folder)]
        log(f"$ {' '.join(command)}")
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        found = archives(folder)
    if not found:
        raise SystemExit(f"census: pip download left no wheel or sdist of {spec} in {folder}")
    return found[0]


def archives(folder: Path) -> list[Path]:
    """The wheels, then the sdists, in `folder`."""
    if not folder.is_dir():
        return []
    wheels = sorted(folder.glob("*.whl"))
    sdists = sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".tgz", ".zip")))
    return wheels + sdists


def python_files(archive: Path) -> Iterator[tuple[str, bytes]]:
    """Each `.py` member of a wheel or sdist, with its path in the archive."""
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as bundle:
            for name in sorted(bundle.namelist()):
                if name.endswith(".py"):
                    yield name, bundle.read(name)
        return
    with tarfile.open(archive) as bundle:
        for member in sorted(bundle.getmembers(), key=lambda m: m.name):
            stream = bundle.extractfile(member) if member.isfile() and member.name.endswith(".py") else None
            if stream is not None:
                yield member.name, stream.read()


def has_attention(source: str) -> bool:
    """Whether a file holds an attention's ingredients: a softmax call and a product (a product call or `@`).

    A cheap screen, wider than the tool's own detector (`sdpa_port/discover/eager_sites.py`, which follows the
    scores from the product through the softmax into a second product): the tool says "no eager attention found" for
    a file the screen keeps wrongly. A file `ast` cannot parse is screened on its text.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        lowered = source.lower()
        return "softmax" in lowered and any(word in source for word in (*PRODUCT_FUNCTIONS, " @ "))
    softmax = product = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _called_name(node.func)
            softmax = softmax or name in SOFTMAX_NAMES
            product = product or name in PRODUCT_FUNCTIONS
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            product = True
        if softmax and product:
            return True
    return False


def _called_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Call):  # `nn.Softmax(dim=-1)(scores)`
        return _called_name(func.func)
    return ""


def select(archive: Path, tree: Path, only: list[str] | None) -> tuple[int, list[Path]]:
    """Copy the `.py` files of `archive` under `tree`, keeping their paths, as a user's checkout of the package has
    them (a file's config class beside it is read when it is verified): (files read, the screened-in files)."""
    total, chosen = 0, []
    for name, data in python_files(archive):
        if only and not any(name.startswith(prefix) for prefix in only):
            continue
        total += 1
        target = tree / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if has_attention(data.decode("utf-8", errors="replace")):
            chosen.append(target)
    return total, chosen


def can_verify() -> str:
    """Empty when this Python can run `--verify`, else why not."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    return f"--verify not run: this Python has no {' or '.join(missing)}" if missing else ""


# ------------------------------------------------------------------ classing


def classify(record: dict, tree: Path, unverifiable: str = "") -> Row:
    """One file's class, from its JSON record (`census.classify`, then what a package's files need in addition).

    The reasons name the files by their paths in the archive, not in the temporary tree."""
    row = _classify(record, tree, unverifiable)
    return replace(row, why=row.why.replace(f"{tree}/", ""))


def _classify(record: dict, tree: Path, unverifiable: str) -> Row:
    path = _inside(record["path"], tree)
    entry = census.classify(record)
    if entry.status == "refused":
        codes = tuple(census._codes(record))
        first = f" (first: {entry.reason})" if entry.reason else ""
        return Row(path, "refused", ", ".join(codes) + first, codes)
    if entry.status == "already supports SDPA":
        # the classes left eager beside those on SDPA, each with the code that refuses it
        staying = [_STAYING.match(w) for w in record.get("warnings", [])]
        return Row(path, "already supports SDPA", ", ".join(f"{m[1]} stays eager ({m[2]})" for m in staying if m))
    if entry.status == "nothing to port":
        detail = record.get("detail") or ""
        return Row(path, "no eager attention found", "" if detail == "no eager attention found" else detail)
    if entry.status == "error":
        return Row(path, "error", entry.reason)
    style = record.get("style") or ""
    if unverifiable:
        return Row(path, "ported, not verifiable", unverifiable, style=style)
    failure = _IMPORT_FAILURE.match(entry.reason) if entry.verification == "error" else None
    if failure:
        return Row(path, "ported, not verifiable", f"not loadable here: {failure.group(1)}: {failure.group(2)}", style=style)
    kind = {"verified": "ported, verified", "failed": "ported, failed", "not verifiable": "ported, not verifiable"}
    style = record.get("style") or ""
    return Row(path, kind.get(entry.verification, "ported, verification error"), entry.reason, style=style)


_STAYING = re.compile(r"^(\w+) stays eager: .*\[(\w\d+)\]$")


def _inside(path: str, tree: Path) -> str:
    try:
        return Path(path).relative_to(tree).as_posix()
    except ValueError:
        return path


# ------------------------------------------------------------------ the section


def markdown(spec: str, rows: list[Row], facts: dict[str, str], seconds: float) -> str:
    """The package's section: the counts per class, the refusal codes, and one row per screened file."""
    kinds = collections.Counter(row.kind for row in rows)
    per_code = collections.Counter(code for row in rows for code in row.codes)
    marker = f"package {spec}"
    out = [
        f"<!-- census {marker} -->",
        f"## package {spec}",
        "",
        f"{facts['read']} `.py` files read, {len(rows)} screened in (a softmax call and a product), "
        f"{datetime.date.today().isoformat()}, {_duration(seconds)}, transformers {facts['transformers']}, "
        f"torch {facts['torch']}: "
        f"`{facts['command']}`",
        "",
    ]
    if facts.get("note"):
        out += [facts["note"], ""]
    out += ["| class | files |", "|---|---:|", *[f"| {kind} | {kinds.get(kind, 0)} |" for kind in CLASSES], ""]
    styles = collections.Counter(row.style for row in rows if row.kind.startswith("ported") and row.style)
    if styles:
        said = ", ".join(f"{style} {count}" for style, count in sorted(styles.items()))
        out += [f"Ported files by style ([inline](inline-style.md): rewritten in place): {said}.", ""]
    if per_code:
        out += ["Refused files per refusal code (a file may have several; see [refusals.md](refusals.md)):", ""]
        out += ["| code | files |", "|---|---:|"]
        out += [f"| {code} | {count} |" for code, count in sorted(per_code.items(), key=lambda item: (-item[1], item[0]))]
        out.append("")
    out += ["| file | class | codes or reason |", "|---|---|---|"]
    out += [f"| `{row.path}` | {row.kind} | {census._cell(row.why, 300)} |" for row in sorted(rows, key=lambda r: r.path)]
    out += ["", f"<!-- /census {marker} -->"]
    return "\n".join(out) + "\n"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def third_party(chosen: list[Path], own: set[str]) -> tuple[list[str], list[str]]:
    """The top-level packages the files import that are neither the standard library, torch, transformers nor the
    package's own: (installed here, not installed). The census's figures depend on the first list (einops decides
    whether a diffusion model's attention runs or stands in)."""
    names: set[str] = set()
    for path in chosen:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError, ValueError):
            continue
        names.update(imported_tops(tree)[0])
    names -= own | set(sys.stdlib_module_names) | {"torch", "transformers", "__future__"}
    names = {name for name in names if name.isidentifier()}
    present = sorted(name for name in names if importlib.util.find_spec(name) is not None)
    return present, sorted(names - set(present))


def loading_note(chosen: list[Path], tree: Path) -> str:
    """What `--verify` could load: the package's top-level modules, importable in this Python or not."""
    tops = sorted({p.relative_to(tree).parts[0].removesuffix(".py") for p in chosen} - {"tests", "test", "examples"})
    importable = [name for name in tops if name.isidentifier() and importlib.util.find_spec(name) is not None]
    missing = [name for name in tops if name not in importable]
    said = ", ".join(f"`{name}`" for name in missing) or "none"
    present, absent = third_party(chosen, set(tops))
    others = (
        f"Other packages the screened-in files import: installed here {', '.join(f'`{n}`' for n in present) or 'none'}; "
        f"not installed {', '.join(f'`{n}`' for n in absent) or 'none'}. "
    )
    return others + (
        f"`--verify` loads each file inside the installed transformers. The package's top-level modules not importable "
        f"in this Python: {said}. A file that imports them (or its own siblings, relatively) is loaded with stand-ins "
        "for those imports (`verify/stubs.py`: registries decorate while it loads, and the sibling files its relative "
        "imports name run, so a config class beside it is real), and only its attention classes are checked, each on its own "
        "(`verify/alone.py`, `verify/inline.py`): a class that uses a stand-in when it runs is \"not verifiable\". "
        "Files importing only torch, transformers and installed packages were loaded and checked like release files."
    )


def census_package(arguments: argparse.Namespace) -> int:
    """`scripts/census.py --package NAME==VERSION`: fetch, screen, port and verify, write the section."""
    spec = arguments.package
    if "==" not in spec:
        print("census: --package takes NAME==VERSION, e.g. modelscope==1.40.2", file=sys.stderr)
        return 2

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    archive = fetch(spec, arguments.cache or CACHE, log)
    only = arguments.only.split(",") if arguments.only else None
    unverifiable = can_verify()
    with tempfile.TemporaryDirectory(prefix="census-package-") as directory:
        tree = Path(directory) / "package"
        read, chosen = select(archive, tree, only)
        log(f"{archive.name}: {read} .py files read, {len(chosen)} screened in, copied to {tree}")
        records = census.run_tool(chosen, max(arguments.jobs, 2), arguments.memory_gb, log, verify=not unverifiable) if chosen else []
        rows = [classify(record, tree, unverifiable) for record in records]
        note = unverifiable or loading_note(chosen, tree)  # reads the files: while they are there
    transformers = "not installed" if importlib.util.find_spec("transformers") is None else census.installed_transformers()[0]
    command = f"python scripts/census.py --package {spec} --jobs {arguments.jobs}"
    command += f" --only {arguments.only}" if arguments.only else ""
    torch = "not installed" if importlib.util.find_spec("torch") is None else importlib.metadata.version("torch")
    facts = {"read": str(read), "transformers": transformers, "torch": torch, "command": command}
    facts["note"] = note
    section = markdown(spec, rows, facts, time.monotonic() - started)
    if arguments.out:
        census.write_section(arguments.out, f"package {spec}", section)
        log(f"wrote the {spec} section of {arguments.out}")
    else:
        print(section)
    if arguments.json:
        arguments.json.write_text("".join(json.dumps(asdict(row)) + "\n" for row in rows), encoding="utf-8")
    counts = collections.Counter(row.kind for row in rows)
    log(f"{len(rows)} files: " + ", ".join(f"{kind} {counts.get(kind, 0)}" for kind in CLASSES))
    return 0
