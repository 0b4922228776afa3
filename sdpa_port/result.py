"""Typed results of a port: what happened to a file and why."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sdpa_port.analyse.site import AttentionSite


class Status(str, enum.Enum):
    PORTED = "ported"
    UNCHANGED = "unchanged"  # nothing to port, or already supports SDPA
    REFUSED = "refused"
    ERROR = "error"


class Style(str, enum.Enum):
    AUTO = "auto"
    CLASS = "class"
    INTERFACE = "interface"


@dataclass(frozen=True)
class PortResult:
    status: Status
    source: str
    style: Style | None = None
    detail: str = ""  # one line: what happened
    reasons: tuple[str, ...] = ()  # refusal or error reasons, one per problem
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # the edits made, for the report
    attention_classes: tuple[str, ...] = ()
    sites: tuple[AttentionSite, ...] = field(default=(), compare=False)

    @property
    def changed(self) -> bool:
        return self.status is Status.PORTED


class PortError(Exception):
    """A port that cannot be completed for a reason worth reporting (becomes a refusal)."""
