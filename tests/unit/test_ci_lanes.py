"""`.ci/run` splits nox's sessions into two lanes: together they must hold every session nox runs, each once."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lanes() -> list[list[str]]:
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    return [found.split() for found in re.findall(r'^LANE_\w+="([^"]*)"$', text, flags=re.MULTILINE)]


def _sessions() -> list[str]:
    text = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    found = re.search(r"^nox\.options\.sessions = \[([^\]]*)\]$", text, flags=re.MULTILINE)
    assert found, "noxfile.py sets nox.options.sessions on one line"
    return re.findall(r'"(\w+)"', found.group(1))


def test_the_ci_lanes_hold_every_session_once() -> None:
    lanes = _lanes()
    assert len(lanes) == 2, lanes
    sessions = [session for lane in lanes for session in lane]
    assert sorted(sessions) == sorted(_sessions()), (sessions, _sessions())
    assert len(set(sessions)) == len(sessions), sessions
