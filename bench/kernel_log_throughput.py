"""Kernel-log throughput: capalarm's backtest against Debian's mtail on the same kern.log.

    python bench/kernel_log_throughput.py [--lines 2000000] [--seed 1] [--reps 3]

Generates (or reuses, under bench/out/) a syslog kern.log corpus with
bench/gen_fence_corpus.py, then times, median of ``--reps`` runs each:

- ``mtail --one_shot`` with bench/mtail/fence.mtail (bytes and packets by destination and
  port), whose totals are checked against the corpus's true totals;
- ``capalarm backtest --config bench/fence_bench.yaml CORPUS --output /dev/null`` (parse,
  classify, aggregate, detect), whose record count is checked the same way;
- ``alarm.collectors.kernel.fastscan.scan_flows`` alone on one core, native scanner and regex path: the
  parser's share.

Prints lines/s for each and the ratio to mtail, and which code path each measured (the
backtest reports the scanner its workers ran; the in-process scanner says whether the
installed package has the native extension and where it was imported from, so a source tree
shadowing the installed package is visible).  The floor is backtest >= 5x mtail.  Exits 1 if a
tool's totals are wrong or the floor is missed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
FLOOR = 5.0


def corpus(lines: int, seed: int) -> tuple[Path, dict[str, int]]:
    path = OUT / f"kern-{lines}-s{seed}.log"
    totals_path = Path(str(path) + ".totals.json")
    if not (path.exists() and totals_path.exists()):
        OUT.mkdir(parents=True, exist_ok=True)
        print(f"generating {path} ...", file=sys.stderr)
        gen = [
            sys.executable,
            str(HERE / "gen_fence_corpus.py"),
            "--lines",
            str(lines),
            "--out",
            str(path),
        ]
        subprocess.run([*gen, "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    return path, json.loads(totals_path.read_text())


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return elapsed, proc


def mtail_totals(stdout: str) -> tuple[int, int]:
    """(packets, bytes) summed over every (dst, dport) series of the one-shot JSON dump."""
    metrics = json.loads(stdout)
    sums = {}
    for name in ("fence_packets_total", "fence_bytes_total"):
        sums[name] = sum(
            int(lv["Value"]["Value"])
            for m in metrics.get(name, [])
            for lv in m.get("LabelValues", [])
        )
    return sums["fence_packets_total"], sums["fence_bytes_total"]


def run_mtail(path: Path, reps: int, totals: dict[str, int]) -> dict[str, Any]:
    mtail = shutil.which("mtail")
    if mtail is None:
        return {"error": "mtail not installed (apt-get install mtail)"}
    cmd = [
        mtail,
        "--one_shot",
        "--one_shot_format=json",
        "--progs",
        str(HERE / "mtail"),
        "--logs",
        str(path),
    ]
    cmd += ["--logtostderr", "--port", "0"]
    times = []
    for _ in range(reps):
        elapsed, proc = timed(cmd)
        times.append(elapsed)
        counted = mtail_totals(proc.stdout)
    ok = counted == (totals["packets"], totals["bytes"])
    return {
        "seconds": statistics.median(times),
        "runs": times,
        "packets": counted[0],
        "bytes": counted[1],
        "ok": ok,
    }


def run_backtest(
    path: Path, reps: int, totals: dict[str, int], workers: int | None
) -> dict[str, Any]:
    exe = shutil.which("capalarm")
    cmd = [exe] if exe else [sys.executable, "-m", "alarm.cli"]
    cmd += [
        "backtest",
        "--config",
        str(HERE / "fence_bench.yaml"),
        str(path),
        "--output",
        "/dev/null",
    ]
    if workers:
        cmd += ["--workers", str(workers)]
    times, summary = [], {}
    for _ in range(reps):
        try:
            elapsed, proc = timed(cmd)
        except RuntimeError as exc:
            return {"error": str(exc)}
        times.append(elapsed)
        for line in proc.stderr.splitlines():  # the summary is the last JSON line on stderr
            if line.startswith('{"backtest"'):
                summary = json.loads(line)["backtest"]
    ok = summary.get("records") == totals["packets"] and summary.get("lines") == totals["lines"]
    return {
        "seconds": statistics.median(times),
        "runs": times,
        "summary": summary,
        "ok": ok,
        "path": f"{summary.get('scanner') or 'unknown'} scanner, {' '.join(cmd[:3])}",
    }


def run_scanner(path: Path, reps: int, totals: dict[str, int], native: bool) -> dict[str, Any]:
    """The scanner alone in this process, one core, over 16 MB byte ranges read beforehand:
    ``scan_flows`` (parse and sum per flow and tick) on the native path or the regex path."""
    import os

    import alarm
    from alarm.backtest import SPLIT_BYTES, read_range
    from alarm.collectors.kernel.fastscan import native_available, scan_flows

    where = str(Path(alarm.__file__).parent)
    if native and not native_available():
        return {
            "error": f"the native scanner is not built in the alarm package imported from {where} "
            "(pip install needs a C compiler; a source tree on sys.path shadows the installed one)"
        }
    size = os.path.getsize(path)
    chunks = [
        read_range(str(path), s, min(size, s + SPLIT_BYTES)) for s in range(0, size, SPLIT_BYTES)
    ]
    year = time.gmtime().tm_year
    times = []
    for _ in range(reps):
        lines = packets = nbytes = 0
        t0 = time.perf_counter()
        for chunk in chunks:
            res = scan_flows(chunk, "syslog", ("EGRESS_FENCE",), 10.0, year, native=native)
            lines += res.lines
            packets += res.records
            nbytes += int(res.nbytes.sum())
        times.append(time.perf_counter() - t0)
    ok = (lines, packets, nbytes) == (totals["lines"], totals["packets"], totals["bytes"])
    path_ran = "native scanner" if native else "regex path"
    return {
        "seconds": statistics.median(times),
        "runs": times,
        "ok": ok,
        "path": f"{path_ran}, alarm from {where}",
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, help="backtest worker processes (default: its own)")
    ap.add_argument(
        "--skip", action="append", default=[], choices=["mtail", "backtest", "scanners"]
    )
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()

    path, totals = corpus(args.lines, args.seed)
    n = totals["lines"]
    results: dict[str, dict[str, Any]] = {}
    if "mtail" not in args.skip:
        results["mtail one-shot"] = run_mtail(path, args.reps, totals)
    if "backtest" not in args.skip:
        results["capalarm backtest"] = run_backtest(path, args.reps, totals, args.workers)
    if "scanners" not in args.skip:
        results["scan_flows native (1 core)"] = run_scanner(path, args.reps, totals, True)
        results["scan_flows regex (1 core)"] = run_scanner(path, args.reps, totals, False)

    print(f"corpus: {path} ({n} lines, {totals['packets']} fence records, {totals['bytes']} bytes)")
    base = results.get("mtail one-shot", {}).get("seconds")
    failed = False
    for name, res in results.items():
        if "error" in res:
            print(f"  {name:28s} unavailable: {res['error']}")
            failed |= name == "capalarm backtest"
            continue
        rate = n / res["seconds"]
        ratio = f"{(base / res['seconds']):5.1f}x mtail" if base else ""
        check = "totals ok" if res["ok"] else "TOTALS WRONG"
        print(f"  {name:28s} {rate:12,.0f} lines/s  {res['seconds']:7.2f} s  {ratio}  {check}")
        if res.get("path"):
            print(f"  {'':28s} measured: {res['path']}")
        failed |= not res["ok"]
    bt = results.get("capalarm backtest", {})
    if base and "seconds" in bt:
        ratio = base / bt["seconds"]
        print(
            f"floor: backtest >= {FLOOR:.0f}x mtail: {'met' if ratio >= FLOOR else 'MISSED'} ({ratio:.1f}x)"
        )
        failed |= ratio < FLOOR
    if args.json:
        print(json.dumps({"corpus": str(path), "totals": totals, "results": results}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
