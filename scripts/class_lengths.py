"""Count the lines of the generated SDPA classes, beside the hand ports of a later release if a wheel is given.

    python scripts/class_lengths.py --site .nox/tf440/lib/python3.11/site-packages/transformers \\
        --hand transformers-4.47.1-py3-none-any.whl gpt2 bert opt mbart distilbert

Each `modeling_<model>.py` of `--site` is copied to a temporary folder and ported there with the CLI
(`python -m sdpa_port FILE --no-verify --no-tests`, run by this Python); the lines of each class whose name holds
`Sdpa` are counted with `ast` (its last line less its first, plus one). With `--hand`, the same file of the wheel
is read without installing it and its `Sdpa` classes counted alike.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODELS = ("gpt2", "bert", "opt", "mbart", "distilbert")


def class_lengths(source: str) -> dict[str, int]:
    """The number of lines of each class of `source` whose name holds `Sdpa`."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and "Sdpa" in node.name and node.end_lineno is not None:
            found[node.name] = node.end_lineno - node.lineno + 1
    return found


def ported(site: Path, model: str, folder: Path) -> str:
    path = folder / f"modeling_{model}.py"
    shutil.copy(site / "models" / model / path.name, path)
    command = [sys.executable, "-m", "sdpa_port", str(path), "--no-verify", "--no-tests"]
    subprocess.run(command, check=True, capture_output=True)
    return path.read_text(encoding="utf-8")


def hand(wheel: Path, model: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(f"transformers/models/{model}/modeling_{model}.py").decode()


def _listed(lengths: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in lengths.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--site", type=Path, required=True, help="the installed transformers package folder")
    parser.add_argument("--hand", type=Path, help="a transformers wheel whose hand ports to count beside")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models:
            line = f"{model}: {_listed(class_lengths(ported(args.site, model, Path(folder))))}"
            if args.hand is not None:
                line += f" | hand: {_listed(class_lengths(hand(args.hand, model)))}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
