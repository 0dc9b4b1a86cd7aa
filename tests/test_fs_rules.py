"""What "bytes written" means, rule by rule, on a real file system watched by a real fs
collector (inotify on the local disk; fanotify on a private tmpfs, so its file-system mark sees
only this test's writes; some rules in poll mode too).  Every test compares the counted bytes
with an independent accounting of what was written."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.test_fs_kit import (
    MODES,
    Recorder,
    collector,
    make_space,
    quiesce,
    running,
    settings,
    tree_bytes,
    write,
)

space = pytest.fixture(params=MODES)(make_space)


async def test_files_present_at_first_start_are_the_starting_state(space) -> None:
    mode, tree, _ = space
    (tree / "sub").mkdir()
    write(tree / "old.bin", os.urandom(3000))
    write(tree / "sub" / "older.bin", os.urandom(5000))
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    async with running(c, rec):
        await quiesce(c)
        assert rec.events == [], "what is there at first start must not count"
        assert set(rec.files()) == {
            f"f:{os.lstat(p).st_dev}:{os.lstat(p).st_ino}"
            for p in (tree / "old.bin", tree / "sub" / "older.bin")
        }
        assert rec.position["trees"][str(tree)]["state"] == "ready"
        assert c.health.mode == mode and c.health.up
        write(tree / "old.bin", b"x" * 700, "ab")
        await quiesce(c)
    assert [(e.key, e.nbytes) for e in rec.events] == [(str(tree / "old.bin"), 700)]
    assert rec.events[0].evidence["change"] == "grew"


async def test_created_files_count_their_size_in_nested_new_directories(space) -> None:
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    sizes = [0, 1, 4095, 4096, 70_000, 1 << 20]
    async with running(c, rec):
        for i, n in enumerate(sizes):
            d = tree / f"a{i}" / "b" / "c"  # made and written at once: the watch comes after
            d.mkdir(parents=True)
            write(d / f"f{i}", os.urandom(n))
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == sum(sizes) == tree_bytes(str(tree))
    assert rec.counts["files_created"] == len(sizes)
    assert rec.counts["dirs_created"] == 3 * len(sizes)
    per_path = rec.by_path()
    for i, n in enumerate(sizes):
        assert per_path[str(tree / f"a{i}" / "b" / "c" / f"f{i}")] == n


async def test_rename_in_counts_size_rename_out_counts_nothing(space) -> None:
    mode, tree, outside = space
    write(outside / "in.bin", os.urandom(12_345))
    (outside / "dir").mkdir()
    write(outside / "dir" / "inner.bin", os.urandom(2_000))
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    async with running(c, rec):
        os.rename(outside / "in.bin", tree / "in.bin")
        os.rename(outside / "dir", tree / "dir")  # a whole directory moved in
        await quiesce(c)
        assert rec.bytes_under(str(tree)) == 14_345
        assert rec.by_path()[str(tree / "in.bin")] == 12_345
        assert rec.by_path()[str(tree / "dir" / "inner.bin")] == 2_000
        # Inside the tree, after it was counted: a rename moves no bytes.
        os.rename(tree / "in.bin", tree / "renamed.bin")
        os.rename(tree / "dir", tree / "dir2")
        await quiesce(c)
        assert rec.bytes_under(str(tree)) == 14_345
        # Out: nothing counted, the entries leave the ledger.
        ledger_before = set(rec.files())
        os.rename(tree / "renamed.bin", outside / "back.bin")
        await quiesce(c)
        assert rec.bytes_under(str(tree)) == 14_345
        gone = ledger_before - set(rec.files())
        st = os.lstat(outside / "back.bin")
        assert gone == {f"f:{st.st_dev}:{st.st_ino}"}
        # And in again: a move into the tree counts again.
        os.rename(outside / "back.bin", tree / "again.bin")
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == 14_345 + 12_345
    assert rec.by_path()[str(tree / "dir2" / "inner.bin")] == 0  # moved, never rewritten


async def test_a_temporary_name_renamed_at_once_counts_where_it_lands(space) -> None:
    """pip and npm write a temporary name and rename it: the bytes land on the final name."""
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.3), rec)
    async with running(c, rec):
        for i in range(20):
            write(tree / f"x{i}.tmp", os.urandom(1000 + i))
            os.rename(tree / f"x{i}.tmp", tree / f"x{i}.whl")
        await quiesce(c)
    per_path = rec.by_path()
    assert all(not k.endswith(".tmp") for k in per_path)
    assert sum(per_path[str(tree / f"x{i}.whl")] for i in range(20)) == sum(
        1000 + i for i in range(20)
    )


@pytest.mark.parametrize("settle", [0.0, 3.0])
async def test_a_file_renamed_into_a_directory_made_just_before_counts_once(
    space, settle: float
) -> None:
    """npm's cacache: ``mkdir -p`` of the destination, a rename into it, the next write.  The
    rename's destination is not watched yet (inotify reports only its source's departure);
    the file counts once, on where it lands when it lands within settle."""
    mode, tree, _ = space
    (tree / "tmp").mkdir()
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=settle), rec)
    sizes = [5000 + i for i in range(6)]
    async with running(c, rec):
        for i, n in enumerate(sizes):
            write(tree / "tmp" / f"t{i}", os.urandom(n))
            if i % 2:  # every other one already counted at its temporary name
                await quiesce(c)
            final = tree / "content" / f"{i:02x}" / "cd"
            final.mkdir(parents=True)
            os.rename(tree / "tmp" / f"t{i}", final / "blob")
            write(tree / "tmp" / f"next{i}", b"")  # the next temporary, at once
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == sum(sizes) == tree_bytes(str(tree))
    assert rec.counts["files_created"] == 2 * len(sizes)
    if settle >= 3.0:
        per_path = rec.by_path()
        for i in range(0, len(sizes), 2):
            assert per_path[str(tree / "content" / f"{i:02x}" / "cd" / "blob")] == sizes[i]


async def test_growth_counts_the_growth_of_a_file_held_open(space) -> None:
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    written = 0
    async with running(c, rec):
        with open(tree / "log", "ab", buffering=0) as f:
            for i in range(60):
                chunk = os.urandom(100 + 37 * i)
                f.write(chunk)
                written += len(chunk)
                await asyncio.sleep(0.03)
            await quiesce(c)
            assert rec.bytes_under(str(tree)) == written
        await quiesce(c)
    assert rec.bytes_under(str(tree)) == written == os.lstat(tree / "log").st_size
    assert len(rec.changes("grew")) >= 2  # counted as it grew, not once at the end


@pytest.mark.slow
async def test_a_file_held_open_and_appended_for_a_minute(tmp_path: Path) -> None:
    """The issue's case: an append every 0.2 s for 60 s, counted as it grows, exactly."""
    rec = Recorder()
    c = collector(settings([str(tmp_path)], mode="inotify", settle=0.1), rec)
    written = 0
    ticks = set()
    async with running(c, rec):
        with open(tmp_path / "slow.log", "ab", buffering=0) as f:
            for i in range(300):
                data = b"%06d " % i + os.urandom(50)
                f.write(data)
                written += len(data)
                await asyncio.sleep(0.2)
        await quiesce(c)
    assert rec.bytes_under(str(tmp_path)) == written
    for e in rec.events:
        ticks.add(int(e.ts // 5))
    assert len(ticks) >= 10, "the growth is counted across the minute, at event time"


async def test_rewrite_in_place_counts_its_new_size_as_capacity(space) -> None:
    mode, tree, _ = space
    write(tree / "db", os.urandom(8192))
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    async with running(c, rec):
        await asyncio.sleep(0.02)
        fd = os.open(tree / "db", os.O_WRONLY)
        os.pwrite(fd, os.urandom(100), 4000)  # same size, new content
        os.close(fd)
        await quiesce(c)
    (ev,) = rec.events
    assert ev.nbytes == 0 and ev.capacity == 8192
    assert ev.evidence["change"] == "rewritten" and ev.evidence["capacity_is_new_size"]
    assert rec.counts["rewrites"] == 1


async def test_truncation_never_counts_negative_and_rewriting_after_counts_again(space) -> None:
    mode, tree, _ = space
    write(tree / "f", os.urandom(10_000))
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    async with running(c, rec):
        os.truncate(tree / "f", 0)
        await quiesce(c)
        assert rec.bytes_under(str(tree)) == 0 and rec.counts["truncations"] == 1
        write(tree / "f", os.urandom(6_000), "r+b")  # rewritten after the truncation was seen
        await quiesce(c)
        assert rec.bytes_under(str(tree)) == 6_000
        os.truncate(tree / "f", 1_000)  # shorter: the rest of it may be new, as capacity
        await quiesce(c)
    assert min(e.nbytes for e in rec.events) >= 0
    assert rec.bytes_under(str(tree)) == 6_000
    assert rec.counts["truncations"] == 2
    assert rec.capacity_under(str(tree)) == 6_000 + 1_000


async def test_hard_links_count_once(space) -> None:
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    async with running(c, rec):
        write(tree / "a", os.urandom(9_999))
        await quiesce(c)
        (tree / "sub").mkdir()
        for i in range(5):
            os.link(tree / "a", tree / "sub" / f"link{i}")
        await quiesce(c)
        write(tree / "sub" / "link3", b"z" * 1, "ab")  # growth through another name
        await quiesce(c)
        os.unlink(tree / "a")
        await quiesce(c)
        st = os.lstat(tree / "sub" / "link0")
        assert rec.files()[f"f:{st.st_dev}:{st.st_ino}"].startswith("[10000,")
    assert rec.bytes_under(str(tree)) == 10_000
    assert rec.counts["hard_links"] == 5


async def test_symlinks_count_their_own_size_and_are_never_followed(space) -> None:
    mode, tree, outside = space
    big = outside / "big.bin"
    write(big, os.urandom(200_000))
    (outside / "d").mkdir()
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    async with running(c, rec):
        os.symlink(big, tree / "link")
        os.symlink(outside / "d", tree / "dirlink")
        await quiesce(c)
        write(big, os.urandom(1000), "ab")  # written through nothing we watch
        write(outside / "d" / "x", os.urandom(5000))
        await quiesce(c)
    assert rec.by_path() == {
        str(tree / "link"): len(str(big)),
        str(tree / "dirlink"): len(str(outside / "d")),
    }


async def test_deleted_before_measured_counts_once_flagged(space) -> None:
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.2), rec)
    n = 400
    async with running(c, rec):
        for i in range(n):
            p = tree / f"ghost{i}"
            write(p, os.urandom(3000))
            os.unlink(p)
        await quiesce(c)
    per_path: dict[str, list] = {}
    for e in rec.events:
        per_path.setdefault(e.key, []).append(e)
    assert len(per_path) == n, "every file is accounted for exactly once"
    assert all(len(v) == 1 for v in per_path.values())
    flagged = rec.changes("deleted_before_measured")
    assert flagged and rec.counts["deleted_before_measured"] == len(flagged)
    assert all(e.nbytes == 0 for e in flagged)
    assert all(e.nbytes in (0, 3000) for e in rec.events)  # what was measured, or last known


async def test_sparse_files_count_their_data_dense_files_their_size(space) -> None:
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    async with running(c, rec):
        with open(tree / "holes", "wb") as f:
            f.truncate(1 << 30)
            f.seek(512 << 20)
            f.write(os.urandom(8192))
        write(tree / "dense", os.urandom(300_000))
        await quiesce(c)
    per_path = rec.by_path()
    assert per_path[str(tree / "dense")] == 300_000
    assert 8192 <= per_path[str(tree / "holes")] <= 64 * 1024, per_path
    (ev,) = [e for e in rec.events if e.key.endswith("holes")]
    assert ev.evidence["size"] == 1 << 30 and ev.evidence["sparse_data"] == ev.nbytes


async def test_hostile_names_are_counted_and_round_trip(space) -> None:
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.1), rec)
    base = os.fsencode(tree)
    names = [b"new\nline", b"\xff\xfe bad utf8", b"x" * 255, b"-rf", b" lead", b"\x1b[31mred"]
    async with running(c, rec):
        os.mkdir(base + b"/\xc3(dir\n")
        for i, n in enumerate(names):
            write(base + b"/" + n, b"a" * (i + 1))
        write(base + b"/\xc3(dir\n/inner\xff", b"b" * 10)
        await quiesce(c)
    per_path = rec.by_path()
    for i, n in enumerate(names):
        key = os.fsdecode(base + b"/" + n)
        assert per_path[key] == i + 1
        assert os.path.lexists(os.fsencode(key))
    assert per_path[os.fsdecode(base + b"/\xc3(dir\n/inner\xff")] == 10
    for e in rec.events:
        assert "\n" not in repr(e.evidence)  # evidence holds no names


async def test_100k_files_in_one_directory(space) -> None:
    mode, tree, _ = space
    rec = Recorder()
    c = collector(settings([str(tree)], mode=mode, settle=0.2), rec)
    n = 100_000
    async with running(c, rec):
        await asyncio.to_thread(_many_files, tree / "big", n)
        await quiesce(c, timeout=180)
    assert rec.counts["files_created"] == n
    assert rec.bytes_under(str(tree)) == tree_bytes(str(tree)) == sum(i % 97 for i in range(n))
    assert len(c.engine.state.inodes) == n


def _many_files(d: Path, n: int) -> None:
    d.mkdir()
    base = str(d) + "/"
    for i in range(n):
        fd = os.open(base + f"{i:06d}", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"q" * (i % 97))
        os.close(fd)


@pytest.mark.parametrize("change", ["create", "grow", "delete", "rename"])
async def test_poll_mode_counts_the_same(tmp_path: Path, change: str) -> None:
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    write(tree / "d" / "old", os.urandom(1000))
    rec = Recorder()
    c = collector(settings([str(tree)], mode="poll", poll_interval=0.2, settle=0.1), rec)
    async with running(c, rec):
        assert c.health.mode == "poll"
        if change == "create":
            write(tree / "d" / "new", os.urandom(777))
        elif change == "grow":
            write(tree / "d" / "old", os.urandom(333), "ab")
        elif change == "delete":
            os.unlink(tree / "d" / "old")
        else:
            os.rename(tree / "d" / "old", tree / "moved")
        await quiesce(c)
    expected = {"create": 777, "grow": 333, "delete": 0, "rename": 0}[change]
    assert rec.bytes_under(str(tree)) == expected
    files = set(rec.files())
    assert len(files) == {"create": 2, "grow": 1, "delete": 0, "rename": 1}[change]


async def test_poll_mode_counts_a_new_file_on_a_reused_inode_number_by_its_size(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    rec = Recorder()
    c = collector(settings([str(tree)], mode="poll", poll_interval=0.3, settle=0.05), rec)
    async with running(c, rec):
        write(tree / "a", os.urandom(1000))
        await quiesce(c)
        ino = os.lstat(tree / "a").st_ino
        # Between two rounds: deleted, and its number given to a bigger file (to a round,
        # a rename of "a" to "b" that grew, unless told apart by the birth time).
        os.unlink(tree / "a")
        write(tree / "b", os.urandom(4000))
        assert os.lstat(tree / "b").st_ino == ino, "ext4 reuses a freed inode number"
        await quiesce(c)
    assert rec.by_path() == {str(tree / "a"): 1000, str(tree / "b"): 4000}
    assert rec.counts["inodes_reused"] == 1


async def test_poll_mode_a_rename_that_grew_counts_the_growth(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    rec = Recorder()
    c = collector(settings([str(tree)], mode="poll", poll_interval=0.3, settle=0.05), rec)
    async with running(c, rec):
        write(tree / "a", os.urandom(1000))
        await quiesce(c)
        os.rename(tree / "a", tree / "b")
        write(tree / "b", os.urandom(500), "ab")
        await quiesce(c)
    assert rec.by_path() == {str(tree / "a"): 1000, str(tree / "b"): 500}
    assert rec.counts["inodes_reused"] == 0
