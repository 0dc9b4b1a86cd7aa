"""Lifecycles that must never page falsely or leave a page open: a source or surface removed by
a reload or between restarts resolves its alerts once and loses its series; a storm of SIGHUPs
under load never stops the service; kill -9 in the middle of a backlog loses nothing and
evaluates no tick twice."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from alarm.backtest import run_backtest
from alarm.collectors.kernel.synthetic import fence_line
from alarm.config import config_from_dict, load_config
from alarm.detector.sources import SOURCE_START_GRACE
from alarm.events import NAMED, Batch, Event, SourceHealth, WriteEvents
from alarm.service import Service
from tests.fakes.receiver import Receiver
from tests.fakes.server import free_port, serve
from tests.servicekit import get, metric, wait_for

PREFIX = "EGRESS_FENCE tlife"


class Tap:
    """A source the test writes to: named write events, on demand."""

    def __init__(self) -> None:
        self.health = SourceHealth(up=True, caught_up=True)
        self.queue: asyncio.Queue[list[Event]] = asyncio.Queue()

    def write(self, surface: str, nbytes: int) -> None:
        self.queue.put_nowait([Event(time.time(), (None, surface), nbytes, "writer")])

    async def run(self, emit: Any) -> None:
        while True:
            rows = await self.queue.get()
            await emit(Batch(WriteEvents.of(NAMED, rows), {"records_read": len(rows)}))


@contextlib.asynccontextmanager
async def service_from_file(path: Path, **kwargs: Any) -> AsyncIterator[Service]:
    service = Service(load_config(path), config_path=str(path), **kwargs)
    task = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(service.started.wait(), 10)
        yield service
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def lifecycle_config(tmp_path: Path, with_board: bool) -> dict:
    board = {
        "name": "board",
        "kind": "fs",
        "spike": {"enabled": False},
        "budget": {"allowance_bits_per_second": 100, "tolerance_bits": 800, "resolve_hold": "1h"},
    }
    sources: list[dict] = [{"name": "tap", "type": "fs", "paths": [str(tmp_path / "watched")]}]
    if with_board:
        # A source that cannot read: down, alarmed as source_down.
        sources.append({"name": "gone", "type": "kmsg", "kmsg_path": "/nonexistent/kmsg"})
    return {
        "tick": "0.2s",
        "state_dir": str(tmp_path / "state"),
        "http": {"listen": "127.0.0.1:0"},
        "sources": sources,
        "surfaces": [board, {"name": "keep", "kind": "fs"}]
        if with_board
        else [{"name": "keep", "kind": "fs"}],
        "unclassified_spike": {"enabled": False},
        # The down source holds ticks open at start for at most this long.
        "event_time": {"lateness": "2s"},
    }


async def test_a_reload_that_removes_a_firing_surface_and_a_down_source_resolves_each_once(
    tmp_path,
):
    (tmp_path / "watched").mkdir()
    path = write_config(tmp_path / "c.yaml", lifecycle_config(tmp_path, with_board=True))
    changes: list[dict] = []
    tap = Tap()
    async with service_from_file(
        path, collectors={"tap": tap}, on_change=lambda c: changes.append(c.to_dict())
    ) as service:
        tap.write("board", 1000)  # 8 kbit against 800 bits of tolerance

        def firing(target: str, rule: str) -> bool:
            return any(
                c["state"] == "firing"
                and c.get("surface", c.get("source")) == target
                and c["rule"] == rule
                for c in changes
            )

        await wait_for(
            lambda: firing("board", "budget") and firing("gone", "source_down"),
            20 + SOURCE_START_GRACE,
        )
        write_config(path, lifecycle_config(tmp_path, with_board=False))
        assert await service.reload()
        resolved = [c for c in changes if c["state"] == "resolved"]
        assert sorted((c.get("surface") or c.get("source"), c["rule"]) for c in resolved) == [
            ("board", "budget"),
            ("gone", "source_down"),
        ]
        assert all("removed from the configuration" in c["summary"] for c in resolved)
        _, _, text = await get(service, "/metrics")
        assert 'surface="board"' not in text and 'source="gone"' not in text
        assert metric(text, "capalarm_surface_written_bytes_total", surface="keep") == 0
        # The surface that stayed keeps counting; nothing is re-announced.
        tap.write("keep", 10)
        await asyncio.sleep(1.0)
        assert [c for c in changes if c["state"] == "firing" and c["at"] > resolved[0]["at"]] == []


async def test_a_surface_removed_between_restarts_resolves_at_start(tmp_path):
    (tmp_path / "watched").mkdir()
    path = write_config(tmp_path / "c.yaml", lifecycle_config(tmp_path, with_board=True))
    tap = Tap()
    changes: list[dict] = []
    async with service_from_file(
        path, collectors={"tap": tap}, on_change=lambda c: changes.append(c.to_dict())
    ):
        tap.write("board", 1000)
        # Both firing when it stops: the budget, and the source that never opens (down once
        # its start grace is over).
        await wait_for(
            lambda: (
                {c["rule"] for c in changes if c["state"] == "firing"} >= {"budget", "source_down"}
            ),
            20 + SOURCE_START_GRACE,
        )
    write_config(path, lifecycle_config(tmp_path, with_board=False))
    after: list[dict] = []
    async with service_from_file(
        path, collectors={"tap": Tap()}, on_change=lambda c: after.append(c.to_dict())
    ):
        await wait_for(lambda: len(after) >= 2, 10)
        await asyncio.sleep(0.5)
    assert sorted((c.get("surface") or c.get("source"), c["rule"], c["state"]) for c in after) == [
        ("board", "budget", "resolved"),
        ("gone", "source_down", "resolved"),
    ]


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(ts))


def write_backlog(log: Path, start: float, seconds: int) -> int:
    """A 1 kB record a second, with a 20x burst for ten minutes in the middle."""
    total = 0
    with open(log, "w") as fh:
        for s in range(seconds):
            n = 20 if seconds // 2 <= s < seconds // 2 + 600 else 1
            for k in range(n):
                fh.write(f"{rfc3339(start + s)} host kernel: ")
                fh.write(fence_line(PREFIX, "10.20.1.5", 443, "TCP", 1000, 40000 + k) + "\n")
                total += 1000
    return total


def subprocess_config(tmp_path: Path, log: Path, port: int, hook: str) -> dict:
    return {
        "tick": "10s",
        "state_dir": str(tmp_path / "state"),
        "http": {"listen": f"127.0.0.1:{port}"},
        "sources": [{"name": "kern", "type": "file", "paths": [str(log)], "prefixes": [PREFIX]}],
        "surfaces": [
            {
                "name": "proxy",
                "match": {"dst": ["10.20.0.0/16"]},
                "spike": {"absolute_bytes_per_second": 15_000},
                "budget": {"allowance_bits_per_second": 16000, "tolerance_bits": 4e6},
            }
        ],
        "unclassified_spike": {"enabled": False},
        "event_time": {"lateness": "5s"},
        "webhooks": [{"url": hook, "name": "rx", "timeout": "2s"}],
    }


async def scrape(port: int) -> str | None:
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(5)) as r,
        ):
            return await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None


def start(config: Path, stderr: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "alarm.cli", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=stderr.open("a"),
    )


async def last_tick(port: int) -> float:
    text = await scrape(port)
    value = metric(text, "capalarm_last_tick_timestamp_seconds") if text else None
    return value or 0.0


async def test_kill_9_in_the_middle_of_a_backlog_then_restart_is_exact(tmp_path):
    log = tmp_path / "kern.log"
    tick = 10.0
    # A day of backlog: the file source reads it natively in chunks and the detector judges
    # its 8,640 ticks in about a second, so a scrape every 20 ms lands inside it (four hours
    # went through in 0.1 s, between two scrapes).
    hours = 24
    # The backlog ends three minutes ago: ticks past its end (up to end + 120, every alert
    # it raises resolved) are then evaluated at once, not waited for.
    first = (time.time() // tick - hours * 360 - 16) * tick
    total = write_backlog(log, first, hours * 3600 - 20)
    end = first + hours * 3600 - 20
    rx = Receiver()
    port = free_port()
    stderr = tmp_path / "capalarm.log"
    async with serve(rx.app()) as srv:
        cfg = subprocess_config(tmp_path, log, port, f"{srv.base}/hook")
        path = write_config(tmp_path / "c.yaml", cfg)
        proc = start(path, stderr)
        try:
            # Kill it once it is well into the backlog, but not through it.
            await wait_for(lambda: last_tick(port), 30)
            await wait_for(lambda: _between(last_tick(port), first + 600, end - 3600), 60, 0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed_at = rx.unique()
            proc = start(path, stderr)

            async def done() -> bool:
                return await last_tick(port) >= end + 120

            await wait_for(done, 120)
            text = await scrape(port)
            assert text is not None
            assert metric(text, "capalarm_surface_written_bytes_total", surface="proxy") == total
            # Every tick from the first record's to the last evaluated, each exactly once.
            evaluated = metric(text, "capalarm_ticks_total")
            last = metric(text, "capalarm_last_tick_timestamp_seconds")
            assert evaluated == round((last - first) / tick), (evaluated, first, last)
            assert metric(text, "capalarm_internal_errors_total") == 0  # no call raised
            await asyncio.sleep(2)  # deliveries
        finally:
            proc.terminate()
            proc.wait(10)
    # The same alert changes the backtest gives on the file, none twice.
    out = io.StringIO()
    run_backtest(config_from_dict({**cfg, "webhooks": []}), [str(log)], out, workers=2)
    expected = {
        (c["fingerprint"], c["state"], c["at"])
        for c in map(json.loads, out.getvalue().splitlines())
        if c["state"] in ("firing", "resolved")
    }
    got = [
        (r.payload["fingerprint"], r.payload["state"], r.payload["at"])
        for r in rx.unique().values()
    ]
    assert len(got) == len(set(got)), "an alert was delivered twice under different ids"
    assert {g for g in got if g[2] <= end + 60} == {e for e in expected if e[2] <= end + 60}
    assert killed_at is not None and expected


async def _between(value: Any, lo: float, hi: float) -> bool:
    v = await value
    return lo <= v <= hi


async def test_a_storm_of_sighups_under_load_never_stops_the_service(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    port = free_port()
    stderr = tmp_path / "capalarm.log"
    cfg = subprocess_config(tmp_path, log, port, "http://127.0.0.1:9/hook")
    cfg["tick"] = "0.5s"
    path = write_config(tmp_path / "c.yaml", cfg)
    proc = start(path, stderr)
    sent = 0
    try:
        await wait_for(lambda: scrape(port), 30)
        for _ in range(100):
            with log.open("a") as fh:
                for k in range(50):
                    fh.write(f"{rfc3339(time.time())} host kernel: ")
                    fh.write(fence_line(PREFIX, "10.20.1.5", 443, "TCP", 100 + k, 40000 + k))
                    fh.write("\n")
                    sent += 100 + k
            os.kill(proc.pid, signal.SIGHUP)
            await asyncio.sleep(0.02)
        assert proc.poll() is None, stderr.read_text()[-3000:]

        async def counted() -> bool:
            text = await scrape(port)
            return bool(text) and (
                metric(text, "capalarm_surface_written_bytes_total", surface="proxy") == sent
            )

        await wait_for(counted, 30)
        assert proc.poll() is None
        assert "Traceback" not in stderr.read_text()
    finally:
        proc.terminate()
        proc.wait(10)
