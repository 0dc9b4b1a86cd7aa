"""Faults: a receiver that is down and comes back, one that answers 500, times out or speaks
garbage, ``kill -9`` of the service in the middle of a delivery (and at random points) with
restarts, and a full disk under the state directory."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.synthetic import fence_line
from alarm.events import Batch, SourceHealth
from tests.fakes.kit import PROMPT_RESOLVES, change, record, running_notifications
from tests.fakes.receiver import Receiver
from tests.fakes.server import free_port, serve
from tests.servicekit import get, metric, running_service, wait_for


def per_alert_states(rx: Receiver) -> dict[str, list[str]]:
    """Statuses per alert, as a receiver that drops duplicate webhook-ids sees them."""
    out: dict[str, list[str]] = {}
    for r in rx.unique().values():
        data = r.payload["data"]
        out.setdefault(data["fingerprint"], []).append(data["status"])
    return out


async def test_receiver_down_then_back_gets_every_alert_once_in_order(tmp_path):
    """The receiver's port refuses connections for 20 s (backoff capped at 2 s: past the cap a
    longer outage behaves the same), then it listens again."""
    port = free_port()
    rx = Receiver()
    cfg = {
        "destinations": [
            {
                "type": "webhook",
                "name": "w",
                "url": f"http://127.0.0.1:{port}/hook",
                "concurrency": 16,
            }
        ],
        "outbox": {"base_backoff": "200ms", "max_backoff": "2s"},
    }
    async with running_notifications(tmp_path, cfg) as n:
        t0 = time.time()
        targets = [f"s{i}" for i in range(100)]
        await record(n, *[change(t, at=t0) for t in targets])
        await asyncio.sleep(10)
        await record(n, *[change(t, "spike", "resolved", at=t0 + 10) for t in targets])
        await asyncio.sleep(10)
        (ch,) = n.views
        assert ch.queue_depth == 200 and ch.sent == 0 and ch.retried >= 100
        back = time.monotonic()
        async with serve(rx.app(), port):
            await wait_for(lambda: len(rx.received) == 200, timeout=30)
            drained = time.monotonic() - back
            await wait_for(lambda: ch.queue_depth == 0, timeout=5)
    assert len(set(rx.ids())) == 200 == len(rx.ids())  # every one delivered, none twice
    states = per_alert_states(rx)
    assert len(states) == 100 and all(s == ["firing", "resolved"] for s in states.values())
    assert drained < 10, f"drained in {drained:.1f}s after the receiver came back"
    assert ch.dead_letters == 0


async def test_receiver_answering_500_timeouts_and_garbage(tmp_path):
    rx = Receiver(hang_seconds=1.5)
    rx.fail_next(["500", "hang", "garbage"] * 6)
    async with serve(rx.app()) as srv:
        cfg = {
            "destinations": [
                {"type": "webhook", "name": "w", "url": f"{srv.base}/hook", "timeout": "500ms"}
            ],
            "outbox": {"base_backoff": "50ms", "max_backoff": "200ms"},
        }
        async with running_notifications(tmp_path, cfg) as n:
            await record(n, *[change(f"t{i}") for i in range(10)])
            await wait_for(lambda: len(rx.unique()) == 10, timeout=30)
            (ch,) = n.views
            await wait_for(lambda: ch.queue_depth == 0, timeout=5)
    assert ch.retried >= 18 and ch.sent == 10 and ch.failed == 0
    assert len(rx.ids()) == len(set(rx.ids()))
    # Each one went out under the same webhook-id on every attempt.
    assert set(rx.attempted_ids) == set(rx.ids())


# -- redirects -------------------------------------------------------------------------

REDIRECTS = (301, 302, 303, 307, 308)
SECRET_HEADER = "X-Hook-Token"


@dataclass
class Hits:
    """What arrived where a redirect pointed: method, path, headers and body of each request."""

    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    def app(
        self, answer: Callable[[web.Request], web.StreamResponse] | None = None
    ) -> web.Application:
        async def any_path(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            self.seen.append((request.method, request.path, dict(request.headers), body))
            return answer(request) if answer else web.json_response({"ok": True})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", any_path)
        return app


async def test_a_redirect_is_a_failed_delivery_never_followed_to_any_origin(tmp_path, monkeypatch):
    """Every sender's receiver answers a 301/302/303/307/308, to a path of its own origin or
    to another port (another origin, standing in for a host an attacker chose).  aiohttp's
    default followed them: a 303 turned the POST into a GET whose 200 counted as delivered,
    and a 307 carried the signed body and the secret header to the other origin."""
    other = Hits()
    landing = Hits()  # the receiver's own origin, where "same" redirects point

    def redirect(request: web.Request) -> web.StreamResponse:
        parts = request.path.split("/")  # /r/<code>/<same|other>/...
        if parts[1] != "r":
            return web.json_response({"ok": True})  # the landing page: 200 to anything
        code, where = int(parts[2]), parts[3]
        if where == "same":
            location = "/landing"
        else:  # the same path on another origin, with credentials and a token in the query
            location = f"http://user:pw-in-location@127.0.0.1:{other_port}{request.path}?sig=s1g"
        return web.Response(status=code, headers={"Location": location})

    async with serve(other.app()) as other_srv, serve(landing.app(redirect)) as srv:
        other_port = other_srv.port
        base = srv.base
        destinations: list[dict[str, Any]] = [
            {
                "type": "webhook",
                "name": f"w{code}{where}",
                "url": f"{base}/r/{code}/{where}/hook",
                "headers": {SECRET_HEADER: "hook-secret"},
            }
            for code in REDIRECTS
            for where in ("same", "other")
        ]
        destinations += [
            {"type": "alertmanager", "name": "am", "urls": [f"{base}/r/307/other/am"]},
            {
                "type": "pagerduty",
                "name": "pd",
                "url": f"{base}/r/308/other/pd",
                "routing_key": {"env": "CAPALARM_PD_KEY"},
            },
            {"type": "slack", "name": "chat", "url": {"env": "CAPALARM_SLACK_URL"}},
        ]
        monkeypatch.setenv("CAPALARM_PD_KEY", "R" * 32)
        monkeypatch.setenv("CAPALARM_SLACK_URL", f"{base}/r/301/other/services/T0/B0/slacktoken")
        cfg = {
            "destinations": destinations,
            "outbox": {"base_backoff": "20ms", "max_backoff": "100ms"},
        }
        async with running_notifications(tmp_path, cfg) as n:
            await record(n, change())
            views = list(n.views)
            try:
                await wait_for(lambda: all(ch.retried >= 2 or ch.sent for ch in views), timeout=20)
            finally:
                api = await n.api()
    assert {ch.name: ch.sent for ch in views if ch.sent} == {}
    assert all(ch.failed == 0 for ch in views)  # retried like any failure, not dead-lettered
    assert other.seen == []  # not one request reached the other origin
    assert [(m, p) for m, p, _, _ in landing.seen if p == "/landing"] == []
    errors = {c["channel"]: c["queued"][0]["last_error"] for c in api["channels"]}
    for code in REDIRECTS:
        assert f"HTTP {code} redirect to {base}/landing not followed" in errors[f"w{code}same"]
        reason = errors[f"w{code}other"]
        assert (
            f"HTTP {code} redirect to http://127.0.0.1:{other_port}/r/{code}/other/hook" in reason
        )
    assert f"http://127.0.0.1:{other_port}/r/307/other/am/api/v2/alerts" in errors["am"]
    assert f"http://127.0.0.1:{other_port}/r/308/other/pd" in errors["pd"]
    # Slack's URL path is its secret: only the origin the redirect named.
    assert f"HTTP 301 redirect to http://127.0.0.1:{other_port}/ not followed" in errors["chat"]
    shown = json.dumps(api)
    assert "pw-in-location" not in shown and "s1g" not in shown and "slacktoken" not in shown


# -- kill -9 ---------------------------------------------------------------------------


PREFIX = "EGRESS_FENCE"


def burst(log: Path, n: int) -> None:
    """``n`` records logged now (each counts in the tick its timestamp falls in)."""
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime())
    with log.open("a") as fh:
        for i in range(n):
            line = fence_line(PREFIX, "198.51.100.7", 8080, "TCP", 600, 40000 + i)
            fh.write(f"{stamp} host kernel: [ 1.{i:06d}] {line}\n")


def service_config(tmp_path: Path, port: int, hook: str, silences: str = "[]") -> Path:
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    (tmp_path / "secret").write_text(secret)
    path = tmp_path / "capalarm.yaml"
    path.write_text(
        f"""
tick: 0.5s
state_dir: {tmp_path / "state"}
http: {{listen: "127.0.0.1:{port}"}}
sources:
  - {{name: kern, type: file, paths: ["{tmp_path / "kern.log"}"], format: syslog, start_at_end: false}}
unclassified:
  egress: {{allowance_bits_per_second: 64000, tolerance_bits: 32000, resolve_hold: 1s}}
unclassified_spike: {{enabled: false}}
notifications:
  destinations:
    - type: webhook
      name: hook
      url: "{hook}"
      secrets: [{{file: "{tmp_path / "secret"}"}}]
  outbox: {{base_backoff: 100ms, max_backoff: 500ms}}
  flap: {{reopen_window: 0s}}  # resolves at once: this test follows each change
  silences: {silences}
"""
    )
    return path


@contextlib.asynccontextmanager
async def capalarm(config: Path, port: int, log: Path) -> AsyncIterator[subprocess.Popen]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "alarm.cli", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("a"),
    )

    async def up() -> bool:
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{port}/healthz") as r,
            ):
                return r.status == 200
        except aiohttp.ClientError:
            return proc.poll() is not None  # died: stop waiting, the assert below says so

    try:
        await wait_for(up, timeout=20)
        assert proc.poll() is None, log.read_text()[-2000:]
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


async def api(port: int) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}/api/v1/notifications") as r,
    ):
        return await r.json()


def secret_of(tmp_path: Path) -> str:
    return (tmp_path / "secret").read_text().strip()


@contextlib.asynccontextmanager
async def paging_to(tmp_path: Path, rx: Receiver) -> AsyncIterator[tuple[Path, int, Path, Path]]:
    """``rx`` served on loopback and a service config that pages it: (config, the service's
    port, an empty kern.log its file source reads, where its log is to go)."""
    port = free_port()
    kern = tmp_path / "kern.log"
    kern.write_text("")
    async with serve(rx.app()) as srv:
        config = service_config(tmp_path, port, f"{srv.base}/hook")
        rx.secret = secret_of(tmp_path)
        yield config, port, kern, tmp_path / "capalarm.log"


async def test_kill_9_mid_delivery_and_at_random_points_then_restart(tmp_path):
    port = free_port()
    kern = tmp_path / "kern.log"
    kern.write_text("")
    stderr = tmp_path / "capalarm.log"
    rx = Receiver(hang_seconds=60)
    async with serve(rx.app()) as srv:
        config = service_config(tmp_path, port, f"{srv.base}/hook")
        rx.secret = secret_of(tmp_path)
        rx.fail_next(["hang"])  # the first delivery never gets its answer...

        async with capalarm(config, port, stderr) as proc:
            burst(kern, 40)  # 24 kB in one tick: the capacity budget fires
            await asyncio.wait_for(rx.arrived.wait(), 20)
            hung = rx.attempted_ids[0]
            proc.send_signal(signal.SIGKILL)  # ...because the service dies in the middle of it
            proc.wait(5)

        async with capalarm(config, port, stderr):
            # The restarted service sends it again, under the same idempotency key.
            await wait_for(lambda: hung in rx.ids(), timeout=20)
            await wait_for(
                lambda: [s for s in per_alert_states(rx).values() if s[-1] == "resolved"], 20
            )

        # More alerts, with kill -9 at random moments: mid-tick, mid-write, mid-delivery.
        rng = random.Random(3)
        for cycle in range(4):
            async with capalarm(config, port, stderr) as proc:
                # Each burst a different size: equal bursts at the restarts' steady rhythm are
                # a beacon, rightly, and that alert would still be open when the wait below ends.
                burst(kern, 47 + 13 * cycle)
                await asyncio.sleep(rng.uniform(0.2, 1.8))
                proc.send_signal(signal.SIGKILL)
                proc.wait(5)

        async with capalarm(config, port, stderr) as proc:

            async def settled() -> bool:
                body = await api(port)
                idle = all(c["queue_depth"] == 0 for c in body["channels"])
                quiet = all(a["state"] == "resolved" for a in body["alerts"])
                return idle and quiet and bool(body["alerts"])

            try:
                await wait_for(settled, timeout=30)
            except AssertionError:
                body = await api(port)
                raise AssertionError(
                    f"not settled: {body['channels']} {body['alerts']}\n{stderr.read_text()[-3000:]}"
                ) from None
            body = await api(port)
            # SIGHUP reloads the notifications section; the running service takes the silence.
            config = service_config(
                tmp_path,
                port,
                f"{srv.base}/hook",
                '[{match: {kinds: [egress]}, ends: "2099-01-01T00:00:00Z", comment: maintenance}]',
            )
            proc.send_signal(signal.SIGHUP)
            await wait_for(lambda: _silences(port), timeout=10)

    assert rx.bad_signatures == []
    states = per_alert_states(rx)
    assert states, "nothing was delivered"
    for fp, seq in states.items():
        # Per alert: firing, resolved, firing, resolved ... never two of a kind in a row once
        # duplicates are dropped, and never left firing at the receiver.
        assert all(a != b for a, b in itertools.pairwise(seq)), (fp, seq)
        assert seq[0] == "firing" and seq[-1] == "resolved", (fp, seq)
    assert body["dead_letters"] == []
    assert "Traceback" not in stderr.read_text()


async def _silences(port: int) -> bool:
    body = await api(port)
    return [s["comment"] for s in body["silences"]] == ["maintenance"]


# -- disk full -------------------------------------------------------------------------


class TapCollector:
    """Emits kernel-written fence records when the test says so."""

    def __init__(self, name: str, tick: float):
        self.name = name
        self.health = SourceHealth(provenance_verified=True)
        self.reader = FenceReader((PREFIX,), require_trusted=True, tick=tick)
        self.queue: asyncio.Queue[list[KernelRecord]] = asyncio.Queue()

    def burst(self, n: int) -> None:
        self.queue.put_nowait(
            [
                KernelRecord(
                    ts=time.time(),
                    message=fence_line(PREFIX, "198.51.100.9", 8080, "TCP", 600, 41000 + i),
                    facility=0,
                    trusted=True,
                )
                for i in range(n)
            ]
        )

    async def run(self, emit):
        self.health.up = True
        self.health.caught_up = True
        while True:
            records = await self.queue.get()
            read = self.reader.read(records)
            await emit(Batch(read.events, {"records_read": len(records)}))


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "8m"):
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a tmpfs for the disk-full test: {res.stderr.strip()}")
        pytest.skip(f"needs root to mount a small tmpfs: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """Fill the file system to the last byte (big chunks, then pages, then bytes)."""
    filler = path / "filler"
    with filler.open("wb", buffering=0) as fh:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * size)
    return filler


async def test_disk_full_on_the_state_directory_raises_an_alarm_and_drops_nothing(tmp_path, caplog):
    rx = Receiver()
    with small_tmpfs(tmp_path / "state"):
        async with serve(rx.app()) as srv:
            cfg: dict[str, Any] = {
                "tick": "0.2s",
                "state_dir": str(tmp_path / "state"),
                "sources": [{"name": "tap"}],
                "unclassified": {
                    "egress": {
                        "allowance_bits_per_second": 64000,
                        "tolerance_bits": 32000,
                        "resolve_hold": "0.5s",
                    }
                },
                "unclassified_spike": {"enabled": False},
                "notifications": {
                    "destinations": [{"type": "webhook", "name": "w", "url": f"{srv.base}/hook"}],
                    "outbox": {"base_backoff": "50ms", "max_backoff": "200ms"},
                    "flap": PROMPT_RESOLVES,
                },
            }
            tap = TapCollector("tap", 0.2)
            async with running_service(cfg, collectors={"tap": tap}) as svc:
                await asyncio.sleep(0.5)
                filler = fill(tmp_path / "state")
                tap.burst(40)  # 24 kB: the budget fires while nothing can be written

                def got(rule: str, status: str) -> bool:
                    return any(
                        r.payload["data"]["rule"] == rule and r.payload["data"]["status"] == status
                        for r in rx.received
                    )

                await wait_for(lambda: got("outbox_write_failed", "firing"), timeout=15)
                await wait_for(lambda: got("budget", "firing"), timeout=15)
                _, _, text = await get(svc, "/metrics")
                _, _, body = await get(svc, "/api/v1/notifications")
                assert "database or disk is full" in json.loads(body)["outbox"]["write_error"]

                filler.unlink()  # room again: held changes are stored, the alarm resolves
                await wait_for(lambda: got("outbox_write_failed", "resolved"), timeout=15)
                await wait_for(lambda: got("budget", "resolved"), timeout=15)
                ch = svc.notify.views[0]
                await wait_for(lambda: ch.queue_depth == 0, timeout=10)

    alarm = next(r for r in rx.received if r.payload["data"]["rule"] == "outbox_write_failed")
    assert alarm.payload["data"]["severity"] == "critical"
    assert "cannot write notifications" in alarm.payload["data"]["summary"]
    assert metric(text, "capalarm_notifier_unpersisted", notifier="w") is not None
    assert metric(text, "capalarm_notifier_unjournaled_total", notifier="w") == 0  # all fit
    assert "cannot write notifications to" in caplog.text or "cannot be written to" in caplog.text
    # Delivered from memory, then stored: not sent a second time.
    assert len(rx.ids()) == len(set(rx.ids()))
    budget = [
        r.payload["data"]["status"] for r in rx.received if r.payload["data"]["rule"] == "budget"
    ]
    assert budget == ["firing", "resolved"]
