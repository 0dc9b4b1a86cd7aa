"""SQLite state: source positions, counters and detector state, saved in one transaction.

Positions and the counters they produced are written together, so after a crash the service
resumes from a position whose records are exactly the ones already counted.  Sources whose
state is too large for one position (a file tree's snapshot, a registry's listing) keep it in
the *ledger*, a table of rows per source that each save updates by the rows that changed, in
the same transaction.

The detector's arrays are stored raw in named groups (see Detector.state_arrays), with a JSON
header that says which rows (surface keys) a group's arrays hold; a save hands over a group
whole, and what the file holds afterwards is exactly that group.  Each array is kept as chunks
of ``CHUNK`` bytes of its raw bytes, in the order of its axes in memory (table
``array_chunks``), and a save writes only the chunks whose 64-bit hash differs from the one
saved last (``array_meta`` holds each array's dtype, shape, axis order and chunk hashes; this
store keeps a copy of the hashes, 8 bytes a chunk, 0.05 % of the arrays: 0.36 MB at 100,000
surfaces).  At 100,000 surfaces the arrays are some 740 MB and most of them stand still
between saves (a daily profile learns one slot's row a tick, the tails' kept peaks change
when an incident ends): writing them whole cost ~3 s a save, writing what changed costs what
hashing them costs (~0.15 s) plus the changed chunks.  A changed dtype, shape or chunk size,
or a new array, is written whole; an array the group no longer has is deleted.  (JSON with
base64 cost about 6 s and 262 MB per save at 100k surfaces; one BLOB per array, schema
version 1, ~3 s: a version 1 file is read as it is, and each group moves to chunks at its
next save.)

The WAL.  A save's transaction goes to the write-ahead log (``capalarm.db-wal``) and is
copied into the database file by a *checkpoint*.  SQLite runs one at a commit that leaves
the WAL past 1,000 pages, on the committing thread (the pipeline's: at 100,000 surfaces ~0.1 s
of a 0.3 s save), and a WAL file keeps the size of the largest transaction ever written to it
(the first save at 100,000 surfaces: 780 MB, beside a database of the same size).  So this
store's connection does not checkpoint at commit: once saves have written ``CHECKPOINT_AT``
bytes since the last one (SQLite's 1,000 pages; every checkpoint save at 100,000 surfaces), a
thread of its own (``_checkpoints``, with a connection of its own that never waits for a lock)
copies the WAL into the database while the pipeline goes on, and truncates the WAL file to
nothing when it has grown past ``WAL_LIMIT``; and SQLite cuts the WAL file back to
``WAL_LIMIT`` whenever a writer starts it afresh (``journal_size_limit``).  Once the
checkpoint after a save has run, the WAL file is at most ``WAL_LIMIT`` on disk (while a
transaction is written it is as large as that transaction).  A checkpoint moves no data that
the WAL does not still hold, so a kill -9 at any point of one leaves the last committed save,
as at any other point.

Locks.  Another process holding the database (a backup, an operator's ``sqlite3`` inside a
transaction) must not stop the pipeline thread, which saves and records alert changes between
ticks: once open, every write waits for SQLite's write lock at most ``BUSY_TIMEOUT`` and then
fails (the caller retries later, exporters/diskfull.py and alarm/service.py say how).  This
process's own writers of the file (this store and the notification outbox, on other threads)
would then fail on each other: they take ``write_lock`` first and wait there instead.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alarm.detector.persist import DTYPES

try:  # XXH64 per chunk at memory speed (alarm/_chunkhash.c); hashlib where it is not built
    from alarm._chunkhash import hashes as _xxh64_chunks
except ImportError:  # pragma: no cover - the extension is built wherever a compiler was
    _xxh64_chunks = None

# A group of arrays: (header, {name: array}).
ArrayGroup = tuple[dict[str, Any], dict[str, np.ndarray]]

# 2: arrays as chunks (array_meta, array_chunks).  1: one BLOB per array (arrays), still read.
SCHEMA_VERSION = 2
READABLE_VERSIONS = ("1", "2")
# Bytes per chunk of an array: chosen by measurement at 100,000 surfaces (docs/benchmarks.md,
# "State save per tick"): smaller chunks write fewer unchanged bytes around each change but
# cost a row each (an insert, an index entry, its page overhead).
CHUNK = 16384
# The chunk hash this process computes: the native one, else a 64-bit BLAKE2b (same purpose,
# ~6x slower).  Stored with each array: hashes of another kind mean "rewrite it whole".
HASH = "xxh64" if _xxh64_chunks is not None else "blake2b-64"
# Seconds a write waits for another process's lock on the database before it fails.
BUSY_TIMEOUT = 0.2
# Bytes the WAL file is cut back to once checkpointed (module docstring, "The WAL"): above a
# plain checkpoint's transaction at 100,000 surfaces (36-60 MB), so that a running service
# reuses its WAL file and only a first save, or one that rewrites arrays whole, truncates it.
WAL_LIMIT = 64 << 20
# Bytes of saves after which the checkpoint thread is asked to run: SQLite's default for a
# checkpoint at commit (1,000 pages of 4 kB).  A checkpoint save at 100,000 surfaces writes
# 36-60 MB, so each is followed by one.
CHECKPOINT_AT = 4 << 20

log = logging.getLogger("capalarm.state")


@dataclass(frozen=True, slots=True)
class _Saved:
    """What the file holds of one array: enough to tell which of its chunks changed."""

    dtype: str
    shape: tuple[int, ...]
    # The order of the axes the chunks hold the array in: its memory's (see _stored).
    axes: tuple[int, ...]
    chunk: int
    hash: str
    hashes: np.ndarray  # uint64, one per chunk


@dataclass(slots=True)
class SaveStats:
    """What the last save wrote of the arrays handed to it."""

    array_bytes: int = 0  # the arrays' bytes
    written_bytes: int = 0  # chunk bytes written
    chunks_written: int = 0
    # Arrays written whole: new, or of another dtype, shape, axis order, chunk size or hash.
    arrays_whole: int = 0
    # Everything else the save wrote: its JSON texts (the value, the groups' headers, the
    # arrays' hashes) and ledger rows, in bytes.
    other_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """What the save handed to SQLite (its pages and index entries add to it)."""
        return self.written_bytes + self.other_bytes


def chunk_hashes(data: bytes | memoryview, chunk: int, kind: str = HASH) -> np.ndarray:
    """One 64-bit hash per ``chunk`` bytes of ``data`` (the last chunk may be shorter)."""
    if kind == "xxh64" and _xxh64_chunks is not None:
        return np.frombuffer(_xxh64_chunks(data, chunk), dtype=np.uint64)
    if kind != "blake2b-64":
        raise ValueError(f"unknown chunk hash {kind!r}")
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(data[i : i + chunk], digest_size=8).digest(), "little")
            for i in range(0, len(data), chunk)
        ],
        dtype=np.uint64,
    )


class StateError(RuntimeError):
    """The state database cannot be used: one line, naming the file and why."""


def storage_cause(exc: BaseException, path: str | Path) -> str:
    """Why a read or write of the SQLite file ``path`` failed, in words an operator can act
    on: locked by another process, disk full, read-only, not writable by this user, not a
    database, damaged.  SQLite says "database is locked" or "unable to open database file";
    this says which it is about and what to do."""
    path = Path(path)
    where = path.parent
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    err = exc.errno if isinstance(exc, OSError) else None
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "is locked" in text:
        return (
            "locked by another process (another capalarm on the same state directory, or a "
            "program holding the database in a transaction)"
        )
    if name.startswith("SQLITE_FULL") or err in (errno.ENOSPC, errno.EDQUOT) or "is full" in text:
        return f"disk full (free space in {where})"
    if name == "SQLITE_NOTADB" or "not a database" in text:
        return "not a SQLite database (overwritten or another program's file; move it aside)"
    if name.startswith("SQLITE_CORRUPT") or "malformed" in text:
        return "damaged (truncated or corrupt; move it aside to start afresh)"
    writable = _writable(where, path)
    if writable:
        return writable
    if name.startswith("SQLITE_READONLY") or err == errno.EROFS or "readonly" in text:
        return "read-only"
    if name.startswith("SQLITE_IOERR") or err == errno.EIO:
        return f"I/O error ({exc})"
    return str(exc) or type(exc).__name__


def _writable(where: Path, path: Path) -> str:
    """Why ``path`` in ``where`` cannot be written, or "" when it can as far as can be told."""
    with contextlib.suppress(OSError):
        if os.statvfs(where).f_flag & os.ST_RDONLY:
            return f"read-only file system ({where})"
    user = f"uid {os.geteuid()}"
    if where.is_dir() and not os.access(where, os.W_OK | os.X_OK):
        return f"permission denied ({user} cannot write the state directory {where})"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f"permission denied ({user} cannot write {path})"
    return ""


class StateStore:
    def __init__(self, state_dir: str | Path):
        """Opens (or creates) ``state_dir``/capalarm.db.  OSError when the directory cannot
        be made; StateError when the database cannot be used, or is of another schema
        version."""
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "capalarm.db"
        # Held around every write transaction by this store and the outbox (module docstring).
        self.write_lock = threading.Lock()
        # What the file holds of each group's arrays, as of array generation _generation (a
        # counter in kv that every save of arrays moves on): another writer of the same file
        # moves it too, and then what is held here is read again from the file.
        self._saved: dict[str, dict[str, _Saved | None]] = {}
        self._generation: int | None = None
        # The chunk hash this store writes (tests set the fallback's).
        self.hash = HASH
        self.last_save = SaveStats()
        # The checkpoint thread (module docstring, "The WAL"): started by a save when none is
        # running; _checkpoint_wanted is a save's request it has not taken yet.
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_wanted = False
        self._checkpoint_running = False
        self._checkpoint_thread: threading.Thread | None = None
        self._closed = False
        self._unchecked = 0  # bytes saved since a checkpoint was last asked for
        self.checkpoints = 0
        self.checkpoint_failures = 0
        try:
            self._open()
        except sqlite3.Error as exc:
            with contextlib.suppress(Exception):
                self.db.close()
            raise StateError(
                f"cannot use the state database {self.path}: {storage_cause(exc, self.path)}"
            ) from None
        except StateError:
            self.db.close()
            raise

    def _open(self) -> None:
        # check_same_thread=False: the store is used only from the pipeline thread, but that
        # thread is not the one that opened it.
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        # Whose file this is, before anything is written to it.
        self._check_schema()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        # Checkpoints run on their own thread, not at this connection's commits; a WAL file
        # started afresh is cut back to WAL_LIMIT (module docstring, "The WAL").
        self.db.execute("PRAGMA wal_autocheckpoint=0")
        self.db.execute(f"PRAGMA journal_size_limit={int(WAL_LIMIT)}")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, saved REAL NOT NULL)"
        )
        # Version 1's arrays, one BLOB each: read, and emptied group by group as they are saved.
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS arrays (grp TEXT NOT NULL, name TEXT NOT NULL, "
            "dtype TEXT NOT NULL, shape TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (grp, name))"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS array_meta (grp TEXT NOT NULL, name TEXT NOT NULL, "
            "dtype TEXT NOT NULL, shape TEXT NOT NULL, axes TEXT NOT NULL, "
            "chunk INTEGER NOT NULL, hash TEXT NOT NULL, hashes BLOB NOT NULL, "
            "PRIMARY KEY (grp, name))"
        )
        # A rowid table, not WITHOUT ROWID: its rows are chunks of kilobytes (SQLite advises
        # WITHOUT ROWID for rows under a twentieth of a page).
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS array_chunks (grp TEXT NOT NULL, name TEXT NOT NULL, "
            "idx INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (grp, name, idx))"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS ledger (source TEXT NOT NULL, key TEXT NOT NULL, "
            "value TEXT NOT NULL, PRIMARY KEY (source, key)) WITHOUT ROWID"
        )
        self.db.execute(
            "INSERT OR IGNORE INTO kv VALUES ('schema', ?, ?)", (str(SCHEMA_VERSION), time.time())
        )
        # Opening waited the default 5 s for a lock (and fails at start if it stays held);
        # from now on a held lock fails a save quickly, and the save is tried again later.
        self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")

    def _check_schema(self) -> None:
        """A new (empty) file, or a capalarm database of a version in READABLE_VERSIONS (an
        older one says so until its first save of arrays, which converts the groups it saves
        and marks the file SCHEMA_VERSION); else StateError."""
        tables = {
            r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables:
            return
        if "kv" not in tables:
            others = ", ".join(sorted(tables)[:5])
            raise StateError(
                f"{self.path} is not a capalarm state database (it holds tables {others}): "
                "use --state-dir to choose another directory, or move the file aside"
            )
        row = self.db.execute("SELECT value FROM kv WHERE key = 'schema'").fetchone()
        if row is None:
            if self.db.execute("SELECT 1 FROM kv LIMIT 1").fetchone() is None:
                return  # created, never written: as new
            raise StateError(
                f"{self.path} has no schema version: not a capalarm state database "
                "(move it aside to start afresh)"
            )
        if str(row[0]) not in READABLE_VERSIONS:
            seen = str(row[0])[:20]
            raise StateError(
                f"the state database {self.path} has schema version {seen}; this capalarm "
                f"reads version {SCHEMA_VERSION} (and converts version 1) (run the capalarm "
                "that wrote it, or move the file aside to start afresh)"
            )

    def load(self, key: str = "pipeline") -> dict[str, Any]:
        row = self.db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        if row is None:
            return {}
        try:
            value = json.loads(row[0])
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def load_groups(self) -> dict[str, ArrayGroup]:
        """Every saved array group.  Arrays that cannot be read are left out."""
        out: dict[str, ArrayGroup] = {}
        for grp, header in self.db.execute(
            "SELECT substr(key, 8), value FROM kv WHERE key LIKE 'arrays:%'"
        ):
            try:
                head = json.loads(header)
            except ValueError:
                continue
            if isinstance(head, dict):
                out[grp] = (head, {})
        for grp, name, dtype, shape, data in self.db.execute(
            "SELECT grp, name, dtype, shape, data FROM arrays"
        ):
            if grp not in out or dtype not in DTYPES:
                continue
            try:
                dims = tuple(int(d) for d in json.loads(shape))
                out[grp][1][name] = np.frombuffer(data, dtype=dtype).reshape(dims).copy()
            except (ValueError, TypeError):
                continue
        for grp, name, *meta in self.db.execute(
            "SELECT grp, name, dtype, shape, axes, chunk, hash, hashes FROM array_meta"
        ).fetchall():
            if grp not in out:
                continue
            saved = _meta(*meta)
            if saved is not None and saved.dtype in DTYPES:
                a = self._assemble(grp, name, saved)
                if a is not None:
                    out[grp][1][name] = a
        return out

    def _assemble(self, grp: str, name: str, saved: _Saved) -> np.ndarray | None:
        """One array from its chunks; None when a chunk is missing, of the wrong size, or
        (where this process computes that hash) not the one saved with it."""
        dtype = np.dtype(saved.dtype)
        nbytes = int(np.prod(saved.shape, dtype=np.int64)) * dtype.itemsize
        count = -(-nbytes // saved.chunk)
        if len(saved.hashes) != count:
            return None
        buf = np.empty(nbytes, dtype=np.uint8)
        seen = 0
        for idx, data in self.db.execute(
            "SELECT idx, data FROM array_chunks WHERE grp = ? AND name = ? ORDER BY idx",
            (grp, name),
        ):
            at = idx * saved.chunk
            if not 0 <= idx < count or len(data) != min(saved.chunk, nbytes - at):
                return None
            buf[at : at + len(data)] = np.frombuffer(data, dtype=np.uint8)
            seen += 1
        if seen != count:
            return None
        computable = saved.hash == "blake2b-64" or (
            saved.hash == "xxh64" and _xxh64_chunks is not None
        )
        if computable and not np.array_equal(
            chunk_hashes(memoryview(buf), saved.chunk, saved.hash), saved.hashes
        ):
            return None
        stored = buf.view(dtype).reshape([saved.shape[i] for i in saved.axes])
        # C order, as it was handed over (one copy, at start, where the axes were reordered).
        return np.ascontiguousarray(stored.transpose(np.argsort(saved.axes)))

    def ledger_rows(self, source: str) -> Iterator[tuple[str, str]]:
        """The saved ledger rows of one source, as (key, value), read in pages."""
        return StateStore._rows(self.db, source)

    def ledger_reader(self, source: str) -> Callable[[], Iterator[tuple[str, str]]]:
        """A function a source calls (from any thread) to read its saved ledger rows, over a
        connection of its own."""
        path = self.path

        def read() -> Iterator[tuple[str, str]]:
            db = sqlite3.connect(path, check_same_thread=False)
            try:
                yield from StateStore._rows(db, source)
            finally:
                db.close()

        return read

    @staticmethod
    def _rows(db: sqlite3.Connection, source: str) -> Iterator[tuple[str, str]]:
        last = ""
        while True:
            rows = db.execute(
                "SELECT key, value FROM ledger WHERE source = ? AND key > ? ORDER BY key LIMIT 10000",
                (source, last),
            ).fetchall()
            if not rows:
                return
            yield from rows
            last = rows[-1][0]

    def ledger_sources(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT source FROM ledger")]

    def save(
        self,
        value: dict[str, Any],
        key: str = "pipeline",
        groups: dict[str, ArrayGroup] | None = None,
        ledger: Mapping[str, Mapping[str, str | None]] | None = None,
        drop_ledgers: Iterable[str] = (),
    ) -> None:
        """``value`` as JSON under ``key``, each array group (replaced whole) and the ledger
        rows (written, or deleted where None; ``drop_ledgers``: sources whose rows all go),
        atomically."""
        text = json.dumps(value, separators=(",", ":"))
        now = time.time()
        with self.write_lock:
            self._save(text, key, now, groups, ledger, drop_ledgers)
        # As SQLite's own checkpoints at commit (1,000 pages): a WAL of small saves is left to
        # grow to CHECKPOINT_AT before it is copied, not copied after every save.
        self._unchecked += self.last_save.total_bytes
        if self._unchecked >= CHECKPOINT_AT:
            self._unchecked = 0
            self.request_checkpoint()

    def _save(
        self,
        text: str,
        key: str,
        now: float,
        groups: dict[str, ArrayGroup] | None,
        ledger: Mapping[str, Mapping[str, str | None]] | None,
        drop_ledgers: Iterable[str],
    ) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            stats = SaveStats(other_bytes=len(text))
            self.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (key, text, now))
            for source in drop_ledgers:
                self.db.execute("DELETE FROM ledger WHERE source = ?", (source,))
            for source, rows in (ledger or {}).items():
                written = [(source, k, v) for k, v in rows.items() if v is not None]
                self.db.executemany("INSERT OR REPLACE INTO ledger VALUES (?, ?, ?)", written)
                self.db.executemany(
                    "DELETE FROM ledger WHERE source = ? AND key = ?",
                    [(source, k) for k, v in rows.items() if v is None],
                )
                stats.other_bytes += sum(len(k) + len(v) for _, k, v in written)
            saved: dict[str, dict[str, _Saved | None]] = {}
            generation = None
            if groups:
                generation = self._next_generation(now)
            for grp, (header, arrays) in (groups or {}).items():
                head = json.dumps(header, separators=(",", ":"))
                stats.other_bytes += len(head)
                self.db.execute(
                    "INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (f"arrays:{grp}", head, now)
                )
                saved[grp] = self._save_group(grp, arrays, stats)
            self.db.execute("COMMIT")
        except BaseException:
            # What the file holds is read again at the next save: this one may have written
            # part of a group before it failed, and rolled back.
            self._saved = {}
            self._generation = None
            # SQLite may have rolled back already (a full disk does): the original error is
            # the one to report.
            if self.db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
            raise
        if generation is not None:
            self._generation = generation
            self._saved.update(saved)
        self.last_save = stats

    def _next_generation(self, now: float) -> int:
        """Moves the file's array generation on (in the open transaction); forgets what this
        store held of the file when another writer moved it since this store's last save."""
        row = self.db.execute("SELECT value FROM kv WHERE key = 'array_generation'").fetchone()
        try:
            current = int(row[0]) if row is not None else 0
        except ValueError:
            current = -1
        if current != self._generation:
            self._saved = {}
        generation = max(current, 0) + 1
        self.db.execute(
            "INSERT OR REPLACE INTO kv VALUES ('array_generation', ?, ?)", (str(generation), now)
        )
        # A version 1 file holds chunked arrays from now on: a capalarm that reads only
        # version 1 would miss them, and must refuse the file instead.
        self.db.execute(
            "UPDATE kv SET value = ? WHERE key = 'schema' AND value <> ?",
            (str(SCHEMA_VERSION), str(SCHEMA_VERSION)),
        )
        return generation

    def _known(self, grp: str) -> dict[str, _Saved | None]:
        """What the file holds of group ``grp``'s arrays (None: a row this store cannot use,
        to be rewritten)."""
        known = self._saved.get(grp)
        if known is None:
            known = {
                name: _meta(*meta)
                for name, *meta in self.db.execute(
                    "SELECT name, dtype, shape, axes, chunk, hash, hashes FROM array_meta "
                    "WHERE grp = ?",
                    (grp,),
                )
            }
        return known

    def _save_group(
        self, grp: str, arrays: dict[str, np.ndarray], stats: SaveStats
    ) -> dict[str, _Saved | None]:
        """Makes the file hold exactly ``arrays`` for ``grp``, writing the chunks that changed."""
        known = self._known(grp)
        # A version 1 file's arrays of this group: replaced by chunks from now on.
        self.db.execute("DELETE FROM arrays WHERE grp = ?", (grp,))
        for name in known.keys() - arrays.keys():
            self.db.execute("DELETE FROM array_meta WHERE grp = ? AND name = ?", (grp, name))
            self.db.execute("DELETE FROM array_chunks WHERE grp = ? AND name = ?", (grp, name))
        out: dict[str, _Saved | None] = {}
        for name, a in arrays.items():
            stored, axes = _stored(a)
            data = _blob(stored)
            now = _Saved(
                str(a.dtype),
                tuple(a.shape),
                axes,
                CHUNK,
                self.hash,
                chunk_hashes(data, CHUNK, self.hash),
            )
            stats.array_bytes += a.nbytes
            before = known.get(name)
            if (
                before is not None
                and (before.dtype, before.shape, before.axes, before.chunk, before.hash)
                == (now.dtype, now.shape, now.axes, now.chunk, now.hash)
                and len(before.hashes) == len(now.hashes)
            ):
                changed = np.flatnonzero(now.hashes != before.hashes)
                if not len(changed):
                    out[name] = before
                    continue
            else:
                # Whole: the chunks on file (if any) are of another layout, or unknown.
                changed = np.arange(len(now.hashes))
                self.db.execute("DELETE FROM array_chunks WHERE grp = ? AND name = ?", (grp, name))
                stats.arrays_whole += 1
            rows = [
                (grp, name, int(i), data[int(i) * CHUNK : (int(i) + 1) * CHUNK]) for i in changed
            ]
            self.db.executemany("INSERT OR REPLACE INTO array_chunks VALUES (?, ?, ?, ?)", rows)
            self.db.execute(
                "INSERT OR REPLACE INTO array_meta VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    grp,
                    name,
                    now.dtype,
                    json.dumps(now.shape),
                    json.dumps(now.axes),
                    CHUNK,
                    now.hash,
                    now.hashes.tobytes(),
                ),
            )
            stats.chunks_written += len(rows)
            stats.written_bytes += sum(len(r[3]) for r in rows)
            stats.other_bytes += now.hashes.nbytes
            out[name] = now
        return out

    # -- checkpoints (module docstring, "The WAL") -------------------------------------------
    def request_checkpoint(self) -> None:
        """Have the WAL copied into the database (and cut back when it grew past WAL_LIMIT)
        on the checkpoint thread, started if none is running: never on the caller's."""
        with self._checkpoint_lock:
            if self._closed:
                return
            self._checkpoint_wanted = True
            if self._checkpoint_running:
                return
            self._checkpoint_running = True
            self._checkpoint_thread = threading.Thread(
                target=self._checkpoints, name="capalarm-checkpoint", daemon=True
            )
            self._checkpoint_thread.start()

    def wait_checkpoint(self, timeout: float | None = None) -> bool:
        """Waits until the checkpoints asked for so far have run; False on ``timeout``."""
        with self._checkpoint_lock:
            thread = self._checkpoint_thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _checkpoints(self) -> None:
        """The checkpoint thread: one checkpoint per request taken, until none is left."""
        db: sqlite3.Connection | None = None
        try:
            while True:
                with self._checkpoint_lock:
                    if not self._checkpoint_wanted or self._closed:
                        self._checkpoint_running = False
                        return
                    self._checkpoint_wanted = False
                try:
                    if db is None:
                        db = sqlite3.connect(self.path, check_same_thread=False)
                        # Never wait: a checkpoint that finds a lock taken is tried again
                        # after the next save, and the pipeline is never held by one.
                        db.execute("PRAGMA busy_timeout = 0")
                        db.execute("PRAGMA synchronous=NORMAL")
                        db.execute(f"PRAGMA journal_size_limit={int(WAL_LIMIT)}")
                    self._checkpoint(db)
                    self.checkpoints += 1
                except sqlite3.Error as exc:
                    # The next save asks again; a save that fails says why (alarm/service.py).
                    self.checkpoint_failures += 1
                    log.debug("checkpoint of %s failed: %s", self.path, exc)
        finally:
            with self._checkpoint_lock:
                self._checkpoint_running = False
            if db is not None:
                db.close()

    def _checkpoint(self, db: sqlite3.Connection) -> None:
        """Copies the WAL into the database alongside this process's writers (PASSIVE: no
        lock is waited for, none is held that a writer needs); when all of it is copied and
        the file is larger than WAL_LIMIT, truncates it (TRUNCATE takes the write lock, held
        for an ftruncate here, and only when no writer of this process holds write_lock)."""
        busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if busy or frames != copied or self.wal_bytes() <= WAL_LIMIT:
            return
        if not self.write_lock.acquire(blocking=False):
            return  # a save is writing: it asks for another checkpoint when done
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            self.write_lock.release()

    def wal_bytes(self) -> int:
        """The WAL file's size (0 when there is none)."""
        try:
            return os.stat(f"{self.path}-wal").st_size
        except OSError:
            return 0

    def close(self) -> None:
        """Waits for the checkpoint thread (the last checkpoint after the final save), then
        closes; the last connection to close checkpoints the WAL and removes it."""
        with self._checkpoint_lock:
            self._closed = True
            thread = self._checkpoint_thread
        if thread is not None:
            thread.join()
        self.db.close()


def _meta(dtype: Any, shape: Any, axes: Any, chunk: Any, kind: Any, hashes: Any) -> _Saved | None:
    """An array_meta row, or None when it is not one this store wrote."""
    try:
        dims = tuple(int(d) for d in json.loads(shape))
        order = tuple(int(i) for i in json.loads(axes))
        if not isinstance(dtype, str) or not isinstance(kind, str) or int(chunk) <= 0:
            return None
        if any(d < 0 for d in dims) or sorted(order) != list(range(len(dims))):
            return None
        return _Saved(dtype, dims, order, int(chunk), kind, np.frombuffer(hashes, dtype=np.uint64))
    except (ValueError, TypeError):
        return None


def _stored(a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """``a`` as the C-contiguous array its chunks hold, and the order of its axes there.

    An array that is a transposed view (the tails' kept peaks, 100 MB at 100,000 surfaces, are
    kept surface by surface and handed over day-major) is stored in the order its memory has:
    reordering it costs a strided copy (0.3 s there) every save, and in memory order a surface
    whose peaks change dirties one chunk, not one per day and peak.  Anything else that is not
    C-contiguous is copied into C order."""
    if a.flags.c_contiguous:
        return a, tuple(range(a.ndim))
    axes = tuple(sorted(range(a.ndim), key=lambda i: -a.strides[i]))
    moved = a.transpose(axes)
    if moved.flags.c_contiguous:
        return moved, axes
    return np.ascontiguousarray(a), tuple(range(a.ndim))


def _blob(a: np.ndarray) -> memoryview | bytes:
    """An array's bytes without a copy; an empty array (the aggregates' arrays of a detector
    without aggregates) as no bytes, which memoryview cannot cast."""
    if a.size == 0:
        return b""
    return memoryview(np.ascontiguousarray(a)).cast("B")
