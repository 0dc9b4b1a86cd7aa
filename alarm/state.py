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
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from alarm.detector.persist import DTYPES

# A group of arrays: (header, {name: array}).
ArrayGroup = tuple[dict[str, Any], dict[str, np.ndarray]]

SCHEMA_VERSION = 1


class StateStore:
    def __init__(self, state_dir: str | Path):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "capalarm.db"
        # check_same_thread=False: the store is used only from the pipeline thread, but that
        # thread is not the one that opened it.
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
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
