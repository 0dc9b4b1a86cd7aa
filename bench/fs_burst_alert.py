#!/usr/bin/env python3
"""Figure: a burst of writes into a watched tree -> the rate in /metrics and the alert at a
webhook receiver, in ticks and seconds.

The whole service runs in-process, built from a configuration as ``capalarm run`` builds it:
a ``type: fs`` source on a fresh directory (``mode: auto``, so inotify, with the default
``settle`` unless told), one surface on it, the webhook destination pointing at a loopback
receiver.  Each of ``--bursts`` bursts writes ``--files`` files of ``--size`` bytes as fast
as a thread can; the clock starts just before its first write.  Per burst it records:

- anchor: when ``inotifywait -m -r`` (Debian inotify-tools), watching the same tree in the
  same run, printed the first file of the burst — the kernel's notification and nothing else;
- when ``capalarm_surface_write_rate_bytes_per_second`` on /metrics first shows the burst
  (scraped every 20 ms over HTTP, as Prometheus would, only faster);
- when the detector fired (``on_change``) and when the receiver had ``alert.firing``.

So that the alert fires at once the surface has ``spike.absolute_bytes_per_second`` (a rate
that is always a spike) and no budget; it resolves within ``resolve_hold`` (1 s) so every
burst fires anew, and the notifier's flap damper and reopen window are off (each burst
is an incident).

    python bench/fs_burst_alert.py [--bursts 9] [--files 200] [--size 4096] [--tick 0.5]
                                   [--settle 0.5] [--gap 6.37]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

# After site-packages: an installed capalarm is what runs.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from alarm.config import config_from_dict
from alarm.service import Service
from bench.spike_receiver import SpikeReceiver

SURFACE = "scratch"


class InotifyWait:
    """``inotifywait -m -r`` on the tree; the time each path was first printed."""

    def __init__(self, tree: Path) -> None:
        self.first: dict[str, float] = {}
        self.proc = subprocess.Popen(
            ["inotifywait", "-m", "-r", "-q", "-e", "create,close_write", "--format", "%w%f",
             str(tree)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.first.setdefault(line.rstrip("\n"), time.time())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


# The writer is its own process, as a workload is (a thread here would queue behind the
# service's threads for the GIL at every system call); it prints when its first write starts.
WRITER = """
import os, sys, time
prefix, files, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = os.urandom(size)
print(repr(time.time()), flush=True)
for i in range(files):
    with open(f"{prefix}{i:05d}", "wb") as f:
        f.write(data)
"""


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    async with SpikeReceiver() as hook:
        received = hook.received
        detected: list[float] = []
        out: dict[str, list[float]] = {"inotifywait": [], "metrics": [], "detector": [], "hook": []}
        with tempfile.TemporaryDirectory(prefix="capalarm-fs-burst-") as tmp:
            tree = Path(tmp, "tree")
            tree.mkdir()
            burst_bps = args.files * args.size / args.tick
            cfg = config_from_dict(
                {
                    "tick": args.tick,
                    "state_dir": f"{tmp}/state",
                    "http": {"listen": "127.0.0.1:0"},
                    "sources": [
                        {"name": "watch", "type": "fs", "paths": [str(tree)], "settle": args.settle}
                    ],
                    "surfaces": [
                        {
                            "name": SURFACE,
                            "kind": "fs",
                            "match": {"path": [str(tree)]},
                            # Always a spike above a tenth of the burst's rate over one tick.
                            "spike": {
                                "absolute_bytes_per_second": burst_bps / 10,
                                "resolve_hold": "1s",
                            },
                            "budget": {"allowance_bits_per_second": 1e12, "tolerance_bits": 1e15},
                        }
                    ],
                    "notifications": hook.notifications(tmp),
                }
            )

            def on_change(change: Any) -> None:
                if change.rule == "spike" and change.state == "firing":
                    detected.append(time.time())

            watcher = InotifyWait(tree)
            service = Service(cfg, on_change=on_change)
            task = asyncio.create_task(service.run())
            try:
                await asyncio.wait_for(service.started.wait(), 10)
                collector: Any = dict(service.collectors)["watch"]
                await asyncio.wait_for(collector.ready.wait(), 30)
                await asyncio.sleep(2.0)  # inotifywait has set its watches
                mode = collector.health.mode
                metrics_url = f"http://127.0.0.1:{service.http_port}/metrics"
                async with aiohttp.ClientSession() as session:
                    for b in range(args.bursts):
                        # In the tree's root, which inotifywait watches already (files in a new
                        # directory it may miss: it adds the watch after the directory's event).
                        prefix = str(tree / f"b{b}-")
                        first = f"{prefix}00000"
                        n_recv, n_det = len(received), len(detected)
                        writer = await asyncio.create_subprocess_exec(
                            sys.executable, "-c", WRITER, prefix, str(args.files), str(args.size),
                            stdout=asyncio.subprocess.PIPE,
                        )  # fmt: skip
                        assert writer.stdout is not None
                        t0 = float(await writer.stdout.readline())
                        seen_rate = None
                        deadline = t0 + 20
                        while time.time() < deadline and (
                            seen_rate is None or len(received) == n_recv
                        ):
                            if seen_rate is None:
                                async with session.get(metrics_url) as resp:
                                    text = await resp.text()
                                if _rate(text) > 0:
                                    seen_rate = time.time()
                            await asyncio.sleep(0.02)
                        await writer.wait()
                        if (
                            seen_rate is None
                            or len(received) == n_recv
                            or first not in watcher.first
                        ):
                            print(
                                f"burst {b + 1}: not seen within 20 s (rate "
                                f"{'seen' if seen_rate else 'not seen'}, detector fired "
                                f"{len(detected) - n_det}, webhooks {len(received) - n_recv})",
                                file=sys.stderr,
                            )
                            continue
                        out["inotifywait"].append(watcher.first[first] - t0)
                        out["metrics"].append(seen_rate - t0)
                        out["detector"].append(detected[n_det] - t0)
                        out["hook"].append(received[n_recv] - t0)
                        print(
                            f"burst {b + 1}: inotifywait {out['inotifywait'][-1]:.3f}s, "
                            f"/metrics rate {out['metrics'][-1]:.3f}s, detector "
                            f"{out['detector'][-1]:.3f}s, webhook {out['hook'][-1]:.3f}s"
                        )
                        # Not a multiple of the tick: each burst starts at another phase of it.
                        await asyncio.sleep(max(0.0, t0 + args.gap - time.time()))
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                watcher.close()
    print(f"(fs source mode: {mode})")
    return out


def _rate(text: str) -> float:
    prefix = "capalarm_surface_write_rate_bytes_per_second{"
    for line in text.splitlines():
        if line.startswith(prefix) and f'surface="{SURFACE}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=9)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--tick", type=float, default=0.5)
    ap.add_argument("--settle", type=float, default=0.5, help="the fs source's settle (default)")
    ap.add_argument("--gap", type=float, default=6.37)
    args = ap.parse_args()
    if shutil.which("inotifywait") is None:
        print("inotifywait (Debian inotify-tools) is needed for the anchor", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.ERROR)
    got = asyncio.run(run(args))
    if not got["hook"]:
        print("no burst was delivered", file=sys.stderr)
        return 1
    n = len(got["hook"])
    tick = args.tick
    print(
        f"\nburst of {args.files} files x {args.size} B into a watched tree -> alert, median of "
        f"{n} bursts; tick {tick:g}s, settle {args.settle:g}s; the surface has "
        "spike.absolute_bytes_per_second (a rate that is always a spike)"
    )
    rows = [
        ("anchor  first file -> inotifywait prints it", "inotifywait"),
        ("figure  first file -> rate in /metrics", "metrics"),
        ("        first file -> detector fires", "detector"),
        ("figure  first file -> webhook received", "hook"),
    ]
    for label, key in rows:
        m = statistics.median(got[key])
        print(f"  {label:44s} {m:7.3f} s = {m / tick:5.2f} ticks")
    print(
        "  code path: fs source (inotify reader thread -> engine step, settle) -> pipeline "
        "(event-time tick) -> detector -> outbox -> signed webhook"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
