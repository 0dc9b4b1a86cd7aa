"""One step's worth of watcher events, applied in the order they happened.

Deletes and renames change the tracked names at once (later events refer to the new names);
entries created, written or changed are only noted, and looked at (``lstat``) once at the end
of the step, so a file written in a hundred ``write`` calls is measured once, and a file
renamed right after it was written is measured where it landed.  Where a directory has many
entries noted (a burst of new files), they are looked at with one descriptor in C and the new
ones added in bulk (dirscan.py ``stat_names``, state.py ``observe_listing``), as a scan does.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from alarm.collectors.fs import dirscan
from alarm.collectors.fs.state import FileState, Output

BULK_LOOK = 16  # entries noted in one directory from which they are looked at in bulk


@dataclass(slots=True)
class Touch:
    ts: float
    wrote: bool
    change: str
    pid: int
    gone_ok: bool  # a merged create+delete event: gone at the look means deleted


class Touches:
    def __init__(
        self,
        state: FileState,
        out: Output,
        skip: Callable[[int, bytes], bool],
        counting: Callable[[int], bool] = lambda dir_id: True,
    ) -> None:
        self.state = state
        self.out = out
        self.skip = skip
        self.counting = counting  # False: the dir is in a baseline that has not listed it yet
        self.entries: dict[tuple[int, bytes], Touch] = {}
        self.new_dirs: list[tuple[int, float]] = []  # (dir id, when): to be scanned
        # Directories registered while this step's events were read (fanotify names a new
        # directory by its handle before its mkdir is looked at): their scan, started after
        # the look, lists every entry there, so a touch in one is left to it; looked at here
        # too, each new file went through observe twice (the scan's look finds it known).
        self.scanning: set[int] = set()

    def touch(
        self,
        dir_id: int,
        name: bytes,
        ts: float,
        wrote: bool = False,
        change: str = "created",
        pid: int = 0,
        gone_ok: bool = False,
    ) -> None:
        if dir_id in self.scanning or self.skip(dir_id, name):
            return
        key = (dir_id, name)
        t = self.entries.get(key)
        if t is None:
            self.entries[key] = Touch(ts, wrote, change, pid, gone_ok)
        else:
            t.ts = ts
            t.wrote = t.wrote or wrote
            t.gone_ok = t.gone_ok or gone_ok
            if pid:
                t.pid = pid

    def vanish(self, dir_id: int, name: bytes, ts: float, moved: bool = False) -> None:
        """Deleted, or ``moved`` to where we did not see it arrive."""
        if self.skip(dir_id, name):
            return
        t = self.entries.pop((dir_id, name), None)
        self.state.vanish(dir_id, name, ts, self.out, wrote=t is not None and t.wrote, moved=moved)

    def move(self, d1: int, n1: bytes, d2: int, n2: bytes, ts: float, pid: int = 0) -> None:
        """A rename seen at both ends.  Between trees it is a move out of one and into the
        other (the bytes count in the tree they arrive in)."""
        state = self.state
        a, b = state.dirs.get(d1), state.dirs.get(d2)
        if a is None or b is None or a.tree != b.tree:
            if a is not None:
                self.vanish(d1, n1, ts, moved=True)
            if b is not None:
                self.touch(d2, n2, ts, change="moved_in", pid=pid)
            return
        t = self.entries.pop((d1, n1), None)
        if state.move(d1, n1, d2, n2, ts, self.out):
            if t is not None:
                self.entries[(d2, n2)] = t
            return
        # Not tracked at the source: created and renamed before we looked.
        if t is None:
            t = Touch(ts, False, "created", pid, False)
        self.entries[(d2, n2)] = t

    def look(self, now: float) -> None:
        """lstat every entry noted, in the order first noted (in bulk: directory by
        directory, in the order each was first noted), and count what changed."""
        entries = self.entries
        if dirscan.available() and len(entries) >= BULK_LOOK:
            by_dir: dict[int, list[tuple[bytes, Touch]]] = {}
            for (dir_id, name), t in entries.items():
                by_dir.setdefault(dir_id, []).append((name, t))
            for dir_id, noted in by_dir.items():
                if len(noted) < BULK_LOOK or not self._look_bulk(dir_id, noted, now):
                    for name, t in noted:
                        self._look_one(dir_id, name, t, now)
        else:
            for (dir_id, name), t in entries.items():
                self._look_one(dir_id, name, t, now)
        entries.clear()

    def _look_one(self, dir_id: int, name: bytes, t: Touch, now: float) -> None:
        state = self.state
        out = self.out
        if dir_id not in state.dirs:
            return
        path = state.entry_path(dir_id, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if t.gone_ok:
                state.vanish(dir_id, name, t.ts, out, wrote=t.wrote)
            return  # its delete or rename event is still to come
        except OSError as exc:
            out.problem("permission_errors", f"cannot stat: {exc.strerror}")
            return
        count = self.counting(dir_id)
        new_dir = state.observe(
            dir_id, name, st, min(t.ts, now), count, out, change=t.change, pid=t.pid
        )
        if new_dir >= 0:
            self.new_dirs.append((new_dir, t.ts))

    def _look_bulk(self, dir_id: int, noted: list[tuple[bytes, Touch]], now: float) -> bool:
        """The entries of one directory looked at with one descriptor; False when it cannot
        be opened (then they are looked at one by one)."""
        state = self.state
        out = self.out
        if dir_id not in state.dirs:
            return True
        try:
            fd = dirscan.open_dir(state.path(dir_id))
        except OSError:
            return False
        try:
            lst = dirscan.stat_names(fd, dir_id, [name for name, _ in noted])
        finally:
            os.close(fd)
        err = lst.err
        ok = err == 0
        for i in np.flatnonzero(~ok).tolist():
            name, t = noted[i]
            if int(err[i]) == errno.ENOENT:
                if t.gone_ok:
                    state.vanish(dir_id, name, t.ts, out, wrote=t.wrote)
            else:
                out.problem("permission_errors", f"cannot stat: {os.strerror(int(err[i]))}")
        count = self.counting(dir_id)
        ts = np.minimum(np.array([t.ts for _, t in noted]), now)
        touches = [t for _, t in noted]
        rest = state.observe_listing(
            dir_id,
            lst,
            np.flatnonzero(ok),
            ts,
            count,
            out,
            changes=[t.change for t in touches],
            pids=[t.pid for t in touches],
        )
        for i in rest.tolist():
            if dir_id not in state.dirs:
                break
            name, t = noted[i]
            new_dir = state.observe(
                dir_id, name, lst.stat(i), float(ts[i]), count, out, change=t.change, pid=t.pid
            )
            if new_dir >= 0:
                self.new_dirs.append((new_dir, t.ts))
        return True
