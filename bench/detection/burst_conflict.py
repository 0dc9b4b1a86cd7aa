"""How often benign surfaces of the held-out fleets look like the smallest burst issue 11 names.

    python bench/detection/burst_conflict.py [--seeds 1-5] [--factor 31]

Issue 11 asks for every burst of >= 30x a surface's level for a minute to be detected within
two ticks, and for at most one false alarm per surface-week in the worst family.  A burst adds
30-50x the level on top of what the surface writes, so its ticks carry at least ``--factor``
(31) times the level.  This counts, on the benign twins of the main fleets (no attacks), the
incidents per surface-week in which a surface's own ticks reach that: one tick, and two ticks
in a row (what a detector that pages on every such burst within two ticks must page on).  An
incident is a run of such ticks; a minute (6 ticks) without one ends it, as a pager counts.
Anchor: the false-alarm floor of the worst family, 1 per surface-week.

Runs on choice seeds by default: it reads benign traffic only and chooses nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.detection import fleets  # noqa: E402
from bench.detection.heldout import parse_seeds  # noqa: E402

FAMILIES = ("cache", "burst", "intermittent-lognormal", "intermittent-pareto", "workday")
RUN_GAP = 6  # ticks without one that end an incident (a minute at 10 s)


def level_of(params: dict[str, float]) -> float:
    """A surface's level as fleets.py defines it: median write x mean writes per written
    tick (the Pareto family's median is x_m 2^(1/alpha))."""
    if "median" in params:
        median = params["median"]
    else:
        median = params["x_m"] * 2.0 ** (1.0 / params["alpha"])
    return median * (1.0 + params["extra_writes"])


def incidents(hit: np.ndarray) -> int:
    idx = np.flatnonzero(hit)
    return int((np.diff(idx, prepend=-RUN_GAP - 1) > RUN_GAP).sum()) if idx.size else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("1-5"))
    ap.add_argument("--factor", type=float, default=31.0)
    args = ap.parse_args(argv)
    one: dict[str, list[float]] = {f: [] for f in FAMILIES}
    two: dict[str, list[float]] = {f: [] for f in FAMILIES}
    for seed in args.seeds:
        fleet = fleets.main_fleet(seed, attacks=False)
        weeks = fleet.clock.ticks * fleet.clock.tick / (7 * 86400.0)
        for j, s in enumerate(fleet.surfaces):
            if s.family not in one:
                continue
            hit = fleet.nbytes[:, j] >= args.factor * level_of(s.params)
            one[s.family].append(incidents(hit) / weeks)
            two[s.family].append(incidents(hit[1:] & hit[:-1]) / weeks)
    print(
        f"benign main fleets, seeds {args.seeds[0]}-{args.seeds[-1]}: incidents per "
        f"surface-week in which a surface's own ticks reach {args.factor:g}x its level"
    )
    print(f"{'family':24s} {'surfaces':>8s} {'one tick':>9s} {'two in a row':>13s}")
    for family in FAMILIES:
        a, b = np.array(one[family]), np.array(two[family])
        print(f"{family:24s} {a.size:8d} {a.mean():9.2f} {b.mean():13.2f}")
    print("anchor: the worst family's false-alarm floor, 1 per surface-week")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
