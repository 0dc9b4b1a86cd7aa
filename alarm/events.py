"""Write events and batches: the one shape every source hands over, whatever its kind.

A source turns what it reads (fence records, file changes, registry uploads) into
:class:`WriteEvents`: columns of cells, each ``nbytes`` written in ``events`` events at event
time ``ts`` by one *subject* — the thing the kind's classifier reads to pick a surface (an
egress flow, a path, a repository).  Subjects are held once per batch in a table of the kind's
own, which also names each subject as a contributor (the heavy-hitter key shown as evidence,
never a metric label) and may carry a small evidence record (a receipt: inode and digest, or
package, version and uploader).

A :class:`Batch` is the unit the pipeline applies in one step: the events, the source's counter
deltas and its position after them, so that what is saved is always a position together with
exactly the counts it produced.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from alarm.sanitize import shown, shown_evidence

# A forged record's sample line as kept and shown: about one fence line (prefix, interfaces,
# MACs, addresses, ports), never a page of workload text.
FORGED_SAMPLE_CHARS = 300

# Subjects of this kind name their surface directly (replayed write events, the demo): the
# classifier is bypassed and the surface's kind is the declared one.
NAMED = "named"

# Counters every source has (``capalarm_source_<name>_total``).  Counters particular to a
# source type are declared with the type (alarm/collectors/base.py) and exported the same way.
CORE_COUNTERS: dict[str, str] = {
    "records_read": "Records read from the source (log lines, file-system events, listed artifacts).",
    "parse_errors": "Records that looked like the source's kind but could not be read.",
    "records_lost": "Records known to be lost (ring overwrite, sequence gap, queue overflow).",
    "records_lost_unknown": "Gaps of unknown size: records may have been lost, how many cannot be known (e.g. a journald cursor reset).",
    "forged_records": "Look-alike records the kernel provably did not write: rejected and alarmed.",
    "late_events": "Events whose tick had already been evaluated: counted in the first open tick.",
    "future_events": "Events stamped further ahead than a tick: counted now (clock skew).",
}


class Subjects(Protocol):
    """The distinct subjects of one batch.  Contributor names and evidence are text the
    workload chose (a file name, a package, a process name): a source hands them over safe to
    encode (no lone surrogate, alarm/sanitize.py ``shown``), as KeyedSubjects makes them."""

    def __len__(self) -> int: ...

    def contributor(self, i: int) -> str: ...

    def evidence(self, i: int) -> dict[str, Any] | None: ...

    # Optional: ``contributor_table() -> ContributorTable | None``, the subjects' contributors
    # in bulk (the pipeline asks every subject otherwise).


class ContributorTable(Protocol):
    """The distinct contributors of one batch's subjects, by index, named only when asked:
    the pipeline sums what each wrote in numpy and names the few that a bounded heavy-hitter
    summary can keep (alarm/surfaces.py ``HeavyHitters.add_batch``).  A table whose indexes
    each name a distinct contributor says so with a true ``names_distinct``: its indexes then
    stand for their names in a tick's and a surface's recent contributors until those are
    read (alarm/surfaces.py ``TickTop``); one that does not say is named tick by tick."""

    # Per subject, the index of its contributor (-1: it names none); subjects of one name
    # share an index.
    of_subject: np.ndarray
    count: int  # indexes are 0 .. count - 1
    # Index -> the receipt of its latest subject that carries one; None: none does.
    evidence: dict[int, dict[str, Any]] | None

    def names(self, ids: Sequence[int]) -> list[str]:
        """The contributor name (``Subjects.contributor``) of each index."""
        ...

    def find(self, names: Sequence[str]) -> np.ndarray:
        """The index of each name in this batch (-1: not in it)."""
        ...


@dataclass(slots=True)
class KeyedSubjects:
    """Subjects as plain lists: ``keys[i]`` is what the kind's classifier reads (a path, a
    ``(repository, artifact)`` pair; for :data:`NAMED`, ``(kind or None, surface)``)."""

    keys: list[Any]
    contributors: list[str]
    receipts: list[dict[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        # Where workload text enters, once: a file name that is not UTF-8 (surrogate escapes
        # from os.fsdecode) or a lone surrogate from JSON is made encodable here, so nothing
        # downstream (page, API, metrics, notifications) meets one.  The keys stay as they
        # are: the classifier matches the real path.
        self.contributors = [shown(c) for c in self.contributors]
        if self.receipts is not None:
            self.receipts = [None if r is None else shown_evidence(r) for r in self.receipts]

    def __len__(self) -> int:
        return len(self.keys)

    def contributor(self, i: int) -> str:
        return self.contributors[i]

    def evidence(self, i: int) -> dict[str, Any] | None:
        return self.receipts[i] if self.receipts is not None else None


class Event(NamedTuple):
    """One write event, for sources that produce few (file systems, registries)."""

    ts: float
    key: Any  # the subject's key, as the kind's classifier reads it
    nbytes: int
    contributor: str
    events: int = 1
    evidence: dict[str, Any] | None = None
    # Bytes the write could carry (its capacity bound) when that is not ``nbytes``: a file
    # rewritten in place, a wiki edit (changed bytes written, the new revision's size carried).
    capacity: int | None = None


def _i64(values: Iterable[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.int64)


@dataclass(slots=True)
class WriteEvents:
    """Cells of one kind: cell ``j`` is ``nbytes[j]`` bytes in ``events[j]`` events by subject
    ``subject[j]`` at ``ts[j]``; ``capacity[j]`` the bytes it could carry (None: ``nbytes``)."""

    kind: str
    subjects: Subjects
    subject: np.ndarray
    ts: np.ndarray
    nbytes: np.ndarray
    events: np.ndarray
    capacity: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.subject)

    @classmethod
    def of(cls, kind: str, rows: Sequence[Event]) -> WriteEvents:
        """Cells from events, one subject per distinct (key, contributor)."""
        index: dict[tuple[Any, str], int] = {}
        keys: list[Any] = []
        names: list[str] = []
        receipts: list[dict[str, Any] | None] = []
        subject = []
        for ev in rows:
            ident = (ev.key, ev.contributor)
            i = index.get(ident)
            if i is None:
                i = index[ident] = len(keys)
                keys.append(ev.key)
                names.append(ev.contributor)
                receipts.append(ev.evidence)
            elif ev.evidence is not None:
                receipts[i] = ev.evidence  # the latest measurement of the subject
            subject.append(i)
        capacity = None
        if any(ev.capacity is not None for ev in rows):
            capacity = _i64(ev.nbytes if ev.capacity is None else ev.capacity for ev in rows)
        return cls(
            kind=kind,
            subjects=KeyedSubjects(keys, names, receipts if any(receipts) else None),
            subject=_i64(subject),
            ts=np.array([ev.ts for ev in rows], dtype=np.float64),
            nbytes=_i64(ev.nbytes for ev in rows),
            events=_i64(ev.events for ev in rows),
            capacity=capacity,
        )

    def capacity_bytes(self) -> np.ndarray:
        return self.nbytes if self.capacity is None else self.capacity


@dataclass(slots=True)
class Batch:
    """What a source hands over in one step, applied by the pipeline in one step."""

    events: WriteEvents | None = None
    # Counter deltas: CORE_COUNTERS and the source type's own counters, by name.
    counts: dict[str, int] = field(default_factory=dict)
    # JSON-serialisable position *after* this batch; None: unchanged.
    position: dict[str, Any] | None = None
    # Every event stamped before this has been handed over (as far as the source can tell).
    # None: the source says nothing new (a caught-up source is taken to be at "now").
    watermark: float | None = None
    # Rows of the source's ledger to write (key -> JSON text) or delete (None), for state too
    # large to be one position (a file tree, a registry listing); saved with the counts.
    ledger: dict[str, str | None] | None = None
    # One forged record of this batch as a sample line (sanitised, bounded), for the
    # forged-records alert; None: none, or none kept.
    forged_sample: str | None = None


Emit = Callable[[Batch], Awaitable[None]]


@dataclass(slots=True)
class SourceHealth:
    """How a source is doing right now, written by the source on the event loop and read there
    (the service copies it to the pipeline with each tick).  Not saved: it describes this
    process."""

    up: bool = False
    # 1 when the source can prove where a record came from (kmsg facility, journald
    # transport); 0 for files, which cannot.
    provenance_verified: bool = False
    # Everything the source could read so far has been emitted: its events up to "now" are in.
    caught_up: bool = False
    # A source that polls (registries, boards): how often it looks (s); 0 for one that reads
    # records as they come.  A poll sees only what happened before it started, so a poller is
    # never "at now" between polls: it holds ticks at its watermark instead (eventtime.py).
    poll_interval: float = 0.0
    last_record_ts: float = 0.0
    last_success_at: float = 0.0  # last complete read or poll (unix s)
    read_seconds: float = 0.0  # what the last read or poll took
    mode: str = ""  # how it reads, where the source has a choice (fs: inotify, poll)
    # Why the source cannot see what it watches although it runs ("" while it sees): a
    # missed canary, a watched tree gone, a registry not polled successfully for too long.
    blind: str = ""
    errors: int = 0  # failures (a poll that failed, a reader that died)
    last_error: str = ""
    last_error_at: float = 0.0

    def failed(self, message: str, at: float) -> None:
        self.errors += 1
        self.last_error = shown(message)[:500]
        self.last_error_at = at
