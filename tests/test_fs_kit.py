"""Helpers for the fs source tests (no tests here): a recorder standing in for the pipeline and
its store, and a way to run a collector until it is quiet.

The recorder applies every batch as the pipeline does, in one step: events kept, counter deltas
summed, the position replaced and ledger rows written (None deletes) into a dict, so a
"restart" is a new collector built from ``recorder.position`` and ``recorder.ledger``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from alarm.collectors.base import SourceContext
from alarm.collectors.fs.ledger import ledger_files
from alarm.collectors.fs.settings import FsSettings
from alarm.collectors.fs.source import FsCollector, build
from alarm.events import Batch, Event

CI = os.environ.get("CI") == "true"
MODES = ["inotify", "fanotify"]


@dataclass
class Recorder:
    batches: int = 0
    events: list[Event] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    position: dict[str, Any] | None = None
    ledger: dict[str, str] = field(default_factory=dict)
    watermarks: list[float] = field(default_factory=list)
    fail_next: int = 0  # raise on the next N emits (a pipeline that failed to apply)

    async def __call__(self, batch: Batch) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("emit failed (test)")
        self.batches += 1
        for name, n in batch.counts.items():
            self.counts[name] += n
        ev = batch.events
        if ev is not None:
            subjects = ev.subjects
            cap = ev.capacity_bytes()
            for j in range(len(ev)):
                i = int(ev.subject[j])
                self.events.append(
                    Event(
                        float(ev.ts[j]),
                        subjects.keys[i],  # type: ignore[attr-defined]
                        int(ev.nbytes[j]),
                        subjects.contributor(i),
                        int(ev.events[j]),
                        subjects.evidence(i),
                        int(cap[j]),
                    )
                )
        if batch.position is not None:
            self.position = batch.position
        if batch.watermark is not None:
            self.watermarks.append(batch.watermark)
        for key, value in (batch.ledger or {}).items():
            if value is None:
                self.ledger.pop(key, None)
            else:
                self.ledger[key] = value

    def files(self) -> dict[str, str]:
        """The saved inodes, one ``f:<dev>:<ino>`` -> ledger value each: the ledger's
        blocks and tombstones resolved as a restart reads them (ledger.py)."""
        return ledger_files(self.ledger)

    def bytes_under(self, prefix: str) -> int:
        p = prefix.rstrip("/") + "/"
        return sum(e.nbytes for e in self.events if e.key.startswith(p))

    def capacity_under(self, prefix: str) -> int:
        p = prefix.rstrip("/") + "/"
        return sum(e.capacity or 0 for e in self.events if e.key.startswith(p))

    def by_path(self) -> Counter[str]:
        c: Counter[str] = Counter()
        for e in self.events:
            c[e.key] += e.nbytes
        return c

    def changes(self, change: str) -> list[Event]:
        return [e for e in self.events if e.evidence and e.evidence.get("change") == change]


def settings(paths: list[str], **kw: Any) -> FsSettings:
    return FsSettings(name=kw.pop("name", "fs-test"), type="fs", paths=paths, **kw)


def collector(
    cfg: FsSettings, rec: Recorder | None = None, tick: float = 1.0, state_dir: str = ""
) -> FsCollector:
    """A collector resuming from what ``rec`` holds (a first start when it holds nothing)."""
    ledger = dict(rec.ledger) if rec is not None else {}
    position = rec.position if rec is not None else None
    ctx = SourceContext(tick, position, lambda: iter(list(ledger.items())), state_dir)
    return build(cfg, ctx)


async def wait_for(cond: Any, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def quiet(c: FsCollector, since: float, rounds: set[int]) -> bool:
    """Nothing to count: no queued events, no pending files or orphans, no scan but the poll
    rounds', and for poll trees a round started after ``since`` done.  ``rounds``: the ids of
    poll rounds seen running that started after ``since`` (kept between calls)."""
    e = c.engine
    readers = [w.reader for w in (e.inotify, e.fanotify) if w is not None]
    if e.state.pending or e.state.orphans or any(r.pending() for r in readers):
        return False
    if e.inotify is not None and e.inotify.holding:
        return False
    polls = [j for j in e.jobs if j.reason == "poll"]
    if len(polls) < len(e.jobs):
        return False
    if not e.polling:
        return True
    if not all(t.last_poll > since for t in e.trees):
        return False
    # Under load a round can take longer than poll_interval and the next starts at once: a
    # running round is the steady state then, and one seen after the call that has finished
    # is what says everything written before it was counted.
    running = {id(j) for j in polls}
    if polls and len(rounds) < 1_000:
        rounds.update(running)
    return not polls or bool(rounds - running)


async def quiesce(c: FsCollector, timeout: float = 30.0) -> None:
    """Until everything written before the call is counted: no queued events, no pending
    files, no scans, and for poll trees a round started after the call done; stable for
    0.3 s."""
    since = time.time()
    deadline = time.monotonic() + timeout
    stable = 0
    rounds: set[int] = set()
    while stable < 6:
        if time.monotonic() > deadline:
            raise AssertionError("collector did not go quiet")
        await asyncio.sleep(0.05)
        stable = stable + 1 if quiet(c, since, rounds) else 0
    if c.engine.state.settle:
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(c: FsCollector, rec: Recorder) -> AsyncIterator[FsCollector]:
    task = asyncio.create_task(c.run(rec))
    try:
        await wait_for(lambda: c.ready.is_set() or task.done(), what="first scans")
        if task.done():
            task.result()
        yield c
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def tree_bytes(root: str) -> int:
    """An independent accounting: the sizes of the files under ``root`` now (symlinks by
    their own size, nothing followed)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


def need_root(why: str) -> None:
    if os.geteuid() != 0:
        if CI:
            pytest.fail(f"CI runs as root: {why}")
        pytest.skip(f"needs root: {why}")


def mount_tmpfs(path: Path, request: pytest.FixtureRequest, size: str = "4g") -> None:
    need_root("mounting a private tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "capalarm-test", str(path)], check=True
    )
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(path)], check=False))


def make_space(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path, Path]:
    """The ``space`` fixture (``space = pytest.fixture(params=MODES)(make_space)`` in a test
    module): (mode, tree, a directory outside the tree on the same file system)."""
    mode = request.param
    base = tmp_path
    if mode == "fanotify":
        base = tmp_path / "mnt"
        mount_tmpfs(base, request)
    tree, outside = base / "tree", base / "outside"
    tree.mkdir()
    outside.mkdir()
    return mode, tree, outside


def write(path: Path | str | bytes, data: bytes, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)
