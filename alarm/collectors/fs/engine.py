"""The fs source's engine: its trees, their watchers and scans, stepped from a worker thread.

Each :meth:`Engine.step` (one at a time, never on the event loop) takes what the reader
threads queued, applies it in order (:class:`Touches`), looks at what was touched, counts
pending files whose ``settle`` passed, runs scans for a bounded number of entries, checks tree
roots, canaries and poll rounds, and returns one batch's worth: write events, counter deltas,
ledger rows, the position and the watermark.

Modes, per tree (docs/fs-source.md has the why):

- ``inotify``: a watch per directory; what ``auto`` takes first, as it costs the writer least.
- ``fanotify``: one file-system mark, events with the writer's pid, no watch limit and no
  window in which a new subdirectory is unwatched.  ``auto`` takes it for a tree that runs out
  of inotify watches (or when inotify cannot be had), where the group and the mark can be made
  (CAP_SYS_ADMIN, a file system that reports file handles).
- ``poll``: a scan every ``poll_interval``; ``auto`` takes it on network and FUSE file systems,
  whose writes from elsewhere raise no events, and a directory falls back to it when the
  inotify watch limit is reached.

The position and the ledger rows are described in ledger.py.  On a restart the ledger is the
starting state and a reconcile scan counts what changed since the position's ``at``.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alarm.collectors.base import SourceUnavailable
from alarm.collectors.fs.canary import Canaries, Canary
from alarm.collectors.fs.columns import EventColumns
from alarm.collectors.fs.ledger import (
    MERGE_FAN_IN,
    TOMBSTONE,
    block_seq,
    decode_block,
    full_block,
    parse_ledger_value,
    resolve,
    tree_position,
    valid_position,
)
from alarm.collectors.fs.ledger import position as make_position
from alarm.collectors.fs.mounts import fs_type, mounts_inside, polled
from alarm.collectors.fs.receipts import ReceiptBudget
from alarm.collectors.fs.scan import ScanJob
from alarm.collectors.fs.settings import FsSettings
from alarm.collectors.fs.state import Dir, FileState, Output, show
from alarm.collectors.fs.touches import Touch, Touches
from alarm.collectors.fs.watch_fanotify import FanotifyWatch
from alarm.collectors.fs.watch_inotify import HOLD_SECONDS, InotifyWatch
from alarm.collectors.fs.workload import Workloads

MAX_EVENTS = 50_000  # watcher events per step
SCAN_BUDGET = 20_000  # entries scanned per step
BLIND_REASONS_SHOWN = 3  # per source; the rest is "and N more"
# An inode whose names all went (state.py, orphans) is forgotten only when no scan that could
# still find it is running, ORPHAN_GRACE after it went (an overflow a scan raced with is read
# by then, and reconciled), and, where directories are polled, once a poll round started
# after it went has listed every directory without any changing meanwhile (scan.py, clean):
# a round misses a file renamed from a directory it has not listed into one it has, so only
# a clean round's "not found" means gone.
ORPHAN_GRACE = 1.0
# A touch whose entry a look found gone waits this long (and while events are queued) for
# the rename that says where the file went (touches.py, ``missed``).
MISSED_SECONDS = 2.0
MAX_ORPHANS = 100_000


@dataclass(slots=True)
class Tree:
    index: int
    path: bytes
    mode: str = ""  # fanotify | inotify | poll ("" until the tree exists)
    state: str = "baseline"  # baseline until its first full scan is done, then ready
    # Why the source cannot see this tree, by reason (missing, canary, watch): each a short
    # message naming the tree, joined into ``health.blind``.
    blind: dict[str, str] = field(default_factory=dict)
    last_poll: float = 0.0
    missing_since: float | None = None
    initial: ScanJob | None = None


@dataclass(slots=True)
class StepResult:
    events: EventColumns
    counts: dict[str, int]
    ledger: dict[str, str | None]
    position: dict[str, Any] | None
    watermark: float
    more: bool
    caught_up: bool
    up: bool
    blind: str
    mode: str
    problems: list[str]
    last_event_ts: float


class Engine:
    def __init__(
        self,
        cfg: FsSettings,
        tick: float,
        position: dict[str, Any] | None,
        notify: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg = cfg
        self.notify = notify
        self.workloads = Workloads()  # fanotify's writer pids: program and cgroup, as evidence
        self.trees = [Tree(i, os.fsencode(p)) for i, p in enumerate(cfg.paths)]
        self.state = FileState(
            [t.path for t in self.trees],
            cfg.settle,
            dir_added=self._dir_added,
            dir_removed=self._dir_removed,
            pid_info=self.workloads.of,
        )
        self.position_in = position if valid_position(position) else None
        self.position_invalid = position is not None and self.position_in is None
        self.inotify: InotifyWatch | None = None
        self.fanotify: FanotifyWatch | None = None
        self.jobs: list[ScanJob] = []
        self.canaries = (
            Canaries(cfg.canary.interval, cfg.canary.deadline) if cfg.canary is not None else None
        )
        self.receipts = ReceiptBudget(
            cfg.receipts.sha256_budget_bytes, cfg.receipts.sha256_max_files, tick
        )
        # The saved snapshot until open(): columns dev, ino, size, counted, mtime, names.
        self.saved_rows = tuple(array("q") for _ in range(6))
        self.saved_dirs: set[tuple[int, int]] = set()
        self.saved_blocks: list[tuple[int, str, str, np.ndarray]] = []  # seq, key, value, cols
        self.saved_gone: list[tuple[int, int]] = []  # tombstones: (dev, ino)
        self.awaiting_sweep: set[int] = set()  # trees whose restart reconcile is not done
        self.watermark = 0.0
        self.restart_since = 0.0
        self.last_position: dict[str, Any] | None = None
        self.opened = False
        self._out = Output()
        self._now = 0.0
        self._seen: list[Canary] = []
        self._next_root_check = 0.0
        self._roots_changed = False
        self._last_read: dict[str, float] = {}
        self._started_at = 0.0
        self.poll_dirs = False  # some directory of a watched tree fell back to polling
        self.inner_mounts: set[str] | None = None  # mount points inside the trees, last seen
        self._clean_poll_gen = 0  # the generation of the last clean poll round
        self._missed: dict[tuple[int, bytes], Touch] = {}  # touches.py, Touches.missed

    # -- the saved snapshot ------------------------------------------------------------
    def load_ledger(self, rows: Iterable[tuple[str, str]], out: Output) -> None:
        """Rows read from the store (before :meth:`open`)."""
        for key, value in rows:
            try:
                if key.startswith("b:"):
                    self.saved_blocks.append((block_seq(key), key, value, decode_block(value)))
                    continue
                kind, dev, ino = key.split(":")
                ident = (int(dev), int(ino))
                if kind == "f" and value == TOMBSTONE:
                    self.saved_gone.append(ident)
                elif kind == "f":
                    size, counted, mtime, names = parse_ledger_value(value)
                    values = (ident[0], ident[1], size, counted, mtime, names)
                    for col, v in zip(self.saved_rows, values, strict=True):
                        col.append(v)
                elif kind == "d":
                    self.saved_dirs.add(ident)
                else:
                    raise ValueError(key)
            except (ValueError, AttributeError):
                out.counts["ledger_rows_invalid"] += 1
                out.ledger[str(key)] = None

    def _saved_inodes(self, remap: dict[int, int], out: Output) -> None:
        """The saved inodes into the state, one per (device, inode) as ledger.resolve reads
        the rows; blocks holding anything overridden are written again (ledger.py)."""
        state = self.state
        devs, inos, sizes, counted, mtimes, names = self.saved_rows
        if not self.saved_blocks and not self.saved_gone:
            if remap:
                for i, d in enumerate(devs):
                    devs[i] = remap.get(d, d)
            state.load_saved(devs, inos, sizes, counted, mtimes, names)
            return
        rows = np.array([np.frombuffer(c, dtype=np.int64) for c in self.saved_rows])
        rows = rows.reshape(6, -1)
        gone = np.array(self.saved_gone, dtype=np.uint64).view(np.int64).T.reshape(2, -1)
        blocks = [(seq, cols) for seq, _, _, cols in self.saved_blocks]
        state.saved.load([(seq, value, c.shape[1]) for seq, _, value, c in self.saved_blocks])
        self.saved_blocks = []
        self.saved_rows = tuple(array("q") for _ in range(6))
        cols, in_block, rewrite = resolve(blocks, rows, gone, remap)
        del rows
        # Many blocks for what they hold (small ones a crash left before their merge): one
        # write makes them few again.
        many = len(state.saved) > math.ceil(in_block.sum() / full_block()) + 2 * MERGE_FAN_IN
        if rewrite or many:
            for dev, ino in self.saved_gone:
                out.ledger[f"f:{dev}:{ino}"] = None
            state.saved.replace(cols[:, in_block], out.ledger)
        # As arrays, not lists: a list of Python ints per column would stay in the
        # interpreter's arenas after the load (+100 B of RSS per file at 300k).
        columns = [_array(c, "Q" if i == 1 else "q") for i, c in enumerate(cols)]
        blocked = _array(in_block, "B")
        del cols, in_block
        state.load_saved(*columns, blocked)

    # -- opening -----------------------------------------------------------------------
    def open(self, now: float) -> Output:
        """Make the watchers, decide modes, register roots and schedule the first scans.
        Raises SourceUnavailable when a mode the config insists on cannot be had."""
        out = self._out = Output()
        self._now = self.state.now = now
        self._started_at = now
        again = self.opened
        if self.position_invalid:
            out.counts["position_invalid"] += 1
            self.position_invalid = False
        if not again:
            self._first_open(now, out)
        else:
            self._reopen(now, out)
        self.opened = True
        self._next_root_check = now + self.cfg.poll_interval
        self.inner_mounts = mounts_inside([os.fsdecode(t.path) for t in self.trees])
        return out

    def _first_open(self, now: float, out: Output) -> None:
        saved_trees = (self.position_in or {}).get("trees", {})
        since = float((self.position_in or {}).get("at", now))
        remap: dict[int, int] = {}
        stats: list[os.stat_result | None] = []
        for tree in self.trees:
            st = _lstat_dir(tree.path)
            stats.append(st)
            saved = saved_trees.get(os.fsdecode(tree.path))
            if st is not None and isinstance(saved, dict):
                dev, ino = saved.get("dev"), saved.get("ino")
                if ino == st.st_ino and isinstance(dev, int) and dev != st.st_dev:
                    remap[dev] = st.st_dev  # same tree, renumbered device (reboot, remount)
        if remap:
            out.counts["devices_renumbered"] += len(remap)
        state = self.state
        state.saved_dirs = {(remap.get(d, d), i) for d, i in self.saved_dirs}
        self._saved_inodes(remap, out)
        self.saved_rows = tuple(array("q") for _ in range(6))
        self.saved_blocks = []
        self.saved_gone = []
        self.saved_dirs = set()
        for tree, st in zip(self.trees, stats, strict=True):
            saved = saved_trees.get(os.fsdecode(tree.path))
            ready = isinstance(saved, dict) and saved.get("state") == "ready"
            if st is None:
                tree.state = "ready"  # nothing there is a starting state: all of it comes later
                if ready:
                    self.awaiting_sweep.add(tree.index)
                self._tree_missing(tree, now, out)
                continue
            self._decide_mode(tree)
            root = state.add_root(tree.index, st)
            if ready:
                tree.state = "ready"
                self.awaiting_sweep.add(tree.index)
                job = ScanJob([root.id], True, min(since, now), "restart reconcile")
                job.on_done = self._reconciled(tree)
            else:
                tree.state = "baseline"
                job = ScanJob([root.id], False, now, "baseline")
                job.on_done = self._baselined(tree)
            tree.initial = job
            self._start(job)
        self.restart_since = min(since, now)
        self.watermark = self.restart_since if self.awaiting_sweep else now

    def _reopen(self, now: float, out: Output) -> None:
        """A rerun after a failure: the tracked state is what was emitted (the collector
        re-emits a batch that was not); new watchers, and a reconcile of everything."""
        self.jobs.clear()
        since = self.watermark or now
        for d in list(self.state.dirs.values()):
            d.wd, d.handle = -1, b""
        for tree in self.trees:
            root = self.state.roots[tree.index]
            if root < 0:
                continue
            self._ensure_watcher(tree.mode)
            if tree.mode == "fanotify" and self.fanotify is not None:
                self.fanotify.mark(tree.path)
            for d in self._subtree(root):
                self._dir_added(d)
            job = ScanJob([root], tree.state == "ready", since, "reconcile after restart of run")
            if tree.state != "ready":
                job.on_done = self._baselined(tree)
            self._start(job)
        self._start_readers()

    def _decide_mode(self, tree: Tree) -> None:
        if tree.mode:
            self._ensure_watcher(tree.mode)
            return
        want = self.cfg.mode
        fstype = fs_type(os.fsdecode(tree.path))
        if want == "poll" or (want == "auto" and polled(fstype)):
            tree.mode = "poll"
            return
        problems = []
        # auto: inotify first (it costs the writer least: bench/fs_writer_tax.py); fanotify
        # when inotify cannot be had, or later when the tree runs out of watches.
        order = {
            "auto": ("inotify", "fanotify"),
            "inotify": ("inotify",),
            "fanotify": ("fanotify",),
        }
        for candidate in order[want]:
            try:
                self._ensure_watcher(candidate)
                if candidate == "fanotify":
                    assert self.fanotify is not None
                    self.fanotify.mark(tree.path)
                tree.mode = candidate
                return
            except OSError as exc:
                problems.append(f"{candidate}: {exc}")
                if want == "fanotify":
                    raise SourceUnavailable(
                        f"fanotify cannot watch {show(tree.path)} ({fstype}): {exc} (needs "
                        "CAP_SYS_ADMIN and a file system that reports file handles)"
                    ) from exc
                if want == "inotify":
                    raise SourceUnavailable(f"inotify: {exc}") from exc
        tree.mode = "poll"
        self._out.problems.append(f"{show(tree.path)} is polled: " + "; ".join(problems)[:200])

    def _ensure_watcher(self, mode: str) -> None:
        limit = self.cfg.queue_limit
        if mode == "inotify" and self.inotify is None:
            self.inotify = InotifyWatch(self.state, self.notify, limit)
            if self.opened:
                self.inotify.start()
        elif mode == "fanotify" and self.fanotify is None:
            self.fanotify = FanotifyWatch(
                self.state, self.notify, limit, self._resolve_inside, self.workloads.of
            )
            if self.opened:
                self.fanotify.start()

    def _start_readers(self) -> None:
        for w in (self.inotify, self.fanotify):
            if w is not None and not w.reader.alive:
                w.start()

    def start(self) -> None:
        """Start the reader threads (after :meth:`open`, once ``notify`` can be called)."""
        self._start_readers()

    def close(self) -> None:
        if self.canaries is not None:
            for c in list(self.canaries.live.values()):
                self.canaries.remove(c.name, self.trees[c.tree].path)
        for job in self.jobs:
            job.close()
        for w in (self.inotify, self.fanotify):
            if w is not None:
                w.close()
        self.inotify = self.fanotify = None

    # -- hooks from the state ----------------------------------------------------------
    def _dir_added(self, d: Dir) -> None:
        tree = self.trees[d.tree]
        out = self._out
        if tree.mode == "poll" or d.poll:
            d.poll = True
        elif tree.mode == "inotify" and self.inotify is not None:
            if self.inotify.add(d, out) != errno.ENOSPC:
                return
            if self.cfg.mode == "auto" and self._switch_to_fanotify(tree):
                return
            d.poll = True
            self.poll_dirs = True
            out.counts["poll_fallback_dirs"] += 1
            out.problems.append(f"{show(self.state.path(d.id))} and below are polled (no watches)")
        elif (
            tree.mode == "fanotify" and self.fanotify is not None and not self.fanotify.add(d, out)
        ):
            d.poll = True  # e.g. a FUSE mount inside the tree: no file handles
            self.poll_dirs = True

    def _switch_to_fanotify(self, tree: Tree) -> bool:
        """A tree that ran out of inotify watches is watched with fanotify, if it can be:
        the mark first, then every directory's handle, then the watches go (no gap)."""
        try:
            self._ensure_watcher("fanotify")
            assert self.fanotify is not None
            self.fanotify.mark(tree.path)
        except OSError:
            return False
        tree.mode = "fanotify"
        dirs = self._subtree(self.state.roots[tree.index])
        for d in dirs:
            if not d.handle and not self.fanotify.add(d, self._out):
                d.poll = True
                self.poll_dirs = True
        if self.inotify is not None:
            for d in dirs:
                self.inotify.remove(d)
        self._out.counts["mode_switches"] += 1
        self._out.problems.append(
            f"{show(tree.path)}: out of inotify watches, watched with fanotify from now on"
        )
        return True

    def _dir_removed(self, d: Dir) -> None:
        if self.inotify is not None and d.wd >= 0:
            self.inotify.remove(d)
        if self.fanotify is not None and d.handle:
            self.fanotify.remove(d)

    def _resolve_inside(self, path: bytes, ts: float, ops: Touches) -> int:
        """A directory fanotify named that we do not know: register it when it is inside a
        tree (-2 while that tree's baseline is running: the baseline will list it)."""
        state = self.state
        for tree in self.trees:
            if tree.mode != "fanotify":
                continue
            base = tree.path.rstrip(b"/")
            if path != base and not path.startswith(base + b"/"):
                continue
            root = state.roots[tree.index]
            if root < 0 or tree.state == "baseline":
                return -2
            did = root
            here = base
            for comp in path[len(base) :].split(b"/"):
                if not comp:
                    continue
                here = here + b"/" + comp
                d = state.dirs[did]
                cid = d.children.get(comp)
                if cid is None:
                    st = _lstat_dir(here)
                    if st is None:
                        return -2
                    new = state.observe(did, comp, st, ts, True, self._out, change="mkdir")
                    if new >= 0:
                        ops.new_dirs.append((new, ts))
                        ops.scanning.add(new)
                    cid = d.children.get(comp)
                    if cid is None:
                        return -2
                did = cid
            return did
        return -1

    def _counting(self, dir_id: int) -> bool:
        """Whether a change seen in ``dir_id`` is a write: not while its tree's baseline has
        registered (and watched) the directory but not listed it yet, when what is there is
        still the starting state."""
        d = self.state.dirs.get(dir_id)
        return d is None or d.listed or self.trees[d.tree].state != "baseline"

    def _skip(self, dir_id: int, name: bytes) -> bool:
        """Our own canaries are seen, never counted."""
        canaries = self.canaries
        if canaries is None or not canaries.is_ours(name):
            return False
        d = self.state.dirs.get(dir_id)
        if d is None or d.parent >= 0:
            return False
        c = canaries.saw(name, self._now)
        if c is not None:
            self._seen.append(c)
        return True

    # -- scans -------------------------------------------------------------------------
    def _start(self, job: ScanJob) -> None:
        job.start(self.state)
        self.jobs.append(job)

    def _subtree(self, dir_id: int) -> list[Dir]:
        out, stack = [], [dir_id]
        dirs = self.state.dirs
        while stack:
            d = dirs.get(stack.pop())
            if d is not None:
                out.append(d)
                stack.extend(d.children.values())
        return out

    def _baselined(self, tree: Tree) -> Callable[[], None]:
        def done() -> None:
            tree.state = "ready"
            tree.initial = None

        return done

    def _reconciled(self, tree: Tree) -> Callable[[], None]:
        def done() -> None:
            tree.initial = None
            self.awaiting_sweep.discard(tree.index)
            if not self.awaiting_sweep:
                self.state.sweep_saved(self._out)

        return done

    def _reconcile(self, mode: str, since: float, reason: str) -> None:
        """Rescan every tree in ``mode`` (after an overflow or a dead reader)."""
        for job in [j for j in self.jobs if j.reason == reason]:
            since = min(since, job.since)
            job.close()
            self.jobs.remove(job)
        roots = [
            self.state.roots[t.index]
            for t in self.trees
            if t.mode == mode and self.state.roots[t.index] >= 0 and t.state == "ready"
        ]
        if roots:
            self._start(ScanJob(roots, True, since, reason))

    def _poll_due(self, now: float) -> None:
        if any(j.reason == "poll" for j in self.jobs):
            return
        due = [t for t in self.trees if now - t.last_poll >= self.cfg.poll_interval]
        if not due:
            return
        dirs = self.state.dirs
        roots = [
            d.id
            for d in dirs.values()
            if d.poll
            and (d.parent < 0 or not dirs[d.parent].poll)
            and self.trees[d.tree].state == "ready"
            and self.trees[d.tree].initial is None
        ]
        since = min((t.last_poll for t in self.trees), default=now) or now
        for t in self.trees:
            t.last_poll = now
        self.poll_dirs = any(self.trees[dirs[r].tree].mode != "poll" for r in roots)
        if roots:
            self._start(ScanJob(roots, True, min(since, now), "poll"))

    # -- tree roots --------------------------------------------------------------------
    def _tree_missing(self, tree: Tree, now: float, out: Output) -> None:
        if "missing" not in tree.blind:
            out.problem("tree_missing", f"tree {show(tree.path)} is missing or not a directory")
            tree.blind["missing"] = f"tree {show(tree.path)} is gone or not a directory"
            tree.missing_since = now
        root = self.state.roots[tree.index]
        if root >= 0:
            self.state.remove_dir(root, now, out)

    def _check_mounts(self, now: float, out: Output) -> None:
        """A file system mounted on (or unmounted from) a directory inside a tree replaces
        what is at that path without an event: look at it again as a new entry."""
        state = self.state
        points = mounts_inside([os.fsdecode(t.path) for t in self.trees])
        before, self.inner_mounts = self.inner_mounts, points
        if before is None or before == points:
            return
        if self.fanotify is not None:
            # A device number of an unmounted file system may come back for another: mark
            # again as directories are added (marking twice is harmless).
            self.fanotify.fsids.clear()
        for point in sorted(points ^ before):
            out.counts["mounts_changed"] += 1
            parent_path, _, name = os.fsencode(point).rpartition(b"/")
            parent = self._dir_at(parent_path)
            if parent < 0 or not name:
                continue
            cid = state.dirs[parent].children.get(name)
            if cid is not None:
                state.remove_dir(cid, now, out)
            st = _lstat_dir(os.fsencode(point))
            if st is None:
                continue
            new_dir = state.observe(parent, name, st, now, True, out, change="found_by_scan")
            if new_dir >= 0:
                self._start(ScanJob([new_dir], True, now, "new directory"))

    def _dir_at(self, path: bytes) -> int:
        """The registered directory at ``path``, or -1."""
        state = self.state
        for tree in self.trees:
            base = tree.path.rstrip(b"/")
            root = state.roots[tree.index]
            if root < 0 or (path != base and not path.startswith(base + b"/")):
                continue
            did = root
            for comp in path[len(base) :].split(b"/"):
                if comp:
                    did = state.dirs[did].children.get(comp, -1)
                    if did < 0:
                        return -1
            return did
        return -1

    def _check_roots(self, now: float, out: Output) -> None:
        state = self.state
        for tree in self.trees:
            st = _lstat_dir(tree.path)
            root = state.roots[tree.index]
            if root >= 0:
                d = state.dirs[root]
                if st is not None and (st.st_dev, st.st_ino) == (d.dev, d.ino):
                    continue
                if st is not None:  # replaced or mounted over: the watch sees something else
                    out.problem("watch_lost", f"the watch on {show(tree.path)} is gone")
                self._tree_missing(tree, now, out)
                if tree.initial is not None:
                    with contextlib.suppress(ValueError):
                        self.jobs.remove(tree.initial)
                    tree.initial.close()
                    tree.initial = None
                    tree.state = "ready"
                root = -1
            if st is None:
                if "missing" not in tree.blind:
                    self._tree_missing(tree, now, out)
                continue
            # (Re)appeared: what it holds was written after we started looking.
            self._decide_mode(tree)
            self._start_readers()
            new = state.add_root(tree.index, st)
            since = tree.missing_since or now
            if tree.index in self.awaiting_sweep:
                since = min(since, self.restart_since)  # missing since before the restart
            tree.blind.pop("missing", None)
            tree.missing_since = None
            tree.state = "ready"
            job = ScanJob([new.id], True, since, "tree appeared")
            if tree.index in self.awaiting_sweep:
                job.on_done = self._reconciled(tree)
            tree.initial = job
            self._start(job)

    # -- canaries ----------------------------------------------------------------------
    def _canaries(self, now: float, out: Output) -> None:
        canaries = self.canaries
        if canaries is None:
            return
        for c in self._seen:
            tree = self.trees[c.tree]
            tree.blind.pop("canary", None)
            canaries.remove(c.name, tree.path)
        self._seen.clear()
        for c in list(canaries.live.values()):
            tree = self.trees[c.tree]
            # A poll-mode tree sees its canary at the next round.
            allowed = canaries.deadline + (self.cfg.poll_interval if tree.mode == "poll" else 0)
            if c.seen is not None or now <= c.written + allowed:
                continue
            out.problem(
                "canary_missed",
                f"canary in {show(tree.path)} not seen within {allowed:g}s (mode {tree.mode})",
            )
            tree.blind["canary"] = f"canary missed in {show(tree.path)}"
            canaries.remove(c.name, tree.path)
        if now < canaries.next_at:
            return
        canaries.next_at = now + canaries.interval
        for tree in self.trees:
            root = self.state.roots[tree.index]
            if root < 0 or tree.initial is not None:
                continue
            err = canaries.write(tree.index, tree.path, now)
            if err is None:
                tree.blind.pop("canary_write", None)
                continue
            # A tree no canary can be written into (read-only, immutable, full) gives no
            # proof of sight: blind, saying why, and tried again every interval.
            out.problem("canary_unwritable", f"no canary for {show(tree.path)}: {err}")
            tree.blind["canary_write"] = f"cannot write a canary in {show(tree.path)}: {err}"

    # -- the step ----------------------------------------------------------------------
    def step(self, now: float) -> StepResult:
        out = self._out = Output()
        self._now = self.state.now = now
        state = self.state
        ops = Touches(state, out, self._skip, self._counting, self._missed)
        more = False
        last_read: list[float] = []
        ignored: list[int] = []
        reads: list[tuple[str, float, float | None]] = []  # (mode, last read, overflow at)
        if self.inotify is not None:
            ires, m = self.inotify.translate(ops, MAX_EVENTS, now)
            self._roots_changed |= ires.roots_changed
            ignored = ires.ignored
            more |= m
            out.counts["records_read"] += ires.events
            reads.append(("inotify", ires.last_read, ires.overflow_at))
        if self.fanotify is not None:
            fres, m = self.fanotify.translate(ops, MAX_EVENTS)
            more |= m
            out.counts["records_read"] += fres.events
            out.counts["parse_errors"] += fres.malformed
            out.counts["unresolved_events"] += fres.unresolved
            reads.append(("fanotify", fres.last_read, fres.overflow_at))
        for mode, read_at, overflow_at in reads:
            previous = self._last_read.get(mode, self._started_at)
            if read_at:
                self._last_read[mode] = read_at
                last_read.append(read_at)
            if overflow_at is not None:
                out.problem(
                    "queue_overflows", f"{mode} event queue overflowed: reconciling its trees"
                )
                out.counts["records_lost_unknown"] += 1
                self._reconcile(mode, previous, "overflow reconcile")
        ops.look(now)
        # Kept for the rename a later step reads, while events are queued or for a while.
        self._missed = {
            k: t for k, t in ops.missed.items() if more or now - t.missed < MISSED_SECONDS
        }
        hints = ops.hints()  # shared: a new directory may be listed by more than one scan
        for did, ts in ops.new_dirs:
            if did in state.dirs:
                job = ScanJob([did], True, ts, "new directory")
                job.hints = hints
                self._start(job)
        if ignored and self.inotify is not None:
            lost, replaced = self.inotify.check_ignored(ignored, out, now)
            for parent, name in replaced:
                # Something else is at that path now (a mount inside the tree went away):
                # look at it as new.
                try:
                    st = os.lstat(state.entry_path(parent, name))
                except OSError:
                    continue
                new_dir = state.observe(parent, name, st, now, True, out, change="found_by_scan")
                if new_dir >= 0:
                    self._start(ScanJob([new_dir], True, now, "new directory"))
            for did in lost:
                tree = self.trees[state.dirs[did].tree]
                tree.blind["watch"] = f"watch lost in {show(tree.path)}"
                job = ScanJob([did], True, now, "watch lost")
                job.on_done = self._repaired(tree)
                self._start(job)
        self._watch_health(now, out)
        # A file a scan found waits past its settle for the fanotify events queued before
        # the scan saw it (in the reader or still in the kernel): they name its writer.
        state.settle_due(now, out, self.fanotify.reader.through if self.fanotify else None)
        self._run_jobs(now, out)
        if self._roots_changed or now >= self._next_root_check:
            self._roots_changed = False
            self._next_root_check = now + self.cfg.poll_interval
            self._check_roots(now, out)
            self._check_mounts(now, out)
        self._poll_due(now)
        self._canaries(now, out)
        state.flush(out)
        self._expire_orphans(now, out)
        state.write_blocks(out)
        if state.saved.due():
            state.compact_blocks(out)
        hashed, skipped = self.receipts.add(out.events, now)
        out.counts["receipts_hashed"] += hashed
        out.counts["receipts_skipped"] += skipped
        return self._result(now, out, more, last_read)

    def _repaired(self, tree: Tree) -> Callable[[], None]:
        def done() -> None:
            tree.blind.pop("watch", None)

        return done

    def _watch_health(self, now: float, out: Output) -> None:
        """Readers that died (their descriptor failed): a new watcher and a reconcile."""
        for watch in (self.inotify, self.fanotify):
            if watch is None or not watch.reader.failed:
                continue
            mode = watch.mode
            why = watch.reader.error or "reader thread stopped"
            out.problem("watch_lost", f"{mode} reader failed: {why}")
            since = self._last_read.get(mode, self._started_at)
            watch.close()
            if mode == "inotify":
                self.inotify = None
            else:
                self.fanotify = None
            try:
                self._ensure_watcher(mode)
            except OSError as exc:
                out.problems.append(f"cannot make a new {mode} watcher: {exc}")
                for t in self.trees:
                    if t.mode == mode:
                        t.blind["watch"] = f"no {mode} watcher for {show(t.path)}"
                continue
            for t in self.trees:
                root = self.state.roots[t.index]
                if t.mode == mode and root >= 0:
                    if mode == "fanotify":
                        assert self.fanotify is not None
                        self.fanotify.mark(t.path)
                    for d in self._subtree(root):
                        d.wd, d.handle = -1, b""
                        self._dir_added(d)
            self._start_readers()
            self._reconcile(mode, since, "watch lost")

    def _run_jobs(self, now: float, out: Output) -> None:
        budget = SCAN_BUDGET
        # Without canaries no name is skipped: no call per listed entry to say so.
        skip = self._skip if self.canaries is not None else None
        for job in list(self.jobs):
            if budget <= 0:
                break
            done, used = job.run(self.state, budget, now, out, skip)
            budget -= used
            out.counts["scan_entries"] += used
            if done:
                self.jobs.remove(job)
                out.counts["scans_completed"] += 1
                if job.reason == "poll" and job.clean:
                    self._clean_poll_gen = job.gen
                if job.on_done is not None:
                    job.on_done()

    def _expire_orphans(self, now: float, out: Output) -> None:
        """Forget the orphans no scan can find any more (ORPHAN_GRACE, a clean poll round),
        and no event either: the events queued before an orphan's name went are applied
        first (a reader's ``through``), as one of them may say where it went.  A file
        renamed into a directory made a moment before, its name dropped by a scan, was
        forgotten while the events that named the directory still waited behind a queue
        more than ORPHAN_GRACE long, and its scan then counted the file again as new
        (tests/test_fs_split_renames.py, fanotify, in 3 of 20 runs of its loop)."""
        state = self.state
        if not state.orphans:
            return
        gen = 0  # none, while a scan runs (only beyond MAX_ORPHANS)
        if not self.jobs:
            gen = self._clean_poll_gen if self.polling else state.gen + 1
        before = now - ORPHAN_GRACE
        for watch in (self.inotify, self.fanotify):
            if watch is not None:
                before = min(before, watch.reader.through)
        state.expire_orphans(before, gen, out, MAX_ORPHANS)

    def _result(self, now: float, out: Output, more: bool, last_read: list[float]) -> StepResult:
        counting_jobs = [j for j in self.jobs if j.count]
        holding = self.inotify is not None and self.inotify.holding
        floor = [now if not more else min(last_read, default=now)]
        floor += [j.since for j in counting_jobs]
        oldest = self.state.oldest_pending()
        if oldest is not None:
            floor.append(oldest)
        if holding:
            floor.append(now - HOLD_SECONDS)
        poll_trees = [t for t in self.trees if t.last_poll and (t.mode == "poll" or self.poll_dirs)]
        floor += [t.last_poll for t in poll_trees]
        watermark = max(min(floor), self.watermark)
        self.watermark = watermark
        caught_up = (
            not more
            and not counting_jobs
            and oldest is None
            and not holding
            and not poll_trees
            and not any(j for j in self.jobs)
        )
        position = self._position(watermark)
        if position == self.last_position:
            position = None
        else:
            self.last_position = position
        modes = sorted(
            {t.mode for t in self.trees if t.mode} | ({"poll"} if self.poll_dirs else set())
        )
        counts = {k: n for k, n in out.counts.items() if n}
        last_ts = out.events.last_ts()
        return StepResult(
            out.events,
            counts,
            out.ledger,
            position,
            watermark,
            more or bool(self.jobs and any(j.count or j.reason == "baseline" for j in self.jobs)),
            caught_up,
            self.opened,
            self.blind(),
            "+".join(modes),
            out.problems,
            last_ts,
        )

    def _position(self, watermark: float) -> dict[str, Any]:
        trees = {}
        for t in self.trees:
            root = self.state.roots[t.index]
            ident = None
            if root >= 0:
                d = self.state.dirs[root]
                ident = (d.dev, d.ino)
            trees[os.fsdecode(t.path)] = tree_position(t.state, t.mode, ident)
        return make_position(watermark, trees)

    # -- what the collector asks between steps -----------------------------------------
    def next_deadline(self, now: float) -> float:
        """When a step is due even without new events."""
        times = [self._next_root_check]
        if self.polling:
            times.append(min(t.last_poll for t in self.trees) + self.cfg.poll_interval)
        oldest = self.state.oldest_pending()
        if oldest is not None:
            times.append(oldest + self.cfg.settle)
        if self.inotify is not None and self.inotify.holding:
            times.append(now + HOLD_SECONDS)
        if self.canaries is not None:
            times.append(self.canaries.next_at)
            times += [c.written + self.canaries.deadline for c in self.canaries.live.values()]
        if self.jobs:
            times.append(now)
        elif self.state.orphans and not self.polling:
            first = next(iter(self.state.orphans.values()))
            times.append(max(now, first.since + ORPHAN_GRACE))
        return min(times)

    def blind(self) -> str:
        """Why the source cannot see (what ``health.blind`` says, "" while it sees every
        tree): a missed canary, a tree gone, a watch lost, each naming its tree."""
        reasons = [m for t in self.trees for m in t.blind.values()]
        shown = "; ".join(reasons[:BLIND_REASONS_SHOWN])
        more = len(reasons) - BLIND_REASONS_SHOWN
        return shown + (f"; and {more} more" if more > 0 else "")

    @property
    def polling(self) -> bool:
        return self.poll_dirs or any(t.mode == "poll" for t in self.trees)

    def tree_modes(self) -> dict[str, str]:
        return {os.fsdecode(t.path): t.mode for t in self.trees}

    def memory(self) -> dict[str, int]:
        """Tracked files and the bytes of the tables that hold them."""
        st = self.state
        return {
            "files": len(st.inodes),
            "names": len(st.names),
            "dirs": len(st.dirs),
            "table_bytes": st.inodes.nbytes + st.names.nbytes,
        }


def _array(col: np.ndarray, code: str) -> array:
    out = array(code)
    out.frombytes(np.ascontiguousarray(col).tobytes())
    return out


def _lstat_dir(path: bytes) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISDIR(st.st_mode) else None
