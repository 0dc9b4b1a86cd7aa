#!/usr/bin/env python3
"""Figure: what saving the detector state costs at 100 and at 100,000 surfaces.

    python bench/state_save.py [--surfaces 100,100000] [--reps 3]

For each surface count, a detector that has judged 30 ticks of 10 s in which 50 surfaces wrote
(few changed, the rest declared and idle) is saved through the installed StateStore, as the
service's checkpoint saves it (alarm/statesave.py): the fast group (alert states, sums, recent
levels) with every checkpoint, the slow group (learned profiles) on its own cadence.  Prints
each save's cost and size, how often the service saves it (SAVE_FACTOR times its cost, at
least every tick) and what that comes to per 10 s tick; and, as the anchor in the same run,
the earlier save (every array as base64 JSON, every tick).  Medians over --reps; each save is a
real SQLite transaction in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(
        str(Path(__file__).resolve().parents[1])
    )  # after site-packages: an installed capalarm is what runs

import numpy as np

from alarm.config import config_from_dict
from alarm.detector.engine import Detector
from alarm.state import StateStore
from alarm.statesave import SAVE_FACTOR

TICK = 10.0
WRITTEN = 50


def timed(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def judged(n: int) -> Detector:
    config = config_from_dict(
        {
            "tick": f"{TICK:g}s",
            "surfaces": [{"name": f"s{i}", "match": {"dport": [i % 65536]}} for i in range(n)],
        }
    )
    det = Detector(config, [("egress", f"s{i}") for i in range(n)] + [("egress", "unclassified")])
    rows = det.members
    rng = np.random.default_rng(1)
    now = (time.time() // TICK) * TICK - 30 * TICK
    for _ in range(30):
        now += TICK
        nbytes = np.zeros(rows)
        events = np.zeros(rows)
        written = rng.choice(rows, min(WRITTEN, rows), replace=False)
        nbytes[written] = rng.integers(100, 10_000, len(written))
        events[written] = 1
        det.evaluate_arrays(now, TICK, nbytes, events, lambda row: [])
    return det


def measure(n: int, reps: int) -> dict[str, float]:
    det = judged(n)
    with tempfile.TemporaryDirectory(prefix="capalarm-state-") as tmp:
        store = StateStore(tmp)

        def save(group: str) -> None:
            store.save({}, groups={group: (det.state_header(), det.state_arrays(group))})

        def old() -> None:
            store.save({"detector": det.to_state()}, key="old")

        out = {
            "rows": len(det.keys),
            "fast": timed(lambda: save("fast"), reps),
            "slow": timed(lambda: save("slow"), reps),
            "anchor": timed(old, reps),
        }
        for g in ("fast", "slow"):
            out[f"{g}_mb"] = sum(a.nbytes for a in det.state_arrays(g).values()) / 1e6
        out["anchor_mb"] = len(json.dumps(det.to_state(), separators=(",", ":"))) / 1e6
        store.close()
    for g in ("fast", "slow"):
        every = max(TICK, SAVE_FACTOR * out[g])
        out[f"{g}_every"] = every
        out[f"{g}_per_tick"] = out[g] * TICK / every
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--surfaces", default="100,100000")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.surfaces.split(",")]
    print(f"median of {args.reps}; {WRITTEN} surfaces written per {TICK:g} s tick")
    for n in counts:
        r = measure(n, args.reps)
        per_tick = r["fast_per_tick"] + r["slow_per_tick"]
        print(f"{n:,} surfaces ({r['rows']:,} rows)")
        for g, what in (("fast", "checkpoint (fast group)"), ("slow", "profiles (slow group)")):
            print(
                f"  {what:24} {r[g]:7.3f} s  {r[g + '_mb']:7.1f} MB  every "
                f"{r[g + '_every']:5.0f} s  -> {r[g + '_per_tick']:.3f} s per tick"
            )
        print(f"  anchor: base64 JSON, every tick {r['anchor']:7.3f} s  {r['anchor_mb']:7.1f} MB")
        print(
            f"  per tick: {per_tick:.3f} s ({100 * per_tick / TICK:.1f} % of a tick) vs "
            f"{r['anchor']:.3f} s (x{r['anchor'] / per_tick:.1f} less)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
