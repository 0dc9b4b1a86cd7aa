#!/usr/bin/env python3
"""Figure: `/` (the status page) and the first page of /api/v1/surfaces at N declared
surfaces, against the 1 s floor of issue 28.  Measured on the installed package over HTTP:
exporters.http.HttpServer on loopback, its snapshot taken from alarm.pipeline.Pipeline on a
one-thread executor as the service takes it, requested by an aiohttp client (the time to the
last byte).  Anchor in the same run: the whole fleet in one answer, what /api/v1/surfaces
answered before it had pages (surfaces_json of every surface, serialised as aiohttp does).

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

from metrics_scrape import pipeline  # noqa: E402

from alarm.history import HistoryRequest  # noqa: E402
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

    async def snapshot(history: HistoryRequest | None):  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(one, p.snapshot, time.time(), 10, {}, {}, history)

    server = HttpServer(snapshot, lambda: [], lambda: [], lambda: (True, ""))
    port = await server.start("127.0.0.1", 0)
    took: dict[str, list[float]] = {path: [] for path, _ in PATHS}
    sizes: dict[str, int] = {}
    snap_s, anchor_s = [], []
    async with aiohttp.ClientSession() as session:
        for _ in range(reps):
            for path, _ in PATHS:
                t0 = time.perf_counter()
                async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                    body = await resp.read()
                    assert resp.status == 200, (path, resp.status)
                took[path].append(time.perf_counter() - t0)
                sizes[path] = len(body)
            t0 = time.perf_counter()
            snap = await snapshot(None)
            t1 = time.perf_counter()
            json.dumps(surfaces_json(snap))
            snap_s.append(t1 - t0)
            anchor_s.append(time.perf_counter() - t0)
    await server.stop()
    med = statistics.median
    print(f"{n:,} surfaces, over HTTP on loopback, median of {reps}:")
    for path, what in PATHS:
        print(f"  {what:32s} {med(took[path]):6.2f} s   {sizes[path] / 1e3:8.0f} kB  {path}")
    print(
        f"  of which the pipeline's snapshot {med(snap_s):6.2f} s (alarm/pipeline.py)\n"
        f"  anchor: every surface in one answer (the API before pages) {med(anchor_s):6.2f} s"
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
