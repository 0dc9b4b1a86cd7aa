"""SQLite state: source positions, counters and detector state, saved in one transaction.

Positions and the counters they produced are written together, so after a crash the service
resumes from a position whose records are exactly the ones already counted.  Sources whose
state is too large for one position (a file tree's snapshot, a registry's listing) keep it in
the *ledger*, a table of rows per source that each save updates by the rows that changed, in
the same transaction.

The detector's arrays are stored raw, one BLOB per array, in named groups (see
Detector.state_arrays): a group is replaced whole, with a JSON header that says which rows
(surface keys) its arrays hold.  JSON with base64 cost about 6 s and 262 MB per save at 100k
surfaces; raw arrays cost what the disk takes to write them, and the big, slowly learned
profiles need not be written every tick.

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
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from alarm.detector.persist import DTYPES

# A group of arrays: (header, {name: array}).
ArrayGroup = tuple[dict[str, Any], dict[str, np.ndarray]]

SCHEMA_VERSION = 1
# Seconds a write waits for another process's lock on the database before it fails.
BUSY_TIMEOUT = 0.2


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
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, saved REAL NOT NULL)"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS arrays (grp TEXT NOT NULL, name TEXT NOT NULL, "
            "dtype TEXT NOT NULL, shape TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (grp, name))"
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
        """A new (empty) file, or a capalarm database of this SCHEMA_VERSION; else StateError."""
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
        if str(row[0]) != str(SCHEMA_VERSION):
            seen = str(row[0])[:20]
            raise StateError(
                f"the state database {self.path} has schema version {seen}; this capalarm "
                f"reads version {SCHEMA_VERSION} (run the capalarm that wrote it, or move the "
                "file aside to start afresh)"
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
        return out

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
            self.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (key, text, now))
            for source in drop_ledgers:
                self.db.execute("DELETE FROM ledger WHERE source = ?", (source,))
            for source, rows in (ledger or {}).items():
                self.db.executemany(
                    "INSERT OR REPLACE INTO ledger VALUES (?, ?, ?)",
                    [(source, k, v) for k, v in rows.items() if v is not None],
                )
                self.db.executemany(
                    "DELETE FROM ledger WHERE source = ? AND key = ?",
                    [(source, k) for k, v in rows.items() if v is None],
                )
            for grp, (header, arrays) in (groups or {}).items():
                head = json.dumps(header, separators=(",", ":"))
                self.db.execute(
                    "INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (f"arrays:{grp}", head, now)
                )
                self.db.execute("DELETE FROM arrays WHERE grp = ?", (grp,))
                self.db.executemany(
                    "INSERT INTO arrays VALUES (?, ?, ?, ?, ?)",
                    [
                        (
                            grp,
                            name,
                            str(a.dtype),
                            json.dumps(a.shape),
                            _blob(a),
                        )
                        for name, a in arrays.items()
                    ],
                )
            self.db.execute("COMMIT")
        except BaseException:
            # SQLite may have rolled back already (a full disk does): the original error is
            # the one to report.
            if self.db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()


def _blob(a: np.ndarray) -> memoryview | bytes:
    """An array's bytes without a copy; an empty array (the aggregates' arrays of a detector
    without aggregates) as no bytes, which memoryview cannot cast."""
    if a.size == 0:
        return b""
    return memoryview(np.ascontiguousarray(a)).cast("B")
