"""Regenerate the golden ports of the fixtures: `python scripts/regen_golden.py`, then review `git diff fixtures/golden`.

The golden test (tests/unit/test_golden.py) only compares; it never writes.
"""

from __future__ import annotations

from pathlib import Path

from sdpa_port import Status, port_source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def main() -> int:
    for style in ("class", "interface", "inline"):
        for path in sorted((FIXTURES / f"{style}_style").glob("modeling_*.py")):
            result = port_source(path.read_text(encoding="utf-8"), filename=path.name)
            if result.status is not Status.PORTED or result.style != style:
                print(f"{path.name}: {result.status.value} ({result.style}): {'; '.join(result.reasons) or result.detail}")
                return 1
            _write(path, result.source)
    return 0


def _write(path: Path, source: str) -> None:
    golden = FIXTURES / "golden" / path.name
    changed = not golden.exists() or golden.read_text(encoding="utf-8") != source
    golden.write_text(source, encoding="utf-8")
    print(f"{golden.relative_to(FIXTURES.parent)}: {'rewritten' if changed else 'unchanged'}")


if __name__ == "__main__":
    raise SystemExit(main())
