"""The tracked files of a tree in compact columns: what every change is measured against and
what a restart resumes from, at about 130 bytes per file (bench/fs_startup.py measures it).

- :class:`InodeTable`: one row per inode (hard links share it): device, inode, size, the
  measure last counted (``counted``), the measure at the last look, mtime, how many tracked
  names point at it, flags.
- :class:`U64Map`: open addressing with linear probing from a 64-bit key to an int64 value.
  Deleted keys leave tombstones; the table is rebuilt (vectorised) when live + dead keys pass
  70 %.  It indexes names (hash of directory id and name bytes -> directory and inode row)
  and inodes ((device, inode) -> row).

Columns are ``array.array``: element access from Python costs a fifth of a numpy scalar's,
and numpy views over the same buffers (``np.frombuffer``) do the vectorised work.  A view must
not outlive the call that made it (an array with a live view cannot be resized).

Names are not stored: a name's key is the process-salted ``hash((dir_id, name))``, all a
lookup needs (an event carries the name).  Two names colliding in 64 bits is about one chance
in 10^7 for a million names, and would cost one file counted as replaced.  Python dicts of the
same content cost about 300 bytes per file.
"""

from __future__ import annotations

from array import array

import numpy as np

from alarm.collectors.fs import dirscan

EMPTY = 0
DELETED = 1
MASK64 = (1 << 64) - 1
MAX_LOAD = 0.7


def key64(value: object) -> int:
    """A 64-bit map key for ``value`` (never EMPTY or DELETED)."""
    k = hash(value) & MASK64
    return k if k > DELETED else k + 2


def _zeros(code: str, n: int) -> array:
    # Repeating one zero fills the buffer in place; array(code, bytes(...)) made the zeros
    # twice (a bytes object, then its copy), a fifth of a first scan's table work.
    return array(code, [0]) * n


def _grown(col: array, n: int) -> array:
    new = _zeros(col.typecode, n)
    new[: len(col)] = col
    return new


def view(col: array, dtype: type) -> np.ndarray:
    return np.frombuffer(col, dtype=dtype)


class U64Map:
    """uint64 key -> int64 value, each entry with a generation (when a scan last saw it)."""

    def __init__(self, capacity: int = 1024) -> None:
        cap = 1 << max(4, (max(capacity, 2) - 1).bit_length())
        self.keys = _zeros("Q", cap)
        self.vals = _zeros("q", cap)
        self.gens = _zeros("i", cap)
        self.live = 0
        self.filled = 0  # live + tombstones
        self._mask = cap - 1

    def __len__(self) -> int:
        return self.live

    @property
    def nbytes(self) -> int:
        return len(self.keys) * (8 + 8 + 4)

    def index(self, key: int) -> int:
        """Index holding ``key``, or -1."""
        keys = self.keys
        mask = self._mask
        i = key & mask
        while True:
            k = keys[i]
            if k == key:
                return i
            if k == EMPTY:
                return -1
            i = (i + 1) & mask

    def get(self, key: int, default: int = -1) -> int:
        i = self.index(key)
        return default if i < 0 else self.vals[i]

    def put(self, key: int, value: int, gen: int = 0) -> None:
        keys = self.keys
        mask = self._mask
        i = key & mask
        free = -1
        while True:
            k = keys[i]
            if k == key:
                self.vals[i] = value
                self.gens[i] = gen
                return
            if k == EMPTY:
                break
            if k == DELETED and free < 0:
                free = i
            i = (i + 1) & mask
        if free >= 0:
            i = free
        else:
            self.filled += 1
        keys[i] = key
        self.vals[i] = value
        self.gens[i] = gen
        self.live += 1
        if self.filled > MAX_LOAD * len(keys):
            self._rebuild(len(keys) * (2 if self.live > 0.35 * len(keys) else 1))

    def find_many(self, keys: np.ndarray) -> np.ndarray:
        """The index of each of ``keys`` (uint64), or -1: :meth:`index`, vectorised (every
        round, the keys still looking move one on)."""
        native = dirscan.probe(self.keys, keys)
        if native is not None:
            return native
        table = view(self.keys, np.uint64)
        mask = self._mask
        found = np.full(len(keys), -1, dtype=np.int64)
        pos = (keys & np.uint64(mask)).astype(np.int64)
        todo = np.arange(len(keys))
        while len(todo):
            at = pos[todo]
            k = table[at]
            hit = k == keys[todo]
            found[todo[hit]] = at[hit]
            todo = todo[~hit & (k != EMPTY)]
            pos[todo] = (pos[todo] + 1) & mask
        return found

    def put_many(self, keys: np.ndarray, vals: np.ndarray, gen: int = 0) -> None:
        """Insert ``keys`` (uint64), none of them in the map yet and no two equal, with
        ``vals``: :meth:`put` in bulk (grown first, so no rebuild happens midway)."""
        n = len(keys)
        if not n:
            return
        cap = len(self.keys)
        if self.filled + n > MAX_LOAD * cap:
            if self.live + n > MAX_LOAD * cap / 2:
                cap *= 2  # as put grows: twice, when more than half the load limit is live
            while self.live + n > MAX_LOAD * cap:
                cap *= 2
            self._rebuild(cap)
        self._place(keys, np.asarray(vals, dtype=np.int64), np.full(n, gen, dtype=np.int32))
        self.live += n
        self.filled += n

    def _place(self, keys: np.ndarray, vals: np.ndarray, gens: np.ndarray) -> None:
        """Vectorised linear probing into EMPTY slots (a DELETED one is passed over, which a
        lookup does too): every round, of the keys still looking, the first for each free
        position takes it; the others move one on.  In C where it was built."""
        if dirscan.place(self.keys, self.vals, self.gens, keys, vals, gens):
            return
        mask = self._mask
        tk, tv, tg = (
            view(self.keys, np.uint64),
            view(self.vals, np.int64),
            view(self.gens, np.int32),
        )
        pos = (keys & np.uint64(mask)).astype(np.int64)
        todo = np.arange(len(keys))
        while len(todo):
            uniq, first = np.unique(pos[todo], return_index=True)
            win = todo[first[tk[uniq] == EMPTY]]
            tk[pos[win]] = keys[win]
            tv[pos[win]] = vals[win]
            tg[pos[win]] = gens[win]
            placed = np.zeros(len(keys), dtype=bool)
            placed[win] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) & mask

    def pop(self, key: int) -> int:
        """Remove ``key``; returns its value or -1."""
        i = self.index(key)
        if i < 0:
            return -1
        self.keys[i] = DELETED
        self.live -= 1
        return self.vals[i]

    def pop_at(self, i: int) -> None:
        if self.keys[i] > DELETED:
            self.keys[i] = DELETED
            self.live -= 1

    def _rebuild(self, capacity: int) -> None:
        old_keys = view(self.keys, np.uint64)
        live = np.flatnonzero(old_keys > DELETED)
        keys = old_keys[live]
        vals = view(self.vals, np.int64)[live]
        gens = view(self.gens, np.int32)[live]
        del old_keys
        self.keys = _zeros("Q", capacity)
        self.vals = _zeros("q", capacity)
        self.gens = _zeros("i", capacity)
        self._mask = capacity - 1
        self.live = self.filled = len(live)
        self._place(keys, vals, gens)


# InodeTable flags
PENDING = 1  # created or moved in, not yet counted (waiting for ``settle``)
SAVED = 2  # loaded from the saved snapshot, not yet found by the reconcile scan
# Saved as (ledger.py): a block holds this inode number (its entry, or an earlier file's on
# the number), so the row goes with a tombstone; its ``f:`` row; its ``f:`` key holds the
# tombstone of an earlier file on the number.  An entry of a block is what a restart reads
# of the inode only with IN_BLOCK and neither ROW nor TOMB.
IN_BLOCK = 4
ROW = 8
TOMB = 16


class InodeTable:
    """Rows of inodes; a free list reuses the rows of removed ones."""

    COLUMNS = (
        ("dev", "q"),
        ("ino", "Q"),
        ("size", "q"),
        ("counted", "q"),  # the measure last counted (docs/fs-source.md)
        ("measure", "q"),  # the measure at the last look (ahead of counted while PENDING)
        ("mtime", "q"),
        ("names", "i"),
        ("flags", "B"),
        ("used", "B"),
    )

    def __init__(self, capacity: int = 1024) -> None:
        capacity = max(capacity, 16)
        for name, code in self.COLUMNS:
            setattr(self, name, _zeros(code, capacity))
        self.top = 0  # rows [0, top) have been handed out
        self.free = array("q")
        self.idents = U64Map(capacity)
        self.live = 0

    # declared for type checkers; set in __init__
    dev: array
    ino: array
    size: array
    counted: array
    measure: array
    mtime: array
    names: array
    flags: array
    used: array

    def __len__(self) -> int:
        return self.live

    @property
    def nbytes(self) -> int:
        per_row = sum(array(code).itemsize for _, code in self.COLUMNS)
        return per_row * len(self.dev) + self.idents.nbytes + 8 * len(self.free)

    def find(self, dev: int, ino: int) -> int:
        """The row of (dev, ino), or -1.  The map key is a hash: the row's columns decide."""
        row = self.idents.get(key64((dev, ino)))
        if row >= 0 and (self.dev[row] != dev or self.ino[row] != ino):
            return -1  # a 64-bit collision: treated as unknown (counted as new, never lost)
        return row

    def add(
        self, dev: int, ino: int, size: int, measure: int, counted: int, mtime: int, flags: int
    ) -> int:
        if self.free:
            row = self.free.pop()
        else:
            if self.top == len(self.dev):
                n = 2 * len(self.dev)
                for name, _ in self.COLUMNS:
                    setattr(self, name, _grown(getattr(self, name), n))
            row = self.top
            self.top += 1
        self.dev[row] = dev
        self.ino[row] = ino
        self.size[row] = size
        self.measure[row] = measure
        self.counted[row] = counted
        self.mtime[row] = mtime
        self.names[row] = 0
        self.flags[row] = flags
        self.used[row] = 1
        self.idents.put(key64((dev, ino)), row)
        self.live += 1
        return row

    def add_many(
        self,
        dev: np.ndarray,
        ino: np.ndarray,
        idents: np.ndarray,
        size: np.ndarray,
        measure: np.ndarray,
        counted: np.ndarray,
        mtime: np.ndarray,
        flags: int,
    ) -> np.ndarray:
        """:meth:`add` in bulk for inodes not in the table, ``idents`` their keys
        (key64((dev, ino)), no two equal); returns their rows."""
        n = len(dev)
        reuse = min(n, len(self.free))
        rows = np.empty(n, dtype=np.int64)
        if reuse:
            rows[:reuse] = np.frombuffer(self.free, dtype=np.int64)[len(self.free) - reuse :][::-1]
            del self.free[len(self.free) - reuse :]
        fresh = n - reuse
        if self.top + fresh > len(self.dev):
            cap = len(self.dev)
            while self.top + fresh > cap:
                cap *= 2
            for name, _ in self.COLUMNS:
                setattr(self, name, _grown(getattr(self, name), cap))
        rows[reuse:] = np.arange(self.top, self.top + fresh)
        self.top += fresh
        view(self.dev, np.int64)[rows] = dev
        view(self.ino, np.uint64)[rows] = ino
        view(self.size, np.int64)[rows] = size
        view(self.measure, np.int64)[rows] = measure
        view(self.counted, np.int64)[rows] = counted
        view(self.mtime, np.int64)[rows] = mtime
        view(self.names, np.int32)[rows] = 0
        view(self.flags, np.uint8)[rows] = flags
        view(self.used, np.uint8)[rows] = 1
        self.idents.put_many(idents, rows)
        self.live += n
        return rows

    def remove(self, row: int) -> None:
        if not self.used[row]:
            return
        self.idents.pop(key64((self.dev[row], self.ino[row])))
        self.used[row] = 0
        self.flags[row] = 0
        self.free.append(row)
        self.live -= 1

    def rows_with(self, flag: int) -> list[int]:
        top = self.top
        flags = view(self.flags, np.uint8)[:top]
        used = view(self.used, np.uint8)[:top]
        return np.flatnonzero((flags & flag).astype(bool) & (used == 1)).tolist()
