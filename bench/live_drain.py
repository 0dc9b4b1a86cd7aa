#!/usr/bin/env python3
"""Figure: live kernel drain.  A flood of nft-logged UDP packets (default 100k records/s for
10 s) in a throwaway network namespace; capalarm's /dev/kmsg collector (drain process +
parser) must report 0 lost records.  The anchor is a naive reader: one Python process that
reads and parses each record in the same loop, as a typical implementation does.

    sudo python bench/live_drain.py [--rate 100000] [--seconds 10] [--runs 3]

The sender is a small C ``sendmmsg`` loop compiled with gcc at bench time and paced to the
rate (run at nice -10 so other load on the box cannot hold it below the rate), so the two
cores are left to the kernel's printk, the drain and the parser.  The naive reader runs at
the default priority, as a typical implementation would.  Per run:
offered rate, fence records the kernel logged (nft counter), all records the kernel logged
between two marker records (SEQ delta), records received, records reported lost, and the
check received + lost == SEQ delta.  Then the median of the runs, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after site-packages: an installed capalarm is what runs

from alarm.collectors.kernel.fence import FenceRead, FenceReader  # noqa: E402
from alarm.collectors.kernel.formats import parse_kmsg_record  # noqa: E402
from alarm.collectors.kernel.kmsg import KmsgCollector  # noqa: E402
from alarm.collectors.kernel.records import KernelRecord  # noqa: E402
from alarm.events import Batch  # noqa: E402
from tests.kernelnet import fence_netns, inject_kmsg, kernel_missing  # noqa: E402

PORT = 9911
PAYLOAD = 100  # LEN=128 per record
SENDER_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#define BATCH 64
/* sender RATE SECONDS PAYLOAD PORT: UDP to 127.0.0.1:PORT at RATE packets/s, paced in
   sendmmsg batches; a bound, never-read socket takes the packets (no ICMP errors). */
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    long rate = atol(argv[1]); double secs = atof(argv[2]);
    int payload = atoi(argv[3]), port = atoi(argv[4]);
    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int small = 1024; setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    if (bind(rx, (void *)&a, sizeof a) || connect(tx, (void *)&a, sizeof a)) { perror("socket"); return 1; }
    static char buf[65536]; memset(buf, 'z', sizeof buf);
    struct mmsghdr m[BATCH]; struct iovec iov[BATCH];
    for (int i = 0; i < BATCH; i++) {
        iov[i].iov_base = buf; iov[i].iov_len = payload; memset(&m[i], 0, sizeof m[i]);
        m[i].msg_hdr.msg_iov = &iov[i]; m[i].msg_hdr.msg_iovlen = 1; }
    long total = (long)(rate * secs), sent = 0; double t0 = now();
    while (sent < total) {
        double el = now() - t0; long due = (long)(el * rate); if (due > total) due = total;
        if (due - sent < BATCH && due < total) {  /* ahead: sleep until the next batch is due */
            double wait = (double)(sent + BATCH) / rate - el; struct timespec d;
            d.tv_sec = (time_t)wait; d.tv_nsec = (long)((wait - d.tv_sec) * 1e9);
            nanosleep(&d, NULL); continue; }
        int n = due - sent > BATCH ? BATCH : (int)(due - sent);
        int r = sendmmsg(tx, m, n, 0); if (r < 0) { perror("sendmmsg"); return 1; } sent += r;
    }
    printf("%ld %.6f\n", sent, now() - t0);
    return 0;
}
"""


def build_sender(workdir: Path) -> Path:
    src, exe = workdir / "sender.c", workdir / "sender"
    src.write_text(SENDER_C)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a live process: how much the drain had to buffer at worst."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_of(pid: int) -> float:
    """utime + stime of a live process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the anchor: read and parse in one loop ------------------------------------------------
def naive_reader(prefix: str) -> None:
    """Runs in its own process: read one record, parse it, count it, repeat."""
    start, end = f"{prefix} MARK start", f"{prefix} MARK end"
    fence = prefix + " IN="
    boot_wall = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
    fd = os.open("/dev/kmsg", os.O_RDONLY)
    os.lseek(fd, 0, os.SEEK_END)
    print("ready", flush=True)
    prev = None
    lost = mine = window = nbytes = 0
    start_seq = end_seq = None
    t0 = os.times()
    while True:
        try:
            raw = os.read(fd, 8192)
        except BrokenPipeError:  # overrun: the next SEQ shows how many
            continue
        rec = parse_kmsg_record(raw, boot_wall)
        seq = rec.seq or 0
        if prev is not None and seq > prev + 1 and start_seq is not None:
            lost += seq - prev - 1
        prev = seq
        msg = rec.message
        if msg == start:
            start_seq = seq
            continue
        if msg == end:
            end_seq = seq
            break
        if start_seq is None:
            continue
        window += 1
        if msg.startswith(fence):
            mine += 1
            nbytes += int(msg.split(" LEN=", 1)[1].split(" ", 1)[0])
    t1 = os.times()
    cpu = t1.user + t1.system - t0.user - t0.system
    print(json.dumps({"mine": mine, "window": window, "lost": lost, "start": start_seq,
                      "end": end_seq, "bytes": nbytes, "cpu": cpu}), flush=True)  # fmt: skip


async def run_naive(prefix: str, send: Any) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--naive-reader", prefix, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    await proc.stdout.readline()  # ready
    inject_kmsg(f"{prefix} MARK start")
    sent = await send()
    t_end = time.monotonic()
    inject_kmsg(f"{prefix} MARK end")
    result = json.loads(await asyncio.wait_for(proc.stdout.readline(), 300))
    result["catch_up"] = time.monotonic() - t_end
    await proc.wait()
    return {**result, **sent}


# -- capalarm's collector -----------------------------------------------------------------------
class WindowReader(FenceReader):
    """The collector's real fence reader (what the service runs on every chunk), on the
    records between the two markers; it also notes the markers' sequence numbers."""

    def __init__(self, prefix: str, seen: dict[str, Any]) -> None:
        super().__init__((prefix,), require_trusted=True, tick=1.0)
        self.start, self.end = f"{prefix} MARK start", f"{prefix} MARK end"
        self.seen = seen

    def read(self, records: list[KernelRecord]) -> FenceRead:
        seen = self.seen
        keep = []
        for rec in records:
            msg = rec.message
            if seen["start"] is None:
                if msg == self.start:
                    seen["start"] = rec.seq
                continue
            if seen["end"] is not None:
                continue
            if msg == self.end:
                seen["end"] = rec.seq
                continue
            seen["window"] += 1
            keep.append(rec)
        read = super().read(keep)
        if read.events is not None:
            seen["mine"] += int(read.events.events.sum())
            seen["bytes"] += int(read.events.nbytes.sum())
        return read


async def run_collector(prefix: str, send: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {"mine": 0, "window": 0, "bytes": 0, "start": None, "end": None}
    counts: dict[str, int] = {}
    done = asyncio.Event()
    collector = KmsgCollector(name="bench", reader=WindowReader(prefix, seen))

    async def emit(batch: Batch) -> None:
        # The batch's counts are those of the records just read (markers included).
        before_start = seen["start"] is None
        for k, n in batch.counts.items():
            counts[k] = counts.get(k, 0) + n
        if before_start or "lost0" not in seen:
            seen.setdefault("lost0", 0 if before_start else counts.get("records_lost", 0))
        if seen["end"] is not None and "lost1" not in seen:
            seen["lost1"] = counts.get("records_lost", 0)
            done.set()

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    task = asyncio.create_task(collector.run(emit))
    await asyncio.wait_for(collector.ready.wait(), 30)
    inject_kmsg(f"{prefix} MARK start")
    sent = await send()
    t_end = time.monotonic()
    inject_kmsg(f"{prefix} MARK end")
    await asyncio.wait_for(done.wait(), 300)
    catch_up = time.monotonic() - t_end
    drain_cpu = cpu_of(collector.drain_pid) if collector.drain_pid else 0.0
    drain_mb = peak_rss_mb(collector.drain_pid) if collector.drain_pid else 0.0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    lost = seen.pop("lost1") - seen.pop("lost0")
    parent_cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    return {
        **seen,
        **sent,
        "lost": lost,
        "catch_up": catch_up,
        "cpu": drain_cpu + parent_cpu,
        "drain_cpu": drain_cpu,
        "drain_mb": drain_mb,
        "unexplained": counts.get("lost_unexplained", 0),
        "extra": {k: n for k, n in counts.items() if k.startswith("lost_")},
    }


async def one_run(
    reader: str, sender: Path, rate: int, seconds: float, sender_nice: int
) -> dict[str, Any]:
    with fence_netns(proto="udp", ports=(PORT,)) as ns:

        async def send() -> dict[str, Any]:
            cmd = [str(sender), str(rate), str(seconds), str(PAYLOAD), str(PORT)]
            argv = ns.exec_argv(["nice", "-n", str(sender_nice), *cmd])
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate()
            count, elapsed = out.split()
            return {"sent": int(count), "send_s": float(elapsed)}

        if reader == "capalarm":
            res = await run_collector(ns.prefix, send)
        else:
            res = await run_naive(ns.prefix, send)
        res["logged"] = ns.counter().packets
        res["logged_bytes"] = ns.counter().bytes
    res["seq_delta"] = res["end"] - res["start"] - 1
    res["offered"] = res["sent"] / res["send_s"]
    res["check"] = res["window"] + res["lost"] == res["seq_delta"]
    return res


COLUMNS = (
    ("offered/s", "offered", "{:>10.0f}"),
    ("fence logged", "logged", "{:>12d}"),
    ("SEQ delta", "seq_delta", "{:>10d}"),
    ("fence recv", "mine", "{:>10d}"),
    ("all recv", "window", "{:>9d}"),
    ("lost", "lost", "{:>7d}"),
    ("recv+lost=SEQ", "check", "{!s:>13}"),
    ("bytes ok", "bytes_ok", "{!s:>8}"),
    ("catch-up s", "catch_up", "{:>10.2f}"),
    ("CPU s", "cpu", "{:>6.2f}"),
)


def row(label: str, r: dict[str, Any]) -> str:
    return f"{label:<14}" + " ".join(fmt.format(r[key]) for _, key, fmt in COLUMNS)


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, key, _ in COLUMNS:
        vals = [r[key] for r in runs]
        if isinstance(vals[0], bool):
            out[key] = all(vals)
        else:
            m = statistics.median(vals)
            out[key] = type(vals[0])(m) if isinstance(vals[0], int) else m
    return out


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="capalarm-bench-") as tmp:
        sender = build_sender(Path(tmp))
        results: dict[str, list[dict[str, Any]]] = {"capalarm": [], "naive": []}
        print(f"{'run':<14}" + " ".join(f"{h:>{len(fmt.format(0)) if 'd' in fmt or 'f' in fmt else 13}}" for h, _, fmt in COLUMNS))  # fmt: skip
        for i in range(args.runs):
            for reader in ("capalarm", "naive"):
                res = await one_run(reader, sender, args.rate, args.seconds, args.sender_nice)
                res["bytes_ok"] = res["bytes"] == res["mine"] * (PAYLOAD + 28)
                results[reader].append(res)
                print(row(f"{reader} #{i + 1}", res), flush=True)
        print(f"\nmedian of {args.runs} runs, {args.rate}/s offered for {args.seconds:g} s:")
        for reader, runs in results.items():
            print(row(reader, median_row(runs)))
        worst = max(r["lost"] for r in results["capalarm"])
        unexplained = sum(r.get("unexplained", 0) for r in results["capalarm"])
        peak = max(r["drain_mb"] for r in results["capalarm"])
        print(f"\ncapalarm lost (worst run): {worst}; unexplained SEQ gaps: {unexplained}; "
              f"drain peak RSS {peak:.0f} MB (buffer limit 256 MiB)")  # fmt: skip
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return 0 if worst == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=100_000, help="fence records per second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="also write all runs to this file")
    ap.add_argument(
        "--sender-nice",
        type=int,
        default=-10,
        help="the sender's nice: on a shared 2-core box it must win against other load to "
        "hold the offered rate (the readers keep their own priorities)",
    )
    ap.add_argument("--naive-reader", metavar="PREFIX", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.naive_reader:
        naive_reader(args.naive_reader)
        return 0
    reason = kernel_missing()
    if reason or shutil.which("gcc") is None:
        print(f"live_drain: {reason or 'needs gcc'}", file=sys.stderr)
        return 2
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
