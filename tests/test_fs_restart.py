"""State across restarts: the saved snapshot (position + ledger rows) is the starting state,
nothing old counts again, and what was written while the collector was down is found by the
reconcile scan and counted in the outage window.  Also: kill -9 at random moments with a
writer running (nothing twice, nothing lost), and a batch that failed to apply is re-sent."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_fs_kit import (
    MODES,
    Recorder,
    collector,
    make_space,
    mount_tmpfs,
    quiesce,
    running,
    settings,
    tree_bytes,
    write,
)

space = pytest.fixture(params=MODES)(make_space)
REPO = Path(__file__).resolve().parent.parent


async def test_restart_counts_what_changed_while_down_and_nothing_old(space) -> None:
    mode, tree, _outside = space
    (tree / "keep").mkdir()
    write(tree / "keep" / "grow.log", os.urandom(1000))
    write(tree / "keep" / "rewrite.db", os.urandom(4096))
    write(tree / "keep" / "gone.bin", os.urandom(2000))
    write(tree / "keep" / "move.bin", os.urandom(3000))
    cfg = settings([str(tree)], mode=mode, settle=0.1)
    rec = Recorder()
    c = collector(cfg, rec)
    async with running(c, rec):
        write(tree / "keep" / "while-up.bin", os.urandom(500))
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == 500
    saved_at = rec.position["at"]
    before = len(rec.events)

    # The outage.
    await asyncio.sleep(0.05)
    write(tree / "keep" / "grow.log", os.urandom(300), "ab")
    fd = os.open(tree / "keep" / "rewrite.db", os.O_WRONLY)
    os.pwrite(fd, os.urandom(64), 100)
    os.close(fd)
    os.unlink(tree / "keep" / "gone.bin")
    os.rename(tree / "keep" / "move.bin", tree / "moved.bin")
    (tree / "new" / "deep").mkdir(parents=True)
    write(tree / "new" / "deep" / "f.bin", os.urandom(700))
    write(tree / "new.bin", os.urandom(5000))
    await asyncio.sleep(0.05)
    down_until = time.time()

    c2 = collector(cfg, rec)  # a new process: from the saved position and ledger only
    async with running(c2, rec):
        await quiesce(c2)
    after = rec.events[before:]
    per_path = {}
    for e in after:
        per_path[e.key] = per_path.get(e.key, 0) + e.nbytes
    assert per_path == {
        str(tree / "keep" / "grow.log"): 300,
        str(tree / "keep" / "rewrite.db"): 0,
        str(tree / "new"): 0,
        str(tree / "new" / "deep"): 0,
        str(tree / "new" / "deep" / "f.bin"): 700,
        str(tree / "new.bin"): 5000,
    }
    (rw,) = [e for e in after if e.key.endswith("rewrite.db")]
    assert rw.capacity == 4096 and rw.evidence["change"] == "rewritten"
    for e in after:
        assert saved_at <= e.ts <= down_until + 1.0, "counted in the outage window"
    # The ledger is the tree as it is now: one row per file, none for the deleted one.
    files = set(rec.files())
    expect = set()
    for dirpath, _d, names in os.walk(tree):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            expect.add(f"f:{st.st_dev}:{st.st_ino}")
    assert files == expect
    assert rec.bytes_under(str(tree)) == 500 + 300 + 700 + 5000


@pytest.mark.parametrize("mode", ["inotify", "poll"])
async def test_a_new_file_on_the_inode_number_of_one_deleted_while_down_counts_its_size(
    tmp_path: Path, mode: str
) -> None:
    # ext4 (what tmp_path is on here and in CI) gives a freed inode number to the next file
    # at once; tmpfs does not, so this runs on tmp_path in both modes.
    tree = tmp_path / "tree"
    tree.mkdir()
    cfg = settings([str(tree)], mode=mode, settle=0.05, poll_interval=0.2)
    rec = Recorder()
    c = collector(cfg, rec)
    async with running(c, rec):
        for i in range(20):
            write(tree / f"old{i}", os.urandom(1000))
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == 20_000
    old_inodes = {os.lstat(tree / f"old{i}").st_ino for i in range(20)}
    before = len(rec.events)

    # The outage: every file deleted, new (bigger) files made on the freed numbers.
    for i in range(20):
        os.unlink(tree / f"old{i}")
    new_sizes = {f"new{i}": 3000 + i for i in range(20)}
    for name, size in new_sizes.items():
        write(tree / name, os.urandom(size))
    reused = old_inodes & {os.lstat(tree / n).st_ino for n in new_sizes}
    assert reused, "the file system reused no inode number: this test needs one that does"

    c2 = collector(cfg, rec)
    async with running(c2, rec):
        await quiesce(c2)
    after = rec.events[before:]
    assert {e.key: e.nbytes for e in after} == {str(tree / n): s for n, s in new_sizes.items()}
    assert all(e.evidence["change"] == "found_by_scan" for e in after)
    assert rec.counts["inodes_reused"] == len(reused)
    assert (
        rec.bytes_under(str(tree))
        == 20_000 + sum(new_sizes.values())
        == 20_000 + tree_bytes(str(tree))
    )


async def test_hard_links_across_five_restarts_are_no_new_events(space) -> None:
    # pnpm stores, uv caches, `cp -al` trees: many names per inode.  Names are not saved, so
    # each restart finds them all again; only a link made since counts (0 bytes, one event).
    mode, tree, _ = space
    cfg = settings([str(tree)], mode=mode, settle=0.05)
    rec = Recorder()
    c = collector(cfg, rec)
    async with running(c, rec):
        (tree / "store").mkdir()
        for i in range(200):
            write(tree / "store" / f"f{i}", os.urandom(100 + i))
        await quiesce(c)
        # Linked while watched: 9 more names each, in directories of their own.
        for k in range(9):
            (tree / f"copy{k}").mkdir()
            for i in range(200):
                os.link(tree / "store" / f"f{i}", tree / f"copy{k}" / f"f{i}")
        await quiesce(c)
    assert rec.counts["hard_links"] == 9 * 200
    written = rec.bytes_under(str(tree))
    (tree / "before").mkdir()  # present at the first start: linked there too
    for i in range(50):
        os.link(tree / "store" / f"f{i}", tree / "before" / f"f{i}")
    events = len(rec.events)
    for restart in range(5):
        c = collector(cfg, rec)
        async with running(c, rec):
            await quiesce(c)
        new = rec.events[events:]
        if restart == 0:  # the links made while it was down: one event each, no bytes
            assert len([e for e in new if e.evidence["change"] == "hard_link"]) == 50
            assert len(new) == 51  # and the directory they are in
        else:
            assert new == [], f"restart {restart}: {len(new)} phantom events"
        events = len(rec.events)
    assert rec.bytes_under(str(tree)) == written == sum(100 + i for i in range(200))
    # One more link while down, one event; one name fewer, none.
    os.link(tree / "store" / "f0", tree / "store" / "f0-again")
    os.unlink(tree / "copy0" / "f1")
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
    # (Which of f0's names is the new one a scan cannot tell: the event names one of them.)
    (link,) = rec.events[events:]
    st = os.lstat(tree / "store" / "f0")
    assert link.evidence["change"] == "hard_link" and link.nbytes == 0
    assert link.evidence["dev_ino"] == f"{st.st_dev}:{st.st_ino}"


async def test_a_batch_that_failed_to_apply_is_sent_again(tmp_path: Path) -> None:
    rec = Recorder()
    c = collector(settings([str(tmp_path)], mode="inotify", settle=0.05), rec)
    task = asyncio.create_task(c.run(rec))
    await asyncio.wait_for(c.ready.wait(), 20)
    rec.fail_next = 1
    write(tmp_path / "a", os.urandom(1234))
    with pytest.raises(RuntimeError, match="emit failed"):
        await asyncio.wait_for(task, 20)
    write(tmp_path / "b", os.urandom(4321))  # while the source is down
    async with running(c, rec):  # the service restarts the same collector
        await quiesce(c)
    assert rec.bytes_under(str(tmp_path)) == 1234 + 4321 == tree_bytes(str(tmp_path))
    assert sorted(e.key for e in rec.events) == [str(tmp_path / "a"), str(tmp_path / "b")]


# A child process that runs the collector and saves, after every batch, what the store would
# commit in one transaction (position, ledger rows, the counted totals) with an atomic rename.
CHILD = r"""
import asyncio, json, os, sys
from tests.test_fs_kit import Recorder, collector, quiesce, running, settings
state_file, tree, mode, until_quiet = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
NEW = ("created", "found_by_scan")

class Saving(Recorder):
    total = files = 0

    async def __call__(self, batch):
        n0 = len(self.events)
        await super().__call__(batch)
        new = self.events[n0:]
        self.total += sum(e.nbytes for e in new)
        self.files += sum(1 for e in new if e.evidence and e.evidence.get("change") in NEW)
        doc = {"position": self.position, "ledger": self.ledger,
               "bytes": self.total, "files": self.files}
        with open(state_file + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(state_file + ".tmp", state_file)

async def main():
    rec = Saving()
    if os.path.exists(state_file):
        with open(state_file) as f:
            doc = json.load(f)
        rec.position, rec.ledger = doc["position"], doc["ledger"]
        rec.total, rec.files = doc["bytes"], doc["files"]
    c = collector(settings([tree], mode=mode, settle=0.1), rec)
    async with running(c, rec):
        print("ready", flush=True)
        if until_quiet:
            await quiesce(c, timeout=120)
            return
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def _start_child(state: Path, tree: Path, mode: str, until_quiet: bool) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(state), str(tree), mode, "1" if until_quiet else "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"child did not start: {line!r}"
    return proc


def _writer(tree: Path, stop: threading.Event, seed: int) -> tuple[int, int]:
    """New files and appends until ``stop``; returns (files created, bytes written)."""
    rnd = random.Random(seed)
    files = written = 0
    logs = []
    i = 0
    while not stop.is_set():
        i += 1
        if rnd.random() < 0.7 or not logs:
            d = tree / f"d{i % 7}"
            d.mkdir(exist_ok=True)
            data = os.urandom(rnd.randint(0, 5000))
            write(d / f"f{i}", data)
            files += 1
            written += len(data)
            if rnd.random() < 0.2:
                logs.append(d / f"f{i}")
        else:
            data = os.urandom(rnd.randint(1, 300))
            write(rnd.choice(logs), data, "ab")
            written += len(data)
        time.sleep(0.002)
    return files, written


@pytest.mark.parametrize("mode", ["inotify", "fanotify"])
def test_kill_9_at_random_moments_counts_everything_once(
    tmp_path: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    base = tmp_path
    if mode == "fanotify":
        base = tmp_path / "mnt"
        mount_tmpfs(base, request)
    tree = base / "tree"
    tree.mkdir()
    write(tree / "before", os.urandom(999))  # the starting state
    state = tmp_path / "state.json"
    rnd = random.Random(7)
    result: dict[str, tuple[int, int]] = {}
    stop = threading.Event()
    w = threading.Thread(target=lambda: result.setdefault("w", _writer(tree, stop, 11)))
    child = _start_child(state, tree, mode, until_quiet=False)
    w.start()
    for _ in range(4):
        time.sleep(rnd.uniform(0.2, 1.0))
        child.send_signal(signal.SIGKILL)
        child.wait()
        time.sleep(rnd.uniform(0.0, 0.4))  # writes land while nothing watches
        child = _start_child(state, tree, mode, until_quiet=False)
    time.sleep(rnd.uniform(0.2, 1.0))
    stop.set()
    w.join()
    child.send_signal(signal.SIGKILL)
    child.wait()
    final = _start_child(state, tree, mode, until_quiet=True)
    assert final.wait(180) == 0
    doc = json.loads(state.read_text())
    files, written = result["w"]
    assert doc["bytes"] == written == tree_bytes(str(tree)) - 999
    assert doc["files"] == files
