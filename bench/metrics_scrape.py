#!/usr/bin/env python3
"""Figure: a /metrics scrape at N declared surfaces (snapshot + text format), against
Prometheus' default 10 s scrape_timeout.  Anchor: the same families written by the Python
series writer in the same run (what a host without the C extension runs; byte-identical, and
checked so).

    python bench/metrics_scrape.py [--surfaces 100000] [--reps 3]

Each rep takes a fresh snapshot of a pipeline that has run a few ticks of lognormal traffic
(30 % of surfaces silent), then renders it both ways; medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.append(str(REPO))  # after site-packages: an installed capalarm is what runs

from alarm.config import config_from_dict  # noqa: E402
from alarm.pipeline import Pipeline  # noqa: E402
from exporters.prometheus import all_families  # noqa: E402
from exporters.textformat import code_path, render_text  # noqa: E402

T0 = 1_780_000_000.0
TICK = 10.0


def pipeline(n: int, ticks: int) -> Pipeline:
    cfg = config_from_dict(
        {
            "tick": f"{TICK:g}s",
            "state_dir": "/nonexistent/unused",
            "surfaces": [{"name": f"s{i}", "match": {"dport": [i % 65536]}} for i in range(n)],
        }
    )
    p = Pipeline(cfg)
    rows = len(p.table)
    rng = np.random.default_rng(7)
    level = rng.lognormal(6, 1.5, rows)
    silent = rng.random(rows) < 0.3
    for t in range(ticks):
        b = np.round(level * TICK * np.exp(0.3 * rng.standard_t(5, rows)))
        b[silent] = 0
        p._evaluate(T0 + (t + 1) * TICK, b, np.ceil(b / 800), b, {}, False, True)
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--surfaces", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=5)
    args = ap.parse_args(argv)
    p = pipeline(args.surfaces, args.ticks)
    snap_s, native_s, python_s = [], [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        snap = p.snapshot(time.time(), 10, {}, {})
        families = list(all_families(snap, []))
        t1 = time.perf_counter()
        body = render_text(families)
        t2 = time.perf_counter()
        anchor = render_text(families, native=False)
        t3 = time.perf_counter()
        if body != anchor:
            print("the two writers disagree: no figure", file=sys.stderr)
            return 1
        snap_s.append(t1 - t0)
        native_s.append(t2 - t1)
        python_s.append(t3 - t2)
    med = statistics.median
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(
        f"{args.surfaces:,} surfaces, {series:,} series, {len(body) / 1e6:.1f} MB, median of "
        f"{args.reps}:\n"
        f"  snapshot + families          {med(snap_s):7.2f} s\n"
        f"  text, this path              {med(native_s):7.2f} s   scrape {med(snap_s) + med(native_s):.2f} s\n"
        f"  anchor: text, Python writer  {med(python_s):7.2f} s   scrape {med(snap_s) + med(python_s):.2f} s\n"
        f"  against Prometheus' default scrape_timeout of 10 s\n"
        f"code path: {code_path()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
