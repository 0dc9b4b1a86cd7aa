"""Backtest of write events: events/s and peak memory of `capalarm backtest` on a fleet's
write-event JSON lines, in the canonical key order and in another, next to the json.loads
path and a plain Python reference detector reading the same events.

    python bench/backtest_events.py [--surfaces 37] [--days 14] [--reps 3] [--workers 2]

The fleet: ``--surfaces`` surfaces at 10 s ticks for ``--days`` days, each writing in about
half of its ticks (sizes lognormal), as JSON lines in time order — 2.24M events for 37
surfaces over 14 days — written twice: in the canonical order ``{"ts", "surface", "bytes",
"events", "kind"}`` and reordered ``{"kind", "bytes", "ts", "surface", "events"}`` (a legal
order that capalarm once read only through json.loads, issue 26).  Runs, median of ``--reps``
each (a rep of each in turn), on the installed package:

- ``capalarm backtest`` on each file (the service's pipeline with a replay clock; every
  surface declared with its kind, default settings), its peak RSS from the kernel's
  accounting of the child, and which reader read the lines (the backtest's own summary:
  native or Python, and how many lines went through json.loads);
- the anchor, same run: ``capalarm backtest`` of the reordered file with the native reader
  turned off (``alarm.backtest.native_events = None`` in the command's process, which its
  forked workers inherit): every line through json.loads, the path reordered lines took;
- a plain Python loop that parses each line with ``json.loads`` and runs a one-sided CUSUM
  per surface per tick (the least a detector does).

Prints events/s of each, the ratios, peak RSS, and whether memory grew with the input (a run
at twice the days must not need twice the memory).  Floor: >= 500k events/s in both key
orders.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = 500_000.0
TICK = 10.0
T0 = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC


CANONICAL = ("ts", "surface", "bytes", "events", "kind")
REORDERED = ("kind", "bytes", "ts", "surface", "events")


def generate(
    path: Path, surfaces: int, days: float, seed: int = 1, order: tuple[str, ...] = CANONICAL
) -> int:
    rng = random.Random(seed)
    kinds = ["fs", "registry", "egress"]
    names = [(f"s{i:03d}", kinds[i % 3]) for i in range(surfaces)]
    levels = [math.exp(rng.uniform(6, 10)) for _ in names]
    ticks = int(days * 86400 / TICK)
    n = 0
    with open(path, "w") as fh:
        for t in range(ticks):
            ts = T0 + t * TICK
            lines = []
            for (name, kind), level in zip(names, levels, strict=True):
                if rng.random() < 0.5:
                    nbytes = int(level * rng.lognormvariate(0, 0.5))
                    value = {
                        "ts": f"{ts:.0f}",
                        "surface": f'"{name}"',
                        "bytes": str(nbytes),
                        "events": "1",
                        "kind": f'"{kind}"',
                    }
                    lines.append("{" + ", ".join(f'"{k}": {value[k]}' for k in order) + "}\n")
            fh.writelines(lines)
            n += len(lines)
    config = {
        "tick": "10s",
        "sources": [],
        "surfaces": [{"name": name, "kind": kind} for name, kind in names],
    }
    Path(str(path) + ".yaml").write_text(json.dumps(config))
    return n


def reference(path: Path) -> float:
    """Seconds for a plain Python detector: json.loads per line, a CUSUM per surface/tick."""
    t0 = time.perf_counter()
    sums: dict[str, float] = {}
    cusum: dict[str, float] = {}
    alarms = 0
    current = None
    with open(path) as fh:
        for line in fh:
            ev = json.loads(line)
            tick = int(ev["ts"] // TICK)
            if tick != current:
                for name, b in sums.items():
                    s = max(0.0, cusum.get(name, 0.0) + 8 * b - 1e6 * TICK)
                    cusum[name] = s
                    alarms += s > 1e8
                sums = {}
                current = tick
            sums[ev["surface"]] = sums.get(ev["surface"], 0.0) + ev["bytes"]
    return time.perf_counter() - t0


def installed_python() -> str:
    exe = shutil.which("capalarm")
    python = Path(exe).with_name("python") if exe else Path(sys.executable)
    return str(python if python.exists() else sys.executable)


# The installed command with the native reader of event lines turned off (its workers are
# forked from it and inherit that): every line through the Python reader.
WITHOUT_NATIVE = (
    "import sys; from alarm import backtest; backtest.native_events = None; "
    "from alarm.cli import main; sys.exit(main(sys.argv[1:]))"
)


def run_capalarm(path: Path, workers: int, native: bool = True) -> tuple[float, float, dict]:
    exe = shutil.which("capalarm")
    if not native:
        cmd = [installed_python(), "-c", WITHOUT_NATIVE]
    else:
        cmd = [exe] if exe else [sys.executable, "-m", "alarm.cli"]
    cmd += ["backtest", "--config", str(path) + ".yaml", str(path), "-o", "/dev/null"]
    cmd += ["--workers", str(workers)]
    # A fresh wrapper per run: its children's peak RSS is this run's (the backtest process
    # and its workers), not the largest of every run so far.
    wrapper = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "print('RSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(p.returncode)"
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", wrapper, *cmd],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # the installed package, not this checkout
        check=False,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"capalarm backtest failed: {proc.stderr[-2000:]}")
    lines = proc.stderr.strip().splitlines()
    peak_mb = int(lines[-1].split()[1]) / 1024
    summary = next(json.loads(x)["backtest"] for x in lines if x.startswith('{"backtest"'))
    return seconds, peak_mb, summary


def code_path() -> str:
    """What the installed package runs: the detector's path and the reader of event lines."""
    probe = (
        "from alarm.detector import fused; from alarm import backtest; "
        "print(fused.code_path() + '; event lines: ' + "
        "('native reader (alarm/_eventscan.c)' if backtest.native_events else 'regex reader'))"
    )
    proc = subprocess.run(
        [installed_python(), "-c", probe],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # the installed package, not this checkout
        check=False,
    )
    return proc.stdout.strip() or f"unknown ({proc.stderr.strip()[-200:]})"


def reader(summary: dict) -> str:
    """Which reader read the event lines, from the backtest's own summary."""
    if "json_lines" not in summary:  # an install from before issue 26 does not say
        return "not reported by this install"
    name = {"native": "native reader", "python": "Python reader"}.get(summary["scanner"], "?")
    return f"{name}, {summary['json_lines']:,} lines through json.loads"


def median_runs(workers: int, reps: int, configs: list[tuple[Path, bool]]) -> list[tuple]:
    """Median seconds, peak RSS and last summary of each (file, native) run, the runs
    interleaved (a rep of each in turn) so that a shared machine's load falls on all alike."""
    runs: list[list[tuple[float, float, dict]]] = [[] for _ in configs]
    for _ in range(reps):
        for i, (path, native) in enumerate(configs):
            runs[i].append(run_capalarm(path, workers, native))
    return [(statistics.median(r[0] for r in rs), max(r[1] for r in rs), rs[-1][2]) for rs in runs]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--surfaces", type=int, default=37)
    ap.add_argument("--days", type=float, default=14)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="capalarm-bt-") as tmp:
        path = Path(tmp) / "events.jsonl"
        n = generate(path, args.surfaces, args.days)
        other = Path(tmp) / "reordered.jsonl"
        n_other = generate(other, args.surfaces, args.days, order=REORDERED)
        assert n_other == n
        ref = statistics.median(reference(path) for _ in range(args.reps))
        (secs, peak, summary), (secs_o, peak_o, summary_o), (secs_j, peak_j, summary_j) = (
            median_runs(args.workers, args.reps, [(path, True), (other, True), (other, False)])
        )
        double = Path(tmp) / "events2.jsonl"
        n2 = generate(double, args.surfaces, args.days * 2)
        secs2, peak2, _ = run_capalarm(double, args.workers)
    rates = {"canonical key order": n / secs, "reordered keys": n / secs_o}
    print(
        f"{n:,} write events ({args.surfaces} surfaces x {args.days:g} days at 10 s), "
        f"median of {args.reps}; capalarm {summary.get('ticks', 0):,} ticks; "
        f"{args.workers} workers"
    )
    rows = [
        ("capalarm, canonical key order", n / secs, secs, peak, summary),
        ("capalarm, reordered keys", n / secs_o, secs_o, peak_o, summary_o),
        ("anchor: json.loads path, reordered", n / secs_j, secs_j, peak_j, summary_j),
    ]
    for label, rate, s, mb, summ in rows:
        print(f"  {label:36} {rate:10,.0f} events/s {s:7.2f} s  peak RSS {mb:4.0f} MB")
        print(f"  {'':36} event lines: {reader(summ)}")
    print(f"  {'python reference (json.loads+CUSUM)':36} {n / ref:10,.0f} events/s {ref:7.2f} s")
    print(
        f"  ratios: reordered {secs_j / secs_o:.2f}x the json.loads path, "
        f"{secs_o / secs:.2f}x the canonical time; canonical {ref / secs:.2f}x the reference"
    )
    print(
        f"  twice the days (canonical) {n2 / secs2:10,.0f} events/s {secs2:7.2f} s  "
        f"peak RSS {peak2:4.0f} MB ({peak2 / peak:.2f}x the memory for 2x the input)"
    )
    print(f"code path: {code_path()}")
    met = True
    for label, rate in rates.items():
        ok = rate >= FLOOR
        met = met and ok
        print(
            f"floor, {label}: >= {FLOOR:,.0f} events/s: {'met' if ok else 'MISSED'} ({rate:,.0f})"
        )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
