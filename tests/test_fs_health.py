"""Proof of sight: canaries seen (never counted), a watch that silently stopped seeing (a file
system mounted over the tree) caught by the canary, a tree deleted and recreated, a watcher
whose descriptor died replaced with nothing lost.  Each blindness is counted, says why in
``health.blind`` (the service's ``surface_blind`` alarm, naming the tree) and in
``health.last_error``, and clears when the source sees again; ``health.up`` stays true: the
source runs."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from tests.test_fs_kit import (
    MODES,
    Recorder,
    collector,
    make_space,
    mount_tmpfs,
    need_root,
    quiesce,
    running,
    settings,
    tree_bytes,
    wait_for,
    write,
)

space = pytest.fixture(params=MODES)(make_space)
CANARY = {"interval": 0.2, "deadline": 0.6}


@pytest.mark.parametrize("mode", ["inotify", "fanotify", "poll"])
async def test_canaries_are_seen_and_never_counted(
    tmp_path: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    if mode == "fanotify":  # a file system of its own: the mark sees every writer on it
        tmp_path = tmp_path / "mnt"
        mount_tmpfs(tmp_path, request, size="16m")
    rec = Recorder()
    cfg = settings([str(tmp_path)], mode=mode, poll_interval=0.2, settle=0.05, canary=CANARY)
    c = collector(cfg, rec)
    async with running(c, rec):
        await asyncio.sleep(2.0)
        assert c.health.up and c.health.blind == "", c.health.last_error
        write(tmp_path / "real", b"r" * 10)
        # Not quiesce(): a canary every 0.2 s keeps the watch busy more often than not on a
        # loaded machine.  The write is counted, then five more canaries come and go, none counted.
        real = str(tmp_path / "real")
        await wait_for(lambda: rec.by_path().get(real) == 10, what="the write counted")
        await asyncio.sleep(1.0)
        assert c.health.up and c.health.blind == ""
    assert rec.counts["canary_missed"] == 0
    assert rec.by_path() == {str(tmp_path / "real"): 10}
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".capalarm-canary-")]


async def test_a_tree_mounted_over_goes_blind_and_the_canary_says_so(
    space, request: pytest.FixtureRequest
) -> None:
    need_root("mounting a tmpfs over the watched tree")
    mode, tree, _ = space
    rec = Recorder()
    # Root checks rarely: only the canary can notice that the watch sees nothing any more.
    cfg = settings([str(tree)], mode=mode, poll_interval=3600, settle=0.05, canary=CANARY)
    c = collector(cfg, rec)
    async with running(c, rec):
        await wait_for(lambda: c.health.up, what="up")
        await asyncio.sleep(1.0)
        assert c.health.blind == "", "a canary is seen in time while the watch works"
        subprocess.run(["mount", "-t", "tmpfs", "capalarm-over", str(tree)], check=True)
        try:
            await wait_for(lambda: bool(c.health.blind), timeout=10, what="blind")
            assert c.health.blind == f"canary missed in {tree}"
            assert c.health.up, "blind is not down: the source still runs"
            assert rec.counts["canary_missed"] >= 1
            assert "canary" in c.health.last_error and "not seen" in c.health.last_error
        finally:
            subprocess.run(["umount", str(tree)], check=True)
        await wait_for(lambda: c.health.blind == "", timeout=10, what="seeing again")
        assert c.health.up


@pytest.mark.parametrize("mode", ["inotify", "fanotify", "poll"])
async def test_a_tree_that_cannot_be_written_is_blind_until_a_canary_can_be_again(
    tmp_path: Path, request: pytest.FixtureRequest, mode: str
) -> None:
    # A canary that cannot be written proves nothing: the source must say it cannot check
    # (blind, with the reason), keep trying, and see again once the tree can be written.
    tree = tmp_path / "mnt"
    mount_tmpfs(tree, request, size="16m")  # chattr +i needs a file system of our own
    request.addfinalizer(lambda: subprocess.run(["chattr", "-i", str(tree)], check=False))
    cfg = settings([str(tree)], mode=mode, poll_interval=0.2, settle=0.05, canary=CANARY)
    rec = Recorder()
    c = collector(cfg, rec)
    async with running(c, rec):
        await wait_for(lambda: c.engine.canaries.live == {}, what="a first canary seen")
        assert c.health.blind == ""
        subprocess.run(["chattr", "+i", str(tree)], check=True)
        reason = f"cannot write a canary in {tree}: Operation not permitted"
        await wait_for(lambda: c.health.blind == reason, timeout=10, what="blind")
        assert c.health.up, "blind is not down: the source runs"
        assert rec.counts["canary_unwritable"] >= 1
        assert "Operation not permitted" in c.health.last_error
        await asyncio.sleep(1.0)
        assert c.health.blind == reason, "still blind while it cannot write"
        written = rec.counts["canary_unwritable"]
        assert written >= 3, "tried again every interval"
        subprocess.run(["chattr", "-i", str(tree)], check=True)
        await wait_for(lambda: c.health.blind == "", timeout=10, what="seeing again")
        await asyncio.sleep(1.0)  # canaries written and seen again
        assert c.health.blind == "" and rec.counts["canary_missed"] == 0
        write(tree / "after", os.urandom(999))
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == 999 == tree_bytes(str(tree))


async def test_a_deleted_tree_is_missing_and_counted_again_when_recreated(space) -> None:
    mode, tree, _ = space
    write(tree / "old", os.urandom(100))
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, poll_interval=0.2, settle=0.05), rec)
    async with running(c, rec):
        os.unlink(tree / "old")
        os.rmdir(tree)
        await wait_for(lambda: bool(c.health.blind), timeout=10, what="tree missing")
        assert c.health.blind == f"tree {tree} is gone or not a directory"
        assert c.health.up and rec.counts["tree_missing"] == 1
        assert "missing" in c.health.last_error
        # Its files are forgotten once no scan can find them any more (moved, not deleted).
        await wait_for(lambda: not rec.files(), 10, "rows forgotten")
        tree.mkdir()
        (tree / "sub").mkdir()
        write(tree / "sub" / "new", os.urandom(4321))
        await wait_for(lambda: c.health.blind == "", timeout=10, what="tree back")
        await quiesce(c)
    assert rec.by_path()[str(tree / "sub" / "new")] == 4321
    assert rec.bytes_under(str(tree)) == 4321 == tree_bytes(str(tree))


async def test_a_dead_watcher_is_replaced_and_what_it_missed_is_counted(space) -> None:
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.05), rec)
    async with running(c, rec):
        write(tree / "before", os.urandom(1000))
        await quiesce(c)
        watch = c.engine.inotify if mode == "inotify" else c.engine.fanotify
        assert watch is not None
        fd = watch.reader.fd
        # The descriptor goes bad under the reader (it now reads /dev/null: end of file).
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, fd)
        os.close(null)
        for i in range(50):
            write(tree / f"during{i}", os.urandom(100 + i))
        await wait_for(lambda: rec.counts["watch_lost"] >= 1, timeout=10, what="watch lost")
        assert "reader failed" in c.health.last_error
        await quiesce(c)
        write(tree / "after", os.urandom(777))  # the new watcher sees
        await quiesce(c)
        assert c.health.up and c.health.blind == "", "a new watcher sees again"
    assert (
        rec.bytes_under(str(tree))
        == tree_bytes(str(tree))
        == 1000 + 777 + sum(100 + i for i in range(50))
    )
    assert rec.counts["files_created"] == 52


async def test_auto_mode_takes_inotify_first(tmp_path: Path) -> None:
    rec = Recorder()
    c = collector(settings([str(tmp_path)], mode="auto"), rec)
    async with running(c, rec):
        assert c.health.mode == "inotify"
        assert c.engine.tree_modes() == {str(tmp_path): "inotify"}
    assert rec.position["trees"][str(tmp_path)]["mode"] == "inotify"


async def test_a_missing_tree_at_start_is_blind_until_it_appears(tmp_path: Path) -> None:
    tree = tmp_path / "later"
    rec = Recorder()
    c = collector(settings([str(tree)], mode="inotify", poll_interval=0.2, settle=0.05), rec)
    task = asyncio.create_task(c.run(rec))
    try:
        await wait_for(lambda: rec.counts["tree_missing"] == 1, what="tree missing")
        await wait_for(lambda: bool(c.health.blind), what="blind")
        assert c.health.up and c.health.blind == f"tree {tree} is gone or not a directory"
        tree.mkdir()
        write(tree / "first", os.urandom(10))
        await wait_for(lambda: c.health.blind == "", what="seeing")
        await quiesce(c)
        assert rec.by_path() == {str(tree / "first"): 10}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_file_system_mounted_inside_a_tree_is_watched_too(space) -> None:
    need_root("mounting a tmpfs inside the watched tree")
    mode, tree, _ = space
    inner = tree / "inner"
    inner.mkdir()
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, poll_interval=0.2, settle=0.05), rec)
    async with running(c, rec):
        subprocess.run(["mount", "-t", "tmpfs", "capalarm-inner", str(inner)], check=True)
        try:
            await wait_for(lambda: rec.counts["mounts_changed"] >= 1, what="mount seen")
            await quiesce(c)
            write(inner / "on-the-mount", os.urandom(2222))
            await quiesce(c)
            assert rec.by_path()[str(inner / "on-the-mount")] == 2222
        finally:
            subprocess.run(["umount", str(inner)], check=True)
        await wait_for(lambda: rec.counts["mounts_changed"] >= 2, what="unmount seen")
        await quiesce(c)
        write(inner / "underneath", os.urandom(333))
        await quiesce(c)
    assert rec.by_path()[str(inner / "underneath")] == 333


async def test_blindness_names_each_tree_escaped_and_bounded(tmp_path: Path) -> None:
    hostile = tmp_path / "evil\n\x1b[31mname"  # a newline and a terminal escape in the name
    trees = [hostile] + [tmp_path / f"gone{i}" for i in range(4)]
    rec = Recorder()
    c = collector(settings([str(t) for t in trees], mode="inotify", poll_interval=0.2), rec)
    task = asyncio.create_task(c.run(rec))
    try:
        await wait_for(lambda: rec.counts["tree_missing"] == 5, what="five trees missing")
        await wait_for(lambda: bool(c.health.blind), what="blind")
        blind = c.health.blind
        assert c.health.up
        assert "\n" not in blind and "\x1b" not in blind, "control bytes are escaped"
        assert blind.startswith(f"tree {tmp_path}/evil\\n\\x1b[31mname is gone")
        assert blind.endswith("; and 2 more") and blind.count(" is gone ") == 3
        for i in range(4):
            trees[1 + i].mkdir()
        hostile.mkdir()
        await wait_for(lambda: c.health.blind == "", what="every tree back")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
