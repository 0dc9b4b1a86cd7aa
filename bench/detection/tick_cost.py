"""What one tick costs the detector at scale, next to detector v1's per-surface objects.

    python bench/detection/tick_cost.py [--surfaces 100000] [--ticks 30]

Declares N egress surfaces, each writing at its own level with heavy-tailed noise (30 %
silent), runs until the baselines (and the seasonal budget) judge, and prints the median ms/tick of ``Detector.evaluate_arrays`` (the vectorised core),
of ``Detector.evaluate`` (the same from the pipeline's list of TickTotals) and of the v1 loop
(RobustBaseline + CapacityBudget + AlertMachine per surface, as detector v1 evaluated them),
plus memory per surface: the detector's arrays, and the process RSS growth while building it.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after site-packages: an installed capalarm is what runs

from alarm.detector.baseline import RobustBaseline  # noqa: E402

from alarm.config import config_from_dict  # noqa: E402
from alarm.detector.alerts import AlertMachine  # noqa: E402
from alarm.detector.budget import CapacityBudget, capacity_bits  # noqa: E402
from alarm.detector.engine import Detector  # noqa: E402
from alarm.surfaces import TickTotals  # noqa: E402

TICK = 10.0
T0 = 1_780_000_000.0


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def traffic(
    rng: np.random.Generator, level: np.ndarray, silent: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A tick: each surface at its own level (bytes/s) with heavy-tailed noise; some silent."""
    nbytes = np.round(level * TICK * np.exp(0.3 * rng.standard_t(5, level.size)))
    nbytes[silent] = 0.0
    return nbytes, np.ceil(nbytes / 800)


def v1_tick(objs: list, nbytes: np.ndarray, events: np.ndarray, now: float) -> None:
    """The body of detector v1's evaluate(), per surface."""
    for i, (base, budget, spike, over) in enumerate(objs):
        b, e = int(nbytes[i]), int(events[i])
        rate = b / TICK
        excess = budget.update(capacity_bits(b, e, 64.0), TICK)
        if base.ready:
            spike.step(now, TICK, rate, base.threshold())
        base.learn(rate)
        over.step(now, TICK, excess, budget.rule.tolerance_bits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--surfaces", type=int, default=100_000)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--v1-surfaces", type=int, default=10_000, help="v1 is timed on fewer")
    args = ap.parse_args(argv)
    n = args.surfaces
    rng = np.random.default_rng(7)

    config = config_from_dict(
        {
            "tick": f"{TICK:g}s",
            "surfaces": [{"name": f"s{i}", "match": {"dport": [i % 65536]}} for i in range(n)],
        }
    )
    keys = [("egress", f"s{i}") for i in range(n)] + [("egress", "unclassified")]
    gc.collect()
    before = rss_mb()
    det = Detector(config, keys)
    after = rss_mb()
    # The TickTotals path is timed on a second detector fed the same ticks, so that each
    # detector sees each tick once (as the service's does).
    det_totals = Detector(config, keys)
    rows = len(det.keys)

    def never(_key):
        return []

    level = rng.lognormal(6, 1.5, len(keys))  # median 400 B/s, a wide spread of sizes
    silent = rng.random(len(keys)) < 0.3
    warm = int(config.surfaces[0].spike.min_history / TICK) + 5
    for t in range(warm):  # untimed: until the baselines judge
        nbytes, events = traffic(rng, level, silent)
        for d in (det, det_totals):
            d.evaluate_arrays(T0 + (t + 1) * TICK, TICK, nbytes, events, never)
    # The seasonal budget judges after a day and once the hour has a level: count the warm-up
    # as that day, so that the timed ticks run the rule as it runs in steady state.
    for d in (det, det_totals):
        d.relative.level_n[:] = int(np.ceil(d.relative.slot_ticks))
        d.relative.count[:] = d.relative.min_ticks
    core, full, changes = [], [], []
    for t in range(warm, warm + args.ticks):
        nbytes, events = traffic(rng, level, silent)
        now = T0 + (t + 1) * TICK
        t0 = time.perf_counter()
        changes.append(len(det.evaluate_arrays(now, TICK, nbytes, events, never)))
        core.append(time.perf_counter() - t0)
        totals = [
            TickTotals(k, int(b), int(e)) for k, b, e in zip(keys, nbytes, events, strict=True)
        ]
        t0 = time.perf_counter()
        det_totals.evaluate(now, TICK, totals, never)
        full.append(time.perf_counter() - t0)

    m = args.v1_surfaces
    rule = config.surfaces[0]
    objs = [
        (
            RobustBaseline(rule.spike, TICK),
            CapacityBudget(rule.effective_budget()),
            AlertMachine(f"egress/s{i}", "spike", 0, 30, 0.8),
            AlertMachine(f"egress/s{i}", "budget", 0, 30, 0.5),
        )
        for i in range(m)
    ]
    for obj in objs:  # a full window, as after an hour of running
        obj[0].load_state({"values": list(rng.lognormal(6, 1, 360))})
    v1 = []
    for t in range(max(3, args.ticks // 5)):
        nbytes, events = traffic(rng, level[:m], silent[:m])
        t0 = time.perf_counter()
        v1_tick(objs, nbytes, events, T0 + t * TICK)
        v1.append(time.perf_counter() - t0)
    v1_per = statistics.median(v1) / m

    med = statistics.median
    print(f"## Tick cost — {n:,} surfaces ({rows:,} rows with aggregates), tick {TICK:g}s\n")
    print("| | ms / tick (median) | µs / surface |")
    print("|---|---:|---:|")
    print(
        f"| v2 `evaluate_arrays` (vectorised core) | {med(core) * 1e3:.1f} | {med(core) / n * 1e6:.2f} |"
    )
    print(
        f"| v2 `evaluate` (from TickTotals) | {med(full) * 1e3:.1f} | {med(full) / n * 1e6:.2f} |"
    )
    print(
        f"| v1 per-surface objects (anchor; timed on {m:,}, scaled) | {v1_per * n * 1e3:,.0f} | "
        f"{v1_per * 1e6:.2f} |"
    )
    print(
        f"\nAlert changes per tick (median): {med(changes):.0f}; each costs Python time "
        "(figures, evidence), so a storm of thousands costs tens of ms more."
    )
    print(
        f"\nMemory per surface: {det.memory_bytes() / rows:,.0f} B of detector arrays; "
        f"process RSS grew {(after - before) * 2**20 / n:,.0f} B per surface building it "
        f"(v1 window alone: {objs[0][0]._window.nbytes:,} B per surface)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
