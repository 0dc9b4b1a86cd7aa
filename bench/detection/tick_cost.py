"""What one tick costs the detector at scale, next to SPOT as its author's library runs it.

    python bench/detection/tick_cost.py [--surfaces 100000] [--ticks 30] [--spot-surfaces 10000]

Declares N egress surfaces, each writing at its own level with heavy-tailed noise (30 %
silent), runs until nearly every surface has a spike statistic that judges (the bench lowers ``min_history`` to ten
minutes and ``min_peaks`` to 6 so that the warm-up takes minutes, not a day; what a tick
computes is the same), and prints the median ms/tick of ``Detector.evaluate_arrays`` (what
the pipeline calls each tick), plus memory per surface: the detector's arrays, and the
process RSS growth while building it.  The seasonal budget is off (its default).

Anchor, in the same run: libspot (PyPI; the C library of the SPOT paper's author), one
``Spot`` per surface stepped once per tick on one statistic, timed on ``--spot-surfaces`` and
scaled to N.  capalarm judges three statistics per surface, plus budgets, the beacon rule and
alert state, in that time.
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

from alarm.config import config_from_dict  # noqa: E402
from alarm.detector import fused  # noqa: E402
from alarm.detector.engine import Detector  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--surfaces", type=int, default=100_000)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--spot-surfaces", type=int, default=10_000, help="libspot is timed on fewer")
    args = ap.parse_args(argv)
    n = args.surfaces
    rng = np.random.default_rng(7)

    config = config_from_dict(
        {
            "tick": f"{TICK:g}s",
            "surfaces": [
                {
                    "name": f"s{i}",
                    "match": {"dport": [i % 65536]},
                    "spike": {"min_history": "10m", "min_peaks": 6},
                }
                for i in range(n)
            ],
        }
    )
    keys = [("egress", f"s{i}") for i in range(n)] + [("egress", "unclassified")]
    gc.collect()
    before = rss_mb()
    det = Detector(config, keys)
    after = rss_mb()
    rows = len(det.keys)

    def never(_key):
        return []

    level = rng.lognormal(6, 1.5, len(keys))  # median 400 B/s, a wide spread of sizes
    silent = rng.random(len(keys)) < 0.3
    t = 0
    while True:  # untimed: until (nearly) every row has a spike statistic that judges
        nbytes, events = traffic(rng, level, silent)
        det.evaluate_arrays(T0 + (t + 1) * TICK, TICK, nbytes, events, never)
        t += 1
        judging = 1.0 - float(det.spike.learning.mean())
        if t * TICK >= 3600 and (judging >= 0.95 or t * TICK >= 2 * 3600):
            break
    warm = t
    core, changes = [], []
    for t in range(warm, warm + args.ticks):
        nbytes, events = traffic(rng, level, silent)
        now = T0 + (t + 1) * TICK
        t0 = time.perf_counter()
        changes.append(len(det.evaluate_arrays(now, TICK, nbytes, events, never)))
        core.append(time.perf_counter() - t0)

    import libspot

    m = args.spot_surfaces
    spots = []
    for i in range(m):
        spot = libspot.Spot(q=1e-5, level=0.98, max_excess=200)
        spot.fit(np.log1p(level[i] * np.exp(0.3 * rng.standard_t(5, 2000))))
        spots.append(spot)
    spot_ticks = []
    for _ in range(max(3, args.ticks // 5)):
        x = np.log1p(traffic(rng, level[:m], silent[:m])[0] / TICK).tolist()
        t0 = time.perf_counter()
        for spot, v in zip(spots, x, strict=True):
            spot.step(v)
        spot_ticks.append(time.perf_counter() - t0)
    spot_per = statistics.median(spot_ticks) / m

    med = statistics.median
    print(f"## Tick cost — {n:,} surfaces ({rows:,} rows with aggregates), tick {TICK:g}s\n")
    print(f"Rows with a judging spike statistic after the warm-up: {judging:.0%} ({warm} ticks).\n")
    print("| | ms / tick (median) | µs / surface | mean ms | slowest ms |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| `evaluate_arrays` ({fused.code_path()}) | {med(core) * 1e3:.1f} | "
        f"{med(core) / n * 1e6:.2f} | {statistics.mean(core) * 1e3:.1f} | "
        f"{max(core) * 1e3:.1f} |"
    )
    print(
        f"| anchor: libspot `Spot.step`, one statistic per surface (timed on {m:,}, scaled) | "
        f"{spot_per * n * 1e3:,.1f} | {spot_per * 1e6:.2f} | | |"
    )
    print(
        "\nMean and slowest include the ticks that close a five-minute block (the ledger's "
        "windows, every 30 ticks at 10 s): time --ticks 30 or more to see one."
    )
    print(
        f"\nAlert changes per tick (median): {med(changes):.0f}; each costs Python time "
        "(figures, evidence), so a storm of thousands costs tens of ms more."
    )
    print(
        f"\nMemory per surface: {det.memory_bytes() / rows:,.0f} B of detector arrays; "
        f"process RSS grew {(after - before) * 2**20 / n:,.0f} B per surface building it."
    )
    print(
        f"\ncode path: {fused.code_path()}; the registered rules on weeks are numpy "
        "(alarm/detector/rules/)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
