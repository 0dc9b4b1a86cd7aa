#!/usr/bin/env python3
"""Figure: many registries polled at once — CPU share of the collectors and poll lag.

    python bench/registry_fleet.py [--registries 50] [--interval 10] [--duration 60]
                                   [--projects 20] [--files 5]

Starts ``--registries`` PEP 691 (PyPI JSON, api-version 1.1) indexes on loopback in a separate
process (so their CPU is not ours), each with ``--projects`` projects of ``--files`` files and
one new upload per registry every interval; then runs one ``type: registry, api: pypi`` collector
per index, every ``--interval`` seconds, for ``--duration`` seconds, each emitting into a no-op
pipeline.  Prints this process's CPU time over the run as a share of one core, the poll lag
(how late each poll started against its schedule: median and max) and the poll duration
(median and max), and the artifacts counted against the uploads made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(
        str(Path(__file__).resolve().parents[1])
    )  # after site-packages: an installed capalarm is what runs

from aiohttp import web
from pydantic import TypeAdapter

from alarm.collectors.base import SourceContext
from alarm.collectors.registry import SOURCES
from alarm.collectors.registry.settings import RegistrySettings
from alarm.events import Batch

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def serve_indexes(ports: list[int], projects: int, files: int, interval: float, ready) -> None:
    """The fake indexes (own process): every ``interval`` one more file in some project."""

    async def main() -> None:
        runners = []
        for port in ports:
            state = {"uploads": 0, "start": time.time()}

            def doc(name: str, state=state) -> dict:
                k = int(name.split("-")[1])
                extra = int((time.time() - state["start"]) // interval)
                state["uploads"] = extra
                own = [f"{name}-{j}.whl" for j in range(files)]
                own += [f"{name}-new{e}.whl" for e in range(extra) if e % projects == k]
                return {
                    "meta": {"api-version": "1.1"},
                    "name": name,
                    "files": [
                        {"filename": f, "url": f"../../files/{f}", "hashes": {"sha256": f"{abs(hash(f)):064x}"},
                         "size": 1000 + len(f), "upload-time": "2026-01-01T00:00:00Z"}
                        for f in own
                    ],
                }  # fmt: skip

            async def index(request: web.Request) -> web.Response:
                body = {
                    "meta": {"api-version": "1.1"},
                    "projects": [{"name": f"p-{k}"} for k in range(projects)],
                }
                return web.Response(text=json.dumps(body), content_type=JSON_TYPE)

            async def project(request: web.Request, doc=doc) -> web.Response:
                return web.Response(
                    text=json.dumps(doc(request.match_info["name"])), content_type=JSON_TYPE
                )

            app = web.Application()
            app.router.add_get("/simple/", index)
            app.router.add_get("/simple/{name}/", project)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
        ready.set()
        await asyncio.sleep(3600)

    asyncio.run(main())


def free_ports(n: int) -> list[int]:
    import socket

    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


async def run(args: argparse.Namespace, ports: list[int]) -> dict:
    settings = TypeAdapter(RegistrySettings)
    counted = 0

    async def emit(batch: Batch) -> None:
        nonlocal counted
        if batch.events is not None:
            counted += int(batch.events.events.sum())

    sources = []
    for i, port in enumerate(ports):
        cfg = settings.validate_python(
            {"name": f"reg{i}", "type": "registry", "api": "pypi",
             "url": f"http://127.0.0.1:{port}/simple/", "interval": args.interval}
        )  # fmt: skip
        sources.append(SOURCES[0].build(cfg, SourceContext(tick=args.interval)))
    lags: list[float] = []
    durations: list[float] = []
    polls = 0

    async def watch(source) -> None:
        nonlocal polls
        seen = 0.0
        while True:
            await asyncio.sleep(0.05)
            if source.health.last_success_at != seen:
                seen = source.health.last_success_at
                lags.append(source.lag)
                durations.append(source.health.read_seconds)
                polls += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    tasks = [asyncio.create_task(s.run(emit)) for s in sources]
    watchers = [asyncio.create_task(watch(s)) for s in sources]
    await asyncio.sleep(args.duration)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    for t in tasks + watchers:
        t.cancel()
    await asyncio.gather(*tasks, *watchers, return_exceptions=True)
    return {"cpu": cpu, "wall": wall, "lags": lags, "durations": durations, "polls": polls,
            "counted": counted, "errors": sum(s.health.errors for s in sources)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registries", type=int, default=50)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--projects", type=int, default=20)
    ap.add_argument("--files", type=int, default=5)
    args = ap.parse_args(argv)
    ports = free_ports(args.registries)
    ready = multiprocessing.Event()
    server = multiprocessing.Process(
        target=serve_indexes,
        args=(ports, args.projects, args.files, args.interval, ready),
        daemon=True,
    )
    server.start()
    try:
        if not ready.wait(60):
            raise SystemExit("fake indexes did not start")
        out = asyncio.run(run(args, ports))
    finally:
        server.terminate()
        server.join(5)
    lags, durs = out["lags"], out["durations"]
    requests = args.registries * (1 + args.projects)
    print(
        f"registry fleet: {args.registries} PyPI JSON indexes x {args.projects} projects x "
        f"{args.files} files, every {args.interval:g} s, {out['wall']:.0f} s"
    )
    print(
        f"  CPU share          {100 * out['cpu'] / out['wall']:6.1f} % of one core "
        f"({requests} requests per round)"
    )
    print(
        f"  poll lag           median {1000 * statistics.median(lags):.0f} ms, max {1000 * max(lags):.0f} ms "
        f"over {out['polls']} polls"
    )
    print(
        f"  poll duration      median {1000 * statistics.median(durs):.0f} ms, max {1000 * max(durs):.0f} ms"
    )
    print(f"  failed polls       {out['errors']}; uploads counted {out['counted']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
