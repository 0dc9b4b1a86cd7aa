#!/usr/bin/env python3
"""Figure: a /metrics scrape at N declared surfaces, all in -- the pipeline's snapshot, the
families and the render -- against Prometheus' default 10 s scrape_timeout and the 1 s floor
of issue 29.  Measured on the installed package, the path `capalarm run` serves:
alarm.pipeline.Pipeline.snapshot with the scrape's request (SnapshotRequest(): columns only,
alarm/snapshot.py), exporters.prometheus.all_families, then
exporters.textformat.ScrapeCache.render (the HTTP server's cache) with gzip, as Prometheus
asks.

    python bench/metrics_scrape.py [--surfaces 100000] [--reps 3]

Each rep: a pipeline that has run a few ticks of lognormal traffic (30 % of surfaces silent),
then
  - cold: the first scrape (an empty cache);
  - warm: the scrape after the next tick of the same traffic (most rows changed);
  - quiet: the scrape after a tick in which 1 % of the surfaces wrote, after one like it;
Anchors in the same run: the snapshot as it was before columns (``views_per_row``: a
SurfaceView per surface from the detector's per-row readers, which every scrape paid), the full exposition (http.metrics: full, every family) by
the one-shot writer (render_text, what every scrape cost before the cache), and
prometheus_client's generate_latest on the lean families (once, the same series count).
Medians are printed.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.append(str(REPO))  # after site-packages: an installed capalarm is what runs

from prometheus_client import CollectorRegistry, exposition  # noqa: E402

from alarm.config import config_from_dict  # noqa: E402
from alarm.pipeline import Pipeline  # noqa: E402
from alarm.snapshot import SnapshotRequest, SurfaceView  # noqa: E402
from exporters.prometheus import all_families  # noqa: E402
from exporters.textformat import Columns, ScrapeCache, code_path, render_text  # noqa: E402

T0 = 1_780_000_000.0
TICK = 10.0


def tick(p: Pipeline, t: int, active: float, rng: np.random.Generator) -> None:
    rows = len(p.table)
    level = rng.lognormal(6, 1.5, rows)
    b = np.round(level * TICK * np.exp(0.3 * rng.standard_t(5, rows)))
    b[rng.random(rows) >= active] = 0
    p._evaluate(T0 + (t + 1) * TICK, b, np.ceil(b / 800), b, {}, False, True)


def pipeline(n: int, ticks: int) -> Pipeline:
    cfg = config_from_dict(
        {
            "tick": f"{TICK:g}s",
            "state_dir": "/nonexistent/unused",
            "surfaces": [{"name": f"s{i}", "match": {"dport": [i % 65536]}} for i in range(n)],
        }
    )
    p = Pipeline(cfg)
    rng = np.random.default_rng(7)
    for t in range(ticks):
        tick(p, t, 0.7, rng)
    return p


def views_per_row(p: Pipeline, top: int) -> list[SurfaceView]:
    """The anchor: what Pipeline.snapshot made for every request before columns (its loop
    until bd7313c), a SurfaceView per surface from the detector's per-row readers."""
    det, table = p.detector, p.table
    learning = det.spike.learning.tolist()
    views = []
    for row, (kind, name) in enumerate(det.keys):
        if row < len(table):
            nbytes, events = int(table.bytes_total[row]), int(table.events_total[row])
            contributors, error = table.hitters[row].top(top), table.hitters[row].error
        else:
            members = [table.index[m] for m in det.aggregates[(kind, name)]]
            nbytes = int(table.bytes_total[members].sum())
            events = int(table.events_total[members].sum())
            contributors, error = [], 0
        f = det.figures_of(row)
        views.append(
            SurfaceView(
                kind=kind,
                name=name,
                bytes_total=nbytes,
                events_total=events,
                rate=f.rate,
                events_rate=f.events_rate,
                baseline=f.baseline,
                threshold=f.threshold,
                baseline_ready=f.baseline_ready,
                capacity_bps=f.capacity_bps,
                budget_excess=f.budget_excess,
                budget_allowance=f.budget_allowance,
                budget_tolerance=f.budget_tolerance,
                spike_state=int(det.spike_alerts.state[row]),
                budget_state=int(det.budget_alerts.state[row]),
                contributors=contributors,
                contributors_error=error,
                budget_horizons=f.horizons,
                seasonal_ratio=f.seasonal_ratio,
                seasonal_judged=f.seasonal_judged,
                learning=learning[row],
                budget_misconfigured=bool(det.budget.misconfigured[row]),
                rule_alert_states={
                    n: int(det.alert_banks[n].state[row])
                    for n, rule in det.rules.items()
                    if rule.enabled[row]
                },
                **det.members_shift_of(row),
            )
        )
    return views


class _Fixed:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def timed(fn, *args, **kw):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


def series_count(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--surfaces", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=5)
    args = ap.parse_args(argv)
    p = pipeline(args.surfaces, args.ticks)
    rng = np.random.default_rng(11)
    t = args.ticks
    m: dict[str, list[float]] = {}

    def note(key: str, seconds: float) -> None:
        m.setdefault(key, []).append(seconds)

    scrape = SnapshotRequest()  # what /metrics asks the pipeline for

    def snapshot():  # type: ignore[no-untyped-def]
        return p.snapshot(time.time(), 10, {}, {}, scrape)

    # The first scrape of a pipeline lays its surfaces out once (names, label tuples, the
    # horizons' groups): timed apart, all in, on a cache of its own.
    t0 = time.perf_counter()
    ScrapeCache().render(all_families(snapshot(), []), gzip=True)
    first_s = time.perf_counter() - t0
    body = b""
    for _ in range(args.reps):
        cache = ScrapeCache()
        snap, s = timed(snapshot)
        note("cold snapshot", s)
        fams, s = timed(all_families, snap, [])
        note("cold families", s)
        zipped, s = timed(cache.render, fams, gzip=True)
        note("cold render", s)
        body = gzip.decompress(zipped)
        if body != render_text(fams):
            print("the cache and the one-shot writer disagree: no figure", file=sys.stderr)
            return 1
        # Anchors: a view per surface, as every snapshot made before columns; the full
        # exposition by the one-shot writer.
        _, s = timed(views_per_row, p, 10)
        note("anchor views", s)
        full, s = timed(render_text, all_families(snap, [], full=True))
        note("anchor full", s)
        for label, active in (("warm", 0.7), ("quiet", 0.01), ("quiet", 0.01)):
            tick(p, t, active, rng)
            t += 1
            snap, s = timed(snapshot)
            fams, f = timed(all_families, snap, [])
            zipped, r = timed(cache.render, fams, gzip=True)
            note(f"{label} snapshot", s)
            note(f"{label} families", f)
            note(f"{label} render", r)
            note(f"{label} lines", cache.stats.lines_written)
    # The anchor: prometheus_client on the lean families of the last snapshot, once.
    registry = CollectorRegistry(auto_describe=False)
    metrics = [f.metric() if isinstance(f, Columns) else f for f in fams]
    registry.register(_Fixed(metrics))  # type: ignore[arg-type]
    _, client_s = timed(exposition.generate_latest, registry)
    med = {k: statistics.median(v[-1:] if k.startswith("quiet") else v) for k, v in m.items()}
    n = series_count(body)
    print(
        f"{args.surfaces:,} surfaces, lean: {n:,} series ({n / args.surfaces:.1f} a surface), "
        f"{len(body) / 1e6:.1f} MB, gzip {len(zipped) / 1e6:.1f} MB; full: "
        f"{series_count(full):,} series, {len(full) / 1e6:.1f} MB; median of {args.reps}, "
        "seconds:\n"
        "  scrape (gzip)                      snapshot  families  render   ALL IN"
    )
    for label, what in (
        ("cold", "cold: empty cache (a new server)"),
        ("warm", "after a tick, 70 % writing"),
        ("quiet", "after a tick, 1 % writing"),
    ):
        parts = [med[f"{label} {k}"] for k in ("snapshot", "families", "render")]
        lines = f"   ({med[f'{label} lines']:,.0f} lines rewritten)" if label != "cold" else ""
        print(
            f"  {what:34s} {parts[0]:8.3f} {parts[1]:9.3f} {parts[2]:7.3f} {sum(parts):8.3f}{lines}"
        )
    print(
        f"  first scrape of the pipeline, all in (layout made once)    {first_s:6.2f}\n"
        f"  anchor: the snapshot before columns (a view per surface)   {med['anchor views']:6.2f}\n"
        f"  anchor: full exposition, one-shot writer                   {med['anchor full']:6.2f}\n"
        f"  anchor: prometheus_client generate_latest, lean (once)     {client_s:6.2f}\n"
        f"code path: Pipeline.snapshot(SnapshotRequest()) -> all_families -> ScrapeCache over "
        f"{code_path()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
