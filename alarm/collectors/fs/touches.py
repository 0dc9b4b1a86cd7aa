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
    missed: float = 0.0  # when a look first found nothing under the name (0: never)


class Touches:
    def __init__(
        self,
        state: FileState,
        out: Output,
        skip: Callable[[int, bytes], bool],
        counting: Callable[[int], bool] = lambda dir_id: True,
        carried: dict[tuple[int, bytes], Touch] | None = None,
    ) -> None:
        self.state = state
        self.out = out
        self.skip = skip
        self.counting = counting  # False: the dir is in a baseline that has not listed it yet
        # The touches of the last step's ``missed`` first: a rename read now takes its touch
        # along, as if both had been read in one step.
        self.entries: dict[tuple[int, bytes], Touch] = carried or {}
        # Entries the look found gone although no event said so yet: the file was renamed
        # (or deleted) after the events this step read.  Its rename is read by a later step,
        # and what was written under the old name (a growth of a file counted already) is
        # measured only if that rename takes the touch to where the file went; dropped, the
        # rename moved the name and nobody looked at what the file had grown by.
        self.missed: dict[tuple[int, bytes], Touch] = {}
        self.new_dirs: list[tuple[int, float]] = []  # (dir id, when): to be scanned
        # Directories registered while this step's events were read (fanotify names a new
        # directory by its handle before its mkdir is looked at): their scan, started after
        # the look, lists every entry there, so a touch of a name not tracked there is left
        # to it (``deferred``); looked at here too, each new file went through observe twice
        # (the scan's look finds it known).  What the touch knew (when, how, the writer's
        # pid) goes to the scan (:meth:`hints`), and a deferred name renamed away in the same
        # step takes its touch along, to be looked at where it lands: the scan will not find
        # it.  A name already tracked there (renamed in) is looked at as anywhere else: if it
        # moves on before the scan lists the directory, nobody else would measure it.
        self.scanning: set[int] = set()
        self.deferred: dict[tuple[int, bytes], Touch] = {}
        # Names a rename of a tracked file gave in those directories: the only names there the
        # state tracks before the look (no scan or look has listed them yet).
        self.tracked: set[tuple[int, bytes]] = set()

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
        if self.skip(dir_id, name):
            return
        key = (dir_id, name)
        where = self.entries
        if self.scanning and dir_id in self.scanning and key not in self.tracked:
            where = self.deferred
        t = where.get(key)
        if t is None:
            where[key] = Touch(ts, wrote, change, pid, gone_ok)
        else:
            t.ts = ts
            t.wrote = t.wrote or wrote
            t.gone_ok = t.gone_ok or gone_ok
            if pid:
                t.pid = pid

    def _note(self, dir_id: int, name: bytes, t: Touch) -> None:
        """A touch taken along by a rename: noted again under the name it landed on."""
        self.touch(dir_id, name, t.ts, t.wrote, t.change, t.pid, t.gone_ok)

    def _take(self, dir_id: int, name: bytes) -> Touch | None:
        """The touch noted for the entry (looked at or deferred), taken off both."""
        key = (dir_id, name)
        t = self.entries.pop(key, None)
        later = self.deferred.pop(key, None) if self.deferred else None
        if later is None:
            return t
        if t is not None:
            later.ts = max(later.ts, t.ts)
            later.wrote = later.wrote or t.wrote
            later.gone_ok = later.gone_ok or t.gone_ok
            later.pid = t.pid or later.pid
        return later

    def vanish(
        self, dir_id: int, name: bytes, ts: float, moved: bool = False, renamed: bool = False
    ) -> None:
        """Deleted, or ``renamed`` to where we did not see it arrive (``moved``: out of the
        trees for sure)."""
        if self.skip(dir_id, name):
            return
        t = self._take(dir_id, name)
        # A name renamed away that was only ever seen renamed in (and not looked at yet) was
        # not written: no "deleted before measured" for it.  A rename loop with a directory
        # not watched yet gave one such 0-byte write event per rename.
        noted = not renamed or (t is not None and (t.wrote or t.change != "moved_in"))
        wrote = t is not None and t.wrote
        self.state.vanish(dir_id, name, ts, self.out, wrote=wrote, moved=moved, noted=noted)

    def move(self, d1: int, n1: bytes, d2: int, n2: bytes, ts: float, pid: int = 0) -> None:
        """A rename seen at both ends.  Between trees it is a move out of one and into the
        other (the bytes count in the tree they arrive in)."""
        state = self.state
        a, b = state.dirs.get(d1), state.dirs.get(d2)
        if a is None or b is None or a.tree != b.tree:
            if a is not None:
                self.vanish(d1, n1, ts, moved=True, renamed=True)
            if b is not None:
                self.touch(d2, n2, ts, change="moved_in", pid=pid)
            return
        t = self._take(d1, n1)
        if state.move(d1, n1, d2, n2, ts, self.out):
            if d2 in self.scanning:
                self.tracked.add((d2, n2))
            if t is not None:
                state.writer(d2, n2, t.pid)
                self._note(d2, n2, t)
            return
        # Not tracked at the source: created and renamed before we looked.
        if t is None:
            t = Touch(ts, False, "created", pid, False)
        self._note(d2, n2, t)

    def hints(self) -> dict[int, dict[bytes, Touch]]:
        """The deferred touches by directory, for the scans of this step's new directories:
        what they find under those names is stamped, described and attributed as the touch
        was (the event's time, its change, the writer's pid), not as ``found_by_scan``."""
        out: dict[int, dict[bytes, Touch]] = {}
        for (dir_id, name), t in self.deferred.items():
            out.setdefault(dir_id, {})[name] = t
        self.deferred.clear()
        return out

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

    def _missed(self, dir_id: int, name: bytes, t: Touch, now: float) -> None:
        self.state.writer(dir_id, name, t.pid)
        if not t.missed:
            t.missed = now
        self.missed[(dir_id, name)] = t

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
            else:
                self._missed(dir_id, name, t, now)  # its delete or rename event is to come
            return
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
                    self._missed(dir_id, name, t, now)
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
