"""Typed results of a port: what happened to a file and why."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sdpa_port.analyse.site import AttentionSite
from sdpa_port.refusals import Refusal


NO_ATTENTION = "no eager attention found"
SUPPORTS_SDPA = "already supports SDPA"


class Status(str, enum.Enum):
    PORTED = "ported"
    UNCHANGED = "unchanged"  # nothing to port, or already supports SDPA
    REFUSED = "refused"
    ERROR = "error"


class Style(str, enum.Enum):
    AUTO = "auto"
    CLASS = "class"
    INTERFACE = "interface"
    INLINE = "inline"


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
    refusals: tuple[Refusal, ...] = ()  # a refused result's reasons, with their codes
    # an interface-style port: why it may not claim flash attention, "" where the static proof holds
    # (`plan/flash_proof.py`); None for the other styles
    no_flash: str | None = None

    @property
    def changed(self) -> bool:
        return self.status is Status.PORTED

    @classmethod
    def refused(
        cls,
        source: str,
        style: Style | None,
        refusals: tuple[Refusal, ...] | list[Refusal],
        attention_classes: tuple[str, ...] = (),
        warnings: tuple[str, ...] = (),
    ) -> "PortResult":
        """A refusal: the source unchanged, one reason line per refusal (class, line, detail and code)."""
        refusals = tuple(refusals)
        return cls(
            Status.REFUSED,
            source,
            style,
            "refused",
            reasons=tuple(str(r) for r in refusals),
            warnings=warnings,
            attention_classes=attention_classes,
            refusals=refusals,
        )
