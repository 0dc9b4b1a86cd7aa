"""Backtest of write events: events/s and peak memory of `capalarm backtest` on a fleet's
write-event JSON lines, next to a plain Python reference detector reading the same file.

    python bench/backtest_events.py [--surfaces 37] [--days 14] [--reps 3] [--workers 2]

The fleet: ``--surfaces`` surfaces at 10 s ticks for ``--days`` days, each writing in about
half of its ticks (sizes lognormal), as JSON lines ``{"ts", "surface", "bytes", "events"}`` in
time order — 2.24M events for 37 surfaces over 14 days.  Runs, median of ``--reps`` each:

- ``capalarm backtest`` (the installed command: the service's pipeline with a replay clock;
  every surface declared with its kind, default settings), its peak RSS from the kernel's
  accounting of the child;
- the anchor: a plain Python loop that parses each line with ``json.loads`` and runs a
  one-sided CUSUM per surface per tick (the least a detector does).

Prints events/s of both, the ratio, peak RSS, and whether memory grew with the input (a run
at twice the days must not need twice the memory).  Floor: >= 500k events/s.
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


def generate(path: Path, surfaces: int, days: float, seed: int = 1) -> int:
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
            for (name, _), level in zip(names, levels, strict=True):
                if rng.random() < 0.5:
                    nbytes = int(level * rng.lognormvariate(0, 0.5))
                    lines.append(
                        f'{{"ts": {ts:.0f}, "surface": "{name}", "bytes": {nbytes}, "events": 1}}\n'
                    )
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


def run_capalarm(path: Path, workers: int) -> tuple[float, float, dict]:
    exe = shutil.which("capalarm")
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
        [sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, check=False
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
    exe = shutil.which("capalarm")
    python = Path(exe).with_name("python") if exe else Path(sys.executable)
    proc = subprocess.run(
        [str(python if python.exists() else sys.executable), "-c", probe],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # the installed package, not this checkout
        check=False,
    )
    return proc.stdout.strip() or f"unknown ({proc.stderr.strip()[-200:]})"


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
        ref = statistics.median(reference(path) for _ in range(args.reps))
        runs = [run_capalarm(path, args.workers) for _ in range(args.reps)]
        secs = statistics.median(r[0] for r in runs)
        peak = max(r[1] for r in runs)
        summary = runs[-1][2]
        double = Path(tmp) / "events2.jsonl"
        n2 = generate(double, args.surfaces, args.days * 2)
        secs2, peak2, _ = run_capalarm(double, args.workers)
    rate = n / secs
    print(
        f"{n:,} write events ({args.surfaces} surfaces x {args.days:g} days at 10 s), "
        f"median of {args.reps}; capalarm {summary.get('ticks', 0):,} ticks"
    )
    print(f"  capalarm backtest   {rate:12,.0f} events/s  {secs:7.2f} s  peak RSS {peak:6.0f} MB")
    print(f"  python reference    {n / ref:12,.0f} events/s  {ref:7.2f} s")
    print(f"  ratio               {ref / secs:5.2f}x the reference")
    print(
        f"  twice the days      {n2 / secs2:12,.0f} events/s  {secs2:7.2f} s  "
        f"peak RSS {peak2:6.0f} MB ({peak2 / peak:.2f}x the memory for 2x the input)"
    )
    print(f"code path: {code_path()}")
    met = rate >= FLOOR
    print(f"floor: >= {FLOOR:,.0f} events/s: {'met' if met else 'MISSED'} ({rate:,.0f})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
