"""SQLite state: source positions, counters and detector state, saved in one transaction.

Positions and the counters they produced are written together, so after a crash the service
resumes from a position whose records are exactly the ones already counted.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

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

    def save(self, value: dict[str, Any], key: str = "pipeline") -> None:
        text = json.dumps(value, separators=(",", ":"))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (key, text, time.time()))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()
