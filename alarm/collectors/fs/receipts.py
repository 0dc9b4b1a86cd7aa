"""Receipts: handles an operator can re-check without trusting capalarm's word.  Every counted
file's evidence carries its ``dev_ino``, ``size`` and ``mtime`` as measured; within a byte and
file budget per tick the largest writes of a step also get the ``sha256`` of their first
``sha256_bytes`` bytes (the size measured), read with O_NOFOLLOW|O_NONBLOCK (a FIFO or a
symlink swapped in is never read) and only if the file is still the inode measured and still
holds at least that many bytes.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat

import numpy as np

from alarm.collectors.fs.columns import EventColumns
from alarm.collectors.fs.measure import NOATIME, OPEN_FLAGS

CHUNK = 1 << 20


def sha256_of(path: bytes, dev_ino: str, limit: int) -> tuple[str, int] | None:
    """(hex digest, bytes hashed) of the first ``limit`` bytes, or None."""
    try:
        fd = os.open(path, OPEN_FLAGS | NOATIME)
    except PermissionError:
        try:
            fd = os.open(path, OPEN_FLAGS)
        except OSError:
            return None
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or f"{st.st_dev}:{st.st_ino}" != dev_ino:
            return None
        if st.st_size < limit:
            return None  # shorter than measured: not what was counted (file systems reuse inodes)
        h = hashlib.sha256()
        left = min(limit, st.st_size)
        done = 0
        while left > 0:
            data = os.read(fd, min(CHUNK, left))
            if not data:
                break
            h.update(data)
            done += len(data)
            left -= len(data)
        return h.hexdigest(), done
    except OSError:
        return None
    finally:
        os.close(fd)


class ReceiptBudget:
    def __init__(self, budget_bytes: int, max_files: int, tick: float) -> None:
        self.budget_bytes = budget_bytes
        self.max_files = max_files
        self.tick = tick
        self._window = -1
        self.bytes_left = 0
        self.files_left = 0

    def add(self, events: EventColumns, now: float) -> tuple[int, int]:
        """Hash the largest writes among ``events`` within the budget; returns (hashed,
        skipped for the budget)."""
        if self.budget_bytes <= 0 or self.max_files <= 0 or not events:
            return 0, 0
        window = math.floor(now / self.tick)
        if window != self._window:
            self._window = window
            self.bytes_left, self.files_left = self.budget_bytes, self.max_files
        hashed = skipped = 0
        nbytes = np.frombuffer(events.nbytes, dtype=np.int64)
        carried = np.maximum(nbytes, np.frombuffer(events.capacity, dtype=np.int64))
        rows = np.flatnonzero((np.frombuffer(events.dev, dtype=np.int64) >= 0) & (carried > 0))
        # Largest first; equal sizes in the order written.
        rows = rows[np.argsort(-carried[rows], kind="stable")]
        for k, row in enumerate(rows.tolist()):
            if self.files_left <= 0:
                skipped += len(rows) - k  # the rest, without a look at each
                break
            size = events.size[row]
            if size > self.bytes_left:
                skipped += 1
                continue
            dev_ino = f"{events.dev[row]}:{events.ino[row]}"
            got = sha256_of(os.fsencode(events.paths[row]), dev_ino, size)
            if got is None:
                continue
            extra = events.extra.setdefault(row, {})
            extra["sha256"], extra["sha256_bytes"] = got
            self.bytes_left -= got[1]
            self.files_left -= 1
            hashed += 1
        return hashed, skipped
