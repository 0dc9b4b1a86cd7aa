#!/usr/bin/env python3
"""Figure: `/` (the status page) and the first page of /api/v1/surfaces at N declared
surfaces, all in, against the 1 s floor of issue 28.  Measured on the installed package over
HTTP: exporters.http.HttpServer on loopback, its snapshot taken from alarm.pipeline.Pipeline
on a one-thread executor as the service takes it (with the request the server makes: a
HistoryRequest for `/`, a SnapshotRequest for the API page, alarm/snapshot.py), requested by
an aiohttp client; the time is to the last byte, snapshot included, and the snapshot's part
is printed beside it.  Anchors in the same run: the whole fleet in one answer, what
/api/v1/surfaces answered before it had pages (surfaces_json of every surface, serialised as
aiohttp does), and the snapshot before columns (metrics_scrape.views_per_row: a view per
surface from the detector's per-row readers), which every request paid.

    python bench/status_api.py [--surfaces 100000] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.append(str(REPO))  # after site-packages: an installed capalarm is what runs
    sys.path.append(str(REPO / "bench"))

from metrics_scrape import pipeline, views_per_row  # noqa: E402

from alarm.history import HistoryRequest  # noqa: E402
from alarm.snapshot import Snapshot, SnapshotRequest  # noqa: E402
from exporters.http import HttpServer, surfaces_json  # noqa: E402

PATHS = (
    ("/", "status page"),
    ("/?page=2", "status page, page 2"),
    ("/api/v1/surfaces", "API first page (1000)"),
    ("/api/v1/surfaces?order=attention&limit=100", "API top 100 (attention)"),
)


async def run(n: int, reps: int) -> int:
    p = pipeline(n, 5)
    one = ThreadPoolExecutor(1)  # the service's pipeline thread
    spent: list[float] = []  # each snapshot's seconds, on the pipeline thread

    def take(request: SnapshotRequest | HistoryRequest | None) -> Snapshot:
        t0 = time.perf_counter()
        snap = p.snapshot(time.time(), 10, {}, {}, request)
        spent.append(time.perf_counter() - t0)
        return snap

    async def snapshot(request: SnapshotRequest | HistoryRequest | None) -> Snapshot:
        return await asyncio.get_running_loop().run_in_executor(one, take, request)

    server = HttpServer(snapshot, lambda: [], lambda: [], lambda: (True, ""))
    port = await server.start("127.0.0.1", 0)
    took: dict[str, list[float]] = {path: [] for path, _ in PATHS}
    snap_of: dict[str, list[float]] = {path: [] for path, _ in PATHS}
    sizes: dict[str, int] = {}
    anchor_s, views_s = [], []
    async with aiohttp.ClientSession() as session:
        # The first request of a pipeline lays its surfaces out once (names, label tuples).
        t0 = time.perf_counter()
        async with session.get(f"http://127.0.0.1:{port}/api/v1/surfaces?limit=1") as resp:
            await resp.read()
        first_s = time.perf_counter() - t0
        for _ in range(reps):
            for path, _ in PATHS:
                spent.clear()
                t0 = time.perf_counter()
                async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                    body = await resp.read()
                    assert resp.status == 200, (path, resp.status)
                took[path].append(time.perf_counter() - t0)
                snap_of[path].append(sum(spent))
                sizes[path] = len(body)
            t0 = time.perf_counter()
            snap = await snapshot(None)
            json.dumps(surfaces_json(snap))
            anchor_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await asyncio.get_running_loop().run_in_executor(one, views_per_row, p, 10)
            views_s.append(time.perf_counter() - t0)
    await server.stop()
    one.shutdown()
    med = statistics.median
    print(f"{n:,} surfaces, over HTTP on loopback, median of {reps}, seconds:")
    print(f"  {'request':32s} {'ALL IN':>7s} {'snapshot':>9s} {'size':>9s}")
    for path, what in PATHS:
        print(
            f"  {what:32s} {med(took[path]):7.2f} {med(snap_of[path]):9.3f} "
            f"{sizes[path] / 1e3:7.0f} kB  {path}"
        )
    print(
        f"  first request of the pipeline (its layout made once)      {first_s:6.2f}\n"
        f"  anchor: every surface in one answer (the API before pages) {med(anchor_s):6.2f}\n"
        f"  anchor: the snapshot before columns (a view per surface)   {med(views_s):6.2f}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--surfaces", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    return asyncio.run(run(args.surfaces, args.reps))


if __name__ == "__main__":
    raise SystemExit(main())
