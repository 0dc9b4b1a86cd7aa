"""capalarm's false pages per surface-week by family and rule, and the spike rule's in the
fleets' first and second week: how close the false-page rate comes to what
``false_alarms_per_week`` (0.1 per surface and rule by default) says.

    python bench/detection/heldout.py --seeds 6-25 --keep DIR    # capalarm's alerts, kept
    python bench/detection/false_pages.py DIR [--seeds 6-25]

Reads the alerts each fleet's backtest left in ``DIR/<fleet>/alerts.jsonl`` (the fleets are
generated again from their seeds, as heldout.py made them) and scores them as heldout.py does:
pages are incidents, a false page is one starting outside every attack window on its target.
Anchor: the setting itself, 0.1 per surface-week for each rule.  The first week holds each
surface's first day of learning and the first sight of its rare legitimate events (a cache's
warm-ups, a burst family's bursts), which the tail learns after a page or two; the second
week is nearer the steady state.  Chooses nothing: run it on the report seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from alarm.config import config_from_dict  # noqa: E402
from bench.detection import builders as registry  # noqa: E402
from bench.detection import fleets, score  # noqa: E402
from bench.detection.heldout import (  # noqa: E402
    parse_fleets,
    parse_seeds,
    read_changes,
    resolve_window,
)

WEEK_S = 7 * 86400.0
SETTING = 0.1  # false_alarms_per_week, the default of every rule


def count(
    keep: Path,
    seeds: list[int],
    days: float | None,
    builders: tuple[str, ...] | list[str] = registry.DEFAULT_FLEETS,
) -> dict[tuple[str, str, int], list[float]]:
    """(family, rule, week) -> [false pages, benign surface-weeks]; week 0 or 1 (the rest).
    ``days`` None: each fleet's own (registry.DEFAULT_DAYS)."""
    out: dict[tuple[str, str, int], list[float]] = {}
    rules = ("spike", "budget", "duty", "beacon")
    for seed in seeds:
        for builder in builders:
            fleet = registry.FLEETS[builder](
                seed, registry.DEFAULT_DAYS[builder] if days is None else days
            )
            alerts = keep / fleet.name / "alerts.jsonl"
            if not alerts.exists():
                raise SystemExit(f"{alerts}: not found (run heldout.py with --keep {keep})")
            config = config_from_dict(fleets.capalarm_config(fleet))
            window = resolve_window(config, set())
            incs = score.incidents(read_changes(alerts), fleet.clock, window)
            benign = score.benign_masks(fleet)
            week = int(WEEK_S / fleet.clock.tick)
            for rule in rules:
                starts = score.incident_starts([i for i in incs if i.rule == rule])
                for name, family, _ in score.targets(fleet):
                    ok = benign[name]
                    s = np.asarray(starts.get(name, ()), dtype=np.int64)
                    s = s[(s >= 0) & (s < fleet.ticks)]
                    s = s[ok[s]]
                    for half, (lo, hi) in enumerate(((0, week), (week, fleet.ticks))):
                        cell = out.setdefault((family, rule, half), [0.0, 0.0])
                        cell[0] += float(((s >= lo) & (s < hi)).sum())
                        cell[1] += float(ok[lo:hi].sum()) * fleet.clock.tick / WEEK_S
    return out


def rate(cells: list[list[float]]) -> str:
    pages, weeks = sum(c[0] for c in cells), sum(c[1] for c in cells)
    return f"{pages / weeks:.2f} ({pages:.0f})" if weeks else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keep", type=Path, help="the --keep directory of a heldout.py run")
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("6-25"))
    ap.add_argument("--days", type=float, default=None, help="default: each fleet's own")
    ap.add_argument("--fleets", type=parse_fleets, default=list(registry.DEFAULT_FLEETS))
    args = ap.parse_args(argv)
    got = count(args.keep, args.seeds, args.days, args.fleets)
    families = sorted({f for f, _, _ in got})
    rules = sorted({r for _, r, _ in got})
    print(
        f"capalarm's false pages per surface-week (pages), seeds {args.seeds[0]}-"
        f"{args.seeds[-1]}; the setting: {SETTING:g} per surface and rule"
    )
    print("| family | " + " | ".join(rules) + " | spike, week 1 | spike, week 2 |")
    print("|---|" + "---:|" * (len(rules) + 2))
    for fam in [*families, None]:
        pick = (lambda f: True) if fam is None else (lambda f, fam=fam: f == fam)
        cells = [
            rate([v for (f, r, _), v in got.items() if pick(f) and r == rule]) for rule in rules
        ]
        weeks = [
            rate([v for (f, r, h), v in got.items() if pick(f) and r == "spike" and h == w])
            for w in (0, 1)
        ]
        label = "**overall**" if fam is None else fam
        print(f"| {label} | " + " | ".join(cells + weeks) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
