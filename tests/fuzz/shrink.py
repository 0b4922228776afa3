"""Reduce a failing spec to a minimal one that fails the same way (greedy, one field at a time)."""

from __future__ import annotations

from judge import Verdict, judge
from spec import Spec, simpler


def shrink(spec: Spec, verdict: Verdict, budget: int = 200) -> tuple[Spec, Verdict]:
    """Keep taking the first simpler spec whose verdict is the same failure kind, until none is."""
    current, current_verdict = spec, verdict
    tries = 0
    progress = True
    while progress and tries < budget:
        progress = False
        for candidate in simpler(current):
            tries += 1
            candidate_verdict = judge(candidate)
            if candidate_verdict.kind == verdict.kind:
                current, current_verdict = candidate, candidate_verdict
                progress = True
                break
            if tries >= budget:
                break
    return current, current_verdict
