"""Pipeline: kernel records and write events in, closed ticks and alert changes out.

All of its state is owned by one thread (the service runs every call on a single-worker
executor; backtest calls it directly), so it needs no locks and the event loop never does
its CPU work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alarm.classify import EgressClassifier, contributor_name
from alarm.collectors.base import SourceStats
from alarm.config import Config
from alarm.detector.alerts import AlertChange
from alarm.detector.engine import Detector
from alarm.events import WriteEvent
from alarm.fastscan import native_available, scan_flows
from alarm.netfilter import MAX_LINE, FenceParseError, parse_fence
from alarm.records import KernelRecord
from alarm.surfaces import SurfaceKey, SurfaceTable

# Source counters that survive a restart (the rest — up, last error — describe this process).
# Batches at least this large go through the native scanner (below it, its fixed cost of a
# few numpy arrays is more than the per-record parser's).
NATIVE_BATCH = 32
_RESTORED_COUNTERS = (
    "records_read",
    "parse_errors",
    "records_lost",
    "forged_records",
    "truncations",
    "rotations",
)


@dataclass(slots=True)
class TickResult:
    end: float
    changes: list[AlertChange] = field(default_factory=list)


class Pipeline:
    def __init__(self, config: Config, kinds_in_use: Iterable[str] = ("egress",)):
        self.config = config
        self.table = SurfaceTable(config, kinds_in_use)
        self.detector = Detector(config, list(self.table.surfaces))
        self.classifier = EgressClassifier(config.surfaces, config.classify_cache)
        self.sources: dict[str, SourceStats] = {}
        self.positions: dict[str, Any] = {}
        self.ticks = 0
        self.last_tick_end = 0.0
        self.last_tick_seconds = 0.0  # CPU time of the last evaluation

    def source(self, name: str) -> SourceStats:
        stats = self.sources.get(name)
        if stats is None:
            stats = SourceStats()
            self.attach_source(name, stats)
        return stats

    def attach_source(self, name: str, stats: SourceStats) -> None:
        """Use ``stats`` (a collector's own object) for source ``name``, keeping any counts
        restored from saved state."""
        restored = self.sources.get(name)
        if restored is not None and restored is not stats:
            for counter in _RESTORED_COUNTERS:
                setattr(stats, counter, getattr(restored, counter))
        self.sources[name] = stats
        self.detector.attach_source(name, stats)

    def ingest_kernel(
        self,
        source: str,
        records: list[KernelRecord],
        prefixes: tuple[str, ...],
        require_trusted: bool,
    ) -> None:
        """Parse, classify and count fence records.  ``require_trusted``: the source can prove
        kernel origin, so records it cannot vouch for are forged, not traffic."""
        if len(records) >= NATIVE_BATCH and native_available():
            records = self._ingest_native(source, records, prefixes, require_trusted)
        stats = self.source(source)
        table = self.table
        classify = self.classifier.classify
        for rec in records:
            try:
                fence = parse_fence(rec.message, prefixes)
            except FenceParseError:
                stats.parse_errors += 1
                continue
            if fence is None:
                continue
            if require_trusted and not rec.trusted:
                stats.forged_records += 1
                continue
            key = (fence.dst, fence.proto, fence.dpt, fence.out_if, fence.uid, fence.log_prefix)
            surface = classify(key)
            contributor = contributor_name(fence.dst, fence.dpt, fence.proto)
            table.add("egress", surface, fence.length, 1, contributor)

    def _ingest_native(
        self,
        source: str,
        records: list[KernelRecord],
        prefixes: tuple[str, ...],
        require_trusted: bool,
    ) -> list[KernelRecord]:
        """The fence records of a large batch through the native scanner, summed per flow;
        returns the records it cannot take (a message spanning lines), for the per-record
        path.  Each message becomes a kmsg line whose facility carries its trust (0: the
        kernel's; 1: not provably), so the scanner counts forged records as the per-record
        path does; fastscan's regex agrees with ``parse_fence`` on every message (tests)."""
        lines: list[str] = []
        rest: list[KernelRecord] = []
        stats = self.source(source)
        for rec in records:
            msg = rec.message
            if not msg.startswith(prefixes):
                continue  # not a fence record (the per-record path would skip it too)
            if len(msg) > MAX_LINE:
                stats.parse_errors += 1
            elif "\n" in msg:
                rest.append(rec)
            else:
                lines.append(
                    ("0,0,0,-;" if rec.trusted or not require_trusted else "8,0,0,-;") + msg
                )
        if not lines:
            return rest
        lines.append("")
        scan = scan_flows("\n".join(lines).encode(), "kmsg", prefixes, 1.0, 1970)
        stats.parse_errors += scan.parse_errors
        stats.forged_records += scan.forged
        if not len(scan.ids):
            return rest
        names, surface_of = self.classifier.classify_columns(scan)
        n = len(scan.id_dst)
        nbytes = np.bincount(scan.ids, weights=scan.nbytes, minlength=n).astype(np.int64)
        packets = np.bincount(scan.ids, weights=scan.packets, minlength=n).astype(np.int64)
        add = self.table.add
        for i in np.flatnonzero(packets).tolist():
            dpt = int(scan.id_dpt[i])
            contributor = contributor_name(
                scan.dsts[scan.id_dst[i]], None if dpt < 0 else dpt, scan.protos[scan.id_proto[i]]
            )
            add("egress", names[surface_of[i]], int(nbytes[i]), int(packets[i]), contributor)
        return rest

    def ingest_events(self, events: Iterable[WriteEvent], kind: str = "egress") -> None:
        for ev in events:
            contributor = ev.evidence.contributor if ev.evidence else None
            self.table.add(kind, ev.surface, ev.bytes, ev.events, contributor)

    def set_position(self, source: str, position: dict[str, Any] | None) -> None:
        if position is not None:
            self.positions[source] = position

    def contributors(self, key: SurfaceKey) -> list[tuple[str, int]]:
        surface = self.table.surfaces[key]
        return surface.recent.top(self.config.http.top_contributors or 10)

    def close_tick(self, end: float, seconds: float | None = None) -> TickResult:
        tick = seconds or self.config.tick
        totals = self.table.close_tick()
        changes = self.detector.evaluate(end, tick, totals, self.contributors)
        changes += self.detector.evaluate_sources(end, tick, self.sources)
        # Reset "recent" contributors of surfaces that are neither writing nor alerting, so the
        # evidence of the next alert is about the next episode.
        firing = {t for t, _, _ in self.detector.firing()}
        for t in totals:
            if t.bytes == 0 and f"{t.key[0]}/{t.key[1]}" not in firing:
                s = self.table.surfaces[t.key]
                if s.recent.top(1):
                    s.recent = type(s.recent)(self.config.heavy_hitters)
        self.ticks += 1
        self.last_tick_end = end
        return TickResult(end, changes)

    # -- state -------------------------------------------------------------------------
    def to_state(self, detector: bool = True) -> dict[str, Any]:
        """The state as JSON; ``detector=False`` leaves the detector out (the service saves
        its arrays raw, see StateStore)."""
        return {
            "surfaces": self.table.to_state(),
            **({"detector": self.detector.to_state()} if detector else {}),
            "positions": dict(self.positions),
            "sources": {
                n: {
                    "records_read": s.records_read,
                    "parse_errors": s.parse_errors,
                    "records_lost": s.records_lost,
                    "forged_records": s.forged_records,
                    "truncations": s.truncations,
                    "rotations": s.rotations,
                }
                for n, s in self.sources.items()
            },
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.table.load_state(state.get("surfaces", {}))
        self.detector.load_state(state.get("detector", {}))
        self.positions = dict(state.get("positions", {}))
        for n, saved in state.get("sources", {}).items():
            stats = SourceStats()
            for k in _RESTORED_COUNTERS:
                setattr(stats, k, int(saved.get(k, 0)))
            self.attach_source(n, stats)


@dataclass(slots=True)
class SurfaceView:
    kind: str
    name: str
    bytes_total: int
    events_total: int
    rate: float
    events_rate: float
    baseline: float
    threshold: float
    baseline_ready: bool
    capacity_bps: float
    budget_excess: float
    budget_allowance: float
    budget_tolerance: float
    spike_state: int
    budget_state: int
    contributors: list[tuple[str, int]]
    contributors_error: int
    # Every budget horizon: (name, allowance bit/s, tolerance bits, excess bits).
    budget_horizons: list[tuple[str, float, float, float]] = field(default_factory=list)
    seasonal_ratio: float = 0.0
    seasonal_judged: bool = False
    drop_state: int | None = None  # None: the drop rule is off for this surface
    beacon_state: int | None = None  # None: the beacon rule is off for this surface


@dataclass(slots=True)
class SourceView:
    name: str
    stats: SourceStats


@dataclass(slots=True)
class Snapshot:
    """A copy of everything the exposition needs, taken on the pipeline thread so that
    rendering can happen elsewhere without locks."""

    taken_at: float
    tick: float
    ticks: int
    last_tick_end: float
    last_tick_seconds: float
    surfaces: list[SurfaceView]
    sources: list[SourceView]
    source_alerts: list[tuple[str, str, int]]  # source, rule, state
    classify_cache_clears: int
    unknown_surface_events: int


def take_snapshot(pipeline: Pipeline, now: float, top: int) -> Snapshot:
    from copy import copy

    surfaces = []
    table = pipeline.table.surfaces
    # Aggregate surfaces (the sum over a kind) have no table entry: their totals are sums.
    rows = [(key, table[key].bytes_total, table[key].events_total, table[key]) for key in table]
    for key, members in pipeline.detector.aggregates.items():
        totals = [table[m] for m in members]
        rows.append(
            (
                key,
                sum(t.bytes_total for t in totals),
                sum(t.events_total for t in totals),
                None,
            )
        )
    for key, bytes_total, events_total, s in rows:
        d = pipeline.detector.surfaces[key]
        f = d.figures
        surfaces.append(
            SurfaceView(
                kind=key[0],
                name=key[1],
                bytes_total=bytes_total,
                events_total=events_total,
                rate=f.rate,
                events_rate=f.events_rate,
                baseline=f.baseline,
                threshold=f.threshold,
                baseline_ready=f.baseline_ready,
                capacity_bps=f.capacity_bps,
                budget_excess=f.budget_excess,
                budget_allowance=f.budget_allowance,
                budget_tolerance=f.budget_tolerance,
                spike_state=int(d.spike_alert.state),
                budget_state=int(d.budget_alert.state),
                contributors=s.hitters.top(top) if s is not None else [],
                contributors_error=s.hitters.error if s is not None else 0,
                budget_horizons=f.horizons,
                seasonal_ratio=f.seasonal_ratio,
                seasonal_judged=f.seasonal_judged,
                drop_state=None if d.drop_alert is None else int(d.drop_alert.state),
                beacon_state=None if d.beacon_alert is None else int(d.beacon_alert.state),
            )
        )
    return Snapshot(
        taken_at=now,
        tick=pipeline.config.tick,
        ticks=pipeline.ticks,
        last_tick_end=pipeline.last_tick_end,
        last_tick_seconds=pipeline.last_tick_seconds,
        surfaces=surfaces,
        sources=[SourceView(n, copy(s)) for n, s in pipeline.sources.items()],
        source_alerts=[
            (n, r, int(m.state)) for (n, r), m in pipeline.detector.source_alerts.items()
        ],
        classify_cache_clears=pipeline.classifier.cache_clears,
        unknown_surface_events=pipeline.table.unknown_surface_events,
    )
