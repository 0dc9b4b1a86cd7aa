"""Kernel-log ingest floors (issue 29): CPU per line of ``capalarm backtest`` in both syslog
timestamp styles at 200 and 20,000 distinct flows, against Debian's mtail and a C program
summing LEN= fields (bench/lensum.c, compiled here with gcc), all measured in this run; and
the live file source's follow rate on a kern.log.

    python bench/kernel_ingest.py [--lines 400000] [--reps 3] [--skip mtail]

CPU is user+system time of each child (resource.getrusage), median of --reps; every tool's
totals are checked against the corpus's true totals (bench/gen_fence_corpus.py).  The
backtest is the console script pip installed beside this interpreter (not a version
manager's shim in front of it, a shell script that cost ~0.05 s a run here), loading its
modules from bytecode as an installed wheel does (pip compiles at install; this machine sets
PYTHONDONTWRITEBYTECODE, and compiling every module cost ~0.15 s a run): the children get a
bytecode cache under bench/out/pycache, filled by one run before timing.  Beside each
corpus: the backtest of a one-line kern.log (its fixed cost: start-up, config, pool) and the
scanner alone (``scan_flows``, native and regex path, one core, in this process), so the
cost per line past start-up is seen too.  The live
figure runs the file source's own parts in this process -- FileTailCollector with the
native chunk reader and FenceReader, as ``type: file`` builds them -- over a kern.log
written beforehand, polled until caught up: lines/s (wall) and CPU per line, with the
records it counted checked exactly.  Floors: backtest CPU <= mtail / 20 and <= 3x the C
program; live >= 1M lines/s.  Exits 1 if a total is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def corpus(lines: int, stamps: str, flows: int) -> tuple[Path, dict[str, Any]]:
    path = OUT / f"kern-{lines}-{stamps}-f{flows}.log"
    totals = Path(str(path) + ".totals.json")
    if not (path.exists() and totals.exists()):
        OUT.mkdir(parents=True, exist_ok=True)
        gen = [sys.executable, str(HERE / "gen_fence_corpus.py"), "--lines", str(lines)]
        gen += ["--out", str(path), "--stamps", stamps, "--flows", str(flows), "--seed", "1"]
        subprocess.run(gen, check=True, stdout=subprocess.DEVNULL)
    return path, json.loads(totals.read_text())


def child_env() -> dict[str, str]:
    """The children's environment: modules loaded from bytecode, as installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(OUT / "pycache")
    return env


def backtest_command() -> list[str]:
    """The installed console script beside this interpreter (else on PATH, else -m)."""
    beside = Path(sys.executable).parent / "capalarm"
    exe = str(beside) if beside.exists() else shutil.which("capalarm")
    return [exe] if exe else [sys.executable, "-m", "alarm.cli"]


def child_cpu(cmd: list[str]) -> tuple[float, str, str]:
    """(user+sys CPU seconds of the child, stdout, stderr)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {proc.stderr[-1500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, proc.stdout, proc.stderr


def run_mtail(path: Path, totals: dict[str, Any]) -> tuple[float, bool]:
    cmd = [shutil.which("mtail") or "mtail", "--one_shot", "--one_shot_format=json"]
    cmd += ["--progs", str(HERE / "mtail"), "--logs", str(path), "--logtostderr", "--port", "0"]
    cpu, out, _ = child_cpu(cmd)
    metrics = json.loads(out)
    got = [
        sum(
            int(lv["Value"]["Value"]) for m in metrics.get(n, []) for lv in m.get("LabelValues", [])
        )
        for n in ("fence_packets_total", "fence_bytes_total")
    ]
    return cpu, got == [totals["packets"], totals["bytes"]]


def run_lensum(exe: Path, path: Path, totals: dict[str, Any]) -> tuple[float, bool]:
    cpu, out, _ = child_cpu([str(exe), str(path)])
    return cpu, out.split() == [str(totals["packets"]), str(totals["bytes"])]


def run_backtest(path: Path, totals: dict[str, Any]) -> tuple[float, bool, dict[str, Any]]:
    cmd = backtest_command()
    cmd += [
        "backtest",
        "--config",
        str(HERE / "fence_bench.yaml"),
        str(path),
        "--output",
        "/dev/null",
    ]
    cpu, _, err = child_cpu(cmd)
    summary = next(
        json.loads(line)["backtest"]
        for line in reversed(err.splitlines())
        if line.startswith('{"backtest"')
    )
    ok = summary["records"] == totals["packets"] and summary["lines"] == totals["lines"]
    return cpu, ok, summary


def one_line(path: Path) -> tuple[Path, dict[str, Any]]:
    """A kern.log of the corpus's first fence line, and its totals."""
    with open(path, "rb") as fh:
        line = next(x for x in fh if b"EGRESS_FENCE" in x and b" LEN=" in x)
    small = OUT / f"one-{path.name}"
    small.write_bytes(line)
    return small, {"lines": 1, "packets": 1}


def scanner_alone(path: Path, native: bool) -> float:
    """CPU seconds of ``scan_flows`` over the corpus in 8 MB chunks, one core, in this
    process (reading the chunks excepted)."""
    from alarm.backtest import SPLIT_BYTES, _ranges, read_range
    from alarm.collectors.kernel.fastscan import scan_flows

    year = time.gmtime().tm_year
    spans = _ranges(path.stat().st_size, 1)
    chunks = [read_range(str(path), a, b) for a, b in spans]
    assert all(len(c) <= 2 * SPLIT_BYTES for c in chunks)
    c0 = time.process_time()
    for data in chunks:
        scan_flows(data, "syslog", ("EGRESS_FENCE",), 10.0, year, native=native)
    return time.process_time() - c0


def run_live(path: Path, totals: dict[str, Any]) -> tuple[float, float, bool]:
    """(wall seconds, CPU seconds, exact) of the file source's tailer and reader catching up
    with ``path``."""
    from alarm.collectors.kernel.fence import FenceReader
    from alarm.collectors.kernel.file import fence_chunk_reader, kernel_line_parser
    from alarm.collectors.kernel.tail import FileTailCollector

    year = time.gmtime().tm_year
    reader = FenceReader(("EGRESS_FENCE",), False, 10.0)
    chunks = fence_chunk_reader(reader, "syslog", 0.0, year)
    if chunks is None:
        raise RuntimeError("the native scanner is not built")
    tailer = FileTailCollector(
        "kern", [str(path)], kernel_line_parser("syslog", 0.0, year), batch_lines=1 << 20
    )
    tailer.reader, tailer.chunk_reader = reader.read, chunks
    counted = {"packets": 0, "bytes": 0}

    async def emit(batch: Any) -> None:
        ev = batch.read.events if batch.read is not None else None
        if ev is not None:
            counted["packets"] += int(ev.events.sum())
            counted["bytes"] += int(ev.nbytes.sum())

    async def follow() -> None:
        while await tailer.poll(emit):
            pass
        await tailer.close()

    c0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(follow())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    exact = (
        counted == {"packets": totals["packets"], "bytes": totals["bytes"]}
        and tailer.totals["records_read"] == totals["lines"]
    )
    return wall, cpu, exact


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip", action="append", default=[], choices=["mtail", "live"])
    args = ap.parse_args()
    exe = OUT / "lensum"
    OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "lensum.c")], check=True)
    failed = False
    print(f"load average {os.getloadavg()[0]:.2f} at start; backtest: {backtest_command()[0]}")
    print(
        f"{'corpus':34s} {'mtail':>9s} {'C LEN=':>9s} {'backtest':>9s}  (CPU ns/line, median of {args.reps})"
    )
    for stamps in ("rfc3164", "rfc3339"):
        for flows in (200, 20_000):
            path, totals = corpus(args.lines, stamps, flows)
            n = totals["lines"]
            runs: dict[str, list[float]] = {"mtail": [], "lensum": [], "backtest": []}
            ok = True
            summary: dict[str, Any] = {}
            small, small_totals = one_line(path)
            fixed: list[float] = []
            run_backtest(small, small_totals)  # fills the bytecode cache, as pip would have
            for _ in range(args.reps):  # interleaved: a shared machine's load falls on all
                if "mtail" not in args.skip:
                    cpu, good = run_mtail(path, totals)
                    runs["mtail"].append(cpu)
                    ok &= good
                cpu, good = run_lensum(exe, path, totals)
                runs["lensum"].append(cpu)
                ok &= good
                cpu, good, summary = run_backtest(path, totals)
                runs["backtest"].append(cpu)
                ok &= good
                cpu, good, _ = run_backtest(small, small_totals)
                fixed.append(cpu)
                ok &= good
            med = {
                k: statistics.median(v) * 1e9 / n if v else float("nan") for k, v in runs.items()
            }
            ratio_m = med["mtail"] / med["backtest"]
            ratio_c = med["backtest"] / med["lensum"]
            print(
                f"{stamps} {flows:>6,} flows {n:,} lines   {med['mtail']:9.0f} {med['lensum']:9.0f} "
                f"{med['backtest']:9.0f}  mtail/backtest {ratio_m:5.1f}x (floor 20x: "
                f"{'met' if ratio_m >= 20 else 'MISSED'}), backtest/C {ratio_c:4.1f}x (floor 3x: "
                f"{'met' if ratio_c <= 3 else 'MISSED'})  totals {'ok' if ok else 'WRONG'}"
            )
            print(
                f"{'':34s} backtest read by: {summary.get('scanner')}, "
                f"{summary.get('handed_back')} lines handed back"
            )
            start = statistics.median(fixed)
            past = med["backtest"] - start * 1e9 / n
            scans = {native: scanner_alone(path, native) * 1e9 / n for native in (True, False)}
            print(
                f"{'':34s} backtest of one line: {start:.3f} s CPU (fixed cost); past it "
                f"{past:.0f} ns/line; scan_flows alone, one core: native "
                f"{scans[True]:.0f} ns/line, regex {scans[False]:.0f} ns/line"
            )
            failed |= not ok
    if "live" not in args.skip:
        path, totals = corpus(args.lines, "rfc3339", 20_000)
        walls, cpus, exact = [], [], True
        for _ in range(args.reps):
            wall, cpu, good = run_live(path, totals)
            walls.append(wall)
            cpus.append(cpu)
            exact &= good
        n = totals["lines"]
        rate = n / statistics.median(walls)
        print(
            f"live file source, {path.name}: {rate:,.0f} lines/s, "
            f"{statistics.median(cpus) * 1e9 / n:.0f} ns CPU/line (floor 1M lines/s: "
            f"{'met' if rate >= 1e6 else 'MISSED'}), counts {'exact' if exact else 'WRONG'}"
        )
        failed |= not exact
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
