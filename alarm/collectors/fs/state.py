"""The tracked state of an fs source's trees and the accounting rules applied to every change
(docs/fs-source.md, "What bytes written means").

Watchers (inotify, fanotify) and scans only say *where* to look; every look ``lstat``s the
entry and counts the difference against what is tracked, so an event seen twice, an event and
a scan of the same file, or a scan after an overflow never count a byte twice.

- Directories are :class:`Dir` records (few), files are rows of an :class:`InodeTable` (many;
  hard links share a row) and names are keys of a :class:`U64Map`.
- A file created or moved in is *pending* for ``settle`` seconds and counted then, at the
  name it has then: clients write a temporary name and rename it (pip's cache, npm's cacache),
  and the bytes belong to where they land.  A rename inside a tree after that moves no bytes.
- An inode whose last tracked name went away is an *orphan* for a while, not forgotten: a
  rename into a directory nobody watches yet (npm's ``mkdir -p`` then ``rename``), or one a
  scan missed because it listed the target before and the source after it, leaves only the
  old name's departure to see.  Found again (by device and inode) in the same tree, it carries
  its count, and a pending one lands on its new name; the engine forgets orphans nobody found
  (:meth:`FileState.expire_orphans`), and only then is its ledger row deleted.
- Counting writes the file's ledger row (ledger.py) in the same batch, or, for files
  settled together and a baseline's, its entry in a ledger block (:meth:`write_blocks`), so
  what is saved is what was counted.
- A known inode found under a name it did not have (a scan after a restart, an overflow, a
  poll round) and changed is checked for a new birth (birth.py): a file born on the number
  of one deleted unseen is a new file, counted by its size, not as the old one grown.

Owned by one thread at a time (the engine's step runs in a worker thread).
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from alarm.collectors.fs.birth import Births
from alarm.collectors.fs.columns import EventColumns
from alarm.collectors.fs.dirscan import EntryStat, Listing, ledger_rows
from alarm.collectors.fs.ledger import TOMBSTONE, SavedBlocks, ledger_value
from alarm.collectors.fs.measure import SPARSE_SLACK, measure
from alarm.collectors.fs.table import (
    DELETED,
    IN_BLOCK,
    PENDING,
    ROW,
    SAVED,
    TOMB,
    InodeTable,
    U64Map,
    key64,
    view,
)

# What lstat said of an entry: os.lstat's, or a native listing's (dirscan.py).
StatLike = os.stat_result | EntryStat
ROW_MASK = (1 << 32) - 1
MAX_PENDING = 100_000  # pending files beyond this are counted at once (bounded memory)
EVIDENCE_WAIT = 5.0  # how long a file a scan found waits for its writer's events past settle
PATH_CACHE = 65536
# os.fsdecode's codec
FS_ENCODING, FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


@dataclass(slots=True)
class Dir:
    id: int
    parent: int  # -1 for a tree's root
    name: bytes  # a root's is the tree's absolute path
    dev: int
    ino: int
    tree: int
    children: dict[bytes, int] = field(default_factory=dict)
    wd: int = -1  # inotify watch
    handle: bytes = b""  # fanotify directory key
    poll: bool = False  # no watch: rescanned every poll_interval
    listed: bool = False  # a scan has listed it
    gen: int = 0


@dataclass(slots=True)
class Pending:
    dir: int
    name: bytes
    first: float  # when it was first seen (holds the watermark)
    ts: float  # last activity: the event's time when counted
    change: str
    pid: int = 0
    # When a scan found it without a writer (wall time; 0 otherwise): it waits for the events
    # fanotify queued before then, which may name the writer (settle_due, ``through``).
    seen: float = 0.0


@dataclass(slots=True)
class Orphan:
    since: float  # when its last tracked name went
    gen: int  # the generation then: scans started later have a higher one
    tree: int  # where it was (-1: a saved row no reconcile found, any tree)
    moved_out: bool = False  # its name left by a move whose other end we did not see


@dataclass(slots=True)
class Output:
    """What one step produced: write events, ledger rows, counter deltas, problems."""

    events: EventColumns = field(default_factory=EventColumns)
    ledger: dict[str, str | None] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def problem(self, counter: str, message: str) -> None:
        self.counts[counter] += 1
        if len(self.problems) < 20:
            self.problems.append(message[:300])


def show(path: bytes) -> str:
    """A path for a log line or health message: hostile bytes escaped, bounded."""
    text = repr(path)[2:-1]
    return text if len(text) <= 160 else text[:77] + "..." + text[-80:]


class FileState:
    """Directories, files and names of the trees, with the counting rules."""

    def __init__(
        self,
        trees: list[bytes],
        settle: float,
        dir_added: Callable[[Dir], None] = lambda d: None,
        dir_removed: Callable[[Dir], None] = lambda d: None,
        pid_info: Callable[[int], dict[str, Any]] = lambda pid: {},
    ) -> None:
        self.trees = trees
        self.settle = settle
        self.dir_added = dir_added
        self.dir_removed = dir_removed
        self.pid_info = pid_info
        self.roots: list[int] = [-1] * len(trees)
        self.dirs: dict[int, Dir] = {}
        self.dir_ident: dict[tuple[int, int], int] = {}
        self.inodes = InodeTable()
        self.names = U64Map()
        self.pending: dict[int, Pending] = {}
        self.orphans: dict[int, Orphan] = {}  # oldest first
        self.now = 0.0  # the time of the step (set by the engine)
        self.saved_dirs: set[tuple[int, int]] = set()
        # Saved inodes with more than one name: how many, until the restart reconcile is
        # done (the names it finds up to that many are the names they had, not new links).
        self.saved_names: dict[int, int] = {}
        self.gen = 1
        self._next_dir = 1
        self._dead_dirs: dict[int, int] = {}  # dir id -> tree, until flush drops its names
        self._paths: dict[int, bytes] = {}
        self._births = Births()
        # Ledger blocks (ledger.py): those saved; the inodes of this step that go into new
        # ones at its end (:meth:`write_blocks`: a baseline's, files settled in bulk); and
        # the tombstones of inodes no longer tracked whose number a saved block holds, by
        # key64((dev, ino)).  A tracked inode says the same with its flags (table.py:
        # IN_BLOCK, ROW, TOMB), so a number used again takes its tombstone over (TOMB).
        self.saved = SavedBlocks()
        self._blocked: list[tuple[np.ndarray, ...]] = []
        self.tombstones: dict[int, tuple[int, int]] = {}

    # -- generations and paths ---------------------------------------------------------
    def new_gen(self) -> int:
        self.gen += 1
        return self.gen

    def path(self, dir_id: int) -> bytes:
        cached = self._paths.get(dir_id)
        if cached is not None:
            return cached
        d = self.dirs[dir_id]
        parts = []
        while d.parent >= 0:
            parts.append(d.name)
            d = self.dirs[d.parent]
        root = d.name.rstrip(b"/")
        path = b"/".join([root, *reversed(parts)]) if parts else (root or b"/")
        if len(self._paths) >= PATH_CACHE:
            self._paths.clear()
        self._paths[dir_id] = path
        return path

    def entry_path(self, dir_id: int, name: bytes) -> bytes:
        base = self.path(dir_id)
        return (base if base != b"/" else b"") + b"/" + name

    # -- directories -------------------------------------------------------------------
    def add_root(self, tree: int, st: StatLike) -> Dir:
        d = Dir(self._next_dir, -1, self.trees[tree], st.st_dev, st.st_ino, tree, gen=self.gen)
        self._next_dir += 1
        self.dirs[d.id] = d
        self.dir_ident[(d.dev, d.ino)] = d.id
        self.saved_dirs.discard((d.dev, d.ino))
        self.roots[tree] = d.id
        self.dir_added(d)
        return d

    def _register_dir(
        self, parent: Dir, name: bytes, st: StatLike, ts: float, count: bool, out: Output
    ) -> Dir:
        d = Dir(self._next_dir, parent.id, name, st.st_dev, st.st_ino, parent.tree)
        d.gen = self.gen
        d.poll = parent.poll
        self._next_dir += 1
        self.dirs[d.id] = d
        self.dir_ident[(d.dev, d.ino)] = d.id
        parent.children[name] = d.id
        ident = (d.dev, d.ino)
        out.ledger[f"d:{d.dev}:{d.ino}"] = "1"
        if ident in self.saved_dirs:
            self.saved_dirs.discard(ident)
        elif count:
            path = os.fsdecode(self.path(d.id))
            out.events.add(ts, path, 0, "mkdir", d.dev, d.ino)
            out.counts["dirs_created"] += 1
        self.dir_added(d)  # the watch exists before anything lists it
        return d

    def remove_dir(self, dir_id: int, ts: float, out: Output) -> None:
        """A directory and everything under it left the tree (deleted, moved out, or found
        gone).  Names in it are dropped at the end of the step (:meth:`flush`)."""
        d = self.dirs.get(dir_id)
        if d is None:
            return
        parent = self.dirs.get(d.parent)
        if parent is not None and parent.children.get(d.name) == dir_id:
            del parent.children[d.name]
        stack = [dir_id]
        gone: set[int] = set()
        while stack:
            did = stack.pop()
            sub = self.dirs.get(did)
            if sub is None:
                continue
            gone.add(did)
            stack.extend(sub.children.values())
        # Pending files in it are counted now, at the paths they had.
        for row, p in list(self.pending.items()):
            if p.dir in gone:
                self._count_pending(row, out)
        for did in gone:
            sub = self.dirs.pop(did)
            self.dir_ident.pop((sub.dev, sub.ino), None)
            out.ledger[f"d:{sub.dev}:{sub.ino}"] = None
            self.dir_removed(sub)
            if sub.parent < 0 and self.roots[sub.tree] == did:
                self.roots[sub.tree] = -1
        self._dead_dirs.update(dict.fromkeys(gone, d.tree))
        self._paths.clear()

    def flush(self, out: Output) -> None:
        """Drop the names of directories removed in this step (one pass over the names)."""
        if not self._dead_dirs:
            return
        trees = self._dead_dirs
        dead = np.array(list(trees), dtype=np.int64)
        self._dead_dirs = {}
        names = self.names
        keys = view(names.keys, np.uint64)
        vals = view(names.vals, np.int64)
        hit = np.flatnonzero((keys > DELETED) & np.isin(vals >> 32, dead))
        rows = (vals[hit] & ROW_MASK).tolist()
        dirs = (vals[hit] >> 32).tolist()
        del keys, vals
        for i, row, did in zip(hit.tolist(), rows, dirs, strict=True):
            names.pop_at(i)
            self._drop_name(row, out, trees[did])

    # -- names -------------------------------------------------------------------------
    def lookup(self, dir_id: int, name: bytes) -> int:
        v = self.names.get(key64((dir_id, name)))
        return -1 if v < 0 else v & ROW_MASK

    def _bind(self, dir_id: int, name: bytes, row: int) -> None:
        self.names.put(key64((dir_id, name)), (dir_id << 32) | row, self.gen)
        self.inodes.names[row] += 1

    def _unbind(self, dir_id: int, name: bytes) -> int:
        v = self.names.pop(key64((dir_id, name)))
        return -1 if v < 0 else v & ROW_MASK

    def _drop_name(self, row: int, out: Output, tree: int, moved_out: bool = False) -> None:
        """One name of inode ``row`` (in ``tree``) is gone; after the last one the inode is
        an orphan until :meth:`expire_orphans` (a pending one is still counted at ``settle``,
        at the name it had, unless it is found again first)."""
        inodes = self.inodes
        if not inodes.used[row]:
            return
        inodes.names[row] -= 1
        if inodes.names[row] > 0:
            if not inodes.flags[row] & PENDING:
                self._save_row(row, out)  # one name fewer to expect after a restart
            return
        self.orphans.pop(row, None)  # re-inserted: the dict stays oldest first
        self.orphans[row] = Orphan(self.now, self.gen, tree, moved_out)

    def expire_orphans(self, before: float, gen: int, out: Output, limit: int) -> None:
        """Forget orphans that went before ``before`` and generation ``gen`` (nobody found
        them: deleted, or moved out of the trees), and the oldest beyond ``limit``."""
        orphans = self.orphans
        while orphans:
            row = next(iter(orphans))
            o = orphans[row]
            if (o.since > before or o.gen >= gen) and len(orphans) <= limit:
                break
            del orphans[row]
            self._forget(row, out)  # a pending one was written: what was measured counts

    # -- counting ----------------------------------------------------------------------
    def _event(
        self,
        out: Output,
        ts: float,
        path: str,
        nbytes: int,
        change: str,
        row: int,
        pid: int = 0,
        capacity: int = -1,
    ) -> int:
        """One write event about inode ``row``: a row of the step's event columns, from
        which its evidence is made if an alert asks (columns.py)."""
        inodes = self.inodes
        events = out.events
        if pid and pid not in events.workload:
            events.workload[pid] = self.pid_info(pid)  # comm, cgroup, container, pod
        return events.add(
            ts,
            path,
            nbytes,
            change,
            inodes.dev[row],
            inodes.ino[row],
            inodes.size[row],
            inodes.mtime[row],
            pid,
            capacity,
        )

    def _count_pending(self, row: int, out: Output) -> None:
        p = self.pending.pop(row)
        inodes = self.inodes
        m = inodes.measure[row]
        inodes.counted[row] = m
        inodes.flags[row] &= ~PENDING
        path = os.fsdecode(self.entry_path(p.dir, p.name)) if p.dir in self.dirs else ""
        i = self._event(out, p.ts, path, m, p.change, row, p.pid)
        if m != inodes.size[row]:
            out.events.extra[i] = {"sparse_data": m}
        out.counts["files_created"] += 1
        self._save_row(row, out)

    def _count_pending_rows(self, rows: list[int], out: Output) -> None:
        """:meth:`_count_pending` for many rows: their events and ledger rows in bulk."""
        plain = []
        inodes = self.inodes
        for row in rows:
            if inodes.measure[row] != inodes.size[row]:
                self._count_pending(row, out)  # a sparse file: its evidence says so
            else:
                plain.append(row)
        if not plain:
            return
        pop = self.pending.pop
        settled = [pop(row) for row in plain]
        ts = [p.ts for p in settled]
        pids = [p.pid for p in settled]
        changes = [p.change for p in settled]
        in_dir = [p.dir for p in settled]
        # The names decoded in one call (os.fsdecode of each, a tenth of a file's cost here):
        # no name holds a NUL.
        joined = b"\0".join([p.name for p in settled])
        names_str = joined.decode(FS_ENCODING, FS_ERRORS).split("\0")
        dirs = self.dirs
        prefixes = {
            d: os.fsdecode(self.entry_path(d, b"")) if d in dirs else "" for d in set(in_dir)
        }
        paths = [prefixes[d] + n for d, n in zip(in_dir, names_str, strict=True)]
        if "" in prefixes.values():  # a directory gone since: no path
            paths = [p if d in dirs else "" for p, d in zip(paths, in_dir, strict=True)]
        at = np.array(plain, dtype=np.int64)
        measures = view(inodes.measure, np.int64)[at]
        view(inodes.counted, np.int64)[at] = measures
        dev = view(inodes.dev, np.int64)[at]
        ino = view(inodes.ino, np.uint64)[at]
        size = view(inodes.size, np.int64)[at]
        mtime = view(inodes.mtime, np.int64)[at]
        names = view(inodes.names, np.int32)[at]
        events = out.events
        for pid in set(pids):
            if pid and pid not in events.workload:
                events.workload[pid] = self.pid_info(pid)
        events.add_many(ts, paths, measures, changes, dev, ino, size, mtime, pids)
        out.counts["files_created"] += len(plain)
        flags = view(inodes.flags, np.uint8)
        was = flags[at]
        # A block entry of the same file that its new count overrides (a new file on the
        # number of one a block holds, pending again).
        self.saved.garbage += int(np.count_nonzero((was & (IN_BLOCK | ROW | TOMB)) == IN_BLOCK))
        if not self.saved.worth_a_block(len(plain)):
            flags[at] = (was & ~np.uint8(PENDING | TOMB)) | ROW
            ledger_rows(out.ledger, dev, ino, size, measures, mtime, names)
            return
        # In a block: a row or a tombstone saved of the number (a file before this one)
        # would hold it over the block, so it goes.
        for d, i in zip(*self._keyed(dev, ino, (was & (ROW | TOMB)) > 0), strict=True):
            out.ledger[f"f:{d}:{i}"] = None
        flags[at] = (was & ~np.uint8(PENDING | ROW | TOMB)) | IN_BLOCK
        self._blocked.append((dev, ino, size, measures, mtime, names.astype(np.int64)))

    @staticmethod
    def _keyed(dev: np.ndarray, ino: np.ndarray, which: np.ndarray) -> tuple[list[int], ...]:
        if not which.any():
            return [], []
        return dev[which].tolist(), ino[which].tolist()

    def settle_due(self, now: float, out: Output, through: float | None = None) -> None:
        """Count pending files whose ``settle`` has passed (oldest first), and the oldest
        beyond MAX_PENDING.  ``through``: the events fanotify queued before that time are
        applied; a file a scan found without its writer at a later time waits for them
        (at most EVIDENCE_WAIT), as they name the writer's pid."""
        pending = self.pending
        over = len(pending) - MAX_PENDING
        due = []
        settle = self.settle
        wait_from = now - EVIDENCE_WAIT
        for row, p in pending.items():  # oldest first
            waits = p.first + settle > now or (
                through is not None and p.seen >= through and p.seen > wait_from
            )
            if waits and len(due) >= over:
                break
            due.append(row)
        if due:
            self._count_pending_rows(due, out)

    def count_all_pending(self, out: Output) -> None:
        self._count_pending_rows(list(self.pending), out)

    def oldest_pending(self) -> float | None:
        if not self.pending:
            return None
        return self.pending[next(iter(self.pending))].first

    def observe(
        self,
        dir_id: int,
        name: bytes,
        st: StatLike,
        ts: float,
        count: bool,
        out: Output,
        change: str = "created",
        pid: int = 0,
    ) -> int:
        """The entry ``name`` in ``dir_id`` is as ``st`` (lstat) says: count what changed.
        Returns the id of a directory newly registered (to be scanned), else -1."""
        d = self.dirs.get(dir_id)
        if d is None:
            return -1
        if stat.S_ISDIR(st.st_mode):
            return self._observe_dir(d, name, st, ts, count, out)
        child = d.children.get(name)
        if child is not None:  # a directory replaced by a file
            self.remove_dir(child, ts, out)
        inodes = self.inodes
        dev, ino = st.st_dev, st.st_ino
        key = key64((dir_id, name))
        names = self.names
        i = names.index(key)
        row = -1
        if i >= 0:
            row = names.vals[i] & ROW_MASK
            if inodes.dev[row] == dev and inodes.ino[row] == ino:
                names.gens[i] = self.gen
                self._update(row, dir_id, name, st, ts, count, out, pid)
                return -1
            names.pop_at(i)  # the name now holds another inode: the old one left it
            self._drop_name(row, out, d.tree)
        path = self.entry_path(dir_id, name)
        known = inodes.find(dev, ino)
        orphan = known >= 0 and known in self.orphans
        if orphan:
            o = self.orphans.pop(known)
            if (o.tree >= 0 and o.tree != d.tree) or (o.moved_out and change == "moved_in"):
                # It left this tree (or the trees) and came back: moved in, counted as new.
                self._forget(known, out)
                known = -1
        if known >= 0 and self._reborn(known, path, st):
            self._renew(known, dir_id, name, path, st, ts, count, out, change, pid)
            return -1
        if known >= 0:
            p = self.pending.get(known) if orphan else None
            if p is not None:
                p.dir, p.name = dir_id, name  # renamed before it settled: it lands here
            had_names = inodes.names[known] > 0
            self._bind(dir_id, name, known)
            names = inodes.names[known]
            if had_names and names > self.saved_names.get(known, 1):
                if st.st_nlink > 1 and count:
                    # A hard link: its bytes were counted under the first name.
                    out.counts["hard_links"] += 1
                    self._event(out, ts, os.fsdecode(path), 0, "hard_link", known, pid)
                if not inodes.flags[known] & PENDING:
                    self._save_row(known, out)  # one name more to expect after a restart
            self._update(known, dir_id, name, st, ts, count, out, pid)
            return -1
        m, _sparse = measure(path, st)
        if count:
            row = inodes.add(dev, ino, st.st_size, m, 0, st.st_mtime_ns, PENDING)
            if self.tombstones:
                self._number_again(row)
            self._bind(dir_id, name, row)
            seen = time.time() if change == "found_by_scan" and not pid else 0.0
            self.pending[row] = Pending(dir_id, name, ts, ts, change, pid, seen)
            if self.settle <= 0:
                self._count_pending(row, out)
        else:
            row = inodes.add(dev, ino, st.st_size, m, m, st.st_mtime_ns, 0)
            if self.tombstones:
                self._number_again(row)
            self._bind(dir_id, name, row)
            self._save_row(row, out)
        return -1

    def _number_again(self, row: int) -> None:
        """A new inode on the number of one forgotten with a tombstone: the row says so."""
        inodes = self.inodes
        if self.tombstones.pop(key64((inodes.dev[row], inodes.ino[row])), None) is not None:
            inodes.flags[row] |= IN_BLOCK | TOMB

    def observe_listing(
        self,
        dir_id: int,
        lst: Listing,
        idx: np.ndarray,
        ts: np.ndarray,
        count: bool,
        out: Output,
        change: str = "found_by_scan",
        changes: list[str] | None = None,
        pids: list[int] | None = None,
    ) -> np.ndarray:
        """:meth:`observe` in bulk for the entries ``idx`` of a listing (``ts``: the event
        times; ``changes`` and ``pids``, when given, each entry's) that are new names of
        inodes not tracked: what a baseline or a new directory's scan finds, and what a
        burst of events in one directory names.  Those are added to the tables at once (pending when
        ``count``, else saved); the others (directories, names or inodes already known,
        sparse-looking files, two names of one inode) are returned, in listing order, for
        :meth:`observe`.  The counting is observe's: a new inode's measure is its size
        (a symlink's too), 0 for other non-regular files."""
        d = self.dirs.get(dir_id)
        if d is None or not len(idx):
            return idx
        fmt = lst.mode[idx] & 0o170000  # S_IFMT
        size = lst.size[idx]
        allocated = lst.blocks[idx] * 512
        reg = fmt == stat.S_IFREG
        sparse = reg & (allocated * 2 < size) & (size - allocated >= SPARSE_SLACK)
        keys = lst.keys[idx]
        idents = lst.idents[idx]
        ok = (fmt != stat.S_IFDIR) & ~sparse
        ok &= self.names.find_many(keys) < 0
        ok &= self.inodes.idents.find_many(idents) < 0
        for col in (keys, idents):  # two names of one inode here; a 64-bit collision
            ordered = np.sort(col)
            twice = ordered[1:][ordered[1:] == ordered[:-1]]
            if len(twice):
                ok &= ~np.isin(col, twice)
        names = lst.names
        if d.children:
            children = d.children
            ok &= np.fromiter((names[i] not in children for i in idx.tolist()), bool, len(idx))
        if not ok.any():
            return idx
        fast = idx[ok]
        m = np.where(reg[ok] | (fmt[ok] == stat.S_IFLNK), size[ok], 0)
        dev, ino, mtime = lst.dev[fast], lst.ino[fast], lst.mtime[fast]
        inodes = self.inodes
        rows = inodes.add_many(
            dev,
            ino,
            idents[ok],
            size[ok],
            m,
            0 if count else m,
            mtime,
            PENDING if count else IN_BLOCK,
        )
        self.names.put_many(keys[ok], (dir_id << 32) | rows, self.gen)
        view(inodes.names, np.int32)[rows] = 1
        if count:
            fast_ts = ts[fast].tolist()
            at = fast.tolist()
            now = time.time()  # when it was listed: events of writes before are queued
            if changes is None and pids is None:
                seen = now if change == "found_by_scan" else 0.0
                how: Iterable[str] = repeat(change)
                who: Iterable[int] = repeat(0)
                when: Iterable[float] = repeat(seen)
            else:
                how = [changes[i] for i in at] if changes else [change] * len(at)
                who = [pids[i] for i in at] if pids else [0] * len(at)
                when = [
                    now if c == "found_by_scan" and not w else 0.0
                    for c, w in zip(how, who, strict=True)
                ]
            # Made and added from C (map, dict.update): no Python loop per file.
            made = map(
                Pending, repeat(dir_id), [names[i] for i in at], fast_ts, fast_ts, how, who, when
            )
            self.pending.update(zip(rows.tolist(), made, strict=True))
            if self.tombstones:
                again = self._numbers_again(idents[ok])
                view(inodes.flags, np.uint8)[rows[again]] |= IN_BLOCK | TOMB
            if self.settle <= 0:
                self._count_pending_rows(rows.tolist(), out)
        else:
            if self.tombstones:  # the new block holds the number: its tombstone goes
                again = self._numbers_again(idents[ok])
                for d, i in zip(*self._keyed(dev, ino, again), strict=True):
                    out.ledger[f"f:{d}:{i}"] = None
            names_col = np.ones(len(fast), dtype=np.int64)
            self._blocked.append((dev, ino, size[ok], m, mtime, names_col))
        return idx[~ok]

    def _numbers_again(self, idents: np.ndarray) -> np.ndarray:
        """Which of these new inodes are on the number of one forgotten with a tombstone
        (taken off the tombstones: the caller says what became of it)."""
        tombs = self.tombstones
        again = np.isin(idents, np.fromiter(tombs, np.uint64, len(tombs)))
        for k in idents[again].tolist():
            del tombs[k]
        return again

    def write_blocks(self, out: Output) -> None:
        """The inodes blocked in this step (a baseline's, files settled in bulk) as ledger
        blocks, not a row each (ledger.py), as they were when blocked: a row written
        later in the step holds its inode over the block, a tombstone too; the rows and
        tombstones saved before were deleted when they were blocked."""
        if not self._blocked:
            return
        cols = np.empty((6, sum(len(b[0]) for b in self._blocked)), dtype=np.int64)
        at = 0
        for part in self._blocked:
            n = len(part[0])
            for c, col in enumerate(part):
                cols[c, at : at + n] = col.view(np.int64) if c == 1 else col
            at += n
        self._blocked = []
        self.saved.add(cols, out.ledger)

    def compact_blocks(self, out: Output) -> None:
        """When half of what the saved blocks hold is overridden or gone (``saved.due``):
        the blocks written again with only the inodes they still hold, from their own
        values (a pending file on a number a block holds, an orphan's names: the table has
        moved on from what was saved), and every tombstone deleted, as no block holds a
        forgotten inode any more.  Inodes the table says a block holds and none does (none
        should) get a row."""
        cols = self.saved.columns()
        inodes = self.inodes
        top = inodes.top
        flags = view(inodes.flags, np.uint8)[:top]
        used = view(inodes.used, np.uint8)[:top] == 1
        held = np.flatnonzero(used & ((flags & (IN_BLOCK | ROW | TOMB)) == IN_BLOCK))
        dev = view(inodes.dev, np.int64)[held]
        ino = view(inodes.ino, np.int64)[held]
        keep = np.zeros(cols.shape[1], dtype=bool)
        found = np.zeros(len(held), dtype=bool)
        for d in np.unique(dev).tolist():
            mine, theirs = dev == d, cols[0] == d
            keep[theirs] = np.isin(cols[1][theirs], ino[mine])
            found[mine] = np.isin(ino[mine], cols[1][theirs])
        for i in np.flatnonzero(used & ((flags & TOMB) > 0)).tolist():
            out.ledger[f"f:{inodes.dev[i]}:{inodes.ino[i]}"] = None
        for d, i in self.tombstones.values():
            out.ledger[f"f:{d}:{i}"] = None
        self.tombstones = {}
        flags &= ~np.uint8(IN_BLOCK | TOMB)
        flags[held[found]] |= IN_BLOCK
        for row in held[~found].tolist():
            self._save_row(row, out)
        self.saved.replace(cols[:, keep], out.ledger)

    def _save_row(self, row: int, out: Output) -> None:
        """The ledger row of a counted inode, as the table has it."""
        inodes = self.inodes
        flags = inodes.flags[row]
        if flags & (IN_BLOCK | ROW | TOMB) == IN_BLOCK:
            self.saved.garbage += 1  # the block's entry is overridden
        inodes.flags[row] = (flags | ROW) & ~TOMB
        out.ledger[f"f:{inodes.dev[row]}:{inodes.ino[row]}"] = ledger_value(
            inodes.size[row], inodes.counted[row], inodes.mtime[row], inodes.names[row]
        )

    def _forget(self, row: int, out: Output) -> None:
        """Inode ``row`` leaves the tracked state (a pending one is counted first)."""
        if row in self.pending:
            self._count_pending(row, out)
        inodes = self.inodes
        dev, ino = inodes.dev[row], inodes.ino[row]
        flags = inodes.flags[row]
        if flags & IN_BLOCK:
            out.ledger[f"f:{dev}:{ino}"] = TOMBSTONE  # a saved block holds the number
            self.tombstones[key64((dev, ino))] = (dev, ino)
            if not flags & TOMB:
                self.saved.garbage += 2 if not flags & ROW else 1  # the entry, the tombstone
        else:
            out.ledger[f"f:{dev}:{ino}"] = None
        inodes.remove(row)
        self.saved_names.pop(row, None)

    def _reborn(self, row: int, path: bytes, st: StatLike) -> bool:
        """Whether the file at ``path`` is a new file on inode ``row``'s number: changed, and
        born after the mtime last measured of the file that had it."""
        inodes = self.inodes
        if st.st_mtime_ns == inodes.mtime[row] and st.st_size == inodes.size[row]:
            return False  # moved, linked or found again: the same file
        born = self._births.born_ns(path, st.st_ino)
        return born is not None and born > inodes.mtime[row]

    def _renew(
        self,
        row: int,
        dir_id: int,
        name: bytes,
        path: bytes,
        st: StatLike,
        ts: float,
        count: bool,
        out: Output,
        change: str,
        pid: int,
    ) -> None:
        """Inode ``row``'s number now holds a new file: the old one was deleted unseen (what
        was counted of it stays counted); the new one counts like any new file.  The row is
        kept, not removed and added again, because names the old file had may still point at
        it until a sweep drops them."""
        inodes = self.inodes
        if row in self.pending:
            self._count_pending(row, out)
        out.counts["inodes_reused"] += 1
        self.saved_names.pop(row, None)  # the names the old file had are not this one's
        m, _sparse = measure(path, st)
        inodes.size[row], inodes.mtime[row], inodes.measure[row] = st.st_size, st.st_mtime_ns, m
        inodes.flags[row] &= ~SAVED
        self._bind(dir_id, name, row)
        if count:
            inodes.counted[row] = 0
            inodes.flags[row] |= PENDING
            self.pending[row] = Pending(dir_id, name, ts, ts, change, pid)
            if self.settle <= 0:
                self._count_pending(row, out)
        else:
            inodes.counted[row] = m
            self._save_row(row, out)

    def _observe_dir(
        self, parent: Dir, name: bytes, st: StatLike, ts: float, count: bool, out: Output
    ) -> int:
        cid = parent.children.get(name)
        if cid is not None:
            child = self.dirs[cid]
            if (child.dev, child.ino) == (st.st_dev, st.st_ino):
                child.gen = self.gen
                return -1
            self.remove_dir(cid, ts, out)  # another directory took the name
        row = self._unbind(parent.id, name)
        if row >= 0:  # a file replaced by a directory
            self._drop_name(row, out, parent.tree)
        known = self.dir_ident.get((st.st_dev, st.st_ino))
        if known is not None and known in self.dirs:
            # Moved here while we were not looking (a scan after an overflow finds it).
            moved = self.dirs[known]
            old_parent = self.dirs.get(moved.parent)
            if old_parent is not None and old_parent.children.get(moved.name) == known:
                del old_parent.children[moved.name]
            moved.parent, moved.name, moved.gen = parent.id, name, self.gen
            parent.children[name] = known
            self._paths.clear()
            return -1
        return self._register_dir(parent, name, st, ts, count, out).id

    def _update(
        self,
        row: int,
        dir_id: int,
        name: bytes,
        st: StatLike,
        ts: float,
        count: bool,
        out: Output,
        pid: int,
    ) -> None:
        """A tracked inode looked at again: growth counts the growth; a rewrite in place
        (not grown, new mtime) counts its new measure as capacity; truncation counts 0."""
        inodes = self.inodes
        flags = inodes.flags[row]
        if flags & SAVED:
            inodes.flags[row] = flags = flags & ~SAVED
        old_size, counted, old_mtime = inodes.size[row], inodes.counted[row], inodes.mtime[row]
        size, mtime = st.st_size, st.st_mtime_ns
        unchanged = size == old_size and mtime == old_mtime
        if unchanged and not flags & PENDING:
            return  # the common case of a repeated event
        if unchanged:
            m = inodes.measure[row]
        else:
            m, _ = measure(self.entry_path(dir_id, name), st)
        inodes.size[row], inodes.mtime[row], inodes.measure[row] = size, mtime, m
        if flags & PENDING:
            p = self.pending[row]
            p.ts = max(p.ts, ts)
            if pid:
                p.pid = pid
            return
        if count:
            path = None
            if m > counted:
                path = os.fsdecode(self.entry_path(dir_id, name))
                i = self._event(out, ts, path, m - counted, "grew", row, pid)
                if m != size:
                    out.events.extra[i] = {"sparse_data": m}
                out.counts["growths"] += 1
            elif mtime != old_mtime and m > 0 and size <= old_size:
                path = os.fsdecode(self.entry_path(dir_id, name))
                i = self._event(out, ts, path, 0, "rewritten", row, pid, capacity=m)
                out.events.extra[i] = {"capacity_is_new_size": True}
                out.counts["rewrites"] += 1
            if size < old_size:
                out.counts["truncations"] += 1
        inodes.counted[row] = m
        self._save_row(row, out)

    def vanish(
        self,
        dir_id: int,
        name: bytes,
        ts: float,
        out: Output,
        wrote: bool,
        moved: bool = False,
        noted: bool = True,
    ) -> None:
        """The entry is gone (deleted, or ``moved`` where we did not see it arrive: out of
        every tree, or into a directory not watched yet).  ``noted``: something said it was
        created or written there; False when all that was seen is renames, and a name never
        measured then carried no write."""
        d = self.dirs.get(dir_id)
        if d is None:
            return
        cid = d.children.get(name)
        if cid is not None:
            self.remove_dir(cid, ts, out)
            return
        row = self._unbind(dir_id, name)
        if (row < 0 and noted) or (row >= 0 and wrote and row not in self.pending):
            # Never measured (created and gone between two looks), or written since the
            # last look: what was last known of it is all that counts; say so.
            path = os.fsdecode(self.entry_path(dir_id, name))
            i = out.events.add(ts, path, 0, "deleted_before_measured")
            if row >= 0:
                out.events.extra[i] = {"last_known_size": self.inodes.size[row]}
            out.counts["deleted_before_measured"] += 1
        if row >= 0:
            self._drop_name(row, out, d.tree, moved)

    def writer(self, dir_id: int, name: bytes, pid: int) -> None:
        """``pid`` wrote the pending file under that name, when nothing said who did (a scan
        found it before the event that says so was applied at its name)."""
        row = self.lookup(dir_id, name)
        p = self.pending.get(row) if row >= 0 and pid else None
        if p is not None and not p.pid:
            p.pid = pid

    def move(self, d1: int, n1: bytes, d2: int, n2: bytes, ts: float, out: Output) -> bool:
        """A rename from (d1, n1) to (d2, n2), both in the same tree.  False when the source
        is not tracked (the caller looks at the destination as a new entry)."""
        src, dst = self.dirs.get(d1), self.dirs.get(d2)
        if src is None or dst is None:
            return False
        cid = src.children.get(n1)
        if cid is not None:
            old = dst.children.get(n2)
            if old is not None and old != cid:
                self.remove_dir(old, ts, out)
            del src.children[n1]
            child = self.dirs[cid]
            child.parent, child.name = d2, n2
            dst.children[n2] = cid
            self._paths.clear()
            return True
        row = self._unbind(d1, n1)
        if row < 0:
            return False
        target = self._unbind(d2, n2)
        if target >= 0 and target != row:
            self._drop_name(target, out, dst.tree)
        elif target == row:
            self.inodes.names[row] -= 1
        self.names.put(key64((d2, n2)), (d2 << 32) | row, self.gen)
        p = self.pending.get(row)
        if p is not None:
            p.dir, p.name = d2, n2
        return True

    # -- scans -------------------------------------------------------------------------
    def sweep(self, scanned: list[int], gen: int, ts: float, out: Output) -> None:
        """After a scan started at ``gen`` listed the directories ``scanned``: names and
        subdirectories there that it did not see (and nothing touched since) are gone."""
        alive = [did for did in scanned if did in self.dirs]
        if not alive:
            return
        for did in alive:
            d = self.dirs.get(did)
            if d is None:
                continue
            for cid in list(d.children.values()):
                child = self.dirs.get(cid)
                if child is not None and child.gen < gen:
                    self.remove_dir(cid, ts, out)
        self.flush(out)
        names = self.names
        keys = view(names.keys, np.uint64)
        vals = view(names.vals, np.int64)
        gens = view(names.gens, np.int32)
        ids = np.array(alive, dtype=np.int64)
        # Names the scan saw carry its generation: only the others are looked up by
        # directory (after a baseline, none are; np.isin over every slot was its last 10 %).
        hit = np.flatnonzero((keys > DELETED) & (gens < gen))
        hit = hit[np.isin(vals[hit] >> 32, ids)]
        rows = (vals[hit] & ROW_MASK).tolist()
        dirs = (vals[hit] >> 32).tolist()
        del keys, vals, gens
        for i, row, did in zip(hit.tolist(), rows, dirs, strict=True):
            names.pop_at(i)
            self._drop_name(row, out, self.dirs[did].tree)

    def sweep_saved(self, out: Output) -> None:
        """After the reconcile of every tree: saved files and directories it did not find
        were deleted while the service was down, or renamed while it listed (found later):
        orphans, like any inode whose names went."""
        inodes = self.inodes
        for row in inodes.rows_with(SAVED):
            inodes.flags[row] &= ~SAVED
            if inodes.names[row] <= 0:
                self.orphans[row] = Orphan(self.now, self.gen, -1)
        for dev, ino in self.saved_dirs:
            out.ledger[f"d:{dev}:{ino}"] = None
        self.saved_dirs.clear()
        self.saved_names.clear()

    def load_saved(
        self,
        devs: Sequence[int],
        inos: Sequence[int],
        sizes: Sequence[int],
        counted: Sequence[int],
        mtimes: Sequence[int],
        names: Sequence[int],
        in_block: Sequence[bool] | None = None,
    ) -> None:
        """Inodes from the saved ledger, as columns (``in_block``: whether a saved block
        holds each)."""
        inodes = self.inodes
        blocked = in_block if in_block is not None else [False] * len(devs)
        rows = zip(devs, inos, sizes, counted, mtimes, names, blocked, strict=True)
        for dev, ino, size, c, mtime, n, b in rows:
            if inodes.find(dev, ino) < 0:
                row = inodes.add(dev, ino, size, c, c, mtime, SAVED | (IN_BLOCK if b else ROW))
                if n > 1:
                    self.saved_names[row] = n
