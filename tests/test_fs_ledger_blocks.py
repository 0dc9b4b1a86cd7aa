"""Ledger blocks (alarm/collectors/fs/ledger.py): a baseline's inodes are saved as a few
compressed blocks, not a row each.  A restart reads them back as the rows they stand for:
after a baseline of N files it counts nothing, a file changed while down counts once, a file
deleted leaves the ledger, and blocks holding anything overridden are written again."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from alarm.collectors.fs import ledger
from alarm.collectors.fs.ledger import (
    TOMBSTONE,
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
    c.engine.state.tombstones.add(key64((st.st_dev, st.st_ino)))
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
