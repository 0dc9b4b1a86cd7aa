"""A directory listed as columns: the native scan of the fs source (``_dirscan.c``).

``os.scandir`` + ``DirEntry.stat`` makes a ``DirEntry`` and a ``stat_result`` per entry and
looks at it by its full path; :func:`list_dir` reads the directory with getdents64(2) and
looks at each entry with ``fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`` in C, without the
GIL, and hands back one :class:`Listing` of columns (numpy arrays) and the names as bytes,
with each name's key in the names map and each inode's key in the inode map already
computed (table.key64, with the interpreter's own hash).  scan.py adds the entries that are
new names of new inodes to the tables in bulk (state.py, ``observe_listing``) and looks at
the rest one by one as before.

Where the extension was not built (no C compiler at install), :func:`available` is False and
scan.py lists with ``os.scandir`` and observes entry by entry: the same counts, slower.

:func:`ledger_rows` writes ledger rows (ledger.py) for columns of inodes, in C where it can;
:func:`inotify_events` and :func:`fanotify_events` parse what a read of a notification
descriptor returned, in C (None without the extension: inotify.py and fanotify.py parse it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from alarm.collectors.fs.ledger import ledger_value

try:  # the native lister (alarm/collectors/fs/_dirscan.c), built by pip where a compiler is
    from alarm.collectors.fs import _dirscan as _native
except ImportError:  # pragma: no cover - exercised where the extension was not built
    _native = None


def _agrees(native: object) -> bool:
    """Whether the extension's map keys are table.key64's: it computes hash((dir, name)) and
    hash((dev, ino)) the way this interpreter does without making the tuples, and a Python
    whose tuple or int hash differs must not use it (every lookup would miss)."""
    mask = (1 << 64) - 1

    def key(value: object) -> int:
        k = hash(value) & mask
        return k if k > 1 else k + 2

    samples = [
        (7, b"x", 5, 9),
        (1 << 40, b"\xff" * 300, -3, (1 << 64) - 1),
        (2**61 - 1, b"a", 0, 2**61),
    ]
    return all(
        native.keys_of(d, n, dev, ino) == (key((d, n)), key((dev, ino)))  # type: ignore[attr-defined]
        for d, n, dev, ino in samples
    )


if _native is not None and not _agrees(_native):  # pragma: no cover - another interpreter
    _native = None

OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class EntryStat:
    """What ``lstat`` says of one listed entry (the attributes state.py reads)."""

    st_mode: int
    st_dev: int
    st_ino: int
    st_nlink: int
    st_size: int
    st_blocks: int
    st_mtime_ns: int
    st_ctime: float


@dataclass(slots=True)
class Listing:
    """Entries of one directory (a part of it, in order): names and their lstat columns.
    ``err`` is 0, or the errno of the entry's lstat (then its other columns are 0)."""

    names: list[bytes]
    keys: np.ndarray  # uint64: table.key64((dir_id, name))
    dev: np.ndarray
    ino: np.ndarray  # uint64
    mode: np.ndarray
    nlink: np.ndarray
    size: np.ndarray
    blocks: np.ndarray
    mtime: np.ndarray  # ns
    ctime: np.ndarray  # ns
    err: np.ndarray
    idents: np.ndarray  # uint64: table.key64((dev, ino)); 0 where err
    done: bool  # the directory has no more entries

    def __len__(self) -> int:
        return len(self.names)

    def stat(self, i: int) -> EntryStat:
        return EntryStat(
            int(self.mode[i]),
            int(self.dev[i]),
            int(self.ino[i]),
            int(self.nlink[i]),
            int(self.size[i]),
            int(self.blocks[i]),
            int(self.mtime[i]),
            int(self.ctime[i]) / 1e9,
        )


def available() -> bool:
    """Whether the native lister was built (else scans use ``os.scandir``)."""
    return _native is not None


def open_dir(path: bytes) -> int:
    """A descriptor to list ``path`` with (never through a symlink: ELOOP)."""
    return os.open(path, OPEN_FLAGS)


def list_dir(fd: int, dir_id: int, max_entries: int) -> Listing:
    """At least ``max_entries`` entries more of the directory open on ``fd`` (fewer when it
    ends; up to one getdents buffer more).  Needs :func:`available`; OSError from getdents64."""
    assert _native is not None
    return _listing(_native.list_dir(fd, dir_id, max(1, max_entries)))


def stat_names(fd: int, dir_id: int, names: list[bytes]) -> Listing:
    """``names`` of the directory open on ``fd``, looked at as :func:`list_dir` looks at
    entries (in that order).  Needs :func:`available`."""
    assert _native is not None
    return _listing(_native.stat_names(fd, dir_id, names))


def _listing(res: tuple) -> Listing:  # type: ignore[type-arg]
    names, *cols, done = res
    keys, dev, ino, mode, nlink, size, blocks, mtime, ctime, err, idents = cols
    i8 = np.int64
    return Listing(
        names,
        np.frombuffer(keys, np.uint64),
        np.frombuffer(dev, i8),
        np.frombuffer(ino, np.uint64),
        np.frombuffer(mode, i8),
        np.frombuffer(nlink, i8),
        np.frombuffer(size, i8),
        np.frombuffer(blocks, i8),
        np.frombuffer(mtime, i8),
        np.frombuffer(ctime, i8),
        np.frombuffer(err, i8),
        np.frombuffer(idents, np.uint64),
        bool(done),
    )


def probe(table: object, keys: np.ndarray) -> np.ndarray | None:
    """The slot of each of ``keys`` in an open-addressing table (table.py), -1 where absent;
    None without the extension (the caller probes with numpy)."""
    if _native is None:
        return None
    return np.frombuffer(_native.probe(table, np.ascontiguousarray(keys, np.uint64)), np.int64)


def place(
    table: object,
    vals: object,
    gens: object,
    keys: np.ndarray,
    new: np.ndarray,
    new_gens: np.ndarray,
) -> bool:
    """Insert ``keys`` (none in the table) with values and generations, in C; False without
    the extension (the caller places with numpy)."""
    if _native is None:
        return False
    _native.place(
        table,
        vals,
        gens,
        np.ascontiguousarray(keys, np.uint64),
        np.ascontiguousarray(new, np.int64),
        np.ascontiguousarray(new_gens, np.int32),
    )
    return True


def inotify_events(data: bytes) -> list[tuple[int, int, int, bytes]] | None:
    """inotify.parse's events, in C; None without the extension."""
    return None if _native is None else _native.inotify_events(data)


def fanotify_events(
    data: bytes,
) -> tuple[list[tuple[int, int, bytes, bytes, bytes, bytes]], int] | None:
    """fanotify.parse's (events, malformed), in C; None without the extension."""
    return None if _native is None else _native.fanotify_events(data)


def ledger_rows(
    target: dict[str, str | None],
    dev: np.ndarray,
    ino: np.ndarray,
    size: np.ndarray,
    counted: np.ndarray,
    mtime: np.ndarray,
    names: np.ndarray,
) -> None:
    """``f:<dev>:<ino>`` -> ledger.ledger_value(...) into ``target``, for columns of inodes."""
    cols = [np.ascontiguousarray(c, dtype=np.int64) for c in (dev, size, counted, mtime, names)]
    inos = np.ascontiguousarray(ino, dtype=np.uint64)
    if _native is not None:
        _native.ledger_rows(target, cols[0], inos, *cols[1:])
        return
    rows = zip(cols[0].tolist(), inos.tolist(), *(x.tolist() for x in cols[1:]), strict=True)
    for d, i, s, c, m, n in rows:
        target[f"f:{d}:{i}"] = ledger_value(s, c, m, n)
