#!/usr/bin/env python3
"""Figure: a /metrics scrape at N declared surfaces, lean (the default) against Prometheus'
default 10 s scrape_timeout and the 1 s floor of issue 29.  Measured on the installed
package, the path `capalarm run` serves: exporters.prometheus.all_families, then
exporters.textformat.ScrapeCache.render (the HTTP server's cache), plain and gzip.

    python bench/metrics_scrape.py [--surfaces 100000] [--reps 3]

Each rep: a fresh snapshot of a pipeline that has run a few ticks of lognormal traffic (30 %
of surfaces silent), then
  - cold: the first scrape (an empty cache), text and gzip;
  - warm: the scrape after the next tick of the same traffic (most rows changed);
  - quiet: the scrape after a tick in which 1 % of the surfaces wrote, after one like it;
Anchors in the same run: the full exposition (http.metrics: full, every family) by the
one-shot writer (render_text, what every scrape cost before the cache), and
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

    for _ in range(args.reps):
        cache = ScrapeCache()
        snap, s = timed(p.snapshot, time.time(), 10, {}, {})
        note("snapshot", s)
        fams, s = timed(all_families, snap, [])
        note("families", s)
        body, s = timed(cache.render, fams)
        note("cold text", s)
        if body != render_text(fams):
            print("the cache and the one-shot writer disagree: no figure", file=sys.stderr)
            return 1
        zipped, s = timed(cache.render, fams, gzip=True)
        note("cold gzip", s)
        if gzip.decompress(zipped) != body:
            print("the gzip body does not decompress to the text: no figure", file=sys.stderr)
            return 1
        full, s = timed(render_text, all_families(snap, [], full=True))
        note("anchor full", s)
        for label, active in (("warm", 0.7), ("quiet", 0.01), ("quiet", 0.01)):
            tick(p, t, active, rng)
            t += 1
            snap = p.snapshot(time.time(), 10, {}, {})
            fams, f = timed(all_families, snap, [])
            zipped, s = timed(cache.render, fams, gzip=True)
            note(f"{label} families", f)
            note(f"{label} gzip", s)
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
        f"{series_count(full):,} series, {len(full) / 1e6:.1f} MB; median of {args.reps}:\n"
        f"  snapshot (alarm/pipeline.py, not the exporter)  {med['snapshot']:6.2f} s\n"
        f"  lean families                                   {med['families']:6.2f} s\n"
        f"  cold scrape: text                               {med['cold text']:6.2f} s\n"
        f"  cold scrape: gzip of it                         {med['cold gzip']:6.2f} s\n"
        f"  after a tick, 70 % writing: families + gzip     {med['warm families'] + med['warm gzip']:6.2f} s"
        f"   ({med['warm lines']:,.0f} lines rewritten)\n"
        f"  after a tick, 1 % writing: families + gzip      {med['quiet families'] + med['quiet gzip']:6.2f} s"
        f"   ({med['quiet lines']:,.0f} lines rewritten)\n"
        f"  anchor: full exposition, one-shot writer        {med['anchor full']:6.2f} s\n"
        f"  anchor: prometheus_client generate_latest, lean {client_s:6.2f} s (once)\n"
        f"code path: ScrapeCache over {code_path()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
