"""Startup of the fs source on a tree of 1M files: time to the end of the first scan, RSS, steady
RSS per tracked file, and the event loop's worst lag meanwhile (the service must not stall);
then a restart from the saved snapshot (position + ledger rows in SQLite, as the store keeps
them) with a reconcile scan.

    python bench/fs_startup.py                      # 1M files on a private tmpfs, mode auto
    python bench/fs_startup.py --files 200000 --disk --mode inotify

Each phase runs in its own process, so each RSS is its own.  Needs root for the tmpfs mount
(``--disk`` puts the tree under /tmp on the local disk instead).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PER_DIR = 1000


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def make_tree(root: Path, files: int) -> None:
    marker = root / f".made-{files}"
    if marker.exists():
        return
    for d in range((files + PER_DIR - 1) // PER_DIR):
        sub = root / f"d{d:05d}"
        sub.mkdir(exist_ok=True)
        base = str(sub) + "/"
        for i in range(min(PER_DIR, files - d * PER_DIR)):
            fd = os.open(base + f"f{i:04d}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"x" * (i % 61))
            os.close(fd)
    marker.write_text("")


class Store:
    """The ledger and position in SQLite, one transaction per batch (as the service does)."""

    def __init__(self, path: str) -> None:
        # Applied in a worker thread, as the service applies batches off the loop.
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("create table if not exists ledger (k text primary key, v text)")
        self.db.execute("create table if not exists pos (id integer primary key, v text)")
        self.events = 0
        self.bytes = 0

    async def __call__(self, batch) -> None:  # an Emit
        await asyncio.to_thread(self.apply, batch)

    def apply(self, batch) -> None:
        with self.db:
            if batch.ledger:
                rows = [(k, v) for k, v in batch.ledger.items() if v is not None]
                gone = [(k,) for k, v in batch.ledger.items() if v is None]
                self.db.executemany("insert or replace into ledger values (?, ?)", rows)
                self.db.executemany("delete from ledger where k = ?", gone)
            if batch.position is not None:
                self.db.execute(
                    "insert or replace into pos values (1, ?)", (json.dumps(batch.position),)
                )
        if batch.events is not None:
            self.events += len(batch.events)
            self.bytes += int(batch.events.nbytes.sum())

    def position(self):
        row = self.db.execute("select v from pos where id = 1").fetchone()
        return json.loads(row[0]) if row else None

    def rows(self):
        return self.db.execute("select k, v from ledger")


async def lag_probe(stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        out.append(time.perf_counter() - t - 0.01)


async def phase(root: str, db: str, mode: str) -> dict:
    from alarm.collectors.base import SourceContext
    from alarm.collectors.fs.settings import FsSettings
    from alarm.collectors.fs.source import build

    store = Store(db)
    position = store.position()
    before = rss()
    cfg = FsSettings(name="bench", type="fs", paths=[root], mode=mode)
    c = build(cfg, SourceContext(10.0, position, lambda: iter(store.rows()), ""))
    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(lag_probe(stop, lags))
    t0 = time.perf_counter()
    task = asyncio.create_task(c.run(store))
    await asyncio.wait_for(c.ready.wait(), 3600)
    elapsed = time.perf_counter() - t0
    stop.set()
    await probe
    after = rss()
    mem = c.engine.memory()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    lags.sort()
    return {
        "restart": position is not None,
        "mode": c.health.mode,
        "files": mem["files"],
        "dirs": mem["dirs"],
        "seconds": round(elapsed, 2),
        "rss_mib": round(after / 2**20, 1),
        "rss_growth_per_file": round((after - before) / max(mem["files"], 1), 1),
        "table_bytes_per_file": round(mem["table_bytes"] / max(mem["files"], 1), 1),
        "events_counted": store.events,
        "loop_lag_max_ms": round(lags[-1] * 1000, 1) if lags else 0.0,
        "loop_lag_p99_ms": round(lags[int(len(lags) * 0.99)] * 1000, 1) if lags else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--disk", action="store_true", help="the local disk under /tmp, not tmpfs")
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(asyncio.run(phase(args.root, args.db, args.mode))))
        return
    base = Path("/tmp/capalarm-bench-fs")
    base.mkdir(exist_ok=True)
    mnt = base / ("disk" if args.disk else "tmpfs")
    mnt.mkdir(exist_ok=True)
    mounted = False
    if not args.disk and not os.path.ismount(mnt):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8g,nr_inodes=4m", "bench", str(mnt)], check=True
        )
        mounted = True
    try:
        root = mnt / f"tree-{args.files}"
        root.mkdir(exist_ok=True)
        t = time.perf_counter()
        make_tree(root, args.files)
        print(
            f"tree: {args.files} files in {root} ({'disk' if args.disk else 'tmpfs'}), made in {time.perf_counter() - t:.0f}s"
        )
        db = str(base / f"state-{args.files}.db")
        if os.path.exists(db):
            os.unlink(db)
        results = []
        for _ in ("first start", "restart"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--phase",
                    "x",
                    "--root",
                    str(root),
                    "--db",
                    db,
                    "--mode",
                    args.mode,
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        cols = [
            "restart",
            "mode",
            "files",
            "dirs",
            "seconds",
            "rss_mib",
            "rss_growth_per_file",
            "table_bytes_per_file",
            "events_counted",
            "loop_lag_max_ms",
            "loop_lag_p99_ms",
        ]
        print(" | ".join(cols))
        for r in results:
            print(" | ".join(str(r[c]) for c in cols))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


if __name__ == "__main__":
    main()
