"""The one small interface every source implements.

A collector reads its source and hands batches to ``emit``.  ``emit`` is called on the event
loop thread; it returns once the batch has been counted, so the position attached to a batch
is exactly the position of what has been counted.  The service saves positions and counters in
one SQLite transaction, which is what makes restarts resume without double counting.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from alarm.records import KernelRecord


@dataclass(slots=True)
class SourceStats:
    """Per-source counters exported as ``capalarm_source_*``.  Mutated by the collector (read,
    lost, truncations) and by the pipeline (parse errors, forged)."""

    up: bool = False
    # 1 when the source can prove a record came from the kernel (kmsg facility, journald
    # _TRANSPORT); 0 for files, which cannot.
    provenance_verified: bool = False
    records_read: int = 0
    parse_errors: int = 0
    records_lost: int = 0
    forged_records: int = 0
    truncations: int = 0
    rotations: int = 0
    last_record_ts: float = 0.0
    last_error: str = ""
    extra: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Batch:
    records: list[KernelRecord]
    # JSON-serialisable position *after* this batch; None when the source has no position.
    position: dict[str, Any] | None = None


Emit = Callable[[Batch], Awaitable[None]]


class Collector(Protocol):
    name: str
    kind: str  # surface kind this source feeds: "egress", "fs", "registry"
    stats: SourceStats

    async def run(self, emit: Emit) -> None:
        """Read until cancelled.  Never raises for bad input: count it in ``stats``."""
        ...
