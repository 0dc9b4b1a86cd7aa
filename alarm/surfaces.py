"""SurfaceTable: per-surface counters, the open tick's accumulators, and heavy hitters.

Every surface is declared in the config (plus one ``unclassified`` per kind in use), so the
table's size — and every metric's series count — is bounded by the config, never by traffic.
Contributors (destinations, paths, packages) are workload-controlled: they live only in a
bounded heavy-hitter summary per surface and are never metric labels.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from alarm.config import UNCLASSIFIED, Config

SurfaceKey = tuple[str, str]  # (kind, name)
MAX_CONTRIBUTOR_CHARS = 200


class HeavyHitters:
    """Top-k contributors by bytes, in bounded memory.

    A batched Space-Saving variant: counts are merged into a dict that may grow to 2k keys,
    then pruned back to the k largest.  ``error`` is the largest count ever pruned, which bounds
    how far any reported count can be below its true value.
    """

    __slots__ = ("_counts", "_k", "error")

    def __init__(self, k: int):
        self._k = k
        self._counts: dict[str, int] = {}
        self.error = 0

    def add(self, contributor: str, amount: int) -> None:
        if len(contributor) > MAX_CONTRIBUTOR_CHARS:
            contributor = contributor[:MAX_CONTRIBUTOR_CHARS] + "…"
        counts = self._counts
        counts[contributor] = counts.get(contributor, 0) + amount
        if len(counts) > 2 * self._k:
            self._prune()

    def _prune(self) -> None:
        keep = heapq.nlargest(self._k, self._counts.items(), key=lambda kv: kv[1])
        kept = dict(keep)
        dropped = max((v for key, v in self._counts.items() if key not in kept), default=0)
        self.error = max(self.error, dropped)
        self._counts = kept

    def top(self, n: int) -> list[tuple[str, int]]:
        return heapq.nlargest(n, self._counts.items(), key=lambda kv: kv[1])

    def to_state(self) -> dict:
        return {"counts": self.top(self._k), "error": self.error}

    def load_state(self, state: dict) -> None:
        self._counts = {str(k): int(v) for k, v in state.get("counts", [])}
        self.error = int(state.get("error", 0))


@dataclass(slots=True)
class Surface:
    kind: str
    name: str
    bytes_total: int = 0
    events_total: int = 0
    tick_bytes: int = 0
    tick_events: int = 0
    hitters: HeavyHitters = field(default_factory=lambda: HeavyHitters(64))
    # Hitters of the current alert window: reset when the tick closes quiet, so an alert's
    # evidence names who wrote during the spike rather than who wrote most since start.
    recent: HeavyHitters = field(default_factory=lambda: HeavyHitters(64))

    def add(self, nbytes: int, events: int, contributor: str | None) -> None:
        self.bytes_total += nbytes
        self.events_total += events
        self.tick_bytes += nbytes
        self.tick_events += events
        if contributor is not None:
            self.hitters.add(contributor, nbytes)
            self.recent.add(contributor, nbytes)


@dataclass(slots=True, frozen=True)
class TickTotals:
    """What one surface wrote in one closed tick."""

    key: SurfaceKey
    bytes: int
    events: int


class SurfaceTable:
    def __init__(self, config: Config, kinds_in_use: Iterable[str] = ("egress",)):
        k = config.heavy_hitters
        self.surfaces: dict[SurfaceKey, Surface] = {}
        for s in config.surfaces:
            self.surfaces[(s.kind, s.name)] = Surface(
                s.kind, s.name, hitters=HeavyHitters(k), recent=HeavyHitters(k)
            )
        for kind in sorted({*kinds_in_use, *(s.kind for s in config.surfaces)}):
            self.surfaces[(kind, UNCLASSIFIED)] = Surface(
                kind, UNCLASSIFIED, hitters=HeavyHitters(k), recent=HeavyHitters(k)
            )
        self.unknown_surface_events = 0  # events naming a surface the config does not declare

    def get(self, kind: str, name: str) -> Surface | None:
        return self.surfaces.get((kind, name))

    def add(self, kind: str, name: str, nbytes: int, events: int, contributor: str | None) -> None:
        surface = self.surfaces.get((kind, name))
        if surface is None:
            # A replayed or external event naming an undeclared surface: count it where
            # unknown traffic belongs instead of growing the table.
            self.unknown_surface_events += events
            surface = self.surfaces.get((kind, UNCLASSIFIED))
            if surface is None:
                return
        surface.add(nbytes, events, contributor)

    def close_tick(self) -> list[TickTotals]:
        totals = []
        for key, s in self.surfaces.items():
            totals.append(TickTotals(key, s.tick_bytes, s.tick_events))
            s.tick_bytes = 0
            s.tick_events = 0
        return totals

    def to_state(self) -> dict:
        return {
            f"{kind}/{name}": {
                "bytes_total": s.bytes_total,
                "events_total": s.events_total,
                "hitters": s.hitters.to_state(),
            }
            for (kind, name), s in self.surfaces.items()
        } | {"_unknown_surface_events": self.unknown_surface_events}

    def load_state(self, state: dict) -> None:
        self.unknown_surface_events = int(state.get("_unknown_surface_events", 0))
        for key, s in self.surfaces.items():
            saved = state.get(f"{key[0]}/{key[1]}")
            if saved:
                s.bytes_total = int(saved["bytes_total"])
                s.events_total = int(saved["events_total"])
                s.hitters.load_state(saved.get("hitters", {}))
