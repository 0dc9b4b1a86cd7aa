#!/usr/bin/env python3
"""Figure: durable notifications per second through the outbox.

Three measurements in one run, medians of ``--runs``:

1. anchor — a plain synchronous SQLite loop, one INSERT + COMMIT per row (same file settings:
   WAL, synchronous=NORMAL; a row the size of a notification);
2. figure — ``Notifications.record()``: route one alert change and commit its outbox row (plus
   the router's memory) in one transaction, one change per commit, as the pipeline does;
3. figure — end to end: N rows stored, then delivered to a loopback receiver and deleted, next
   to the anchor of the same N POSTs sent straight from aiohttp with the same concurrency
   (no outbox).

    python bench/outbox_throughput.py [--n 5000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

sys.path.append(
    str(Path(__file__).resolve().parents[1])
)  # after site-packages: an installed capalarm is what runs

from alarm.config import config_from_dict
from alarm.detector.alerts import AlertChange, fingerprint
from exporters.notify import Notifications

CONCURRENCY = 8


def alert(i: int, state: str = "firing") -> AlertChange:
    now = time.time()
    return AlertChange(
        fingerprint=fingerprint(f"egress/s{i}", "spike"),
        target_type="surface",
        target=f"s{i}",
        kind="egress",
        rule="spike",
        state=state,
        previous="inactive",
        at=now,
        started_at=now - 10,
        value=24000.0,
        threshold=3600.0,
        figures={
            "rate_bytes_per_second": 24000.0,
            "baseline_bytes_per_second": 1200.0,
            "threshold_bytes_per_second": 3600.0,
            "capacity_bits_per_second": 194560.0,
            "budget_excess_bits": 0.0,
            "budget_allowance_bits_per_second": 1e6,
            "budget_tolerance_bits": 64e6,
        },
        contributors=[("10.20.1.10:443/tcp", 240000)],
        summary="egress surface s wrote 24,000 B/s against a baseline of 1,200 B/s",
    )


def plain_sqlite(path: Path, n: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT, body TEXT)")
    body = json.dumps(alert(0).to_dict())
    t0 = time.perf_counter()
    for i in range(n):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (k, body) VALUES (?, ?)", (str(i), body))
        db.execute("COMMIT")
    dt = time.perf_counter() - t0
    db.close()
    return n / dt


def notifications(state_dir: Path, url: str) -> Notifications:
    return Notifications(
        config_from_dict(
            {
                "state_dir": str(state_dir),
                "notifications": {
                    "destinations": [
                        {"type": "webhook", "name": "w", "url": url, "concurrency": CONCURRENCY}
                    ]
                },
            }
        )
    )


def outbox_record(state_dir: Path, n: int) -> float:
    note = notifications(state_dir, "http://127.0.0.1:9/none")
    changes = [alert(i) for i in range(n)]
    t0 = time.perf_counter()
    for c in changes:
        note.record([c])
    dt = time.perf_counter() - t0
    note.close()
    return n / dt


@contextlib.asynccontextmanager
async def receiver(counter: dict[str, int]):
    async def hook(request: web.Request) -> web.Response:
        await request.read()
        counter["n"] += 1
        return web.Response(status=204)

    app = web.Application()
    app.add_routes([web.post("/hook", hook)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


async def end_to_end(state_dir: Path, n: int) -> tuple[float, float]:
    counter = {"n": 0}
    async with receiver(counter) as url:
        # anchor: the same number of POSTs straight from aiohttp, same concurrency
        body = json.dumps(alert(0).to_dict()).encode()
        sem = asyncio.Semaphore(CONCURRENCY)
        async with ClientSession(
            connector=TCPConnector(limit=CONCURRENCY), timeout=ClientTimeout(total=10)
        ) as s:

            async def post() -> None:
                async with sem, s.post(url, data=body) as r:
                    await r.read()

            t0 = time.perf_counter()
            await asyncio.gather(*(post() for _ in range(n)))
            raw = n / (time.perf_counter() - t0)
        counter["n"] = 0
        note = notifications(state_dir, url)
        task = asyncio.create_task(note.run())
        t0 = time.perf_counter()
        for i in range(n):
            await asyncio.to_thread(note.record, [alert(i)])
            note.wake()
        while counter["n"] < n or note.views[0].queue_depth:
            await asyncio.sleep(0.01)
        through = n / (time.perf_counter() - t0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        note.close()
    return raw, through


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    anchor, record, raw, through = [], [], [], []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="capalarm-bench-") as tmp:
            root = Path(tmp)
            anchor.append(plain_sqlite(root / "plain.db", args.n))
            record.append(outbox_record(root / "rec", args.n))
            r, t = asyncio.run(end_to_end(root / "e2e", args.n))
            raw.append(r)
            through.append(t)
        print(
            f"run {run + 1}: sqlite {anchor[-1]:,.0f}/s  record {record[-1]:,.0f}/s  "
            f"raw POST {raw[-1]:,.0f}/s  through outbox {through[-1]:,.0f}/s",
            flush=True,
        )
    m = statistics.median
    print(f"\noutbox throughput, median of {args.runs} runs, {args.n:,} notifications each")
    print(f"  anchor  plain SQLite INSERT+COMMIT loop          {m(anchor):>10,.0f} rows/s")
    print(
        f"  figure  outbox record(), one change per commit   {m(record):>10,.0f} notifications/s"
        f"  ({m(record) / m(anchor):.2f}x anchor)"
    )
    print(
        f"  anchor  aiohttp POSTs, no outbox (c={CONCURRENCY})          {m(raw):>10,.0f} requests/s"
    )
    print(
        f"  figure  stored, sent, acknowledged (c={CONCURRENCY})       {m(through):>10,.0f} notifications/s"
        f"  ({m(through) / m(raw):.2f}x anchor)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
