#!/usr/bin/env python3
"""Figure: recovery — the time to drain a backlog of 10k queued notifications after a
receiver outage.

Each run queues ``--n`` notifications (distinct alerts, signed Standard Webhooks) while the
receiver is down and the workers have retried them into backoff; then the receiver comes back
and the clock runs until every notification has been received and deleted from the outbox.
Anchor, in the same run: the same number of signed POSTs to the same receiver from a plain
aiohttp loop with the same concurrency (no outbox, no retry state) — the floor the drain is
measured against.

    python bench/backlog_drain.py [--n 10000] [--runs 3] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
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
from exporters.notify import Notifications
from exporters.signing import sign_headers

sys.path.append(
    str(Path(__file__).resolve().parent)
)  # after site-packages: an installed capalarm is what runs
from outbox_throughput import alert


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def receiver(port: int, seen: set[str]):
    async def hook(request: web.Request) -> web.Response:
        await request.read()
        seen.add(request.headers.get("webhook-id", ""))
        return web.Response(status=204)

    app = web.Application()
    app.add_routes([web.post("/hook", hook)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


async def one_run(tmp: Path, n: int, concurrency: int) -> tuple[float, float]:
    key = os.urandom(32)
    (tmp / "secret").write_text("whsec_" + base64.b64encode(key).decode())
    port = free_port()
    note = Notifications(
        config_from_dict(
            {
                "state_dir": str(tmp / "state"),
                "notifications": {
                    "destinations": [
                        {
                            "type": "webhook",
                            "name": "w",
                            "url": f"http://127.0.0.1:{port}/hook",
                            "concurrency": concurrency,
                            "secrets": [{"file": str(tmp / "secret")}],
                        }
                    ],
                    # Capped backoff, as after an outage of any length past the cap.
                    "outbox": {"base_backoff": "1s", "max_backoff": "5s"},
                },
            }
        )
    )
    batch = 500
    for i in range(0, n, batch):
        note.record([alert(j) for j in range(i, min(n, i + batch))])
    task = asyncio.create_task(note.run())
    await asyncio.sleep(3)  # the outage: the heads of the queue fail and back off
    seen: set[str] = set()
    async with receiver(port, seen) as url:
        t0 = time.perf_counter()
        first = None
        while len(seen) < n or note.views[0].queue_depth:
            if first is None and seen:
                first = time.perf_counter() - t0
            await asyncio.sleep(0.005)
        drain = time.perf_counter() - t0
        print(f"  first delivery {first or 0:.2f}s after the receiver came back (backoff)")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        note.close()
        # anchor: the same signed POSTs straight from aiohttp
        seen.clear()
        body = json.dumps({"type": "alert.firing", "data": alert(0).to_dict()}).encode()
        sem = asyncio.Semaphore(concurrency)
        async with ClientSession(
            connector=TCPConnector(limit=concurrency), timeout=ClientTimeout(total=10)
        ) as s:

            async def post(i: int) -> None:
                headers = {"Content-Type": "application/json"}
                headers.update(sign_headers([key], f"msg_{i}", int(time.time()), body))
                async with sem, s.post(url, data=body, headers=headers) as r:
                    await r.read()

            t0 = time.perf_counter()
            await asyncio.gather(*(post(i) for i in range(n)))
            anchor = time.perf_counter() - t0
    return drain, anchor


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the outage's retry lines are not the figure
    drains, anchors = [], []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="capalarm-drain-") as tmp:
            d, a = asyncio.run(one_run(Path(tmp), args.n, args.concurrency))
        drains.append(d)
        anchors.append(a)
        print(f"run {run + 1}: drain {d:.2f}s  plain POSTs {a:.2f}s", flush=True)
    d, a = statistics.median(drains), statistics.median(anchors)
    print(
        f"\nbacklog drain, median of {args.runs} runs, {args.n:,} queued, concurrency {args.concurrency}"
    )
    print(
        f"  figure  receiver back -> outbox empty     {d:8.2f} s  ({args.n / d:,.0f} notifications/s)"
    )
    print(f"  anchor  plain signed POSTs, no outbox     {a:8.2f} s  ({args.n / a:,.0f} requests/s)")
    print(f"  ratio   {d / a:.2f}x the anchor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
