"""A wrong-password flood cannot stall the alarm or lock out the scraper (issue 28, item 1).

bcrypt runs on the auth gate's own threads (exporters/webconfig.py: AuthGate), never on the
default executor the sources read with; waiting checks are bounded in all and per client
address, credentials that passed are trusted a while without bcrypt and a user and password
that failed are refused a while without it.  The flood test runs the real service with basic
auth at bcrypt cost 10 and a tailed kern.log, and 50 clients (each from a loopback address of
its own, bench/auth_flood.py --flood) sending wrong passwords for 5 s.  Before, an
authenticated scrape took 5 s under such a flood and a no-op on the default executor 1.8 s."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import bcrypt
import pytest

from alarm.collectors.kernel.synthetic import fence_line
from exporters import webconfig
from exporters.webconfig import AuthBusy, AuthGate, BasicAuth, load_web_config
from tests.servicekit import running_service, surface_totals, wait_for
from tests.test_webconfig import basic, hashed, write

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "EGRESS_FENCE tflood"
CLIENTS = 50
FLOOD_SECONDS = 5.0


def records(n: int, now: float) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now))
    return "".join(
        f"{stamp} host kernel: {fence_line(PREFIX, '10.20.1.5', 443, 'TCP', 1000, 40000 + k)}\n"
        for k in range(n)
    )


async def test_an_authenticated_scrape_and_the_sources_go_on_during_a_wrong_password_flood(
    tmp_path,
):
    web = write(
        tmp_path / "web.yml",
        {"basic_auth_users": {"prom": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10)).decode()}},
    )
    log = tmp_path / "kern.log"
    log.write_text("")
    cfg = {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kern", "type": "file", "paths": [str(log)], "prefixes": [PREFIX]}],
        "surfaces": [
            {
                "name": "proxy",
                "match": {"dst": ["10.20.0.0/16"]},
                "spike": {"absolute_bytes_per_second": 20_000, "resolve_hold": "30s"},
            }
        ],
        "event_time": {"grace": "0.2s"},
    }
    fired: list[float] = []

    def on_change(change):
        if change.target == "proxy" and change.rule == "spike" and change.state == "firing":
            fired.append(time.monotonic())

    async with running_service(
        cfg, web_config=load_web_config(str(web)), on_change=on_change
    ) as service:
        url = f"http://127.0.0.1:{service.http_port}/metrics"
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

            async def scrape() -> tuple[int, float]:
                t0 = time.monotonic()
                async with session.get(url, headers=basic("prom", "s3cret")) as resp:
                    await resp.read()
                    return resp.status, time.monotonic() - t0

            assert (await scrape())[0] == 200  # the scraper has been let in once
            flood = await asyncio.create_subprocess_exec(
                sys.executable, str(ROOT / "bench" / "auth_flood.py"), "--flood", url,
                "--clients", str(CLIENTS), "--seconds", str(FLOOD_SECONDS),
                stdout=subprocess.PIPE,
            )  # fmt: skip
            started = time.monotonic()
            await asyncio.sleep(1.0)
            scrapes: list[tuple[int, float]] = []
            executor: list[float] = []
            burst_at = counted_after = None
            while time.monotonic() - started < FLOOD_SECONDS - 0.5:
                scrapes.append(await scrape())
                t0 = time.monotonic()
                await loop.run_in_executor(None, lambda: None)
                executor.append(time.monotonic() - t0)
                if burst_at is None and time.monotonic() - started > 2.0:
                    before = surface_totals(service, "proxy")[0]
                    burst_at = time.monotonic()
                    with open(log, "a") as fh:  # 100 kB in one tick: 200 kB/s, a spike
                        fh.write(records(100, time.time()))
                if (
                    burst_at is not None
                    and counted_after is None
                    and surface_totals(service, "proxy")[0] >= before + 100_000
                ):
                    counted_after = time.monotonic() - burst_at
                await asyncio.sleep(0.2)
            if counted_after is None:
                await wait_for(
                    lambda: surface_totals(service, "proxy")[0] >= before + 100_000, timeout=30
                )
                counted_after = time.monotonic() - burst_at
            await wait_for(lambda: bool(fired), timeout=30)
            out, _ = await flood.communicate()
        answers = json.loads(out)
    # The flood was one: thousands of wrong passwords, all refused.
    assert sum(answers.values()) > 500 and set(answers) <= {"401", "429"}, answers
    assert service.http is not None and service.http.web is not None
    gate = service.http.web.gate
    assert gate.checks > 10 and gate.refused > 0
    # The scraper was answered every time, each within a second.
    assert len(scrapes) >= 8 and all(status == 200 for status, _ in scrapes), scrapes
    assert max(seconds for _, seconds in scrapes) < 1.0, scrapes
    # The sources' pool was not held up, the burst was read and counted at once, and paged.
    assert max(executor) < 0.5, executor
    assert counted_after < 1.0, counted_after
    assert fired[0] - burst_at < 2.0


# -- the gate and the tables, one at a time -------------------------------------------------
def held_until(release: threading.Event):
    """A check that takes until ``release`` is set, answering what it is given."""

    def fn(value: bool) -> bool:
        release.wait(10)
        return value

    return fn


async def test_the_gate_bounds_waiting_checks_in_all_and_per_client():
    gate = AuthGate(threads=1, waiting=3, per_client=2)
    release = threading.Event()
    fn = held_until(release)
    try:
        first = asyncio.create_task(gate.run("10.0.0.1", fn, True))
        second = asyncio.create_task(gate.run("10.0.0.1", fn, True))
        await asyncio.sleep(0.05)
        # A third check from the same address is refused at once, whatever is free.
        t0 = time.monotonic()
        with pytest.raises(AuthBusy):
            await gate.run("10.0.0.1", fn, True)
        others = [asyncio.create_task(gate.run(f"10.0.1.{i}", fn, True)) for i in range(2)]
        await asyncio.sleep(0.05)
        # Three waiting (second and the two others): the next is refused at once too.
        with pytest.raises(AuthBusy):
            await gate.run("10.0.2.1", fn, True)
        assert time.monotonic() - t0 < 0.5
        assert gate.refused == 2
        release.set()
        assert await asyncio.gather(first, second, *others) == [True] * 4
        assert gate.checks == 4
    finally:
        gate.close()


async def test_credentials_that_passed_before_go_first_past_the_per_client_limit():
    gate = AuthGate(threads=1, waiting=2, per_client=1)
    release = threading.Event()
    order: list[str] = []

    def fn(name: str) -> bool:
        release.wait(10)
        order.append(name)
        return True

    try:
        running = asyncio.create_task(gate.run("10.0.0.1", fn, "running"))
        await asyncio.sleep(0.05)
        stranger = asyncio.create_task(gate.run("10.0.0.2", fn, "stranger"))
        await asyncio.sleep(0.05)
        # Same address as the running one, over the per-client limit: but it passed before.
        known = asyncio.create_task(gate.run("10.0.0.1", fn, "known", first=True))
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(running, stranger, known)
        assert order == ["running", "known", "stranger"]
    finally:
        gate.close()


@pytest.fixture
def bcrypt_calls(monkeypatch):
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def spy(password: bytes, hashed_password: bytes) -> bool:
        calls.append(password)
        return real(password, hashed_password)

    monkeypatch.setattr(bcrypt, "checkpw", spy)
    return calls


async def test_passed_and_failed_credentials_are_remembered_a_while(bcrypt_calls, monkeypatch):
    auth = BasicAuth({"prom": hashed("s3cret").encode()})
    try:
        for _ in range(3):
            assert await auth.verdict("prom", "s3cret", "10.0.0.1") is True
            assert await auth.verdict("prom", "guess", "10.0.0.2") is False
            assert await auth.verdict("mallory", "guess", "10.0.0.2") is False
        assert bcrypt_calls == [b"s3cret", b"guess", b"guess"]  # once each
        # Past their time, both are checked again.
        monkeypatch.setattr(webconfig, "AUTH_OK_TTL", 0.0)
        monkeypatch.setattr(webconfig, "AUTH_FAILED_TTL", 0.0)
        assert await auth.verdict("prom", "s3cret") is True
        assert await auth.verdict("prom", "guess") is False
        assert bcrypt_calls[3:] == [b"s3cret", b"guess"]
        # Nothing of a password is kept in the clear or as a plain digest: keys are HMACs
        # under a key of this table's own.
        other = BasicAuth(auth.users, auth.gate)
        assert auth._cache_key("prom", "s3cret") != other._cache_key("prom", "s3cret")
        assert all(b"s3cret" not in k for k in [*auth._passed, *auth._failed])
    finally:
        auth.gate.close()


async def test_the_tables_are_bounded(monkeypatch, bcrypt_calls):
    monkeypatch.setattr(webconfig, "AUTH_FAILED_ENTRIES", 5)
    monkeypatch.setattr(webconfig, "AUTH_OK_ENTRIES", 2)
    users = {f"u{i}": hashed("pw").encode() for i in range(4)}
    auth = BasicAuth(users)
    try:
        for i in range(20):
            assert await auth.verdict("u0", f"wrong{i}") is False
        for name in users:
            assert await auth.verdict(name, "pw") is True
        assert len(auth._failed) == 5 and len(auth._passed) == 2
    finally:
        auth.gate.close()


async def test_the_same_credentials_checked_at_once_cost_one_bcrypt(bcrypt_calls):
    auth = BasicAuth({"prom": hashed("s3cret").encode()})
    try:
        got = await asyncio.gather(*(auth.verdict("prom", "s3cret", "10.0.0.1") for _ in range(5)))
        assert got == [True] * 5 and bcrypt_calls == [b"s3cret"]
    finally:
        auth.gate.close()


async def test_a_reloaded_web_config_forgets_the_credentials_it_trusted(tmp_path):
    web = write(tmp_path / "web.yml", {"basic_auth_users": {"prom": hashed("s3cret")}})
    cfg = {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [],
    }
    async with running_service(cfg, web_config=load_web_config(str(web))) as service:
        assert service.http is not None and service.http.web is not None
        w = service.http.web
        assert await w.auth.check("prom", "s3cret")
        assert w.auth._passed
        # The same users, a new header: applied, and the tables start empty all the same.
        write(web, {"basic_auth_users": {"prom": hashed("s3cret")}, "http_server_config": {}})
        await wait_for(lambda: w.reloads == 1, timeout=10)
        assert not w.auth._passed and w.auth.gate is w.gate
        # A changed password is the one that counts at once.
        write(web, {"basic_auth_users": {"prom": hashed("new")}})
        await wait_for(lambda: w.reloads == 2, timeout=10)
        assert not await w.auth.check("prom", "s3cret")
        assert await w.auth.check("prom", "new")


async def test_no_request_runs_on_the_sources_pool(tmp_path):
    """Rendering, compressing, password checks and web config re-reads all run on the HTTP
    side's own threads: nothing a request does is submitted to the default executor."""
    submitted: list[str] = []

    class Recording(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            submitted.append(getattr(fn, "__qualname__", repr(fn)))
            return super().submit(fn, *args, **kwargs)

    default = Recording(2)
    asyncio.get_running_loop().set_default_executor(default)
    web = write(tmp_path / "web.yml", {"basic_auth_users": {"prom": hashed("s3cret")}})
    cfg = {"tick": "0.5s", "state_dir": str(tmp_path / "state"), "sources": []}
    async with running_service(cfg, web_config=load_web_config(str(web))) as service:
        assert service.http is not None and service.http.web is not None
        base = f"http://127.0.0.1:{service.http_port}"
        async with aiohttp.ClientSession() as session:
            for path in ("/", "/metrics", "/api/v1/surfaces?history=1", "/api/v1/alerts",
                         "/api/v1/notifications", "/healthz"):  # fmt: skip
                for auth in (basic("prom", "s3cret"), basic("prom", "wrong"), {}):
                    async with session.get(base + path, headers=auth) as resp:
                        await resp.read()
            # The page is large enough to be compressed off the loop (gzip asked for).
            async with session.get(base + "/", headers=basic("prom", "s3cret")) as resp:
                assert resp.status == 200
                assert resp.headers.get("Content-Encoding") in ("gzip", "deflate")
        write(web, {"basic_auth_users": {"prom": hashed("new")}})
        await wait_for(lambda: service.http.web.reloads == 1, timeout=10)
    assert submitted == [], submitted
