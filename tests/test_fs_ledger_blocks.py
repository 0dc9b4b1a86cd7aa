"""Ledger blocks (alarm/collectors/fs/ledger.py): a baseline's inodes, and files settled
together, are saved as a few compressed blocks, not a row each.  A restart reads them back
as the rows they stand for: after a baseline of N files it counts nothing, a file changed
while down counts once, a file deleted leaves the ledger, and blocks holding anything
overridden are written again.  While the source runs, small blocks are merged and, once half
of what they hold is overridden or gone, the blocks are written again without it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from alarm.collectors.fs import ledger
from alarm.collectors.fs.ledger import (
    TOMBSTONE,
    SavedBlocks,
    decode_block,
    encode_block,
    ledger_files,
    ledger_value,
    resolve,
)
from alarm.collectors.fs.table import key64
from tests.test_fs_kit import Recorder, collector, quiesce, running, settings, write


def cols(*rows: tuple[int, ...]) -> np.ndarray:
    return np.array(rows, dtype=np.int64).T.reshape(6, -1)


def test_a_block_holds_its_columns_exactly() -> None:
    big_ino = (1 << 64) - 5  # a uint64 inode number above int64's range
    dev = np.array([3, 3, 2**40], dtype=np.int64)
    ino = np.array([1, big_ino, 7], dtype=np.uint64)
    size, counted = np.array([0, 10, 1 << 50]), np.array([0, 4, 1 << 50])
    mtime, names = np.array([-5, 1_733_000_000_123_456_789, 0]), np.array([1, 3, 1])
    got = decode_block(encode_block(dev, ino, size, counted, mtime, names))
    assert got.shape == (6, 3)
    assert got[0].tolist() == dev.tolist()
    assert got[1].view(np.uint64).tolist() == ino.tolist()
    assert [r.tolist() for r in got[2:]] == [
        size.tolist(),
        counted.tolist(),
        mtime.tolist(),
        names.tolist(),
    ]
    for bad in ("[1,2,3]", "z1:!!", "z1:" + "QUJD", ""):
        with pytest.raises(ValueError):
            decode_block(bad)


def test_rows_and_tombstones_hold_an_inode_over_blocks_and_later_blocks_over_earlier() -> None:
    b1 = cols((1, 10, 5, 5, 100, 1), (1, 11, 6, 6, 101, 1), (1, 12, 7, 7, 102, 1))
    b2 = cols((1, 12, 9, 9, 109, 1), (1, 13, 8, 8, 103, 1))
    rows = cols((1, 11, 60, 60, 201, 2), (1, 20, 1, 1, 300, 1))
    gone = np.array([[1, 1], [10, 99]], dtype=np.int64)  # 1:10 deleted, 1:99 in no block
    # Blocks read in any order: the seq decides.
    got, in_block, rewrite = resolve([(7, b2), (3, b1)], rows, gone)
    as_rows = {(int(c[0]), int(c[1])): tuple(int(x) for x in c[2:]) for c in got.T}
    assert as_rows == {
        (1, 11): (60, 60, 201, 2),
        (1, 12): (9, 9, 109, 1),
        (1, 13): (8, 8, 103, 1),
        (1, 20): (1, 1, 300, 1),
    }
    held = {(int(c[0]), int(c[1])) for c in got[:, in_block].T}
    assert held == {(1, 12), (1, 13)}
    assert rewrite
    # Nothing overridden: nothing to write again.
    _, in_block, rewrite = resolve([(1, b1)], cols((1, 20, 1, 1, 300, 1)), np.zeros((2, 0), int))
    assert not rewrite and in_block.tolist() == [True, True, True, False]
    # A renumbered device: the blocks are written again with the new number.
    got, _, rewrite = resolve([(1, b1)], cols(), np.zeros((2, 0), int), {1: 4})
    assert rewrite and set(got[0].tolist()) == {4}


def test_ledger_files_is_the_row_per_inode_view() -> None:
    saved = {
        "b:1": encode_block(*cols((5, 1, 10, 10, 7, 1), (5, 2, 0, 0, 8, 1))),
        "f:5:2": ledger_value(3, 3, 9, 2),
        "f:5:1": TOMBSTONE,
        "f:5:3": ledger_value(1, 1, 1),
        "d:5:9": "1",
    }
    assert ledger_files(saved) == {"f:5:2": ledger_value(3, 3, 9, 2), "f:5:3": "[1,1,1]"}


def fill(root: Path, n: int, per_dir: int = 250) -> None:
    for i in range(n):
        d = root / f"d{i // per_dir:03d}"
        if i % per_dir == 0:
            d.mkdir()
        write(d / f"f{i:05d}", b"x" * (i % 37))


def expect_files(root: Path) -> set[str]:
    out = set()
    for dirpath, _d, names in os.walk(root):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            out.add(f"f:{st.st_dev}:{st.st_ino}")
    return out


async def test_a_restart_after_a_baseline_in_blocks_counts_what_changed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger, "BLOCK_ENTRIES", 700)  # several blocks, several steps
    tree = tmp_path / "tree"
    tree.mkdir()
    n = 3000
    fill(tree, n)
    cfg = settings([str(tree)], mode="inotify", settle=0.05)
    rec = Recorder()
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
    assert rec.events == []
    blocks = [k for k in rec.ledger if k.startswith("b:")]
    assert len(blocks) >= n // 700 and not [k for k in rec.ledger if k.startswith("f:")]
    assert set(rec.files()) == expect_files(tree)

    # A restart with nothing changed: nothing counted, nothing written again.
    saved = dict(rec.ledger)
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
    assert rec.events == [] and rec.ledger == saved

    # While down: one grows, one is deleted, one is new, one is rewritten in place.
    grown, gone, rewritten = (
        tree / "d000" / "f00007",
        tree / "d003" / "f00777",
        tree / "d011" / "f02990",
    )
    write(grown, b"g" * 1000, "ab")
    write(tree / "d005" / "new", b"n" * 4321)  # first: not on the deleted one's number
    gone_st = os.lstat(gone)
    os.unlink(gone)
    fd = os.open(rewritten, os.O_WRONLY)
    os.pwrite(fd, b"r" * 4, 0)
    os.close(fd)
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
        await quiesce(c)  # the deleted one's orphan expires
    assert rec.by_path() == {str(grown): 1000, str(tree / "d005" / "new"): 4321, str(rewritten): 0}
    assert set(rec.files()) == expect_files(tree)
    assert rec.ledger.get(f"f:{gone_st.st_dev}:{gone_st.st_ino}") == TOMBSTONE
    counted = len(rec.events)

    # The next restart counts nothing again, writes the blocks again without what was
    # overridden, and drops the tombstone.
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
    assert len(rec.events) == counted
    assert TOMBSTONE not in rec.ledger.values()
    assert set(rec.files()) == expect_files(tree)
    st = os.lstat(grown)
    assert rec.files()[f"f:{st.st_dev}:{st.st_ino}"] == ledger_value(
        st.st_size, st.st_size, st.st_mtime_ns
    )
    b = [k for k in rec.ledger if k.startswith("b:")]
    assert set(b).isdisjoint(blocks), "written again under new numbers"
    held = sum(decode_block(rec.ledger[k]).shape[1] for k in b)
    assert held == n - 3  # the grown and rewritten ones have rows, the deleted one is gone
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
    assert len(rec.events) == counted


async def test_a_ledger_of_rows_only_reads_as_before(tmp_path: Path) -> None:
    """A ledger saved before blocks (a row per inode, position version 1) is read as it
    was, and kept so."""
    tree = tmp_path / "tree"
    tree.mkdir()
    fill(tree, 300)
    cfg = settings([str(tree)], mode="inotify", settle=0.05)
    rec = Recorder()
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
    rows = {k: v for k, v in rec.ledger.items() if k.startswith("d:")} | rec.files()
    rec.ledger = dict(rows)
    assert rec.position is not None and rec.position["v"] == 2
    rec.position["v"] = 1  # as it was saved then
    write(tree / "d000" / "f00001", b"z" * 50, "ab")
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
    assert rec.by_path() == {str(tree / "d000" / "f00001"): 50}
    assert not [k for k in rec.ledger if k.startswith("b:")]
    assert set(rec.files()) == expect_files(tree)


async def test_a_baseline_block_drops_a_tombstone_of_its_inode_number(tmp_path: Path) -> None:
    """An inode number a block held, forgotten (a tombstone), then found again by a baseline
    in a new block: the tombstone goes, or it would hide the new block's inode."""
    tree = tmp_path / "tree"
    tree.mkdir()
    write(tree / "a", b"a" * 10)
    write(tree / "b", b"b" * 20)
    st = os.lstat(tree / "a")
    key = f"f:{st.st_dev}:{st.st_ino}"
    rec = Recorder()
    c = collector(settings([str(tree)], mode="inotify", settle=0.05), rec)
    rec.ledger[key] = TOMBSTONE  # as an earlier forget in this run left it
    c.engine.state.tombstones[key64((st.st_dev, st.st_ino))] = (st.st_dev, st.st_ino)
    async with running(c, rec):
        await quiesce(c)
    assert key not in rec.ledger
    assert set(rec.files()) == expect_files(tree)


async def test_an_unreadable_block_is_dropped_and_counted(tmp_path: Path) -> None:
    write(tmp_path / "a", b"a" * 10)
    rec = Recorder()
    rec.ledger = {"b:4": "z1:not base64!", "b:x": encode_block(*cols((1, 2, 3, 3, 4, 1)))}
    c = collector(settings([str(tmp_path)], mode="inotify"), rec)
    async with running(c, rec):
        await quiesce(c)
    assert rec.counts["ledger_rows_invalid"] == 2
    assert not {"b:4", "b:x"} & set(rec.ledger)
    assert rec.events == []


async def test_changes_while_running_override_the_blocks_across_a_restart(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    fill(tree, 500)
    cfg = settings([str(tree)], mode="inotify", settle=0.05)
    rec = Recorder()
    c = collector(cfg, rec)
    grown, gone = tree / "d000" / "f00003", tree / "d001" / "f00300"
    async with running(c, rec):
        await quiesce(c)
        write(grown, b"g" * 100, "ab")
        st = os.lstat(gone)
        os.unlink(gone)
        await quiesce(c)
    assert rec.by_path() == {str(grown): 100}
    assert rec.ledger[f"f:{st.st_dev}:{st.st_ino}"] == TOMBSTONE
    assert set(rec.files()) == expect_files(tree)
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
    assert rec.by_path() == {str(grown): 100}, "nothing counted again"
    assert set(rec.files()) == expect_files(tree) and TOMBSTONE not in rec.ledger.values()


def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block sizes small enough for a test's few hundred files to merge and compact."""
    monkeypatch.setattr(ledger, "BLOCK_ENTRIES", 64)  # full from 16
    monkeypatch.setattr(ledger, "SMALL_BLOCK", 4)
    monkeypatch.setattr(ledger, "MERGE_FAN_IN", 3)
    monkeypatch.setattr(ledger, "MIN_SETTLED_BLOCK", 2)


def blocks_in(saved: dict[str, str]) -> dict[str, np.ndarray]:
    return {k: decode_block(v) for k, v in saved.items() if k.startswith("b:")}


def test_merged_blocks_hold_what_the_blocks_they_replace_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocks of every size added one after another (inode numbers used again among them):
    what the saved keys resolve to is the last entry of each inode, as before any merge, and
    the blocks stay few."""
    small_blocks(monkeypatch)
    rnd = np.random.default_rng(5)
    saved: dict[str, str] = {}
    blocks = SavedBlocks()
    latest: dict[tuple[int, int], tuple[int, ...]] = {}
    for step in range(300):
        n = int(rnd.choice([1, 2, 3, 5, 17, 40, 70]))
        ino = rnd.integers(1, 400, n)
        ino = np.unique(ino)  # one entry per inode in a step, as the state blocks them
        c = cols(*((7, int(i), step, step, step * 10 + int(i), 1) for i in ino))
        ledger_changes: dict[str, str | None] = {}
        blocks.add(c, ledger_changes)
        for k, v in ledger_changes.items():
            if v is None:
                saved.pop(k, None)
            else:
                saved[k] = v
        for row in c.T.tolist():
            latest[(row[0], row[1])] = tuple(row[2:])
        assert len(saved) == len(blocks) <= 2 + 3 * 2 + blocks.entries // 16
        assert sum(b.shape[1] for b in blocks_in(saved).values()) == blocks.entries
    got = blocks.columns()
    assert {(int(r[0]), int(r[1])): tuple(int(x) for x in r[2:]) for r in got.T} == latest
    files = ledger_files(saved)
    assert len(files) == len(latest)


async def test_files_settled_together_are_blocks_and_count_once_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bursts of new files settle into blocks (merged as they come), growth and deletes
    override them while the source runs, and restarts count nothing again."""
    small_blocks(monkeypatch)
    tree = tmp_path / "tree"
    tree.mkdir()
    cfg = settings([str(tree)], mode="inotify", settle=0.05)
    rec = Recorder()
    c = collector(cfg, rec)
    written = 0
    async with running(c, rec):
        for burst in range(30):
            d = tree / f"d{burst % 4}"
            d.mkdir(exist_ok=True)
            for i in range(8):
                write(d / f"f{burst}-{i}", b"x" * (burst + i))
                written += burst + i
            await quiesce(c)
        assert rec.bytes_under(str(tree)) == written
        assert [k for k in rec.ledger if k.startswith("b:")], "settled in blocks"
        files = [k for k in rec.ledger if k.startswith("f:")]
        assert len(files) < 240 // 2, "most settled files have no row of their own"
        assert set(rec.files()) == expect_files(tree)
        grown, gone = tree / "d0" / "f0-1", tree / "d1" / "f1-2"
        write(grown, b"g" * 77, "ab")
        st = os.lstat(gone)
        os.unlink(gone)
        await quiesce(c)
        await quiesce(c)  # the deleted one's orphan expires
    assert rec.bytes_under(str(tree)) == written + 77
    assert rec.ledger[f"f:{st.st_dev}:{st.st_ino}"] == TOMBSTONE
    assert set(rec.files()) == expect_files(tree)
    for _ in range(2):
        c = collector(cfg, rec)
        async with running(c, rec):
            await quiesce(c)
        assert rec.bytes_under(str(tree)) == written + 77, "nothing counted again"
        assert set(rec.files()) == expect_files(tree)
        assert TOMBSTONE not in rec.ledger.values()
    st = os.lstat(grown)
    assert rec.files()[f"f:{st.st_dev}:{st.st_ino}"] == ledger_value(
        st.st_size, st.st_size, st.st_mtime_ns
    )


async def test_blocks_mostly_overridden_are_written_again_while_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Growth and deletes of files the blocks hold: once they are half of what the blocks
    hold, the blocks are written again with what is left and the tombstones go, without a
    restart; the ledger reads as the files there are all along."""
    small_blocks(monkeypatch)
    tree = tmp_path / "tree"
    tree.mkdir()
    fill(tree, 200, per_dir=50)  # a baseline in blocks
    cfg = settings([str(tree)], mode="inotify", settle=0.05)
    rec = Recorder()
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
        for i in range(200, 400):  # and files settled into blocks
            if i % 50 == 0:
                (tree / f"d{i // 50:03d}").mkdir()
            write(tree / f"d{i // 50:03d}" / f"f{i:05d}", b"y" * (i % 37))
        await quiesce(c)
        before = blocks_in(rec.ledger)
        rows = [k for k in rec.ledger if k.startswith("f:")]
        assert sum(b.shape[1] for b in before.values()) + len(rows) == 400
        assert len(rows) < 10, "settled in blocks"
        for p in sorted(tree.glob("d00[67]/*"))[:60]:
            write(p, b"z" * 5, "ab")
        await quiesce(c)
        assert set(blocks_in(rec.ledger)) == set(before), "60 overridden: not yet"
        for p in sorted(tree.glob("d00[0-5]/*"))[::2]:  # 150
            os.unlink(p)
        await quiesce(c)
        await quiesce(c)  # the orphans expire, and the blocks are written again
        assert set(rec.files()) == expect_files(tree)
    after = blocks_in(rec.ledger)
    assert set(before).isdisjoint(after), "written again"
    assert list(rec.ledger.values()).count(TOMBSTONE) < 150, "tombstones deleted"
    held = {(int(d), int(i)) for b in after.values() for d, i in b[:2].T}
    assert len(held) > 400 - 150 - 60 - 10
    counted = len(rec.events)
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
        write(tree / "d000" / "again", b"a" * 9)  # perhaps on a deleted file's number
        await quiesce(c)
    assert len(rec.events) == counted + 1 and rec.by_path()[str(tree / "d000" / "again")] == 9
    assert set(rec.files()) == expect_files(tree)
    assert TOMBSTONE not in rec.ledger.values()


async def test_a_ledger_whose_settled_files_are_rows_reads_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state of the code before settled-file blocks (8d80cdc): the baseline in blocks,
    every file counted since a row of its own, the deleted ones of the baseline tombstones.
    The new code restarts from it counting nothing, counts what comes after once, and a
    restart from what it then saved counts nothing again."""
    small_blocks(monkeypatch)
    tree = tmp_path / "tree"
    tree.mkdir()
    fill(tree, 100, per_dir=50)
    (tree / "new").mkdir()
    for i in range(60):
        write(tree / "new" / f"n{i}", b"n" * i)
    baseline = [p for p in sorted(tree.glob("d*/*"))]
    gone = baseline[5]
    gone_st = os.lstat(gone)
    os.unlink(gone)
    block = []
    for p in baseline:
        if p != gone:
            st = os.lstat(p)
            block.append((st.st_dev, st.st_ino, st.st_size, st.st_size, st.st_mtime_ns, 1))
    block.append((gone_st.st_dev, gone_st.st_ino, 0, 0, gone_st.st_mtime_ns, 1))
    rec = Recorder()
    rec.ledger["b:1"] = encode_block(*cols(*block))
    rec.ledger[f"f:{gone_st.st_dev}:{gone_st.st_ino}"] = TOMBSTONE
    for p in [tree, *sorted(tree.iterdir())]:
        st = os.lstat(p)
        if p != tree:
            rec.ledger[f"d:{st.st_dev}:{st.st_ino}"] = "1"
    for p in sorted((tree / "new").iterdir()):
        st = os.lstat(p)
        rec.ledger[f"f:{st.st_dev}:{st.st_ino}"] = ledger_value(
            st.st_size, st.st_size, st.st_mtime_ns
        )
    root = os.lstat(tree)
    rec.position = {
        "v": 2,
        "at": 1.0,
        "trees": {str(tree): {"state": "ready", "mode": "inotify", "dev": root.st_dev,
                              "ino": root.st_ino}},
    }  # fmt: skip
    assert set(rec.files()) == expect_files(tree)
    cfg = settings([str(tree)], mode="inotify", settle=0.05)
    c = collector(cfg, rec)
    async with running(c, rec):
        await quiesce(c)
        assert rec.events == []
        write(tree / "new" / "n3", b"+" * 10, "ab")
        for i in range(40):
            write(tree / "d000" / f"late{i}", b"l" * 3)
        await quiesce(c)
    assert rec.by_path() == {
        str(tree / "new" / "n3"): 10,
        **{str(tree / "d000" / f"late{i}"): 3 for i in range(40)},
    }
    assert set(rec.files()) == expect_files(tree)
    for _ in range(2):
        c = collector(cfg, rec)
        async with running(c, rec):
            await quiesce(c)
        assert len(rec.events) == 41
        assert set(rec.files()) == expect_files(tree)
