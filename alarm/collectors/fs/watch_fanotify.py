"""A fanotify file-system mark for fanotify-mode trees, and its events turned into
:class:`Touches` operations, each with the writer's pid.

The mark sees every write on the file system; events are kept when their directory is one of
ours.  Directories we know carry their handle key (:meth:`Fanotify.handle_key`), so the
common case is one dict lookup.  An unknown key is resolved to a path once
(``open_by_handle_at``): inside a tree it is a directory we have not registered yet (made
while we were scanning, or moved in), registered and scanned; outside, it is remembered as
outside (bounded), so the rest of the file system costs a lookup per event.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from alarm.collectors.fs import fanotify as fan
from alarm.collectors.fs.reader import EventReader
from alarm.collectors.fs.state import Dir, FileState, Output, show
from alarm.collectors.fs.touches import Touches

OUTSIDE_MEMORY = 65536
# What _dir says of a directory that is not one of ours (resolve_inside returns the first two).
OUTSIDE, INSIDE, UNRESOLVED = -1, -2, -3


@dataclass(slots=True)
class FanotifyRead:
    overflow_at: float | None = None
    events: int = 0
    malformed: int = 0
    unresolved: int = 0
    last_read: float = 0.0


class FanotifyWatch:
    mode = "fanotify"

    def __init__(
        self,
        state: FileState,
        notify: Callable[[], None],
        queue_limit: int,
        resolve_inside: Callable[[bytes, float, Touches], int],
        writer: Callable[[int], object] = lambda pid: None,
    ) -> None:
        self.state = state
        self.group = fan.Fanotify()
        self.fsids: dict[int, bytes] = {}  # st_dev of each marked file system -> its fsid
        self.keys: dict[bytes, int] = {}  # handle key -> dir id
        self._outside: dict[bytes, None] = {}
        self.resolve_inside = resolve_inside
        self.malformed = 0
        self.writer = writer
        self.reader = EventReader(self.group.fd, self._parse, notify, queue_limit, "fs-fanotify")

    def _parse(self, data: bytes) -> list[fan.RawEvent]:
        events, bad = fan.parse(data)
        self.malformed += bad
        # Who wrote: /proc/<pid> read as soon as the event is (the writer may exit soon
        # after), once per pid (workload.py remembers it for the look that counts it).
        for pid in {ev[1] for ev in events}:
            if pid > 0:
                self.writer(pid)
        return events

    def mark(self, path: bytes) -> None:
        """Mark the file system ``path`` is on (OSError when it cannot be)."""
        dev = os.stat(path).st_dev
        if dev not in self.fsids:
            self.fsids[dev] = self.group.mark_filesystem(path)

    def start(self) -> None:
        self.reader.start()

    def close(self) -> None:
        self.reader.stop()
        self.group.close()

    def add(self, d: Dir, out: Output) -> bool:
        """Know ``d`` by its handle; a directory on another file system (a mount inside the
        tree) gets that file system marked too.  False when it cannot be watched."""
        path = self.state.path(d.id)
        try:
            if d.dev not in self.fsids:
                self.mark(path)
            key = self.group.handle_key(path, self.fsids[d.dev])
        except OSError as exc:
            out.problem("watch_errors", f"cannot get a handle for {show(path)}: {exc.strerror}")
            return False
        d.handle = key
        self.keys[key] = d.id
        self._outside.pop(key, None)
        return True

    def remove(self, d: Dir) -> None:
        if d.handle and self.keys.get(d.handle) == d.id:
            del self.keys[d.handle]
        d.handle = b""

    def _dir(self, key: bytes, ts: float, ops: Touches, res: FanotifyRead) -> int:
        """The directory id a key names; else OUTSIDE (outside every tree), INSIDE (in a tree
        but not registered: its baseline will list it, or it is gone again) or UNRESOLVED
        (gone before we could ask where it was)."""
        did = self.keys.get(key)
        if did is not None:
            return did
        if not key or key in self._outside:
            return OUTSIDE
        path = self.group.resolve(key)
        if path is None:
            res.unresolved += 1
            return UNRESOLVED
        did = self.resolve_inside(path, ts, ops)
        if did == OUTSIDE:
            if len(self._outside) >= OUTSIDE_MEMORY:
                self._outside.clear()
            self._outside[key] = None
        return did

    def translate(self, ops: Touches, max_events: int) -> tuple[FanotifyRead, bool]:
        chunks, more = self.reader.take(max_events)
        res = FanotifyRead()
        for ts, events in chunks:
            res.last_read = ts
            res.events += len(events)
            for mask, pid, key, name, new_key, new_name in events:
                if mask & fan.FAN_Q_OVERFLOW:
                    if res.overflow_at is None:
                        res.overflow_at = ts
                    continue
                if mask & fan.FAN_RENAME:
                    a = self._dir(key, ts, ops, res)
                    b = self._dir(new_key, ts, ops, res)
                    if a >= 0 and b >= 0:
                        ops.move(a, name, b, new_name, ts, pid)
                    elif a >= 0:
                        # Out of the trees only when the other end is known to be outside;
                        # into a directory of a tree we have not registered (gone again by
                        # the time it was resolved, or in a baseline), it is an orphan the
                        # scan that finds it carries, never a move out and a new file.
                        ops.vanish(a, name, ts, moved=b == OUTSIDE, renamed=True)
                    elif b >= 0:
                        how = "moved_in" if a == OUTSIDE else "created"
                        ops.touch(b, new_name, ts, change=how, pid=pid)
                    continue
                if not name:
                    continue
                did = self._dir(key, ts, ops, res)
                if did < 0:
                    continue
                wrote = bool(mask & fan.FAN_MODIFY)
                if mask & fan.FAN_DELETE:
                    # fanotify merges events on one name: a delete may stand for
                    # "created, written, deleted"; the look decides.
                    ops.touch(did, name, ts, wrote=wrote, pid=pid, gone_ok=True)
                else:
                    ops.touch(did, name, ts, wrote=wrote, pid=pid)
        res.malformed, self.malformed = self.malformed, 0
        return res, more
