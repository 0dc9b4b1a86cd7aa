"""inotify watches for the directories of inotify-mode trees, and their events turned into
:class:`Touches` operations.

One watch per directory, added before the directory is listed (so nothing written after the
listing began is missed).  ``ENOSPC`` (``fs.inotify.max_user_watches`` reached) is counted in
``watch_limit_errors``; ``EACCES`` is a ``permission_errors``; what happens to such a directory is the engine's
choice (fanotify for the tree, or polling).  Renames pair ``IN_MOVED_FROM``/``IN_MOVED_TO`` by
cookie; a ``MOVED_FROM`` whose pair does not come within ``HOLD_SECONDS`` of reads moved
where no watch saw it arrive (out of the trees, or into a directory not watched yet), and is
applied before any later event on its name: a held ``MOVED_FROM`` applied after the event that
gave the name to another file dropped that file (a 1 MiB file renamed back and forth while a
restart's reconcile watched one directory and not yet the other was forgotten and counted
again).  ``IN_IGNORED`` on a directory we still hold means
its watch is gone: if the directory is still there, that is a lost watch (``watch_lost``),
re-added and the directory rescanned.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from alarm.collectors.fs import inotify as ino
from alarm.collectors.fs.reader import EventReader
from alarm.collectors.fs.state import Dir, FileState, Output, show
from alarm.collectors.fs.touches import Touches

HOLD_SECONDS = 0.05  # how long, in reads, a MOVED_FROM waits for its pair
MAX_HELD = 4096  # MOVED_FROMs waiting for their pair; beyond it the oldest is applied


@dataclass(slots=True)
class InotifyRead:
    """What a step's inotify events said besides entry changes."""

    overflow_at: float | None = None  # read time of the first IN_Q_OVERFLOW
    ignored: list[int] = field(default_factory=list)  # dirs whose watch went away
    roots_changed: bool = False
    events: int = 0
    last_read: float = 0.0


class InotifyWatch:
    mode = "inotify"

    def __init__(self, state: FileState, notify: Callable[[], None], queue_limit: int) -> None:
        self.state = state
        self.inotify = ino.Inotify()
        self.wds: dict[int, int] = {}
        self.reader = EventReader(self.inotify.fd, ino.parse, notify, queue_limit, "fs-inotify")
        self._held: dict[int, tuple[float, int, bytes]] = {}  # cookie -> (ts, dir, name)
        self._held_names: dict[tuple[int, bytes], int] = {}  # (dir, name) -> its cookie

    def start(self) -> None:
        self.reader.start()

    def close(self) -> None:
        self.reader.stop()
        self.inotify.close()

    def add(self, d: Dir, out: Output) -> int:
        """Watch ``d``: 0, or the errno it could not be watched with (counted here; the
        engine decides what happens to the directory)."""
        path = self.state.path(d.id)
        try:
            wd = self.inotify.add_watch(path)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                out.problem(
                    "watch_limit_errors",
                    f"inotify watch limit reached (fs.inotify.max_user_watches) at {show(path)}",
                )
            elif exc.errno in (errno.EACCES, errno.EPERM):
                out.problem("permission_errors", f"cannot watch {show(path)}: {exc.strerror}")
            elif exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                out.problem("watch_errors", f"cannot watch {show(path)}: {exc.strerror}")
            return exc.errno or -1
        d.wd = wd
        self.wds[wd] = d.id
        return 0

    def remove(self, d: Dir) -> None:
        if d.wd >= 0 and self.wds.get(d.wd) == d.id:
            del self.wds[d.wd]
            self.inotify.rm_watch(d.wd)
        d.wd = -1

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def translate(self, ops: Touches, max_events: int, now: float) -> tuple[InotifyRead, bool]:
        chunks, more = self.reader.take(max_events)
        res = InotifyRead()
        state = self.state
        wds = self.wds
        held = self._held  # a MOVED_FROM read at the end of the last step may pair now
        held_names = self._held_names
        for ts, events in chunks:
            res.last_read = ts
            res.events += len(events)
            for wd, mask, cookie, name in events:
                if mask & ino.IN_Q_OVERFLOW:
                    if res.overflow_at is None:
                        res.overflow_at = ts
                    # A MOVED_FROM just before the overflow: its MOVED_TO may be among what
                    # was dropped, so it did not move out for all we know; gone, and found
                    # again by the reconcile if it is still in the trees (never a new file).
                    self._release(ops)
                    continue
                did = wds.get(wd)
                if did is None:
                    continue
                if mask & ino.IN_IGNORED:
                    del wds[wd]
                    d = state.dirs.get(did)
                    if d is not None:
                        d.wd = -1
                        res.ignored.append(did)
                    continue
                if mask & (ino.IN_UNMOUNT | ino.IN_DELETE_SELF | ino.IN_MOVE_SELF):
                    d = state.dirs.get(did)
                    if d is not None and d.parent < 0:
                        res.roots_changed = True
                    continue
                if not name:
                    continue
                if held:
                    if not mask & (ino.IN_MOVED_FROM | ino.IN_MOVED_TO):
                        # The kernel queues a rename's two halves back to back: an unpaired
                        # MOVED_FROM followed by anything else moved out of the trees.
                        self._release(ops)
                    else:
                        # Its name taken again (moved in from where no watch is, or
                        # renamed away again): the earlier rename left first.
                        waiting = held_names.get((did, name))
                        if waiting is not None and waiting != cookie:
                            self._release_one(ops, waiting)
                if mask & ino.IN_MOVED_FROM:
                    held[cookie] = (ts, did, name)
                    held_names[(did, name)] = cookie
                    if len(held) > MAX_HELD:
                        self._release_one(ops, next(iter(held)))
                    continue
                if mask & ino.IN_MOVED_TO:
                    src = held.pop(cookie, None) if cookie else None
                    if src is not None:
                        del held_names[(src[1], src[2])]
                        ops.move(src[1], src[2], did, name, ts)
                    else:
                        ops.touch(did, name, ts, change="moved_in")
                    continue
                if mask & ino.IN_DELETE:
                    ops.vanish(did, name, ts)
                    continue
                if mask & (ino.IN_CREATE | ino.IN_MODIFY | ino.IN_CLOSE_WRITE | ino.IN_ATTRIB):
                    ops.touch(did, name, ts, wrote=bool(mask & ino.IN_MODIFY))
        # Held while its pair, or an overflow that says the pair may be lost, can be the next
        # event read: while more is queued, or until reads HOLD_SECONDS later did not pair it.
        if held and not chunks and not more:
            self._release(ops)  # nothing more was read: nothing can pair them
        elif held:
            last = res.last_read if more else max(now, res.last_read)
            for cookie in [c for c, (t, _, _) in held.items() if last - t >= HOLD_SECONDS]:
                self._release_one(ops, cookie)
        return res, more

    def _release(self, ops: Touches) -> None:
        for cookie in list(self._held):
            self._release_one(ops, cookie)

    def _release_one(self, ops: Touches, cookie: int) -> None:
        ts, did, name = self._held.pop(cookie)
        del self._held_names[(did, name)]
        # Moved out of every tree, or into a directory of one not watched yet (found by its
        # scan, or arriving unpaired in a watched one when it moves on before that
        # directory's watch exists): inotify cannot tell which, so never "moved out" for
        # sure; an orphan found again in its tree carries its count.
        ops.vanish(did, name, ts, renamed=True)

    def check_ignored(
        self, ignored: list[int], out: Output, now: float
    ) -> tuple[list[int], list[tuple[int, bytes]]]:
        """Directories whose watch went away.  Returns (lost: still there, re-watched, to be
        rescanned; replaced: (parent, name) of gone ones whose path holds something else)."""
        state = self.state
        lost: list[int] = []
        replaced: list[tuple[int, bytes]] = []
        for did in ignored:
            d = state.dirs.get(did)
            if d is None:
                continue
            path = state.path(did)
            try:
                st = os.lstat(path)
                same = (st.st_dev, st.st_ino) == (d.dev, d.ino)
            except OSError:
                st, same = None, False
            if not same:
                if d.parent >= 0:
                    parent, name = d.parent, d.name
                    state.remove_dir(did, now, out)
                    if st is not None:
                        replaced.append((parent, name))
                continue
            out.problem("watch_lost", f"inotify watch on {show(path)} went away; re-watching")
            if self.add(d, out) == 0:
                lost.append(did)
        return lost, replaced
