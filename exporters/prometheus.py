"""/metrics: Prometheus text format or OpenMetrics, chosen by the Accept header.

Lean by default (``http.metrics: lean``): at most 9 series per surface and its alert states
only where a rule is away from rest -- the written bytes and events, the rate, the capacity,
the spike rule's baseline and threshold, the budget nearest to firing
(``surface_budget_ratio``), what the budgets let through in an hour
(``surface_budget_hour_allowance_bytes_per_second``) and one ``capalarm_surface_info`` series
whose labels carry the states that change once in a surface's life (learning, judged,
budget misconfigured, seasonal budget judging).  Every budget horizon's figures are in
/api/v1/surfaces; ``http.metrics: full`` writes them as series too (every family below, 31
series per surface with the default horizons).  The rules and dashboards read only what both
modes write.

Built from a Snapshot in a worker thread, so a scrape never blocks the event loop.  One small
function of families per concern (surfaces, budgets, alerts, sources, notifiers, the service
itself); the per-surface families are ``Columns``, written by exporters/textformat.py (byte for
byte what prometheus_client writes, several times faster at 10,000+ surfaces), OpenMetrics by
prometheus_client.  Label values are surface and source names from the config only: the
series count is bounded by the config, whatever the traffic.
"""

from __future__ import annotations

import gzip as gzip_module
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, exposition, openmetrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from alarm import __version__
from alarm.detector.rows import AGGREGATE
from alarm.events import CORE_COUNTERS
from alarm.snapshot import Snapshot, SourceView, SurfaceView
from exporters.canary_metrics import canary_families
from exporters.textformat import Columns, ScrapeCache, render_text

# Capacity figures are computed in bits (the TCSEC bands are in bit/s) but exposed in
# Prometheus' base unit, bytes, as promtool's lint requires: multiply by 8 for bits.
BITS = 1 / 8
SURFACE_LABELS = ["surface", "kind"]
METRICS_MODES = ("lean", "full")
# The labels of capalarm_surface_info: states that change once or twice in a surface's life.
SURFACE_INFO_LABELS = [
    *SURFACE_LABELS,
    "baseline_ready",
    "learning",
    "budget_misconfigured",
    "seasonal_budget_judged",
]


class NotifierView:
    """What a notifier reports; see exporters/delivery.py."""

    name: str
    sent: int
    failed: int
    retried: int
    dropped: int
    queue_depth: int
    oldest_queued_age: float
    dead_letters: int  # in the dead-letter table (durable outbox; 0 where there is none)
    unpersisted: int  # held in memory because the outbox could not be written
    unjournaled: int  # held changes left out of the held-changes journal


def _surface_family(snap: Snapshot, typ: str, name: str, doc: str, values: np.ndarray) -> Columns:
    return Columns(
        f"capalarm_surface_{name}", doc, typ, SURFACE_LABELS, snap.surface_labels, values
    )


def surface_families(snap: Snapshot, full: bool = True) -> Iterable[Columns]:
    """Volume and rate per surface: what was written, and how fast over the last tick (the
    event rate only in full: it is the rate of write_events_total)."""
    c, g = "counter", "gauge"
    cols = snap.columns
    yield _surface_family(
        snap,
        c,
        "written_bytes",
        "Bytes written through the surface.",
        cols.bytes_total.astype(np.float64),
    )
    yield _surface_family(
        snap,
        c,
        "write_events",
        "Write events (packets, file writes, uploads) on the surface.",
        cols.events_total.astype(np.float64),
    )
    yield _surface_family(
        snap, g, "write_rate_bytes_per_second", "Byte rate over the last tick.", cols.rate
    )
    if full:
        yield _surface_family(
            snap,
            g,
            "write_events_per_second",
            "Event rate over the last tick.",
            cols.events_rate,
        )
    yield _surface_family(
        snap,
        g,
        "capacity_bytes_per_second",
        "Lampson upper bound of the information carried over the last tick (payload + metadata "
        "per event), in bytes/s (x8 for bit/s).",
        cols.capacity_bps * BITS,
    )


def spike_families(snap: Snapshot, full: bool = True) -> Iterable[Columns]:
    """The spike rule: baseline and threshold (whether it judges: capalarm_surface_info, and
    in full its own gauges)."""
    g = "gauge"
    cols = snap.columns
    yield _surface_family(
        snap,
        g,
        "baseline_bytes_per_second",
        "Robust seasonal baseline of the byte rate.",
        cols.baseline,
    )
    yield _surface_family(
        snap,
        g,
        "threshold_bytes_per_second",
        "Spike threshold for the byte rate (0 while the surface is not judged).",
        cols.threshold,
    )
    if not full:
        return
    yield _surface_family(
        snap,
        g,
        "baseline_ready",
        "1 when every statistic of the spike rule judges (its tail is known).",
        cols.baseline_ready.astype(np.float64),
    )
    yield _surface_family(
        snap,
        g,
        "learning",
        "1 while the spike rule does not judge the surface yet (no statistic's tail is known); "
        "its budgets and the beacon rule protect it meanwhile.",
        cols.learning.astype(np.float64),
    )


def members_families(snap: Snapshot) -> Iterable[Metric]:
    """The aggregates' members statistic (alarm/detector/swarm.py), on aggregate rows only."""
    cols = snap.columns
    rows = np.flatnonzero(~np.isnan(cols.members_shift)).tolist()
    kinds = cols.layout.kinds
    for name, doc, values in (
        (
            "members_shift",
            "An aggregate's members statistic: how far its members write above their own "
            "normal size per write, combined over members and the last minutes (about N(0,1) "
            "on ordinary traffic).",
            cols.members_shift,
        ),
        (
            "members_shift_threshold",
            "The members statistic's calibrated threshold (0 while it does not judge).",
            cols.members_shift_threshold,
        ),
    ):
        fam = GaugeMetricFamily(f"capalarm_aggregate_{name}", doc, labels=["kind"])
        for row in rows:
            fam.add_metric([kinds[row]], float(values[row]))
        yield fam


def budget_figures(s: SurfaceView) -> tuple[float, float]:
    """(ratio, hour allowance in bytes/s) of one surface's budgets.  Ratio: the largest CUSUM
    over its tolerance of every horizon and of the seasonal budget (the budget rule fires
    above 1).  Hour allowance: the most the budgets let through over one hour without firing
    -- each horizon is a token bucket that passes k * 3600 s + h in an hour and the surface
    fires on whichever is first, so the least of k + h / 3600 s over its horizons.  (A scrape
    computes them for every surface at once: SurfaceColumns.budget_figures.)"""
    ratio = s.seasonal_ratio if s.seasonal_judged else 0.0
    hour = math.inf
    for _, allowance, tolerance, excess in s.budget_horizons:
        if tolerance > 0:
            ratio = max(ratio, excess / tolerance)
        hour = min(hour, allowance + tolerance / 3600)
    return ratio, hour * BITS


def budget_families(snap: Snapshot, full: bool = True) -> Iterable[Columns]:
    """The capacity budgets: the one nearest to firing and the hour's allowance; in full the
    first horizon's figures, every horizon, the seasonal one."""
    g = "gauge"
    cols = snap.columns
    ratio, hour = cols.budget_figures()
    yield Columns(
        "capalarm_surface_budget_ratio",
        "The capacity budget nearest to firing: the largest CUSUM over tolerance of every "
        "horizon and the seasonal budget (the budget alert fires above 1).",
        g,
        SURFACE_LABELS,
        snap.surface_labels,
        ratio,
    )
    yield Columns(
        "capalarm_surface_budget_hour_allowance_bytes_per_second",
        "The most the surface's budgets let through over one hour without firing, as a rate: "
        "the least of k + h / 3600 s over its horizons (x8 for bit/s).",
        g,
        SURFACE_LABELS,
        snap.surface_labels,
        hour * BITS,
    )
    if not full:
        return
    yield _surface_family(
        snap,
        g,
        "budget_allowance_bytes_per_second",
        "Capacity budget allowance k (x8 for bit/s).",
        cols.allowance[0] * BITS,
    )
    yield _surface_family(
        snap,
        g,
        "budget_tolerance_bytes",
        "Capacity budget tolerance h, the largest leak tolerated (x8 for bits).",
        cols.tolerance[0] * BITS,
    )
    yield _surface_family(
        snap,
        g,
        "budget_excess_bytes",
        "Information carried above the allowance, accumulated (CUSUM; x8 for bits).",
        cols.excess[0] * BITS,
    )
    labels = [*SURFACE_LABELS, "horizon"]
    # One rows list for the three families: its label texts are then written once.
    rows, index = cols.layout.horizon_pairs()
    label_rows = cols.layout.horizon_labels()  # one list while the surfaces stay
    for name, doc, figure in (
        (
            "allowance_bytes_per_second",
            "Capacity budget allowance k per horizon (x8 for bit/s).",
            cols.allowance,
        ),
        (
            "tolerance_bytes",
            "Capacity budget tolerance h per horizon (x8 for bits).",
            cols.tolerance,
        ),
        ("excess_bytes", "CUSUM above the allowance per horizon (x8 for bits).", cols.excess),
    ):
        values = figure[index, rows] * BITS
        yield Columns(f"capalarm_surface_budget_horizon_{name}", doc, g, labels, label_rows, values)
    yield _surface_family(
        snap,
        g,
        "budget_misconfigured",
        "1 when the surface's declared budget fired on its ordinary traffic for more than a day: "
        "it now judges what comes on top of that traffic.",
        cols.budget_misconfigured.astype(np.float64),
    )
    yield _surface_family(
        snap,
        g,
        "seasonal_budget_ratio",
        "Seasonal budget: its CUSUM over its tolerance (the budget alert fires above 1; 0 while "
        "it does not judge).",
        cols.seasonal_ratio,
    )
    yield _surface_family(
        snap,
        g,
        "seasonal_budget_judged",
        "1 when the seasonal budget judges the surface (a day of history, a ready hour).",
        cols.seasonal_judged.astype(np.float64),
    )


def kind_budget_families(snap: Snapshot) -> Iterable[Metric]:
    """Every surface's allowance per horizon, summed per kind (the aggregate left out: it
    repeats its members): what a dashboard sums over nodes, a few series per kind."""
    cols = snap.columns
    rows, index = cols.layout.horizon_pairs()
    groups = cols.layout.kind_horizon_groups(AGGREGATE)
    allowance = cols.allowance[index, rows] * BITS
    fam = GaugeMetricFamily(
        "capalarm_kind_budget_horizon_allowance_bytes_per_second",
        "Capacity budget allowance k per horizon, summed over the kind's surfaces (x8 for bit/s).",
        labels=["kind", "horizon"],
    )
    for (kind, horizon), pairs in groups.items():
        # Added one by one in row order (cumsum is sequential), as a Python sum would.
        fam.add_metric([kind, horizon], float(np.cumsum(allowance[pairs])[-1]))
    yield fam


def state_families(snap: Snapshot) -> Iterable[Columns]:
    """capalarm_surface_info: the states a surface takes once or twice in its life, as labels
    ("1"/"0"), so that they cost one series a surface, not one each."""
    cols = snap.columns
    codes = (
        cols.baseline_ready.astype(np.int64)
        | cols.learning.astype(np.int64) << 1
        | cols.budget_misconfigured.astype(np.int64) << 2
        | cols.seasonal_judged.astype(np.int64) << 3
    )
    rows = cols.layout.info_rows(codes)
    yield Columns(
        "capalarm_surface",
        "Per surface: whether every statistic of the spike rule judges (baseline_ready), none "
        "does yet (learning), its declared budget fired on ordinary traffic for a day "
        "(budget_misconfigured), the seasonal budget judges it (seasonal_budget_judged).",
        "info",
        SURFACE_INFO_LABELS,
        rows,
        np.ones(len(rows)),
    )


def alert_families(snap: Snapshot, full: bool = True) -> Iterable[Metric | Columns]:
    """Alert state per surface and rule (lean: only those away from rest, 0; a series that
    is absent is inactive) and per source and rule (every one: there are few)."""
    cols = snap.columns
    layout = cols.layout
    rules = list(cols.rules)
    n = len(cols)
    shown = np.zeros((n, len(rules)), dtype=bool)
    states = np.zeros((n, len(rules)), dtype=np.int64)
    for j, (st, on) in enumerate(cols.rules.values()):
        states[:, j] = st
        shown[:, j] = True if on is None else on
        if not full:
            shown[:, j] &= st != 0
    at, which = np.nonzero(shown)  # row by row, each row's rules in rule_states order
    rows: list[tuple[str, ...]] = [
        ("surface", layout.names[r], layout.kinds[r], rules[j])
        for r, j in zip(at.tolist(), which.tolist(), strict=True)
    ]
    values: list[float] = states[at, which].astype(np.float64).tolist()
    for source, rule, st in snap.source_alerts:
        rows.append(("source", source, "source", rule))
        values.append(st)
    yield Columns(
        "capalarm_alert_state",
        "Alert state per surface or source and rule: 0 inactive, 1 pending, 2 firing (by "
        "default a surface's rule has a series only while it is pending or firing).",
        "gauge",
        ["target_type", "target", "kind", "rule"],
        rows,
        values,
    )


_SOURCE_GAUGES: tuple[tuple[str, str, Callable[[SourceView], float]], ...] = (
    ("up", "1 while the source is reading.", lambda v: float(v.health.up)),
    (
        "provenance_verified",
        "1 when the source proves a record came from the kernel (kmsg facility, journald "
        "transport); 0 for files, which cannot.",
        lambda v: float(v.health.provenance_verified),
    ),
    (
        "blind",
        "1 while the source runs but cannot see what it watches (canary missed, tree gone, poll "
        "too old): the surface_blind alarm.",
        lambda v: float(bool(v.health.blind)),
    ),
    (
        "caught_up",
        "1 when the source has handed over everything it could read so far.",
        lambda v: float(v.health.caught_up),
    ),
    (
        "last_record_timestamp_seconds",
        "Timestamp of the last record read.",
        lambda v: v.health.last_record_ts,
    ),
    (
        "last_success_timestamp_seconds",
        "When the source last completed a read or poll.",
        lambda v: v.health.last_success_at,
    ),
    (
        "read_duration_seconds",
        "How long the source's last read or poll took.",
        lambda v: v.health.read_seconds,
    ),
    (
        "last_error_timestamp_seconds",
        "When the source last failed (0: never); the error text is in /api/v1/surfaces.",
        lambda v: v.health.last_error_at,
    ),
    (
        "watermark_timestamp_seconds",
        "Event time up to which the source has handed over every event.",
        lambda v: v.watermark,
    ),
)


def source_families(snap: Snapshot) -> Iterable[Metric]:
    """Proof of sight per source: up, fresh, and every counter its type keeps."""
    labels = ["source"]
    info = InfoMetricFamily(
        "capalarm_source", "Source type, surface kind and read mode.", labels=labels
    )
    for v in snap.sources:
        info.add_metric([v.name], {"type": v.type, "kind": v.kind, "mode": v.health.mode})
    yield info
    for name, doc, value in _SOURCE_GAUGES:
        fam = GaugeMetricFamily(f"capalarm_source_{name}", doc, labels=labels)
        for v in snap.sources:
            fam.add_metric([v.name], value(v))
        yield fam
    errors = CounterMetricFamily(
        "capalarm_source_errors",
        "Source failures (a reader that died, a poll that failed).",
        labels=labels,
    )
    for v in snap.sources:
        errors.add_metric([v.name], v.health.errors)
    yield errors
    # Every counter: the core ones for every source, a type's own for the sources of that type.
    names: dict[str, str] = dict(CORE_COUNTERS)
    for v in snap.sources:
        for c, doc in v.declared.items():
            names.setdefault(c, doc)
    for counter, doc in names.items():
        fam = CounterMetricFamily(f"capalarm_source_{counter}", doc, labels=labels)
        for v in snap.sources:
            if counter in v.declared or counter in CORE_COUNTERS:
                fam.add_metric([v.name], v.counters.get(counter, 0))
        yield fam


def notifier_families(notifiers: Sequence[NotifierView]) -> Iterable[Metric]:
    labels = ["notifier"]
    for name, doc, attr, fam_type in (
        ("sent", "Notifications delivered.", "sent", CounterMetricFamily),
        ("failed", "Deliveries given up after the last retry.", "failed", CounterMetricFamily),
        ("retried", "Delivery attempts retried.", "retried", CounterMetricFamily),
        (
            "dropped",
            "Notifications dropped: more held in memory than its bound while the outbox could "
            "not be written.",
            "dropped",
            CounterMetricFamily,
        ),
        (
            "unjournaled",
            "Alert changes held in memory while the outbox could not be written that did not "
            "fit the held-changes journal: a kill -9 before the outbox is written again loses "
            "them.",
            "unjournaled",
            CounterMetricFamily,
        ),
        ("queue_depth", "Notifications waiting.", "queue_depth", GaugeMetricFamily),
        (
            "dead_letters",
            "Notifications in the dead-letter table: rejected, or undelivered past the maximum "
            "age.",
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
        fam = fam_type(f"capalarm_notifier_{name}", doc, labels=labels)
        for n in notifiers:
            fam.add_metric([n.name], getattr(n, attr, 0))
        yield fam


def service_families(snap: Snapshot) -> Iterable[Metric]:
    yield InfoMetricFamily(
        "capalarm_build", "capalarm build information", value={"version": __version__}
    )
    yield CounterMetricFamily("capalarm_ticks", "Ticks evaluated.", value=snap.ticks)
    yield GaugeMetricFamily(
        "capalarm_last_tick_timestamp_seconds",
        "End of the last evaluated tick (event time).",
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
    yield GaugeMetricFamily(
        "capalarm_open_ticks",
        "Ticks holding counted events that are not evaluated yet (a backlog being read).",
        value=snap.open_ticks,
    )
    yield CounterMetricFamily(
        "capalarm_internal_errors",
        "Calls of the pipeline that raised (a tick's evaluation, a batch's counting): each is "
        "logged with its traceback; failing for 5 minutes without a call that works, the "
        "service stops with exit status 1.",
        value=snap.internal_errors,
    )
    yield CounterMetricFamily(
        "capalarm_backlog_skipped_cells",
        "Counts of ticks older than event_time.max_backlog, moved into the first tick evaluated.",
        value=snap.backlog_skipped,
    )
    folded = CounterMetricFamily(
        "capalarm_pages_folded",
        "Pages the detector did not send because they were not news, by the rule that fired "
        "and why: precedent (the surface did as much before, docs/weeks.md), young (its first "
        "days of life), incident (it joined an open incident on the surface).",
        labels=["rule", "reason"],
    )
    for (rule, reason), count in sorted(snap.pages_folded.items()):
        folded.add_metric([rule, reason], count)
    yield folded
    yield CounterMetricFamily(
        "capalarm_unknown_surface_events",
        "Events naming an undeclared surface, counted as unclassified.",
        value=snap.unknown_surface_events,
    )


def state_save_families(snap: Snapshot) -> Iterable[Metric]:
    """The service's checkpoints of its state (alarm/statesave.py): what each wrote and cost,
    and the WAL file they leave (alarm/state.py, "The WAL")."""
    st = snap.state_save
    if st is None:
        return
    for name, doc, fam, value in (
        ("saves", "State checkpoints saved.", CounterMetricFamily, st.saves),
        (
            "save_failures",
            "State checkpoints that failed (disk full, locked, read-only); each is retried.",
            CounterMetricFamily,
            st.failures,
        ),
        (
            "save_duration_seconds",
            "Wall time the last state checkpoint took on the pipeline thread.",
            GaugeMetricFamily,
            st.last_seconds,
        ),
        (
            "last_save_timestamp_seconds",
            "When the last state checkpoint was saved (0: none since start).",
            GaugeMetricFamily,
            st.last_at,
        ),
        (
            "save_written_bytes",
            "Bytes the last state checkpoint wrote: the detector array chunks that changed, "
            "its JSON and ledger rows.",
            GaugeMetricFamily,
            st.last_bytes,
        ),
        (
            "save_written_chunks",
            "Detector array chunks (16 kB) the last state checkpoint wrote.",
            GaugeMetricFamily,
            st.last_chunks,
        ),
        (
            "written_bytes",
            "Bytes the state checkpoints wrote since start.",
            CounterMetricFamily,
            st.bytes_total,
        ),
        (
            "written_chunks",
            "Detector array chunks the state checkpoints wrote since start.",
            CounterMetricFamily,
            st.chunks_total,
        ),
        (
            "wal_bytes",
            "Size of the state database's write-ahead log file.",
            GaugeMetricFamily,
            st.wal_bytes,
        ),
    ):
        yield fam(f"capalarm_state_{name}", doc, value=value)


class _Collector:
    """What CollectorRegistry wants: something with collect()."""

    def __init__(self, families: Iterable[Metric]):
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def all_families(
    snap: Snapshot, notifiers: Sequence[NotifierView], full: bool = False
) -> list[Metric | Columns]:
    """Every family of a scrape, in the order they are written (``full``: every per-surface
    family, ``http.metrics: full``)."""
    return [
        *service_families(snap),
        *state_save_families(snap),
        *surface_families(snap, full),
        *spike_families(snap, full),
        *members_families(snap),
        *budget_families(snap, full),
        *kind_budget_families(snap),
        *state_families(snap),
        *alert_families(snap, full),
        *source_families(snap),
        *notifier_families(notifiers),
        *canary_families(snap),
        *ProcessCollector(registry=None).collect(),
    ]


def accepts_gzip(header: str | None) -> bool:
    """Whether an Accept-Encoding header takes gzip (RFC 9110: ``gzip;q=0`` refuses it)."""
    for item in (header or "").split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip"):
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


def render(
    snap: Snapshot,
    notifiers: Sequence[NotifierView],
    accept: str | None,
    *,
    full: bool = False,
    gzip: bool = False,
    cache: ScrapeCache | None = None,
) -> tuple[bytes, str]:
    """Returns (body, content type), the body gzip-compressed when ``gzip``.  ``cache``: the
    text format is written at a cost proportional to what changed since its last render.
    CPU work: call it off the event loop."""
    families = all_families(snap, notifiers, full)
    if accept and "application/openmetrics-text" in accept:
        metrics = [f.metric() if isinstance(f, Columns) else f for f in families]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(metrics))  # type: ignore[arg-type]
        body = openmetrics.exposition.generate_latest(registry)
        if gzip:
            body = zlib_gzip(body)
        return body, openmetrics.exposition.CONTENT_TYPE_LATEST
    if cache is None:
        body = render_text(families)
        return (zlib_gzip(body) if gzip else body), exposition.CONTENT_TYPE_LATEST
    return cache.render(families, gzip), exposition.CONTENT_TYPE_LATEST


def zlib_gzip(body: bytes) -> bytes:
    return gzip_module.compress(body, compresslevel=1, mtime=0)


__all__: list[Any] = [
    "METRICS_MODES",
    "NotifierView",
    "accepts_gzip",
    "all_families",
    "budget_figures",
    "render",
]
