#!/usr/bin/env python3
"""Figure: what saving the detector state costs per tick at scale.

    python bench/state_save.py [--surfaces 100000] [--reps 3]

Prints, for the same detector in the same run: the service's save (fast group every tick; slow
group, the learned profiles, on its cadence) and, as the anchor, the earlier save (every array
as base64 JSON, every tick).  Medians over --reps; each save is a real SQLite transaction in a
temporary directory.
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

from alarm.config import config_from_dict
from alarm.detector.engine import Detector
from alarm.service import SLOW_SAVE_FACTOR
from alarm.state import StateStore


def timed(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--surfaces", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    n = args.surfaces
    config = config_from_dict(
        {
            "tick": "10s",
            "surfaces": [{"name": f"s{i}", "match": {"dport": [i % 65536]}} for i in range(n)],
        }
    )
    det = Detector(config, [("egress", f"s{i}") for i in range(n)] + [("egress", "unclassified")])
    with tempfile.TemporaryDirectory(prefix="capalarm-state-") as tmp:
        store = StateStore(tmp)

        def save(group: str) -> None:
            store.save({}, groups={group: (det.state_header(), det.state_arrays(group))})

        def old() -> None:
            store.save({"detector": det.to_state()}, key="old")

        fast = timed(lambda: save("fast"), args.reps)
        slow = timed(lambda: save("slow"), args.reps)
        anchor = timed(old, args.reps)
        size = {g: sum(a.nbytes for a in det.state_arrays(g).values()) for g in ("fast", "slow")}
        old_size = len(json.dumps(det.to_state(), separators=(",", ":")))
        store.close()
    every = SLOW_SAVE_FACTOR * slow
    print(f"{n:,} surfaces ({len(det.keys):,} rows), median of {args.reps}")
    print(f"  fast group, every tick:       {fast:7.3f} s  {size['fast'] / 1e6:7.1f} MB")
    print(f"  slow group, every {every:5.0f} s:  {slow:7.3f} s  {size['slow'] / 1e6:7.1f} MB")
    print(f"  anchor: base64 JSON per tick: {anchor:7.3f} s  {old_size / 1e6:7.1f} MB")
    print(f"  per-tick cost: {fast:.3f} s vs {anchor:.3f} s (x{anchor / fast:.1f} less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
