"""What the detector's native tick buys over its numpy code, by fleet size.

    python bench/detection/tick_paths.py [--sizes 10,1000,100000] [--ticks 40]

Issue 26 asks that each rule have one numeric definition, chosen by measurement.  Today the
core rules (spike, budget, beacon, duty, the aggregates' members statistic) are numpy code
with a C twin (``_fused.c``, ``_whole_tick.c``); this prints the median ``evaluate_arrays``
time of each path on the same traffic, in the same process: the installed package's native
whole tick first, then the numpy code alone (``fused.native_module = None``, what runs where
no compiler was at install).  Traffic as in tick_cost.py: each surface at its own lognormal
level with heavy-tailed noise, 30 % silent, an hour of warm-up.  The registered rules
(rules/) are numpy on both paths.
"""

from __future__ import annotations

import argparse
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


def median_tick_ms(n: int, ticks: int) -> tuple[float, str]:
    rng = np.random.default_rng(7)
    config = config_from_dict(
        {
            "tick": f"{TICK:g}s",
            "surfaces": [
                {"name": f"s{i}", "match": {"dport": [i % 65536]}, "spike": {"min_history": "10m"}}
                for i in range(n)
            ],
        }
    )
    keys = [("egress", f"s{i}") for i in range(n)] + [("egress", "unclassified")]
    det = Detector(config, keys)
    level = rng.lognormal(6, 1.5, len(keys))
    silent = rng.random(len(keys)) < 0.3

    def traffic() -> tuple[np.ndarray, np.ndarray]:
        b = np.round(level * TICK * np.exp(0.3 * rng.standard_t(5, level.size)))
        b[silent] = 0.0
        return b, np.ceil(b / 800)

    warm = int(3600 / TICK)
    times = []
    for t in range(warm + ticks):
        b, e = traffic()
        t0 = time.perf_counter()
        det.evaluate_arrays(T0 + (t + 1) * TICK, TICK, b, e, lambda _k: [])
        if t >= warm:
            times.append(time.perf_counter() - t0)
    # The default rules (no seasonal budget, no drop rule) take the whole tick where built.
    path = "native whole tick" if fused.native() is not None else "numpy"
    return statistics.median(times) * 1e3, path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,1000,100000")
    ap.add_argument("--ticks", type=int, default=40)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if fused.native() is None:
        print("the native extension is not built: nothing to compare")
        return 1
    native = {n: median_tick_ms(n, args.ticks) for n in sizes}
    fused.native_module = None  # every later Detector and pass runs its numpy code
    numpy_only = {n: median_tick_ms(n, args.ticks) for n in sizes}
    print("## Detector tick: native whole tick against the numpy code (same run)\n")
    print("| surfaces | native whole tick, ms | numpy alone, ms | numpy / native |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        (a, pa), (b, pb) = native[n], numpy_only[n]
        assert pa == "native whole tick" and pb == "numpy", (pa, pb)
        print(f"| {n:,} | {a:.3f} | {b:.3f} | {b / a:.1f}x |")
    print(
        "\ncode paths: alarm/detector/_whole_tick.c + _fused.c (native), alarm/detector/*.py "
        "(numpy); the registered rules (alarm/detector/rules/) are numpy on both."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
