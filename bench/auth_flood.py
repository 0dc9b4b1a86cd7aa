#!/usr/bin/env python3
"""Figure: an authenticated scrape while a wrong-password flood hits the same listener, and
how long a source's work waits meanwhile.  Anchors in the same run: the same scrape with no
flood, and under the same flood the way password checks were made before (bcrypt through
``asyncio.to_thread`` under one lock, on the default executor the sources also read with).

    python bench/auth_flood.py [--clients 50] [--seconds 10] [--cost 10] [--modes now,before,quiet]

The real service (in this process) serves basic auth (one user, bcrypt at ``--cost``) and
tails a kern.log.  ``--clients`` keep-alive connections in another process, each from a
loopback address of its own, send GET /metrics with the right user and a new wrong password
each time, as fast as they are answered.  Meanwhile three loops of this process, each every
0.25 s and each on its own: a scrape of /metrics with the right password (a 10 s timeout, as
Prometheus'); a no-op on the default executor; 20 fence records appended to the kern.log,
timed until the service has counted them.

``--flood URL`` runs the flood alone (what the other process does) and prints its answers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.append(str(REPO))  # after site-packages: an installed capalarm is what runs

PREFIX = "EGRESS_FENCE tflood"
SCRAPE_TIMEOUT = 10.0


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def flood(url: str, clients: int, seconds: float, user: str = "prom") -> dict[str, int]:
    """``clients`` connections sending ``user`` with a new wrong password each time, each
    from an address of its own (127.0.0.2, 127.0.0.3, ...: loopback answers for all of
    127/8), so that no per-address limit sees one client."""
    import aiohttp

    answers: collections.Counter[str] = collections.Counter()
    stop = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=60)

    async def one(i: int) -> None:
        connector = aiohttp.TCPConnector(limit=1, local_addr=(f"127.0.{i // 250}.{2 + i % 250}", 0))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            while time.monotonic() < stop:
                headers = {"Authorization": basic(user, os.urandom(9).hex())}
                try:
                    async with session.get(url, headers=headers) as resp:
                        await resp.read()
                        answers[str(resp.status)] += 1
                except (TimeoutError, aiohttp.ClientError) as exc:
                    answers[type(exc).__name__] += 1
                    await asyncio.sleep(0.05)

    await asyncio.gather(*(one(i) for i in range(clients)))
    return dict(answers)


def start_flood(url: str, clients: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--flood", url,
         "--clients", str(clients), "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip


class BeforeAuth:
    """Password checks as they were made before (commit 2f56da7): bcrypt under one lock
    through asyncio.to_thread, on the default executor; one verdict cache of 256."""

    def __init__(self, users: dict[str, bytes]):
        import hashlib

        from exporters.webconfig import dummy_hash

        self.users = users
        self.dummy_hash = dummy_hash(users.values())
        self._cache: collections.OrderedDict[bytes, bool] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._sha = hashlib.sha256

    def _check(self, user: str, password: str) -> bool:
        import bcrypt

        hashed = self.users.get(user)
        key = self._sha(
            b"\0".join([user.encode(), hashed or self.dummy_hash, password.encode()])
        ).digest()
        with self._lock:
            verdict = self._cache.get(key)
            if verdict is None:
                try:
                    ok = bcrypt.checkpw(password.encode(), hashed or self.dummy_hash)
                except ValueError:
                    ok = False
                verdict = hashed is not None and ok
                self._cache[key] = verdict
                if len(self._cache) > 256:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        return verdict

    async def verdict(self, user: str, password: str, client: str = "") -> bool | None:
        return await asyncio.to_thread(self._check, user, password)


def fence_records(n: int, now: float) -> str:
    from alarm.collectors.kernel.synthetic import fence_line

    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now))
    return "".join(
        f"{stamp} host kernel: {fence_line(PREFIX, '10.20.1.5', 443, 'TCP', 1000, 40000 + k)}\n"
        for k in range(n)
    )


async def measure(mode: str, clients: int, seconds: float, cost: int) -> dict[str, Any]:
    import aiohttp
    import bcrypt

    from exporters.webconfig import load_web_config
    from tests.servicekit import running_service, surface_totals

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        web = d / "web.yml"
        hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(cost)).decode()
        web.write_text(json.dumps({"basic_auth_users": {"prom": hashed}}))
        log = d / "kern.log"
        log.write_text("")
        cfg = {
            "tick": "1s",
            "state_dir": str(d / "state"),
            "sources": [
                {"name": "kern", "type": "file", "paths": [str(log)], "prefixes": [PREFIX]}
            ],
            "surfaces": [{"name": "proxy", "match": {"dst": ["10.20.0.0/16"]}}],
        }
        async with running_service(cfg, web_config=load_web_config(str(web))) as service:
            assert service.http is not None and service.http.web is not None
            if mode == "before":
                service.http.web.auth = BeforeAuth(service.http.web.config.users)  # type: ignore[assignment]
            url = f"http://127.0.0.1:{service.http_port}/metrics"
            good = {"Authorization": basic("prom", "s3cret")}
            timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)
            loop = asyncio.get_running_loop()
            async with aiohttp.ClientSession(timeout=timeout) as session:

                async def scrape() -> float | None:
                    t0 = time.perf_counter()
                    try:
                        async with session.get(url, headers=good) as resp:
                            await resp.read()
                            ok = resp.status == 200
                    except (TimeoutError, aiohttp.ClientError):
                        ok = False
                    return time.perf_counter() - t0 if ok else None

                assert await scrape() is not None  # the scraper's password is known now
                proc = start_flood(url, clients, seconds) if mode != "quiet" else None
                await asyncio.sleep(1.0)  # the flood is under way
                scrapes: list[float | None] = []
                executor: list[float] = []
                counted: list[float] = []
                end = time.monotonic() + seconds - 1.5

                async def scraper() -> None:
                    while time.monotonic() < end:
                        scrapes.append(await scrape())
                        await asyncio.sleep(0.25)

                async def pool() -> None:
                    while time.monotonic() < end:
                        t0 = time.perf_counter()
                        await loop.run_in_executor(None, lambda: None)
                        executor.append(time.perf_counter() - t0)
                        await asyncio.sleep(0.25)

                async def writer() -> None:
                    while time.monotonic() < end:
                        before = surface_totals(service, "proxy")[0]
                        t0 = time.perf_counter()
                        with open(log, "a") as fh:
                            fh.write(fence_records(20, time.time()))
                        while surface_totals(service, "proxy")[0] < before + 20_000:
                            if time.perf_counter() - t0 > 30:
                                break
                            await asyncio.sleep(0.005)
                        counted.append(time.perf_counter() - t0)
                        await asyncio.sleep(0.25)

                # Each measured on its own, every 0.25 s, so a slow one does not thin the others.
                await asyncio.gather(scraper(), pool(), writer())
            answers = {}
            if proc is not None:
                out, _ = await asyncio.to_thread(proc.communicate)
                answers = json.loads(out)
    ok = [s for s in scrapes if s is not None]
    return {
        "mode": mode,
        "scrapes": len(scrapes),
        "scrapes_failed": len(scrapes) - len(ok),
        "scrape_median_s": statistics.median(ok) if ok else None,
        "scrape_max_s": max(ok) if ok else None,
        "executor_median_s": statistics.median(executor),
        "executor_max_s": max(executor),
        "counted_median_s": statistics.median(counted),
        "counted_max_s": max(counted),
        "flood_answers": answers,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--cost", type=int, default=10)
    ap.add_argument("--modes", default="now,before,quiet")
    ap.add_argument("--flood", metavar="URL", help="run the flood only, against URL")
    args = ap.parse_args(argv)
    if args.flood:
        print(json.dumps(asyncio.run(flood(args.flood, args.clients, args.seconds))), flush=True)
        return 0
    import logging

    logging.basicConfig(level=logging.ERROR)
    for mode in args.modes.split(","):
        r = asyncio.run(measure(mode, args.clients, args.seconds, args.cost))
        fmt = lambda v: "-" if v is None else f"{v * 1000:.0f} ms"  # noqa: E731
        print(
            f"{mode:>6}: authenticated scrape median {fmt(r['scrape_median_s'])}, max "
            f"{fmt(r['scrape_max_s'])}, {r['scrapes_failed']} of {r['scrapes']} failed "
            f"(timeout {SCRAPE_TIMEOUT:g} s); default-executor no-op median "
            f"{fmt(r['executor_median_s'])}, max {fmt(r['executor_max_s'])}; 20 fence records "
            f"counted after median {fmt(r['counted_median_s'])}, max {fmt(r['counted_max_s'])}; "
            f"flood answers {r['flood_answers']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
