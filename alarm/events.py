"""WriteEvent: the one shape every source is reduced to before aggregation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Evidence:
    """What wrote, where to.  For alerts and the status API only, never a metric label.

    ``contributor`` is the heavy-hitter key (e.g. ``10.0.0.5:443/tcp`` or ``uid=1000``); the
    other fields are free-form and bounded by the producer.
    """

    contributor: str
    detail: str = ""


@dataclass(slots=True, frozen=True)
class WriteEvent:
    ts: float
    surface: str
    bytes: int
    events: int = 1
    evidence: Evidence | None = None
