#!/usr/bin/env python3
"""Figure: the CPU of one whole steady poll of a PEP 691 index by the installed registry
source, beside a plain aiohttp poller of the same server and pages, measured in the same run.

    python bench/registry_poll.py [--projects 10000] [--files 10] [--new 10] [--reps 5]
                                  [--conditional] [--skip-anchor]

A loopback aiohttp server in another process (so its CPU is not ours) holds ``--projects``
projects of ``--files`` files each as PEP 691 JSON (api-version 1.1: ``size`` and
``upload-time``), and adds ``--new`` files to some projects before every poll.  With
``--conditional`` it answers ``If-None-Match`` with 304 where the page's ETag matches (as
pypiserver 2 and devpi do; see tests/test_registry_pypi.py); without it, it sends no ETag
and every page is read in full.

Measured (``time.process_time`` of this process, median of ``--reps`` steady polls after one
learning poll):

- **capalarm**: ``RegistryPoller.poll_once`` of a ``type: registry, api: pypi`` source built
  by the installed package as ``capalarm run`` builds it (client, retries, redirects and
  credentials policy, conditional requests, diff, events, batch with ledger rows), emitting
  into a recorder that keeps the count.
- **anchor**: a plain aiohttp poller: one ``ClientSession`` with the same connection limit,
  GET the index, GET every project page (``If-None-Match`` when ``--conditional``),
  ``json.loads``, a set of ``(filename, sha256)`` per project diffed against the last poll's
  with a set difference; nothing else.

Both must count exactly the files added (printed).
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
from typing import Any

if __package__ in (None, ""):
    sys.path.append(
        str(Path(__file__).resolve().parents[1])
    )  # after site-packages: an installed capalarm is what runs

import aiohttp
from aiohttp import web
from pydantic import TypeAdapter

from alarm.collectors.base import SourceContext
from alarm.collectors.registry import SOURCES
from alarm.collectors.registry.settings import RegistrySettings
from alarm.events import Batch

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
CONCURRENCY = 4  # the source's default connection limit; the anchor gets the same


def serve(port: int, projects: int, files: int, conditional: bool, ready: Any) -> None:
    """The index (own process).  ``POST /_bump?n=`` adds n files, one per project round-robin."""

    def page(name: str, extra: list[str]) -> bytes:
        names = [f"{name}-{j}.0-py3-none-any.whl" for j in range(files)] + extra
        doc = {
            "meta": {"api-version": "1.1"},
            "name": name,
            "files": [
                {"filename": f, "url": f"../../packages/{name}/{f}",
                 "hashes": {"sha256": f"{abs(hash(f)):064x}"}, "size": 1000 + len(f),
                 "upload-time": "2026-01-01T00:00:00.000000Z", "requires-python": ">=3.8"}
                for f in names
            ],
        }  # fmt: skip
        return json.dumps(doc).encode()

    extra: dict[int, list[str]] = {}
    cache: dict[int, bytes] = {}
    bumps = [0]
    index = json.dumps(
        {"meta": {"api-version": "1.1"}, "projects": [{"name": f"p-{k}"} for k in range(projects)]}
    ).encode()

    def etag_of(k: int) -> str:
        return f'"{k}-{len(extra.get(k, ()))}"'

    async def get_index(request: web.Request) -> web.Response:
        headers = {"ETag": '"index"'} if conditional else {}
        if conditional and request.headers.get("If-None-Match") == '"index"':
            return web.Response(status=304, headers=headers)
        return web.Response(body=index, content_type=JSON_TYPE, headers=headers)

    async def get_project(request: web.Request) -> web.Response:
        k = int(request.match_info["name"][2:])
        tag = etag_of(k)
        headers = {"ETag": tag} if conditional else {}
        if conditional and request.headers.get("If-None-Match") == tag:
            return web.Response(status=304, headers=headers)
        body = cache.get(k)
        if body is None:
            body = page(f"p-{k}", extra.get(k, []))
            if len(cache) < 20_000:
                cache[k] = body
        return web.Response(body=body, content_type=JSON_TYPE, headers=headers)

    async def bump(request: web.Request) -> web.Response:
        for _ in range(int(request.query["n"])):
            k = (bumps[0] * 7919) % projects
            extra.setdefault(k, []).append(f"p-{k}-99.{bumps[0]}-py3-none-any.whl")
            cache.pop(k, None)
            bumps[0] += 1
        return web.Response(text=str(bumps[0]))

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/simple/", get_index)
        app.router.add_get("/simple/{name}/", get_project)
        app.router.add_post("/_bump", bump)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        ready.set()
        await asyncio.sleep(86400)

    asyncio.run(main())


class PlainPoller:
    """The anchor: what a hand-written aiohttp poller of a PEP 691 index does."""

    def __init__(self, url: str, conditional: bool):
        self.url = url
        self.conditional = conditional
        self.known: dict[str, set[tuple[str, str]]] = {}
        self.etags: dict[str, str] = {}

    async def poll(self, session: aiohttp.ClientSession) -> int:
        accept = {"Accept": JSON_TYPE}
        async with session.get(self.url, headers=accept) as resp:
            names = [p["name"] for p in json.loads(await resp.read())["projects"]]
        new = 0

        async def one(name: str) -> None:
            nonlocal new
            headers = dict(accept)
            if self.conditional and name in self.etags:
                headers["If-None-Match"] = self.etags[name]
            async with session.get(f"{self.url}{name}/", headers=headers) as resp:
                if resp.status == 304:
                    return
                doc = json.loads(await resp.read())
                if etag := resp.headers.get("ETag"):
                    self.etags[name] = etag
            files = {(f["filename"], f["hashes"]["sha256"]) for f in doc["files"]}
            old = self.known.get(name)
            if old is not None:
                new += len(files - old)
            self.known[name] = files

        for start in range(0, len(names), 64):
            await asyncio.gather(*(one(n) for n in names[start : start + 64]))
        return new


async def bump(session: aiohttp.ClientSession, base: str, n: int) -> None:
    async with session.post(f"{base}/_bump?n={n}") as resp:
        await resp.read()


async def run(args: argparse.Namespace, base: str) -> dict[str, Any]:
    url = f"{base}/simple/"
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as control:
        if not args.skip_anchor:
            anchor = PlainPoller(url, args.conditional)
            conn = aiohttp.TCPConnector(limit=CONCURRENCY)
            async with aiohttp.ClientSession(connector=conn) as session:
                await anchor.poll(session)  # learns
                cpu, counted = [], 0
                for _ in range(args.reps):
                    await bump(control, base, args.new)
                    c0 = time.process_time()
                    counted += await anchor.poll(session)
                    cpu.append(time.process_time() - c0)
            out["anchor"] = (cpu, counted)

        cfg = TypeAdapter(RegistrySettings).validate_python(
            {"name": "bench", "type": "registry", "api": "pypi", "url": url}
        )
        store: dict[str, Any] = {"position": None, "ledger": {}}
        source = SOURCES[0].build(cfg, SourceContext(tick=1.0))
        events = [0]

        async def emit(batch: Batch) -> None:
            if batch.events is not None:
                events[0] += int(batch.events.events.sum())
            store["position"] = batch.position or store["position"]
            for k, v in (batch.ledger or {}).items():
                store["ledger"][k] = v

        async with source.client() as client:
            assert await source.poll_once(client, emit, time.time()), source.health.last_error
            cpu = []
            for _ in range(args.reps):
                await bump(control, base, args.new)
                c0 = time.process_time()
                ok = await source.poll_once(client, emit, time.time())
                cpu.append(time.process_time() - c0)
                assert ok, source.health.last_error
        out["capalarm"] = (cpu, events[0])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--projects", type=int, default=10_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--new", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--conditional", action="store_true")
    ap.add_argument("--skip-anchor", action="store_true")
    args = ap.parse_args(argv)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(
        target=serve, args=(port, args.projects, args.files, args.conditional, ready), daemon=True
    )
    server.start()
    try:
        if not ready.wait(60):
            raise SystemExit("the index did not start")
        out = asyncio.run(run(args, f"http://127.0.0.1:{port}"))
    finally:
        server.terminate()
        server.join(5)
    mode = "conditional (ETag, 304)" if args.conditional else "no validators: every page read"
    print(
        f"steady poll of a PEP 691 index: {args.projects} projects x {args.files} files, "
        f"{args.new} new per poll, {mode}; CPU-s per poll, median of {args.reps}"
    )
    expected = args.new * args.reps
    ours = statistics.median(out["capalarm"][0])
    print(
        f"  capalarm RegistryPoller.poll_once (api: pypi)  {ours:7.3f} CPU-s  "
        f"counted {out['capalarm'][1]} of {expected}"
    )
    if "anchor" in out:
        base = statistics.median(out["anchor"][0])
        print(
            f"  anchor: plain aiohttp poller                  {base:7.3f} CPU-s  "
            f"counted {out['anchor'][1]} of {expected}"
        )
        print(f"  ratio                                         {ours / base:7.2f} x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
