"""Proof of sight: a tiny file written into each writable tree every ``interval``, which the
watcher must report within ``deadline``.  A canary not seen in time means the tree's watch is
not working (a dead inotify instance, a file system remounted under it, a poll that stopped):
the source counts ``canary_missed`` and is blind until a later canary is seen; a tree no canary
can be written into is blind too (``canary_unwritable``), until one can.

A canary has a fresh random name each round (``.capalarm-canary-<16 hex>``) and is removed once
seen, so a workload cannot hide writes in it: only names this process wrote are skipped, and
only until they are removed.  Its bytes are never counted.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections import deque
from dataclasses import dataclass

PREFIX = b".capalarm-canary-"
CONTENT = b"capalarm canary\n"
RECENT = 256  # names remembered (their delete events are skipped too)


@dataclass(slots=True)
class Canary:
    tree: int
    name: bytes
    written: float
    seen: float | None = None


class Canaries:
    def __init__(self, interval: float, deadline: float) -> None:
        self.interval = interval
        self.deadline = deadline
        self.live: dict[bytes, Canary] = {}
        self._recent: deque[bytes] = deque(maxlen=RECENT)
        self._recent_set: set[bytes] = set()
        self.next_at = 0.0

    def is_ours(self, name: bytes) -> bool:
        return name.startswith(PREFIX) and name in self._recent_set

    def _remember(self, name: bytes) -> None:
        if len(self._recent) == self._recent.maxlen:
            self._recent_set.discard(self._recent[0])
        self._recent.append(name)
        self._recent_set.add(name)

    def write(self, tree: int, root: bytes, now: float) -> str | None:
        """Write a canary into ``root``; the reason when it cannot be (the tree is not
        writable now; the engine tries again next interval)."""
        name = PREFIX + secrets.token_hex(8).encode()
        self._remember(name)
        try:
            fd = os.open(
                root + b"/" + name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
        except OSError as exc:
            return exc.strerror or str(exc)
        try:
            os.write(fd, CONTENT)
        finally:
            os.close(fd)
        self.live[name] = Canary(tree, name, now)
        return None

    def saw(self, name: bytes, now: float) -> Canary | None:
        c = self.live.get(name)
        if c is not None and c.seen is None:
            c.seen = now
            return c
        return None

    def remove(self, name: bytes, root: bytes) -> None:
        self.live.pop(name, None)
        with contextlib.suppress(OSError):
            os.unlink(root + b"/" + name)

    def overdue(self, now: float) -> list[Canary]:
        return [c for c in self.live.values() if c.seen is None and now > c.written + self.deadline]
