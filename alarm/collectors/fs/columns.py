"""The write events of one step as columns, and their evidence made only when asked.

A step may count tens of thousands of files.  Each event is a row appended to a few arrays
(time, bytes, capacity, the inode's device, number, size and mtime, the writer's pid) and a
path; the evidence record an alert shows (docs/fs-source.md, "Receipts") is built from those
columns by :meth:`FsSubjects.evidence` for the few subjects the pipeline keeps as heavy
hitters, not for every event.  Rare extras (a sparse file's data bytes, a sha256 receipt, the
size last known of a file deleted before it was measured) are kept by row in a dict.

:class:`FsSubjects` is the batch's subject table (alarm/events.py ``Subjects``): one subject
per distinct path (an fs event's key and its contributor are both the path), with the
contributor table the pipeline asks for in bulk.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from alarm.events import WriteEvents
from alarm.sanitize import shown
from alarm.surfaces import MAX_CONTRIBUTOR_CHARS, bounded_name

# The evidence "change" of an event, by code (a byte per event).
CHANGES = (
    "created",
    "moved_in",
    "found_by_scan",
    "grew",
    "rewritten",
    "hard_link",
    "mkdir",
    "deleted_before_measured",
)
CODE = {c: i for i, c in enumerate(CHANGES)}


class EventColumns:
    """Write events appended as rows.  ``dev`` < 0: the event names no inode (a file deleted
    before it was measured)."""

    __slots__ = (
        "capacity",
        "change",
        "dev",
        "extra",
        "ino",
        "mtime",
        "nbytes",
        "paths",
        "pid",
        "size",
        "ts",
        "workload",
    )

    def __init__(self) -> None:
        self.ts = array("d")
        self.paths: list[str] = []
        self.nbytes = array("q")
        self.capacity = array("q")  # -1: the bytes written
        self.change = array("B")
        self.dev = array("q")
        self.ino = array("Q")
        self.size = array("q")
        self.mtime = array("q")
        self.pid = array("q")
        self.extra: dict[int, dict[str, Any]] = {}
        # pid -> its program and workload (workload.py), as read when the event was.
        self.workload: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def __bool__(self) -> bool:
        return bool(self.paths)

    def add(
        self,
        ts: float,
        path: str,
        nbytes: int,
        change: str,
        dev: int = -1,
        ino: int = 0,
        size: int = 0,
        mtime: int = 0,
        pid: int = 0,
        capacity: int = -1,
    ) -> int:
        """Append one event; returns its row (for :attr:`extra`)."""
        self.ts.append(ts)
        self.paths.append(path)
        self.nbytes.append(nbytes)
        self.capacity.append(capacity)
        self.change.append(CODE[change])
        self.dev.append(dev)
        self.ino.append(ino)
        self.size.append(size)
        self.mtime.append(mtime)
        self.pid.append(pid)
        return len(self.paths) - 1

    def add_many(
        self,
        ts: Sequence[float],
        paths: Sequence[str],
        nbytes: np.ndarray,
        changes: Sequence[str],
        dev: np.ndarray,
        ino: np.ndarray,
        size: np.ndarray,
        mtime: np.ndarray,
        pids: Sequence[int],
    ) -> None:
        """:meth:`add` for many events (bytes written, no capacity, no extras)."""
        n = len(paths)
        self.ts.extend(ts)
        self.paths += paths
        self.nbytes.frombytes(np.ascontiguousarray(nbytes, dtype=np.int64).tobytes())
        self.capacity.frombytes(np.full(n, -1, dtype=np.int64).tobytes())
        self.change.extend(CODE[c] for c in changes)
        self.dev.frombytes(np.ascontiguousarray(dev, dtype=np.int64).tobytes())
        self.ino.frombytes(np.ascontiguousarray(ino, dtype=np.uint64).tobytes())
        self.size.frombytes(np.ascontiguousarray(size, dtype=np.int64).tobytes())
        self.mtime.frombytes(np.ascontiguousarray(mtime, dtype=np.int64).tobytes())
        self.pid.extend(pids)

    def extend(self, other: EventColumns) -> None:
        base = len(self)
        for name in ("ts", "nbytes", "capacity", "change", "dev", "ino", "size", "mtime", "pid"):
            getattr(self, name).extend(getattr(other, name))
        self.paths += other.paths
        self.extra.update({base + k: v for k, v in other.extra.items()})
        self.workload.update(other.workload)

    def last_ts(self) -> float:
        return max(self.ts) if self.ts else 0.0

    def evidence(self, row: int) -> dict[str, Any]:
        """The evidence record of event ``row`` (a new dict)."""
        ev: dict[str, Any] = {"change": CHANGES[self.change[row]]}
        dev = self.dev[row]
        if dev >= 0:
            ev["dev_ino"] = f"{dev}:{self.ino[row]}"
        if dev >= 0 and ev["change"] != "mkdir":
            ev["size"] = self.size[row]
            ev["mtime"] = round(self.mtime[row] / 1e9, 6)
        pid = self.pid[row]
        if pid:
            ev["pid"] = pid
            ev.update(self.workload.get(pid, ()))
        extra = self.extra.get(row)
        if extra:
            ev.update(extra)
        return ev

    def write_events(self, kind: str) -> WriteEvents:
        """The batch's cells: one subject per distinct path, its evidence the latest event's."""
        paths = self.paths
        distinct = dict.fromkeys(paths)
        if len(distinct) == len(paths):  # new files: a path each, in order (no loop here)
            keys = list(distinct)
            subject = latest = np.arange(len(paths), dtype=np.int64)
        else:
            index: dict[str, int] = {}
            subject = np.fromiter(
                (index.setdefault(p, len(index)) for p in paths), np.int64, len(paths)
            )
            keys = list(index)
            latest = np.zeros(len(index), dtype=np.int64)
            latest[subject] = np.arange(len(subject))  # the last write wins
        capacity = None
        cap = np.frombuffer(self.capacity, dtype=np.int64)
        nbytes = np.frombuffer(self.nbytes, dtype=np.int64).copy()
        if (cap >= 0).any():
            capacity = np.where(cap >= 0, cap, nbytes)
        return WriteEvents(
            kind=kind,
            subjects=FsSubjects(keys, self, latest),
            subject=subject,
            ts=np.frombuffer(self.ts, dtype=np.float64).copy(),
            nbytes=nbytes,
            events=np.ones(len(subject), dtype=np.int64),
            capacity=capacity,
        )


class FsSubjects:
    """The distinct paths of one batch: ``keys`` for the classifier, each its own contributor,
    evidence built from the event columns when asked."""

    __slots__ = ("_latest", "_table", "contributors", "events", "keys")

    def __init__(self, keys: list[str], events: EventColumns, latest: np.ndarray) -> None:
        self.keys = keys
        # Paths from os.fsdecode: bytes that are not UTF-8 made visible, once, here (all of
        # them ASCII, the common case: nothing to make).
        ascii_only = "".join(keys).isascii()
        self.contributors = keys if ascii_only else [shown(k) for k in keys]
        self.events = events
        self._latest = latest.tolist()
        self._table: FsContributors | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def contributor(self, i: int) -> str:
        return self.contributors[i]

    def evidence(self, i: int) -> dict[str, Any] | None:
        return self.events.evidence(self._latest[i])

    def contributor_table(self) -> FsContributors:
        if self._table is None:
            self._table = FsContributors(self)
        return self._table


class _LazyReceipts(Mapping[int, dict[str, Any]]):
    """Contributor index -> the receipt of its latest subject, made when looked up."""

    def __init__(self, subjects: FsSubjects, last_subject: list[int]) -> None:
        self._subjects = subjects
        self._last = last_subject

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self._last):
            raise KeyError(index)
        ev = self._subjects.evidence(self._last[index])
        assert ev is not None
        return ev

    def __len__(self) -> int:
        return len(self._last)

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._last)))


class FsContributors:
    """alarm/events.py ``ContributorTable`` of fs subjects: contributors named as
    NamedContributors names them (bounded), their receipts made only for those looked up."""

    __slots__ = ("_names", "count", "evidence", "lookup", "of_subject")
    evidence: Mapping[int, dict[str, Any]] | None

    def __init__(self, subjects: FsSubjects) -> None:
        given = subjects.contributors
        n = len(given)
        if n and len(max(given, key=len)) <= MAX_CONTRIBUTOR_CHARS:
            lookup = dict(zip(given, range(n), strict=True))
            if len(lookup) == n and "" not in lookup:
                # Distinct, none cut, none empty (new files): each subject its contributor,
                # no loop per subject.
                self.lookup = lookup
                self._names = list(given)
                self.count = n
                self.of_subject = np.arange(n, dtype=np.int64)
                self.evidence = _LazyReceipts(subjects, list(range(n)))
                return
        given = [bounded_name(c) for c in given]
        self.lookup = {}
        last: list[int] = []
        of_subject = []
        for i, c in enumerate(given):
            if not c:  # names no contributor (a path no longer known)
                of_subject.append(-1)
                continue
            k = self.lookup.get(c)
            if k is None:
                k = self.lookup[c] = len(last)
                last.append(i)
            else:
                last[k] = i  # a contributor's receipt is its latest subject's
            of_subject.append(k)
        self._names = list(self.lookup)
        self.count = len(self._names)
        self.of_subject = np.array(of_subject, dtype=np.int64)
        self.evidence = _LazyReceipts(subjects, last) if last else None

    def names(self, ids: Sequence[int]) -> list[str]:
        return [self._names[i] for i in np.asarray(ids).tolist()]

    def find(self, names: Sequence[str]) -> np.ndarray:
        get = self.lookup.get
        return np.fromiter(map(get, names, repeat(-1)), dtype=np.int64, count=len(names))
