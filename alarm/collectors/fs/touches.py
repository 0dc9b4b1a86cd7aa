"""One step's worth of watcher events, applied in the order they happened.

Deletes and renames change the tracked names at once (later events refer to the new names);
entries created, written or changed are only noted, and looked at (``lstat``) once at the end
of the step, so a file written in a hundred ``write`` calls is measured once, and a file
renamed right after it was written is measured where it landed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from alarm.collectors.fs.state import FileState, Output


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
        """lstat every entry noted, in the order first noted, and count what changed."""
        state = self.state
        out = self.out
        for (dir_id, name), t in self.entries.items():
            if dir_id not in state.dirs:
                continue
            path = state.entry_path(dir_id, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                if t.gone_ok:
                    state.vanish(dir_id, name, t.ts, out, wrote=t.wrote)
                continue  # its delete or rename event is still to come
            except OSError as exc:
                out.problem("permission_errors", f"cannot stat: {exc.strerror}")
                continue
            count = self.counting(dir_id)
            new_dir = state.observe(
                dir_id, name, st, min(t.ts, now), count, out, change=t.change, pid=t.pid
            )
            if new_dir >= 0:
                self.new_dirs.append((new_dir, t.ts))
        self.entries.clear()
