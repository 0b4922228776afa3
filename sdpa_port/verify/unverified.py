"""A port the harness could not check, which is never a pass."""

from __future__ import annotations

from dataclasses import dataclass

from sdpa_port.verify.checks import Check

NOT_VERIFIED = "not verified"


@dataclass(frozen=True)
class Unverified(Check):
    """A port the harness could not check, which is never a pass.

    Printed as `not verified: <reason>`.
    """

    def __str__(self) -> str:
        return f"{NOT_VERIFIED}: {self.detail}"


def unverified(reason: str) -> Unverified:
    return Unverified(NOT_VERIFIED, False, None, reason)
