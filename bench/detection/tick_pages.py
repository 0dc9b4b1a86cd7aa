"""Figure: capalarm's false pages per surface-week, by family and rule, at a tick other than
the default 10 s, on the fleets a heldout.py run kept.  Anchor: the same fleets at 10 s (the
kept run's own alerts), side by side.

    python bench/detection/heldout.py --seeds 6-25 --keep DIR     # fleets and 10 s alerts
    python bench/detection/tick_pages.py DIR --tick 60s [--seeds 6-25] [--workers 2]

Each kept fleet's config.yaml is run again by ``run_backtest`` with only ``tick`` changed,
into DIR-<tick>/<fleet>/alerts.jsonl, and both are scored as false_pages.py scores them.  The
held-out bench runs 10 s ticks only; this shows what a user who sets another tick gets.
Chooses nothing.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.detection import builders  # noqa: E402
from bench.detection.false_pages import count, rate  # noqa: E402
from bench.detection.heldout import parse_seeds  # noqa: E402


def rerun(kept: Path, out: Path, tick: str) -> str:
    """The kept fleet's backtest again at ``tick``; returns the fleet's name."""
    from alarm.backtest import run_backtest
    from alarm.config import config_from_dict

    doc = yaml.safe_load((kept / "config.yaml").read_text())
    doc["tick"] = tick
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "alerts.jsonl", "w") as fh:
        run_backtest(config_from_dict(doc), [str(kept / "events.jsonl")], fh, workers=1)
    return kept.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keep", type=Path, help="the --keep directory of a heldout.py run")
    ap.add_argument("--tick", default="60s")
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("6-25"))
    ap.add_argument("--days", type=float, default=None, help="default: each fleet's own")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    other = args.keep.with_name(f"{args.keep.name}-{args.tick}")
    # fleets.py names each fleet "<builder>-s<seed>" (main-s6, sandbox-s6).
    names = [f"{b}-s{seed}" for seed in args.seeds for b in builders.DEFAULT_FLEETS]
    with ProcessPoolExecutor(args.workers) as pool:
        jobs = [pool.submit(rerun, args.keep / n, other / n, args.tick) for n in names]
        for job in jobs:
            job.result()
    base, moved = count(args.keep, args.seeds, args.days), count(other, args.seeds, args.days)
    rules = sorted({r for _, r, _ in base})
    families = sorted({f for f, _, _ in base})
    print(
        f"capalarm's false pages per surface-week (pages), seeds {args.seeds[0]}-"
        f"{args.seeds[-1]}: the default 10 s tick (anchor) against --tick {args.tick}"
    )
    print("| family | " + " | ".join(f"{r} 10s | {r} {args.tick}" for r in rules) + " |")
    print("|---|" + "---:|" * (2 * len(rules)))
    for fam in [*families, None]:
        cells = []
        for rule in rules:
            for got in (base, moved):
                pick = [v for (f, r, _), v in got.items() if fam in (None, f) and r == rule]
                cells.append(rate(pick))
        print(f"| {'**overall**' if fam is None else fam} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
