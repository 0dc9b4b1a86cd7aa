"""/metrics: Prometheus text format or OpenMetrics, chosen by the Accept header.

Built from a Snapshot with prometheus_client's exposition code, in a worker thread, so a
scrape never blocks the event loop.  Label values are surface and source names from the config
only: the series count is bounded by the config, whatever the traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, exposition, openmetrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from alarm import __version__
from alarm.pipeline import Snapshot


class NotifierView:
    """What a notifier reports; see exporters/webhook.py."""

    name: str
    sent: int
    failed: int
    retried: int
    dropped: int
    queue_depth: int
    oldest_queued_age: float
    dead_letters: int  # in the dead-letter table (durable outbox; 0 where there is none)
    unpersisted: int  # held in memory because the outbox could not be written


def _families(snap: Snapshot, notifiers: Sequence[NotifierView]) -> Iterable[Metric]:
    yield InfoMetricFamily(
        "capalarm_build", "capalarm build information", value={"version": __version__}
    )

    sl = ["surface", "kind"]

    def counter(name: str, doc: str, attr: str) -> CounterMetricFamily:
        fam = CounterMetricFamily(f"capalarm_surface_{name}", doc, labels=sl)
        for s in snap.surfaces:
            fam.add_metric([s.name, s.kind], getattr(s, attr))
        return fam

    def gauge(name: str, doc: str, attr: str, scale: float = 1.0) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(f"capalarm_surface_{name}", doc, labels=sl)
        for s in snap.surfaces:
            fam.add_metric([s.name, s.kind], float(getattr(s, attr)) * scale)
        return fam

    # Capacity figures are computed in bits (the TCSEC bands are in bit/s) but exposed in
    # Prometheus' base unit, bytes, as promtool's lint requires: multiply by 8 for bits.
    bits = 1 / 8

    yield counter("written_bytes", "Bytes written through the surface.", "bytes_total")
    yield counter(
        "write_events",
        "Write events (packets, file writes, uploads) on the surface.",
        "events_total",
    )
    yield gauge("write_rate_bytes_per_second", "Byte rate over the last closed tick.", "rate")
    yield gauge("write_events_per_second", "Event rate over the last closed tick.", "events_rate")
    yield gauge(
        "baseline_bytes_per_second", "Robust baseline (median) of the byte rate.", "baseline"
    )
    yield gauge("threshold_bytes_per_second", "Spike threshold for the byte rate.", "threshold")
    yield gauge(
        "baseline_ready",
        "1 when the baseline has enough history to judge spikes.",
        "baseline_ready",
    )
    yield gauge(
        "capacity_bytes_per_second",
        "Lampson upper bound of the information carried over the last tick (payload + metadata per event), "
        "in bytes/s (x8 for bit/s).",
        "capacity_bps",
        bits,
    )
    yield gauge(
        "budget_allowance_bytes_per_second",
        "Capacity budget allowance k (x8 for bit/s).",
        "budget_allowance",
        bits,
    )
    yield gauge(
        "budget_tolerance_bytes",
        "Capacity budget tolerance h, the largest leak tolerated (x8 for bits).",
        "budget_tolerance",
        bits,
    )
    yield gauge(
        "budget_excess_bytes",
        "Information carried above the allowance, accumulated (CUSUM; x8 for bits).",
        "budget_excess",
        bits,
    )
    # Every budget horizon (1m, 1h, 1d by default); the three above are the first horizon's.
    hl = [*sl, "horizon"]
    for name, doc, index in (
        (
            "allowance_bytes_per_second",
            "Capacity budget allowance k per horizon (x8 for bit/s).",
            1,
        ),
        ("tolerance_bytes", "Capacity budget tolerance h per horizon (x8 for bits).", 2),
        ("excess_bytes", "CUSUM above the allowance per horizon (x8 for bits).", 3),
    ):
        fam = GaugeMetricFamily(f"capalarm_surface_budget_horizon_{name}", doc, labels=hl)
        for s in snap.surfaces:
            for horizon in s.budget_horizons:
                fam.add_metric([s.name, s.kind, horizon[0]], float(horizon[index]) * bits)
        yield fam

    yield gauge(
        "seasonal_budget_ratio",
        "Seasonal budget: its CUSUM over its tolerance (the budget alert fires above 1; 0 while "
        "it does not judge).",
        "seasonal_ratio",
    )
    yield gauge(
        "seasonal_budget_judged",
        "1 when the seasonal budget judges the surface (a day of history, a ready hour).",
        "seasonal_judged",
    )

    state = GaugeMetricFamily(
        "capalarm_alert_state",
        "Alert state per surface or source and rule: 0 inactive, 1 pending, 2 firing.",
        labels=["target_type", "target", "kind", "rule"],
    )
    for s in snap.surfaces:
        state.add_metric(["surface", s.name, s.kind, "spike"], s.spike_state)
        state.add_metric(["surface", s.name, s.kind, "budget"], s.budget_state)
        if s.drop_state is not None:
            state.add_metric(["surface", s.name, s.kind, "drop"], s.drop_state)
        if s.beacon_state is not None:
            state.add_metric(["surface", s.name, s.kind, "beacon"], s.beacon_state)
    for source, rule, st in snap.source_alerts:
        state.add_metric(["source", source, "source", rule], st)
    yield state

    src = ["source"]

    def src_counter(name: str, doc: str, attr: str) -> CounterMetricFamily:
        fam = CounterMetricFamily(f"capalarm_source_{name}", doc, labels=src)
        for v in snap.sources:
            fam.add_metric([v.name], getattr(v.stats, attr))
        return fam

    def src_gauge(name: str, doc: str, attr: str) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(f"capalarm_source_{name}", doc, labels=src)
        for v in snap.sources:
            fam.add_metric([v.name], float(getattr(v.stats, attr)))
        return fam

    yield src_gauge("up", "1 while the source is reading.", "up")
    yield src_gauge(
        "provenance_verified",
        "1 when the source proves a record came from the kernel (kmsg facility, journald transport); 0 for files.",
        "provenance_verified",
    )
    yield src_counter("records_read", "Records read from the source.", "records_read")
    yield src_counter(
        "parse_errors", "Records that matched a fence prefix but did not parse.", "parse_errors"
    )
    yield src_counter(
        "records_lost",
        "Records known or possibly lost (ring overwrite, sequence gap, truncation).",
        "records_lost",
    )
    yield src_counter(
        "forged_records",
        "Fence look-alikes not written by the kernel: rejected and alarmed.",
        "forged_records",
    )
    yield src_counter(
        "truncations", "Followed files truncated in place (copytruncate).", "truncations"
    )
    yield src_counter("rotations", "Followed files rotated by rename.", "rotations")
    yield src_gauge(
        "last_record_timestamp_seconds", "Timestamp of the last record read.", "last_record_ts"
    )

    nl = ["notifier"]
    for name, doc, attr, fam_type in (
        ("sent", "Notifications delivered.", "sent", CounterMetricFamily),
        ("failed", "Deliveries given up after the last retry.", "failed", CounterMetricFamily),
        ("retried", "Delivery attempts retried.", "retried", CounterMetricFamily),
        (
            "dropped",
            "Notifications dropped: more held in memory than its bound while the outbox could not be written.",
            "dropped",
            CounterMetricFamily,
        ),
        ("queue_depth", "Notifications waiting.", "queue_depth", GaugeMetricFamily),
        (
            "dead_letters",
            "Notifications in the dead-letter table: rejected, or undelivered past the maximum age.",
            "dead_letters",
            GaugeMetricFamily,
        ),
        (
            "unpersisted",
            "Notifications held in memory because the outbox could not be written (disk full).",
            "unpersisted",
            GaugeMetricFamily,
        ),
        (
            "oldest_queued_age_seconds",
            "Age of the oldest waiting notification.",
            "oldest_queued_age",
            GaugeMetricFamily,
        ),
    ):
        fam = fam_type(f"capalarm_notifier_{name}", doc, labels=nl)
        for n in notifiers:
            fam.add_metric([n.name], getattr(n, attr, 0))
        yield fam

    yield CounterMetricFamily("capalarm_ticks", "Ticks evaluated.", value=snap.ticks)
    yield GaugeMetricFamily(
        "capalarm_last_tick_timestamp_seconds",
        "End of the last evaluated tick.",
        value=snap.last_tick_end,
    )
    yield GaugeMetricFamily(
        "capalarm_tick_interval_seconds", "Configured tick length.", value=snap.tick
    )
    yield GaugeMetricFamily(
        "capalarm_tick_evaluation_seconds",
        "CPU time the last tick's evaluation took.",
        value=snap.last_tick_seconds,
    )
    yield CounterMetricFamily(
        "capalarm_classify_cache_clears",
        "Times the classification cache was full and cleared (destination churn).",
        value=snap.classify_cache_clears,
    )
    yield CounterMetricFamily(
        "capalarm_unknown_surface_events",
        "Events naming an undeclared surface, counted as unclassified.",
        value=snap.unknown_surface_events,
    )


class _SnapshotCollector:
    def __init__(self, snap: Snapshot, notifiers: Sequence[NotifierView]):
        self._snap = snap
        self._notifiers = notifiers

    def collect(self) -> Iterable[Metric]:
        return _families(self._snap, self._notifiers)


def render(
    snap: Snapshot, notifiers: Sequence[NotifierView], accept: str | None
) -> tuple[bytes, str]:
    """Returns (body, content type).  CPU work: call it off the event loop."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap, notifiers))  # type: ignore[arg-type]
    registry.register(ProcessCollector(registry=None))
    if accept and "application/openmetrics-text" in accept:
        return openmetrics.exposition.generate_latest(
            registry
        ), openmetrics.exposition.CONTENT_TYPE_LATEST
    return exposition.generate_latest(registry), exposition.CONTENT_TYPE_LATEST
