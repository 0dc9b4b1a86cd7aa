#!/usr/bin/env python3
"""Figure: what saving the detector state costs at 100 and at 100,000 surfaces.

    python bench/state_save.py [--surfaces 100,100000] [--reps 3]

For each surface count, a detector that has judged 400 ticks of 10 s in which 50 surfaces wrote
(few changed, the rest declared and idle; past the spike rule's warm-up hour, so the profiles
learn: a daily profile's current slot, a weekly one's current hour) is saved through the
installed StateStore, as the service's checkpoint saves it (alarm/statesave.py): the fast group
(alert states, sums, recent levels) with every checkpoint, the slow group (learned profiles) on
its own cadence.

Two saves of each group are timed: the *first* into an empty state directory (what the first
start of a service writes: everything), and the *next*, after one more tick has been judged
(what a running or restarted service saves: the state moved by one tick; a store that saves
only what changed writes little of it).  Saving the same unchanged state again would measure
nothing a service does.  Prints each save's cost, the bytes handed over and the bytes written
(StateStore.last_save, where the store reports it), how often the service saves it
(SAVE_FACTOR times its cost, at least every tick) and what that comes to per 10 s tick; and, as
the anchor in the same run, the earlier save (every array as base64 JSON, every tick).  Medians
over --reps (a fresh directory for each first save; a judged tick before each next save); each
save is a real SQLite transaction in a temporary directory.
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
# Past the spike rule's warm-up hour (360 ticks of 10 s): the profiles learn.
JUDGED = 400


def timed(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


class Judged:
    """A detector of ``n`` declared surfaces, 50 of them written each tick."""

    def __init__(self, n: int) -> None:
        config = config_from_dict(
            {
                "tick": f"{TICK:g}s",
                "surfaces": [{"name": f"s{i}", "match": {"dport": [i % 65536]}} for i in range(n)],
            }
        )
        self.det = Detector(
            config, [("egress", f"s{i}") for i in range(n)] + [("egress", "unclassified")]
        )
        self.rng = np.random.default_rng(1)
        self.now = (time.time() // TICK) * TICK - (JUDGED + 100) * TICK
        for _ in range(JUDGED):
            self.tick()

    def tick(self) -> None:
        rows = self.det.members
        self.now += TICK
        nbytes = np.zeros(rows)
        events = np.zeros(rows)
        written = self.rng.choice(rows, min(WRITTEN, rows), replace=False)
        nbytes[written] = self.rng.integers(100, 10_000, len(written))
        events[written] = 1
        self.det.evaluate_arrays(self.now, TICK, nbytes, events, lambda row: [])


def written_mb(store: StateStore) -> float:
    """The bytes the last save wrote, as the store reports them (NaN: it does not)."""
    stats = getattr(store, "last_save", None)
    return stats.written_bytes / 1e6 if stats is not None else float("nan")


def measure(n: int, reps: int) -> dict[str, float]:
    j = Judged(n)
    det = j.det
    out: dict[str, float] = {"rows": len(det.keys)}

    def save(store: StateStore, group: str) -> None:
        store.save({}, groups={group: (det.state_header(), det.state_arrays(group))})

    for g in ("fast", "slow"):
        firsts, nexts, wrote = [], [], []
        for _ in range(reps):
            with tempfile.TemporaryDirectory(prefix="capalarm-state-") as tmp:
                store = StateStore(tmp)
                t0 = time.perf_counter()
                save(store, g)
                firsts.append(time.perf_counter() - t0)
                j.tick()
                t0 = time.perf_counter()
                save(store, g)
                nexts.append(time.perf_counter() - t0)
                wrote.append(written_mb(store))
                store.close()
        out[f"{g}_first"] = statistics.median(firsts)
        out[g] = statistics.median(nexts)
        out[f"{g}_written_mb"] = statistics.median(wrote)
        out[f"{g}_mb"] = sum(a.nbytes for a in det.state_arrays(g).values()) / 1e6
    with tempfile.TemporaryDirectory(prefix="capalarm-state-") as tmp:
        store = StateStore(tmp)
        out["anchor"] = timed(lambda: store.save({"detector": det.to_state()}, key="old"), reps)
        store.close()
    out["anchor_mb"] = len(json.dumps(det.to_state(), separators=(",", ":"))) / 1e6
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
    print(
        f"median of {args.reps}; {JUDGED} ticks judged, {WRITTEN} surfaces written per "
        f"{TICK:g} s tick; StateStore from {sys.modules[StateStore.__module__].__file__}"
    )
    for n in counts:
        r = measure(n, args.reps)
        per_tick = r["fast_per_tick"] + r["slow_per_tick"]
        print(f"{n:,} surfaces ({r['rows']:,} rows)")
        for g, what in (("fast", "checkpoint (fast group)"), ("slow", "profiles (slow group)")):
            print(
                f"  {what:24} first {r[g + '_first']:7.3f} s  next {r[g]:7.3f} s  "
                f"{r[g + '_mb']:7.1f} MB, next wrote {r[g + '_written_mb']:7.1f} MB  every "
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
