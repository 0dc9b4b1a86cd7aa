"""SQLite state: source positions, counters and detector state, saved in one transaction.

Positions and the counters they produced are written together, so after a crash the service
resumes from a position whose records are exactly the ones already counted.

The detector's arrays are stored raw, one BLOB per array, in named groups (see
Detector.state_arrays): a group is replaced whole, with a JSON header that says which rows
(surface keys) its arrays hold.  JSON with base64 cost about 6 s and 262 MB per save at 100k
surfaces; raw arrays cost what the disk takes to write them, and the big, slowly learned
profiles need not be written every tick.
"""

from __future__ import annotations

import json
import sqlite3
import time
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

    def save(
        self,
        value: dict[str, Any],
        key: str = "pipeline",
        groups: dict[str, ArrayGroup] | None = None,
    ) -> None:
        """``value`` as JSON under ``key`` and each array group (replaced whole), atomically."""
        text = json.dumps(value, separators=(",", ":"))
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (key, text, now))
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
                            memoryview(np.ascontiguousarray(a)).cast("B"),
                        )
                        for name, a in arrays.items()
                    ],
                )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()
