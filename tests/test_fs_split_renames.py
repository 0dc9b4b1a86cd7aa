"""Renames as real clients make them, on the real kernel, in every mode: a file written in one
directory and renamed into a directory made just before (npm's cacache, pip's cache); many
files renamed back and forth across directories while they are written, with the watcher's
reads and the engine's steps cut small so that renames straddle them; a whole tree of written
files renamed into the watched tree from outside, written into at once, and renamed out again.

Every byte written into the tree counts once, a rename of bytes already counted counts 0, and
bytes that arrive by a rename from outside count when they arrive.  The writers are other
processes (the collector's reader threads see them as they would any client), so with
fanotify each counted write must also name the writer's pid, including files written into a
directory made in the same step, which its scan credits (docs/fs-source.md, fanotify)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from alarm.collectors.fs import engine as fs_engine
from alarm.collectors.fs import reader as fs_reader
from tests.test_fs_kit import (
    MODES,
    Recorder,
    collector,
    make_space,
    quiesce,
    running,
    settings,
    tree_bytes,
)

space = pytest.fixture(params=[*MODES, "poll"])(make_space)
# Poll rounds a few times a second: a round over these trees (hundreds of directories) on a
# loaded machine can outlast a shorter interval, and quiesce() waits for a moment with none.
POLL = 0.25

# Writes a file in a/, makes a new directory (sometimes a few levels deep) and renames the
# file into it; every third new directory also gets a file written straight into it, and every
# fifth renamed file is appended to where it landed.
INTO_NEW_DIRS = r"""
import json, os, random, sys
tree, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(27)
a = os.path.join(tree, "a")
os.makedirs(a, exist_ok=True)
written = 0
for i in range(n):
    size = rng.randrange(1, 20_000)
    src = os.path.join(a, f"f{i}")
    with open(src, "wb") as f:
        f.write(os.urandom(size))
    written += size
    new = os.path.join(tree, f"n{i}", *(["x", "y"] if i % 4 == 0 else []))
    os.makedirs(new)
    dst = os.path.join(new, "f")
    os.rename(src, dst)
    if i % 3 == 0:
        with open(os.path.join(new, "direct"), "wb") as f:
            f.write(os.urandom(777))
        written += 777
    if i % 5 == 0:
        with open(dst, "ab") as f:
            f.write(os.urandom(333))
        written += 333
print(json.dumps({"written": written, "pid": os.getpid()}))
"""

# FILES files spread over directories, renamed across them in a tight loop while they are
# appended to; every so often into a directory made a moment before.
BACK_AND_FORTH = r"""
import json, os, random, sys
tree, files, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(2027)
dirs = [os.path.join(tree, f"d{k}") for k in range(8)]
for d in dirs:
    os.makedirs(d, exist_ok=True)
where = {}
written = 0
for i in range(files):
    p = os.path.join(rng.choice(dirs), f"f{i}")
    size = rng.randrange(1, 4000)
    with open(p, "wb") as f:
        f.write(os.urandom(size))
    written += size
    where[i] = p
made = 0
for r in range(rounds):
    for i in range(files):
        if rng.random() < 0.02:
            made += 1
            d = os.path.join(rng.choice(dirs), f"new{made}")
            os.mkdir(d)
            dirs.append(d)
        dst = os.path.join(rng.choice(dirs), f"f{i}")
        os.rename(where[i], dst)
        where[i] = dst
        if rng.random() < 0.3:
            size = rng.randrange(1, 2000)
            with open(dst, "ab") as f:
                f.write(os.urandom(size))
            written += size
        if rng.random() < 0.2:  # straight back, before anyone looked
            back = dst + ".tmp"
            os.rename(dst, back)
            os.rename(back, dst)
print(json.dumps({"written": written, "pid": os.getpid()}))
"""


def run_writer(script: str, *args: object) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def small_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads of 4 kB (a few dozen events) and a step per read: a rename's events, and a
    rename and the writes around it, land in different reads and different steps."""
    monkeypatch.setattr(fs_reader, "READ_SIZE", 4096)
    monkeypatch.setattr(fs_engine, "MAX_EVENTS", 1)


def new_files_name_their_writer(rec: Recorder, tree: Path, pid: int) -> None:
    """Every new file's bytes name the pid that wrote them, those a new directory's scan
    credited too.  (Not growths: one a scan sees before the event that says who wrote it is
    counted without a pid; docs/fs-source.md, fanotify.)"""
    news = ("created", "moved_in", "found_by_scan")
    counted = [
        e
        for e in rec.events
        if e.nbytes and e.key.startswith(str(tree) + "/") and e.evidence.get("change") in news
    ]
    assert counted
    without = [
        (e.key, e.evidence.get("change"), e.evidence.get("pid"))
        for e in counted
        if e.evidence.get("pid") != pid
    ]
    assert not without, f"{len(without)} of {len(counted)} writes without the writer's pid"


@pytest.mark.parametrize("settle", [0.05, 1.0])
async def test_a_file_renamed_into_a_directory_made_just_before_counts_once(
    space, monkeypatch: pytest.MonkeyPatch, settle: float
) -> None:
    mode, tree, _ = space
    small_reads(monkeypatch)
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=settle, poll_interval=POLL), rec)
    async with running(c, rec):
        w = await asyncio.to_thread(run_writer, INTO_NEW_DIRS, tree, 300)
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == w["written"] == tree_bytes(str(tree))
    if mode == "fanotify":
        new_files_name_their_writer(rec, tree, w["pid"])


async def test_files_renamed_back_and_forth_while_written_count_every_byte_once(
    space, monkeypatch: pytest.MonkeyPatch
) -> None:
    mode, tree, _ = space
    small_reads(monkeypatch)
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.05, poll_interval=POLL), rec)
    async with running(c, rec):
        w = await asyncio.to_thread(run_writer, BACK_AND_FORTH, tree, 500, 6)
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == w["written"] == tree_bytes(str(tree))


# A package tree written outside, renamed in, written into at once (new files, appends, a new
# subdirectory), then renamed out again.
MOVE_TREE = r"""
import json, os, sys
outside, tree, step = sys.argv[1], sys.argv[2], sys.argv[3]
pkg_out, pkg_in = os.path.join(outside, "pkg"), os.path.join(tree, "pkg")
out = {}
if step == "in":
    size = 0
    for s in range(5):
        for k in range(20):
            p = os.path.join(pkg_out, f"s{s}", "deep" if k % 2 else "", f"m{k}")
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(os.urandom(100 + 97 * k + s))
            size += 100 + 97 * k + s
    os.rename(pkg_out, pkg_in)
    added = 0
    for s in range(5):
        with open(os.path.join(pkg_in, f"s{s}", "m0"), "ab") as f:
            f.write(os.urandom(1000))
        os.makedirs(os.path.join(pkg_in, f"s{s}", "later"))
        with open(os.path.join(pkg_in, f"s{s}", "later", "n"), "wb") as f:
            f.write(os.urandom(2000))
        added += 3000
    out = {"moved_in": size, "written": added}
else:
    os.rename(pkg_in, os.path.join(outside, "pkg-gone"))
print(json.dumps(out))
"""


async def test_a_tree_renamed_in_from_outside_and_out_again(
    space, monkeypatch: pytest.MonkeyPatch
) -> None:
    mode, tree, outside = space
    small_reads(monkeypatch)
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.05, poll_interval=POLL), rec)
    async with running(c, rec):
        w = await asyncio.to_thread(run_writer, MOVE_TREE, outside, tree, "in")
        await quiesce(c)
        assert rec.bytes_under(str(tree)) == w["moved_in"] + w["written"]
        assert tree_bytes(str(tree)) == w["moved_in"] + w["written"]
        await asyncio.to_thread(run_writer, MOVE_TREE, outside, tree, "out")
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == w["moved_in"] + w["written"]
    assert tree_bytes(str(tree)) == 0
