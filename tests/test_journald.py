"""journald collector.

Real part: no journald runs in the test VM (no systemd as PID 1), so the kernel tests start a
private ``systemd-journald`` in its own mount namespace (tmpfs over /run and /var/log, its
journal directory bind-mounted from tmp_path) and point the collector's ``journalctl -D`` at
that directory.  That instance reads the real /dev/kmsg, so the records are the kernel's nft log
lines from a throwaway network namespace, as in production.

The exit/retry and cursor-reset paths use a fake ``journalctl`` put first on PATH: a script
printing entries in the real ``-o json`` format (fields copied from journald 252 output here)
and then exiting, because making the real one fail on cue is not possible.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from alarm.collectors.base import SourceUnavailable
from alarm.collectors.kernel.fence import FenceRead
from alarm.collectors.kernel.journald import MISSED_ID, JournaldCollector
from alarm.collectors.kernel.records import KernelRecord
from alarm.events import Batch
from tests.kernelnet import fence_netns, forged_fence, inject_kmsg, require_kernel

LEN_RE = re.compile(r" LEN=(\d+) ")
JOURNALD_PATHS = ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald")


def journald_binary() -> str | None:
    return next((p for p in JOURNALD_PATHS if os.access(p, os.X_OK)), None)


@dataclass
class PrivateJournald:
    pid: int
    directory: str  # pass to journalctl -D


@pytest.fixture
def private_journald(tmp_path: Path) -> Iterator[PrivateJournald]:
    require_kernel()
    binary = journald_binary()
    found = {
        "systemd-journald": binary,
        "unshare": shutil.which("unshare"),
        "journalctl": shutil.which("journalctl"),
    }
    missing = [name for name, path in found.items() if path is None]
    if missing:
        msg = f"needs {', '.join(missing)} (Debian: systemd, util-linux)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    runlog = tmp_path / "runlog"
    runlog.mkdir()
    script = (
        "set -e; mount -t tmpfs tmpfs /run; mkdir -p /run/log /run/systemd; "
        f"mount --bind {runlog} /run/log; mount -t tmpfs tmpfs /var/log; exec {binary}"
    )
    err = tmp_path / "journald.err"
    with open(err, "w") as err_fh:
        # unshare and sh both exec, so the pid is journald's.
        proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script], stderr=err_fh
        )
    try:
        deadline = time.monotonic() + 15
        while not list(runlog.glob("journal/*/system.journal")):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"private journald did not start: {err.read_text()[-500:]}")
            time.sleep(0.05)
        yield PrivateJournald(proc.pid, str(runlog / "journal"))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RecordTap:
    """A reader that keeps the records the collector read."""

    def __init__(self) -> None:
        self.records: list[KernelRecord] = []

    def read(self, records: list[KernelRecord]) -> FenceRead:
        self.records.extend(records)
        return FenceRead(None)


def tapped(**kw) -> JournaldCollector:
    return JournaldCollector(reader=RecordTap(), **kw)  # type: ignore[arg-type]


class Running:
    """A collector in the background, keeping every record it read and every count."""

    def __init__(self, collector: JournaldCollector) -> None:
        self.collector = collector
        self.batches: list[Batch] = []
        self.records: list[KernelRecord] = []
        self.counts: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def emit(self, batch: Batch) -> None:
        self.batches.append(batch)
        tap = self.collector.reader
        self.records.extend(tap.records)  # type: ignore[attr-defined]
        tap.records.clear()  # type: ignore[attr-defined]
        for k, n in batch.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n

    def count(self, name: str) -> int:
        return self.counts.get(name, 0)

    async def __aenter__(self) -> Running:
        self._task = asyncio.create_task(self.collector.run(self.emit))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def until(self, pred: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if self._task is not None and self._task.done():
                self._task.result()
            if time.monotonic() > deadline:
                raise TimeoutError("collector did not deliver in time")
            await asyncio.sleep(0.05)

    def has(self, text: str) -> bool:
        return any(r.message == text for r in self.records)

    async def mark(self, prefix: str, name: str) -> None:
        text = f"{prefix} MARK {name}"
        inject_kmsg(text)
        await self.until(lambda: self.has(text))

    async def following(self, prefix: str) -> None:
        """journalctl -f gives no "ready" signal: inject markers until one comes through."""
        deadline = time.monotonic() + 20
        i = 0
        while time.monotonic() < deadline:
            inject_kmsg(f"{prefix} MARK ready{i}")
            with contextlib.suppress(TimeoutError):
                await self.until(lambda: any("MARK ready" in r.message for r in self.records), 0.5)
                return
            i += 1
        raise TimeoutError("journalctl never started following")

    def fence(self, prefix: str) -> list[KernelRecord]:
        return [r for r in self.records if r.message.startswith(prefix + " IN=")]


def lens(records: list[KernelRecord]) -> list[int]:
    out = []
    for r in records:
        m = LEN_RE.search(r.message)
        assert m, r.message
        out.append(int(m.group(1)))
    return out


# -- real journald ------------------------------------------------------------------------
@pytest.mark.kernel
async def test_kernel_records_trust_and_cursor(private_journald: PrivateJournald) -> None:
    with fence_netns(proto="udp") as ns:
        async with Running(tapped(directory=private_journald.directory)) as run:
            await run.following(ns.prefix)
            ns.udp(20, payload=100)
            inject_kmsg(forged_fence(ns.prefix, 999), level=0)
            await run.mark(ns.prefix, "end")
        fence = run.fence(ns.prefix)
        real = [r for r in fence if r.trusted]
        forged = [r for r in fence if not r.trusted]
        assert lens(real) == [128] * 20 and ns.counter().packets == 20
        assert all(r.facility == 0 for r in real)
        # journald files the user-space write under _TRANSPORT=kernel; facility 1 exposes it.
        assert lens(forged) == [999] and forged[0].facility == 1
        assert run.collector.health.provenance_verified
        assert run.count("records_read") == len(run.records)
        cursor = next(b.position for b in reversed(run.batches) if b.position)
        assert cursor is not None and cursor["cursor"].startswith("s=")
        assert abs(run.records[-1].ts - time.time()) < 60

        # Restart from the cursor: what was logged meanwhile, exactly once.
        ns.udp(7, payload=10)
        inject_kmsg(f"{ns.prefix} MARK second")
        second = Running(tapped(position=cursor, directory=private_journald.directory))
        async with second:
            await second.until(lambda: second.has(f"{ns.prefix} MARK second"))
        assert lens(second.fence(ns.prefix)) == [38] * 7
        assert not any(r.message.endswith("MARK end") for r in second.records)


@pytest.mark.kernel
@pytest.mark.slow
async def test_journald_missed_messages_become_lost(private_journald: PrivateJournald) -> None:
    """Stop journald, overrun the ring buffer, resume: journald logs "Missed N kernel
    messages" and the collector turns that into records_lost."""
    with fence_netns(proto="udp") as ns:
        async with Running(tapped(directory=private_journald.directory)) as run:
            await run.following(ns.prefix)
            os.kill(private_journald.pid, signal.SIGSTOP)
            try:
                sent = ns.udp(5000, payload=20)
            finally:
                os.kill(private_journald.pid, signal.SIGCONT)
            await run.mark(ns.prefix, "end")
            await asyncio.sleep(0.5)
        got = len(run.fence(ns.prefix))
        lost = run.count("records_lost")
        assert got < sent.packets and lost > 0
        assert got + lost >= sent.packets  # journald's count covers every record it skipped


# -- fake journalctl (no journald needed) ---------------------------------------------------
BOOT = "1b2751311a964a009e3d3efd02305bae"


def entry(i: int, message: str, facility: str = "0", transport: str = "kernel") -> str:
    """One entry shaped like journald 252's ``-o json`` output on this VM."""
    obj = {
        "_BOOT_ID": BOOT,
        "__CURSOR": f"s=886e052a50f046a48e7b2aae826da266;i={i:x};b={BOOT};m=8f53e6c6;t=661834cb53b35;x=1",
        "__REALTIME_TIMESTAMP": str(1796066415819573 + i),
        "__MONOTONIC_TIMESTAMP": "2404640454",
        "_SOURCE_MONOTONIC_TIMESTAMP": "1708529085",
        "_TRANSPORT": transport,
        "PRIORITY": "4",
        "SYSLOG_FACILITY": facility,
        "_HOSTNAME": "vm",
        "MESSAGE": message,
    }
    if transport == "driver":
        obj["MESSAGE_ID"] = MISSED_ID
        obj["SYSLOG_IDENTIFIER"] = "systemd-journald"
    return json.dumps(obj)


FENCE = "EGRESS_FENCE tfake IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN={} TOS=0x00 PREC=0x00 TTL=64 ID=1 DF PROTO=UDP SPT=1 DPT=2 LEN=9 "


def fake_journalctl(tmp_path: Path, runs: list[list[str]], exit_codes: list[int]) -> Path:
    """A journalctl on PATH that logs its argv and plays ``runs[k]`` on its k-th call: each
    item is a stdout line, or ``!ERR text`` for stderr; then exits with ``exit_codes[k]``
    (-1: keep running, like ``-f``)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "argv.jsonl"
    script = bindir / "journalctl"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys, time\n"
        f"log, runs, codes = {str(log)!r}, {runs!r}, {exit_codes!r}\n"
        "with open(log, 'a') as f: f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "k = min(len(open(log).readlines()) - 1, len(runs) - 1)\n"
        "for line in runs[k]:\n"
        "    if line.startswith('!ERR '): print(line[5:], file=sys.stderr, flush=True)\n"
        "    else: print(line, flush=True)\n"
        "if codes[k] < 0: time.sleep(60)\n"
        "sys.exit(max(codes[k], 0))\n"
    )
    script.chmod(0o755)
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def test_exit_retry_and_resume_from_cursor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = [
        entry(1, FENCE.format(128)),
        entry(2, FENCE.format(999), facility="1"),  # /dev/kmsg write from user space
        entry(3, "Missed 7 kernel messages", facility="3", transport="driver"),
        "!ERR journal file rotated away",
    ]
    second = [entry(4, FENCE.format(60))]
    log = fake_journalctl(tmp_path, [first, second], [1, -1])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    collector = tapped(retry_max=0.2)
    async with Running(collector) as run:
        await run.until(lambda: len(run.records) == 3)
    assert [r.trusted for r in run.records] == [True, False, True]
    assert lens(run.records) == [128, 999, 60]
    assert run.count("records_lost") == 7 and run.count("records_read") == 3
    assert collector.restarts == 1
    assert "rotated away" in collector.health.last_error
    argv = calls(log)
    assert "-n" in argv[0] and not any(a.startswith("--after-cursor") for a in argv[0])
    cursor3 = json.loads(entry(3, ""))["__CURSOR"]
    assert f"--after-cursor={cursor3}" in argv[1] and "--no-tail" in argv[1]
    assert run.batches[-1].position == {"cursor": json.loads(entry(4, ""))["__CURSOR"]}
    assert argv[0][-4:] == [
        "_TRANSPORT=kernel",
        "+",
        "_TRANSPORT=driver",
        f"MESSAGE_ID={MISSED_ID}",
    ]


async def test_bad_cursor_restarts_from_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_journalctl(
        tmp_path,
        [["!ERR Failed to seek to cursor: Invalid argument"], [entry(9, FENCE.format(77))]],
        [1, -1],
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    collector = tapped(position={"cursor": "s=gone"}, retry_max=0.2)
    async with Running(collector) as run:
        await run.until(lambda: len(run.records) == 1)
    argv = calls(log)
    assert "--after-cursor=s=gone" in argv[0] and "-n" in argv[1]
    # A gap of unknown size: counted, and raised as records_lost by the pipeline.
    assert run.count("cursor_resets") == 1 and run.count("records_lost_unknown") == 1


async def test_missing_journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    collector = JournaldCollector()

    async def emit(batch: Batch) -> None:
        raise AssertionError("nothing to emit")

    with pytest.raises(SourceUnavailable, match="journalctl"):
        await collector.run(emit)
    assert not collector.health.up
