"""What an fs source saves: ledger rows per tracked inode and a small position.

- Ledger (``Batch.ledger``, saved with the counts in one transaction): ``f:<dev>:<ino>`` ->
  ``[size,counted,mtime_ns]`` for each counted inode (``counted``: the measure last counted,
  the size or a sparse file's data bytes), ``[size,counted,mtime_ns,names]`` for one with
  more than one name in the trees (hard links: names are not saved, so without the count a
  restart would take every extra name it finds for a new link), ``d:<dev>:<ino>`` -> ``1``
  for each directory.
- Blocks: inodes counted in bulk are saved in bulk, ``b:<seq>`` -> up to BLOCK_ENTRIES inodes
  as compressed columns (:func:`encode_block`), not a row each: what a baseline finds (often
  all there is), and the files a step settles (MIN_SETTLED_BLOCK or more; fewer are rows).
  A row costs SQLite about as much as the whole scan spends on the file (100,000 rows,
  0.17 s of the pipeline thread; as blocks, 13 rows), and as much again as the watcher spends
  on a new file.  A block is never changed in place: an ``f:`` row of the same inode
  overrides it (a later count), ``f:<dev>:<ino>`` -> ``-`` (TOMBSTONE) says the inode is gone,
  and of two blocks holding one inode the later ``seq`` holds it.  While the source runs,
  :class:`SavedBlocks` merges the small blocks at the end (MERGE_FAN_IN of a size class into
  one: each inode is written again a few times at most, and the blocks stay few), and once
  what is overridden or gone is half of what the blocks hold, the state writes the blocks
  again with only what they still hold and deletes the tombstones (state.py,
  ``compact_blocks``).  A restart reads the rows back into the one row per inode they stand
  for (:func:`resolve`) and, when anything overrode a block entry (or the blocks are many),
  writes the blocks again the same way.
- Position: ``{"v": 2, "at": <watermark>, "trees": {path: {"state": "baseline"|"ready",
  "mode": ..., "dev": ..., "ino": ...}}}``: ``at`` is where a restart's outage window starts,
  a tree's root (dev, ino) tells it is the same tree (or the same one on a renumbered device).
  Version 2 says the ledger may hold blocks: code that reads version 1 only (before blocks)
  takes it as no position and starts from a baseline, counting nothing, where it would have
  dropped the blocks as invalid rows and counted their files again as new.  Version 1 is read.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

POSITION_VERSION = 2
READABLE_POSITIONS = (1, 2)  # 1: before ledger blocks
BLOCK_ENTRIES = 16_384  # inodes per block row at most
# Settled files of one step are a block from this many (fewer are a row each: a block and its
# merges cost more than a few rows).
MIN_SETTLED_BLOCK = 16
MERGE_FAN_IN = 16  # blocks of one size class (or smaller) at the end merged into one
SMALL_BLOCK = 256  # entries below which a block is of the smallest class
TOMBSTONE = "-"
_BLOCK_FORMAT = "z1:"  # zlib of six little-endian int64 columns, base64
_COLUMNS = 6  # dev, ino (as int64 bits), size, counted, mtime, names


def ledger_value(size: int, counted: int, mtime: int, names: int = 1) -> str:
    if names > 1:
        return f"[{size},{counted},{mtime},{names}]"
    return f"[{size},{counted},{mtime}]"


def parse_ledger_value(value: str) -> tuple[int, int, int, int]:
    """``[size,counted,mtime(,names)]`` -> size, counted, mtime and names (1 when not
    saved); ValueError if it is not that."""
    parts = value.strip()[1:-1].split(",")
    if len(parts) not in (3, 4):
        raise ValueError(value[:40])
    size, counted, mtime = (int(p) for p in parts[:3])
    names = int(parts[3]) if len(parts) == 4 else 1
    return size, counted, mtime, names


def tree_position(state: str, mode: str, root: tuple[int, int] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"state": state, "mode": mode}
    if root is not None:
        entry["dev"], entry["ino"] = root
    return entry


def position(watermark: float, trees: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"v": POSITION_VERSION, "at": round(watermark, 6), "trees": trees}


def valid_position(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get("v") in READABLE_POSITIONS
        and isinstance(value.get("at"), int | float)
        and math.isfinite(value["at"])
        and isinstance(value.get("trees"), dict)
    )


def encode_block(
    dev: np.ndarray,
    ino: np.ndarray,
    size: np.ndarray,
    counted: np.ndarray,
    mtime: np.ndarray,
    names: np.ndarray,
) -> str:
    """Columns of inodes as one block value (zlib at level 1: a baseline's columns shrink
    about tenfold for a few milliseconds per 100,000)."""
    n = len(dev)
    cols = np.empty((_COLUMNS, n), dtype="<i8")
    # ino: a uint64 column's bits (an assignment casts without checking)
    cols[0], cols[1], cols[2], cols[3], cols[4], cols[5] = dev, ino, size, counted, mtime, names
    raw = zlib.compress(cols.tobytes(), 1)
    return _BLOCK_FORMAT + base64.b64encode(raw).decode("ascii")


def decode_block(value: str) -> np.ndarray:
    """A block value -> its columns as rows of an int64 array (6, n): dev, ino (the bits of
    a uint64), size, counted, mtime, names.  ValueError if it is not one."""
    if not isinstance(value, str) or not value.startswith(_BLOCK_FORMAT):
        raise ValueError("not a ledger block")
    try:
        raw = zlib.decompress(base64.b64decode(value[len(_BLOCK_FORMAT) :], validate=True))
    except (zlib.error, ValueError) as exc:
        raise ValueError(f"ledger block: {exc}") from None
    if len(raw) % (8 * _COLUMNS):
        raise ValueError("ledger block of a wrong length")
    return np.frombuffer(raw, dtype="<i8").reshape(_COLUMNS, -1).astype(np.int64)


def block_seq(key: str) -> int:
    """``b:<seq>`` -> seq; ValueError otherwise."""
    kind, _, seq = key.partition(":")
    if kind != "b" or not seq.isdigit():
        raise ValueError(key)
    return int(seq)


def resolve(
    blocks: Sequence[tuple[int, np.ndarray]],
    rows: np.ndarray,
    gone: np.ndarray,
    remap: dict[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The inodes the saved rows stand for, one each: ``blocks`` (seq, columns as
    :func:`decode_block` gives them; a list is emptied, so that they go once joined),
    ``rows`` the ``f:`` rows' columns (6, n) and ``gone``
    the tombstones' (dev, ino) (2, n), device numbers renumbered by ``remap``.  An ``f:`` row
    or a tombstone holds its inode over every block, a block of a higher seq over one of a
    lower.  Returns the columns (6, n), for each whether a block holds it, and whether any
    row was overridden, a tombstone, or a block's renumbered (the blocks are to be written
    again)."""
    ordered = [cols for _, cols in sorted(blocks, key=lambda b: b[0])]
    if isinstance(blocks, list):
        blocks.clear()  # the caller's list lets go of the blocks' columns here
    nb = sum(c.shape[1] for c in ordered)
    tomb = np.zeros((_COLUMNS, gone.shape[1]), dtype=np.int64)
    tomb[:2] = gone
    every = np.concatenate([*ordered, rows, tomb], axis=1, dtype=np.int64)
    del ordered
    n = every.shape[1]
    src = np.zeros(n, dtype=np.int8)  # 0 block, 1 f row, 2 tombstone
    src[nb : nb + rows.shape[1]] = 1
    src[nb + rows.shape[1] :] = 2
    renumbered = False
    if remap:
        dev = every[0]
        for old, new in remap.items():
            hit = dev == old
            renumbered |= bool(hit[:nb].any())
            dev[hit] = new
    # The last of each (dev, ino), in the order blocks (by seq), rows, tombstones.
    order = np.lexsort((np.arange(n), every[1].view(np.uint64), every[0]))
    d, i = every[0][order], every[1][order]
    last = np.ones(n, dtype=bool)
    last[:-1] = (d[1:] != d[:-1]) | (i[1:] != i[:-1])
    won = order[last]
    won = np.sort(won[src[won] != 2])  # saved order: blocks, then rows
    stale = len(won) < n
    return every[:, won], src[won] == 0, stale or renumbered


def ledger_files(ledger: dict[str, str]) -> dict[str, str]:
    """What a saved ledger says of its inodes, as one ``f:<dev>:<ino>`` -> ledger value each
    (blocks and tombstones resolved; directories and invalid rows left out)."""
    blocks = []
    rows: list[list[int]] = []
    gone: list[list[int]] = []
    for key, value in ledger.items():
        if key.startswith("b:"):
            blocks.append((block_seq(key), decode_block(value)))
        elif key.startswith("f:"):
            dev, ino = (int(x) for x in key.split(":")[1:])
            ino = int(np.uint64(ino).view(np.int64))
            if value == TOMBSTONE:
                gone.append([dev, ino])
            else:
                rows.append([dev, ino, *parse_ledger_value(value)])
    cols, _, _ = resolve(
        blocks,
        np.array(rows, dtype=np.int64).T.reshape(_COLUMNS, -1),
        np.array(gone, dtype=np.int64).T.reshape(2, -1),
    )
    return {
        f"f:{d}:{i}": ledger_value(s, c, m, n)
        for d, i, s, c, m, n in zip(
            cols[0].tolist(),
            cols[1].view(np.uint64).tolist(),
            *(x.tolist() for x in cols[2:]),
            strict=True,
        )
    }


def full_block() -> int:
    """Entries from which a block is not merged again while the source runs (read at each
    call: tests make BLOCK_ENTRIES small)."""
    return max(1, BLOCK_ENTRIES // 4)


def size_class(entries: int) -> int:
    """0 for small blocks, 1 for middling ones, 2 for full ones (never merged)."""
    if entries >= full_block():
        return 2
    return 0 if entries < SMALL_BLOCK else 1


@dataclass(slots=True)
class SavedBlock:
    seq: int
    value: str  # as saved: a merge or a compaction reads it back
    entries: int


class SavedBlocks:
    """The blocks of this source's ledger, in ``seq`` order, with their values: new ones are
    written through :meth:`add`, and the small ones at the end merged (:meth:`merge`), so
    that blocks made all the time stay few.

    A merge joins blocks at the end only, into blocks of higher ``seq``: every inode they
    hold is held by them over every earlier block, as before.  It keeps every entry,
    overridden or not (which ones are is the state's to say: :meth:`replace`).  ``entries``
    counts them all, ``garbage`` those overridden or forgotten since and the tombstones
    written for them, as the state reports them."""

    def __init__(self) -> None:
        self.blocks: list[SavedBlock] = []
        self.next_seq = 1
        self.entries = 0
        self.garbage = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def load(self, saved: Sequence[tuple[int, str, int]]) -> None:
        """Blocks read back at a restart, (seq, value, entries) each."""
        self.blocks = [SavedBlock(seq, value, n) for seq, value, n in sorted(saved)]
        self.next_seq = max((b.seq for b in self.blocks), default=0) + 1
        self.entries = sum(b.entries for b in self.blocks)
        self.garbage = 0

    def add(self, cols: np.ndarray, ledger: dict[str, str | None]) -> None:
        """Inodes (columns (6, n) as :func:`decode_block` gives them) as new blocks.  Enough
        to fill one: the small blocks at the end are written again with them, so that no
        small block is left behind a full one, where no merge would reach it."""
        if cols.shape[1] >= full_block():
            start = self._tail()
            if start < len(self.blocks):
                cols = np.concatenate([*self._decoded(start), cols], axis=1)
                self._drop(start, ledger)
        self._write(cols, ledger)
        self.merge(ledger)

    def merge(self, ledger: dict[str, str | None]) -> None:
        """While the last MERGE_FAN_IN blocks or more are of the last one's size class or
        smaller, those are joined into one (or more, BLOCK_ENTRIES each)."""
        blocks = self.blocks
        while blocks:
            last = size_class(blocks[-1].entries)
            if last == 2:
                return
            start = len(blocks)
            while start > 0 and size_class(blocks[start - 1].entries) <= last:
                start -= 1
            if len(blocks) - start < MERGE_FAN_IN:
                return
            cols = np.concatenate(self._decoded(start), axis=1)
            self._drop(start, ledger)
            self._write(cols, ledger)

    def columns(self) -> np.ndarray:
        """What the blocks hold, the last entry of each inode (as a restart reads them)."""
        if not self.blocks:
            return np.zeros((_COLUMNS, 0), dtype=np.int64)
        blocks = [(b.seq, decode_block(b.value)) for b in self.blocks]
        cols, _, _ = resolve(
            blocks,
            np.zeros((_COLUMNS, 0), dtype=np.int64),
            np.zeros((2, 0), dtype=np.int64),
        )
        return cols

    def replace(self, cols: np.ndarray, ledger: dict[str, str | None]) -> None:
        """Every block deleted and ``cols`` written as new ones: the state's compaction."""
        self._drop(0, ledger)
        self._write(cols, ledger)
        self.garbage = 0

    @staticmethod
    def worth_a_block(settled: int) -> bool:
        """Whether files settled together go into a block rather than a row each."""
        return settled >= MIN_SETTLED_BLOCK

    def due(self) -> bool:
        """Whether what the blocks hold is half garbage (and not little): time to compact."""
        return self.garbage >= max(BLOCK_ENTRIES, self.entries // 2)

    def _tail(self) -> int:
        start = len(self.blocks)
        while start > 0 and size_class(self.blocks[start - 1].entries) < 2:
            start -= 1
        return start

    def _decoded(self, start: int) -> list[np.ndarray]:
        return [decode_block(b.value) for b in self.blocks[start:]]

    def _drop(self, start: int, ledger: dict[str, str | None]) -> None:
        for b in self.blocks[start:]:
            ledger[f"b:{b.seq}"] = None
            self.entries -= b.entries
        del self.blocks[start:]

    def _write(self, cols: np.ndarray, ledger: dict[str, str | None]) -> None:
        n = cols.shape[1]
        for i in range(0, n, BLOCK_ENTRIES):
            part = cols[:, i : i + BLOCK_ENTRIES]
            value = encode_block(part[0], part[1], part[2], part[3], part[4], part[5])
            seq = self.next_seq
            self.next_seq += 1
            ledger[f"b:{seq}"] = value
            self.blocks.append(SavedBlock(seq, value, part.shape[1]))
            self.entries += part.shape[1]
