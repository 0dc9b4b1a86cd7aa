"""Directory scans in bounded steps: the baseline at first start, the reconcile after a restart
or a queue overflow, a new or moved-in directory, and the rounds of poll mode.

A scan lists directories depth-first on byte paths (names stay bytes: any name the kernel
accepts is handled) and looks at each entry with ``lstat`` (never following a symlink).  With
the native lister (dirscan.py: getdents64 + fstatat in C, a directory's entries as columns)
the entries that are new names of new inodes are added in bulk
(:meth:`FileState.observe_listing`) and the others go through :meth:`FileState.observe` one
by one; without it, ``os.scandir`` and ``observe`` for every entry.  It runs about
``budget`` entries per step, so a tree of a million files is a few hundred steps with the
inotify queue drained between them.  When it
has listed everything it sweeps: what it did not see, and nothing touched since it started, is
gone (:meth:`FileState.sweep`).

Listing one directory at a time, a scan can miss a file renamed from a directory it has not
listed yet into one it has: the old name is swept, the inode is an orphan (state.py) that a
later scan finds again by (device, inode) and carries, never a delete and a new file.  To
know when "not found" can be believed, each listed directory's mtime is read just before it
is listed and again when the scan is done: a scan in which none changed (``clean``) saw every
directory as it was at its end, so what it did not see was not there.  (The stat before the
listing also matters: with multigrain timestamps, Linux 6.13+, a change after a query always
moves the mtime; with coarse timestamps a change within the same tick can go unseen.)

Timestamps: what a counting scan finds was written while the watcher could not see it, at
some time in ``[since, now]``.  It is stamped with the entry's ctime clamped into that window:
the kernel sets ctime on every write and a process cannot set it back (utimensat(2) sets only
atime and mtime), so ctime is an upper bound of the last write that the writer cannot forge
into the past; clamping keeps it inside the outage.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from alarm.collectors.fs import dirscan
from alarm.collectors.fs.state import Dir, FileState, Output, show

if TYPE_CHECKING:
    from alarm.collectors.fs.touches import Touch


@dataclass(slots=True)
class ScanJob:
    roots: list[int]
    count: bool  # False: the baseline (what is there is the starting state)
    since: float  # the start of the window it may find writes in
    reason: str
    recursive: bool = True
    gen: int = 0
    entries: int = 0
    stack: list[int] = field(default_factory=list)
    scanned: list[int] = field(default_factory=list)
    mtimes: dict[int, int] = field(default_factory=dict)  # listed dir -> its mtime then
    clean: bool = False  # done, and no listed directory changed while it ran
    partial: bool = False  # a directory could not be listed to its end
    on_done: Callable[[], None] | None = None
    # dir id -> name -> the watcher's touch left to this scan (touches.py, ``deferred``): an
    # entry found under that name is stamped, described and attributed as the touch says.
    hints: dict[int, dict[bytes, Touch]] = field(default_factory=dict)
    native: bool = False  # listed with the native lister (dirscan.py), decided at start
    _iter: Iterator[os.DirEntry[bytes]] | None = None
    _fd: int = -1  # the directory being listed natively
    _dir: int = -1
    _closer: Callable[[], None] | None = None

    def start(self, state: FileState) -> None:
        self.gen = state.new_gen()
        self.stack = list(reversed(self.roots))
        self.native = dirscan.available()

    def close(self) -> None:
        if self._closer is not None:
            with contextlib.suppress(OSError):
                self._closer()
        self._iter = self._closer = None
        self._fd = -1

    def run(
        self,
        state: FileState,
        budget: int,
        now: float,
        out: Output,
        skip: Callable[[int, bytes], bool] | None,
    ) -> tuple[bool, int]:
        """Scan up to ``budget`` entries; returns (done, entries scanned).  ``skip``: names
        that are not the tree's (our canaries), None when there can be none."""
        used = 0
        count = self.count
        since = self.since
        while used < budget:
            if self._iter is None and self._fd < 0:
                if not self.stack:
                    self.clean = not self.partial and self._unchanged(state)
                    state.sweep(self.scanned, self.gen, now, out)
                    self.entries += used
                    return True, used
                did = self.stack.pop()
                d = state.dirs.get(did)
                if d is None:
                    continue
                path = state.path(did)
                try:
                    mtime = os.stat(path).st_mtime_ns
                    if self.native:
                        fd = dirscan.open_dir(path)
                    else:
                        it = os.scandir(path)
                except FileNotFoundError:
                    continue  # removed meanwhile: its parent's events or sweep handle it
                except NotADirectoryError:
                    continue
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        continue  # a symlink now: its parent's events or sweep handle it
                    if isinstance(exc, PermissionError):
                        out.problem(
                            "permission_errors", f"cannot list {show(path)}: {exc.strerror}"
                        )
                    else:
                        out.problem("scan_errors", f"cannot list {show(path)}: {exc.strerror}")
                    continue
                d.gen = self.gen
                d.listed = True
                self.scanned.append(did)
                self.mtimes[did] = mtime
                if self.native:
                    self._fd, self._dir, self._closer = fd, did, lambda fd=fd: os.close(fd)
                else:
                    self._iter, self._dir, self._closer = iter(it), did, it.close
            did = self._dir
            d = state.dirs.get(did)
            if d is None:
                self.close()
                continue
            if self._fd >= 0:
                used += self._run_native(state, d, budget - used, now, out, skip)
                continue
            exhausted = True
            hints = self.hints.get(did) if self.hints else None
            for entry in self._iter:
                used += 1
                name = entry.name
                if skip is not None and skip(did, name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    if d.poll and count:
                        # Listed, gone before measured, and no event will tell: say so.
                        state.vanish(did, name, now, out, wrote=False)
                    continue
                except PermissionError as exc:
                    out.problem(
                        "permission_errors",
                        f"cannot stat {show(state.entry_path(did, name))}: {exc.strerror}",
                    )
                    continue
                except OSError as exc:
                    out.problem(
                        "scan_errors", f"cannot stat {show(state.entry_path(did, name))}: {exc}"
                    )
                    continue
                ts = min(max(st.st_ctime, since), now) if count else now
                t = hints.get(name) if hints else None
                if t is None:
                    state.observe(did, name, st, ts, count, out, change="found_by_scan")
                else:
                    ts = min(t.ts, now)
                    state.observe(did, name, st, ts, count, out, change=t.change, pid=t.pid)
                if self.recursive and stat.S_ISDIR(st.st_mode):
                    cid = d.children.get(name)
                    if cid is not None:
                        self.stack.append(cid)
                if used >= budget:
                    exhausted = False
                    break
            if exhausted:
                self.close()
        self.entries += used
        return False, used

    def _run_native(
        self,
        state: FileState,
        d: Dir,
        budget: int,
        now: float,
        out: Output,
        skip: Callable[[int, bytes], bool] | None,
    ) -> int:
        """List about ``budget`` more entries of the directory open natively and observe
        them (new names of new inodes in bulk); returns the entries listed."""
        did = d.id
        try:
            lst = dirscan.list_dir(self._fd, did, budget)
        except OSError as exc:
            out.problem("scan_errors", f"cannot list {show(state.path(did))}: {exc.strerror}")
            self.close()
            # Listed in part: what it did not reach is not gone (no sweep there, not clean).
            self.scanned.remove(did)
            self.mtimes.pop(did, None)
            self.partial = True
            return 1
        if lst.done:
            self.close()
        names = lst.names
        count = self.count
        if count:
            ts = np.clip(lst.ctime / 1e9, self.since, now)
        else:
            ts = np.full(len(names), now)
        if skip is None:
            keep = np.ones(len(names), dtype=bool)
        else:
            keep = np.fromiter((not skip(did, n) for n in names), dtype=bool, count=len(names))
        for i in np.flatnonzero(lst.err).tolist():
            if not keep[i]:
                continue
            keep[i] = False
            name, code = names[i], int(lst.err[i])
            if code == errno.ENOENT:
                if d.poll and count:
                    # Listed, gone before measured, and no event will tell: say so.
                    state.vanish(did, name, now, out, wrote=False)
                continue
            what = f"cannot stat {show(state.entry_path(did, name))}: {os.strerror(code)}"
            if code in (errno.EACCES, errno.EPERM):
                out.problem("permission_errors", what)
            else:
                out.problem("scan_errors", what)
        changes: list[str] | None = None
        pids: list[int] | None = None
        hints = self.hints.get(did) if self.hints else None
        if hints:
            changes, pids = ["found_by_scan"] * len(names), [0] * len(names)
            for i, name in enumerate(names):
                t = hints.get(name)
                if t is not None:
                    changes[i], pids[i], ts[i] = t.change, t.pid, min(t.ts, now)
        rest = state.observe_listing(
            did, lst, np.flatnonzero(keep), ts, count, out, changes=changes, pids=pids
        )
        for i in rest.tolist():
            name = names[i]
            st = lst.stat(i)
            change, pid = (changes[i], pids[i]) if changes and pids else ("found_by_scan", 0)
            state.observe(did, name, st, float(ts[i]), count, out, change=change, pid=pid)
            if self.recursive and stat.S_ISDIR(st.st_mode):
                cid = d.children.get(name)
                if cid is not None:
                    self.stack.append(cid)
        return max(1, len(names))

    def _unchanged(self, state: FileState) -> bool:
        """Whether every directory listed still has the mtime it had when listed."""
        for did, mtime in self.mtimes.items():
            if did not in state.dirs:
                return False
            try:
                if os.stat(state.path(did)).st_mtime_ns != mtime:
                    return False
            except OSError:
                return False
        return True
