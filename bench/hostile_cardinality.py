#!/usr/bin/env python3
"""Figure: hostile cardinality.  1M fence records, each to a distinct destination, through the
running service (file source).  Prints capalarm's series count before and after and its peak
RSS, next to Debian's mtail on the same corpus with a per-destination program (the usual way
to count bytes by destination), which is the anchor.

    python bench/hostile_cardinality.py [--lines 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
MTAIL_PROG = """\
counter capalarm_bench_bytes_by_dst by dst
/EGRESS_FENCE.* DST=(?P<dst>\\S+) LEN=(?P<len>\\d+)/ {
  capalarm_bench_bytes_by_dst[$dst] += $len
}
"""


def corpus(lines: int) -> Path:
    path = OUT / f"hostile-{lines}.log"
    if path.exists():
        return path
    OUT.mkdir(exist_ok=True)
    with open(path, "w") as fh:
        buf = []
        for i in range(lines):
            dst = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" if i < 1 << 24 else f"fd00::{i:x}"
            second = i // 2000
            buf.append(
                f"Nov 30 {10 + second // 3600 % 10:02d}:{second // 60 % 60:02d}:{second % 60:02d} host kernel: "
                f"[ {second}.000000] EGRESS_FENCE IN= OUT=eth0 SRC=10.99.0.2 DST={dst} LEN=60 TOS=0x00 "
                f"PREC=0x00 TTL=64 ID={i & 65535} DF PROTO=UDP SPT=40000 DPT={1 + i % 65000} LEN=40\n"
            )
            if len(buf) == 10000:
                fh.write("".join(buf))
                buf.clear()
        fh.write("".join(buf))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def run_capalarm(log: Path, lines: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="capalarm-hostile-"))
    port = free_port()
    cfg = work / "c.yaml"
    cfg.write_text(
        f"tick: 1s\nstate_dir: {work / 'state'}\nhttp: {{listen: 127.0.0.1:{port}}}\n"
        f"sources: [{{name: kern, type: file, paths: [{work / 'kern.log'}], format: syslog}}]\n"
        "surfaces:\n  - {name: proxy, match: {dst: [10.20.0.0/16], dport: [443]}}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "alarm.cli", "--log-level", "WARNING", "run", "--config", str(cfg)]
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                fetch(base + "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(2.5)  # a couple of ticks, so every per-source series exists
        before = series(fetch(base + "/metrics"))
        t0 = time.perf_counter()
        # Hand the service the corpus as a log that appears while it runs.
        shutil.copy(log, work / "kern.log")
        peak = 0
        while True:
            status = json.loads(fetch(base + "/api/v1/surfaces"))
            with open(f"/proc/{proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        peak = int(line.split()[1]) * 1024
            read = status["sources"][0]["records_read"]
            events = sum(s["events_total"] for s in status["surfaces"])
            if events >= lines:
                break
            if time.perf_counter() - t0 > 900:
                raise SystemExit(f"capalarm did not finish: {read} read, {events} counted")
            time.sleep(0.5)
        elapsed = time.perf_counter() - t0
        after = series(fetch(base + "/metrics"))
        return {
            "series_before": before,
            "series_after": after,
            "peak_rss_mb": peak / 2**20,
            "seconds": elapsed,
        }
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def run_mtail(log: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="mtail-hostile-"))
    (work / "progs").mkdir()
    (work / "progs/bytes.mtail").write_text(MTAIL_PROG)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    res = subprocess.run(
        [
            "mtail",
            "--one_shot",
            "--one_shot_format=prometheus",
            "--progs",
            str(work / "progs"),
            "--logs",
            str(log),
        ],
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    shutil.rmtree(work, ignore_errors=True)
    n = sum(
        1 for line in res.stdout.splitlines() if line.startswith("capalarm_bench_bytes_by_dst{")
    )
    return {
        "series_after": n,
        "peak_rss_mb": max(peak, before) / 1024,
        "seconds": elapsed,
        "rc": res.returncode,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    args = ap.parse_args()
    log = corpus(args.lines)
    cap = run_capalarm(log, args.lines)
    mt = run_mtail(log) if shutil.which("mtail") else None
    print(f"hostile cardinality: {args.lines:,} records, {args.lines:,} distinct destinations")
    print(f"{'':10} {'series before':>14} {'series after':>13} {'peak RSS MB':>12} {'seconds':>8}")
    print(
        f"{'capalarm':10} {cap['series_before']:>14} {cap['series_after']:>13} {cap['peak_rss_mb']:>12.1f} {cap['seconds']:>8.1f}"
    )
    if mt:
        print(
            f"{'mtail':10} {'':>14} {mt['series_after']:>13} {mt['peak_rss_mb']:>12.1f} {mt['seconds']:>8.1f}"
        )
    ok = cap["series_after"] == cap["series_before"] and cap["peak_rss_mb"] < 200
    print(json.dumps({"capalarm": cap, "mtail": mt, "floor_met": ok}))


if __name__ == "__main__":
    os.chdir(HERE.parent)
    main()
