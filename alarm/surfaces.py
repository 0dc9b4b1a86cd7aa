"""SurfaceTable: the declared surfaces, by row — their counters, heavy hitters and receipts.

Every surface is declared in the config (plus one ``unclassified`` per kind in use), so the
table's size — and every metric's series count — is bounded by the config, never by traffic.
Contributors (destinations, paths, packages) are workload-controlled: they live only in a
bounded heavy-hitter summary per surface, with at most one bounded receipt each, and are never
metric labels.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from alarm.events import ContributorTable, Subjects
from alarm.sanitize import sanitize, shown
from alarm.settings import UNCLASSIFIED

SurfaceKey = tuple[str, str]  # (kind, name)
MAX_CONTRIBUTOR_CHARS = 200
MAX_RECEIPT_FIELDS = 16
MAX_RECEIPT_CHARS = 300
_COUNT = itemgetter(1)  # of a (contributor, count) pair


def bounded_name(contributor: str) -> str:
    """A contributor as hitters and receipts key it: long names cut, and marked as cut."""
    if len(contributor) > MAX_CONTRIBUTOR_CHARS:
        return contributor[:MAX_CONTRIBUTOR_CHARS] + "…"
    return contributor


class HeavyHitters:
    """Top-k contributors by bytes, in bounded memory.

    A batched Space-Saving variant: counts are merged into a dict that may grow to 2k keys,
    then pruned back to the k largest.  ``error`` is the largest count ever pruned, which bounds
    how far any reported count can be below its true value.
    """

    __slots__ = ("_counts", "_k", "error")

    def __init__(self, k: int, counts: dict[str, int] | None = None, error: int = 0):
        self._k = k
        self._counts: dict[Hashable, int] = {} if counts is None else counts
        self.error = error

    def add(self, contributor: str, amount: int) -> None:
        contributor = bounded_name(contributor)
        counts = self._counts
        counts[contributor] = counts.get(contributor, 0) + amount
        if len(counts) > 2 * self._k:
            self._prune()

    def add_many(self, contributors: list[str], amounts: list[int]) -> None:
        """``add`` for each pair, pruning once at the end (a batch's worth at a time)."""
        if any(len(c) > MAX_CONTRIBUTOR_CHARS for c in contributors):
            contributors = [bounded_name(c) for c in contributors]
        self.add_keys(contributors, amounts)

    def add_keys(self, keys: Sequence[Hashable], amounts: list[int]) -> None:
        """``add_many`` of keys as they are: bounded names, or indexes of one batch's
        ContributorTable that stand for their names (SurfaceTable.recent_table)."""
        counts = self._counts
        get = counts.get
        for key, amount in zip(keys, amounts, strict=True):
            counts[key] = get(key, 0) + amount
        if len(counts) > 2 * self._k:
            self._prune()

    def keys(self) -> list[Hashable]:
        return list(self._counts)

    def rekey(self, new: Mapping[Hashable, Hashable]) -> None:
        """Each key in ``new`` replaced by its new key (one per name: counts unchanged)."""
        self._counts = {new.get(c, c): n for c, n in self._counts.items()}

    def add_batch(
        self, ids: np.ndarray, amounts: np.ndarray, contributors: ContributorTable
    ) -> list[str]:
        """``add_many`` of contributor ``ids[j]`` (distinct, ascending) with ``amounts[j]``,
        naming only what can be kept.  Returns the names it added to (for their receipts).

        The counts and ``error`` are those ``add_many`` of every pair gives, but for ties at
        the k-th place: past 2k keys the prune keeps the k largest of (held + batch), so a
        name not held yet is kept only if its amount is among the k largest of the batch's
        new names, and the k+1 largest of those bound all else dropped (each of them counts at
        least as much, and one of them is dropped).  So a batch of 20,000 flows names k+1 of
        them and finds the ≤ 2k held ones, instead of naming 20,000."""
        counts = self._counts
        k = self._k
        m = len(ids)
        if not m:
            return []
        if m <= len(counts) + k + 1:
            # Naming the batch costs no more than finding what is held: add_many itself.
            batch = [bounded_name(c) for c in contributors.names(ids)]
            self.add_many(batch, amounts.tolist())
            return batch
        if not counts and m > 2 * k:
            # Nothing held (a tick's summary of a surface, made afresh): the general case
            # below with nothing to find, without its steps over no held names.
            top = np.argpartition(amounts, m - (k + 1))[-(k + 1) :]
            batch = [bounded_name(c) for c in contributors.names(ids[top])]
            self.add_keys(batch, amounts[top].tolist())
            self._prune()
            return batch
        held = list(counts)
        at = contributors.find(held) if held else np.zeros(0, dtype=np.int64)
        j = np.minimum(np.searchsorted(ids, at), m - 1)
        present = (at >= 0) & (ids[j] == at)
        fresh = np.ones(m, dtype=bool)
        fresh[j[present]] = False
        new = np.flatnonzero(fresh)
        pruned = len(held) + len(new) > 2 * k  # as add_many would find, whatever is named
        if pruned and len(new) > k + 1:
            new = new[np.argpartition(amounts[new], len(new) - (k + 1))[-(k + 1) :]]
        added = list(compress(held, present.tolist()))
        for name, amount in zip(added, amounts[j[present]].tolist(), strict=True):
            counts[name] += amount
        batch = [bounded_name(c) for c in contributors.names(ids[new])]
        # Two keys of one name add up (FlowContributors); add_keys prunes only where
        # ``pruned`` (held and new distinct names are at most held + new).
        self.add_keys(batch, amounts[new].tolist())
        if pruned:
            self._prune()  # a second prune of k names changes nothing
        return added + batch

    def _prune(self) -> None:
        # A stable sort orders as heapq.nlargest does (ties in insertion order), and sorting
        # in C costs less than nlargest's heap in Python: most prunes keep k of ~2k.
        ranked = sorted(self._counts.items(), key=_COUNT, reverse=True)
        if len(ranked) > self._k:
            self.error = max(self.error, ranked[self._k][1])  # the largest count dropped
        self._counts = dict(ranked[: self._k])

    def __contains__(self, contributor: str) -> bool:
        return contributor in self._counts

    def top(self, n: int) -> list[tuple[Any, int]]:
        if 2 * n >= len(self._counts):  # most of them (a tick's top k of at most 2k)
            return sorted(self._counts.items(), key=_COUNT, reverse=True)[:n]
        return heapq.nlargest(n, self._counts.items(), key=_COUNT)

    def clear(self) -> None:
        self._counts = {}

    def to_state(self) -> dict:
        return {"counts": self.top(self._k), "error": self.error}

    def load_state(self, state: dict) -> None:
        # shown: names saved before they were made safe where they enter.
        self._counts = {shown(str(k)): int(v) for k, v in state.get("counts", [])}
        self.error = int(state.get("error", 0))


class NamedContributors:
    """A ContributorTable of subjects that only name themselves one by one (``contributor``,
    ``evidence``): every name is made once per batch, then found by dict."""

    __slots__ = ("_names", "count", "evidence", "lookup", "of_subject")
    names_distinct = True  # each index is one distinct name, bounded

    def __init__(self, subjects: Subjects):
        n = len(subjects)
        given = [bounded_name(subjects.contributor(i)) for i in range(n)]
        self._names = [c for c in dict.fromkeys(given) if c]  # distinct, by first subject
        self.count = len(self._names)
        self.lookup = dict(zip(self._names, range(self.count), strict=True))
        self.of_subject = np.fromiter(
            map(self.lookup.get, given, repeat(-1)), dtype=np.int64, count=n
        )
        self.evidence: dict[int, dict[str, Any]] | None = None
        for i, c in enumerate(self.of_subject.tolist()):
            receipt = subjects.evidence(i)
            if receipt is not None and c >= 0:  # the latest subject's: a subject's is its latest
                if self.evidence is None:
                    self.evidence = {}
                self.evidence[c] = receipt

    def names(self, ids: Sequence[int]) -> list[str]:
        return [self._names[i] for i in np.asarray(ids).tolist()]

    def find(self, names: Sequence[str]) -> np.ndarray:
        get = self.lookup.get
        return np.fromiter(map(get, names, repeat(-1)), dtype=np.int64, count=len(names))


def contributor_table(subjects: Subjects) -> ContributorTable | None:
    """The contributors of a batch's subjects, in bulk where the subjects offer it
    (``contributor_table``), else named one by one; None when no subject names one."""
    bulk = getattr(subjects, "contributor_table", None)
    table = bulk() if bulk is not None else None
    if table is None:
        table = NamedContributors(subjects)
    return table if table.count else None


class BoundedReceipt(dict[str, Any]):
    """A receipt ``bounded_receipt`` made: what it returns as it is.  A source that asks
    for a contributor's receipt again and again (FlowOwners: once per tick and surface the
    contributor wrote in) bounds it once."""

    __slots__ = ()


def bounded_receipt(evidence: dict[str, Any]) -> dict[str, Any]:
    """A receipt as kept and shown: a few fields, plain values, sanitised text."""
    if type(evidence) is BoundedReceipt:
        return evidence
    out = BoundedReceipt()
    for key, value in list(evidence.items())[:MAX_RECEIPT_FIELDS]:
        if not isinstance(value, bool | int | float) and value is not None:
            value = sanitize(str(value), MAX_RECEIPT_CHARS)
        out[sanitize(str(key), 40)] = value
    return out


def bounded_receipts(
    receipts: dict[str, dict[str, Any]], hitters: HeavyHitters, k: int
) -> dict[str, dict[str, Any]]:
    """Receipts kept for at most 2k contributors: past that, only those still in ``hitters``."""
    if len(receipts) <= 2 * k:
        return receipts
    return {c: r for c, r in receipts.items() if c in hitters}


def names_distinct(contributors: ContributorTable) -> bool:
    """Whether every index of ``contributors`` has a name of its own, as kept (bounded): then
    its indexes can stand for their names (TickTop, SurfaceTable.recent_table).  A table that does
    not say (``names_distinct``) is taken to have indexes that share a name."""
    return bool(getattr(contributors, "names_distinct", False))


def _index_names(contributors: ContributorTable, keys: Iterable[Hashable]) -> dict[int, str]:
    """The kept (bounded) names of the keys that are indexes of ``contributors`` (the
    others are names already)."""
    ids = [c for c in keys if type(c) is int]
    return dict(zip(ids, map(bounded_name, contributors.names(ids)), strict=True))


@dataclass(slots=True)
class TickTop:
    """One (tick, surface)'s contributors as a HeavyHitters made afresh from one batch would
    hold them, unnamed: indexes of the batch's ``contributors`` (whose names are distinct),
    in the summary's order, ``kept`` of them held; past them, the one its prune dropped (its
    receipt was staged too).  Named only if something reads them."""

    contributors: ContributorTable
    ids: np.ndarray
    amounts: np.ndarray
    kept: int
    error: int

    @classmethod
    def of_batch(
        cls, ids: np.ndarray, amounts: np.ndarray, contributors: ContributorTable, k: int
    ) -> TickTop:
        """What ``HeavyHitters(k).add_batch(ids, amounts, contributors)`` holds."""
        m = len(ids)
        if m <= 2 * k:  # all named, in index order, none pruned
            return cls(contributors, ids, amounts, m, 0)
        # The k+1 largest, in argpartition's order, then pruned by a stable sort on the
        # count (the summary's prune): ties keep that order.
        top = np.argpartition(amounts, m - (k + 1))[-(k + 1) :]
        top = top[np.argsort(-amounts[top], kind="stable")]
        return cls(contributors, ids[top], amounts[top], k, int(amounts[top[k]]))

    def top(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` largest held (HeavyHitters.top): indexes and amounts."""
        held = self.amounts[: self.kept]
        order = np.argsort(-held, kind="stable")[:n]
        return self.ids[order], held[order]

    def named(self, k: int) -> tuple[HeavyHitters, dict[str, dict[str, Any]]]:
        """The summary and the staged receipts, named."""
        names = [bounded_name(c) for c in self.contributors.names(self.ids)]
        amounts = self.amounts.tolist()
        hitters = HeavyHitters(k, dict(zip(names[: self.kept], amounts, strict=False)), self.error)
        receipts: dict[str, dict[str, Any]] = {}
        evidence = self.contributors.evidence
        if evidence:
            for name, index in zip(names, self.ids.tolist(), strict=True):
                receipt = evidence.get(index)
                if receipt is not None:
                    receipts[name] = receipt
        return hitters, receipts


class StagedCredits:
    """Contributors of one open tick, per surface row, held until the tick is evaluated: an
    alert's evidence is then who wrote in the ticks it judged (event time), not whatever the
    batches read so far held — a backlog or a replay hands over many ticks at once.  Bounded
    like the table's own hitters: k per row, and receipts for at most 2k contributors.

    A row written by one batch whose contributors' names are distinct is held unnamed
    (``tops``); one written by several, or by a batch whose names are not, by name
    (``hitters``, ``receipts``)."""

    __slots__ = ("_k", "hitters", "receipts", "tops")

    def __init__(self, k: int):
        self._k = k
        self.hitters: dict[int, HeavyHitters] = {}
        self.receipts: dict[int, dict[str, dict[str, Any]]] = {}
        self.tops: dict[int, TickTop] = {}

    def named(self, row: int) -> HeavyHitters | None:
        """Row ``row``'s summary by name (an unnamed one named now), None if it has none."""
        top = self.tops.pop(row, None)
        if top is not None:
            self.hitters[row], self.receipts[row] = top.named(self._k)
        return self.hitters.get(row)

    def add(
        self,
        row: int,
        contributors: list[str],
        amounts: list[int],
        evidence: list[dict[str, Any] | None] | None,
    ) -> None:
        hitters = self.named(row)
        if hitters is None:
            hitters = self.hitters[row] = HeavyHitters(self._k)
        hitters.add_many(contributors, amounts)
        if evidence is not None:
            receipts = self.receipts.setdefault(row, {})
            for contributor, receipt in zip(contributors, evidence, strict=True):
                if receipt is not None:
                    receipts[bounded_name(contributor)] = receipt
            self.receipts[row] = bounded_receipts(receipts, hitters, self._k)

    def add_batch(
        self, row: int, ids: np.ndarray, amounts: np.ndarray, contributors: ContributorTable
    ) -> None:
        """``add`` in bulk (HeavyHitters.add_batch), with the receipts of those added."""
        if not len(ids):
            return
        if row not in self.hitters and row not in self.tops and names_distinct(contributors):
            self.tops[row] = TickTop.of_batch(ids, amounts, contributors, self._k)
            return
        hitters = self.named(row)
        if hitters is None:
            hitters = self.hitters[row] = HeavyHitters(self._k)
        added = hitters.add_batch(ids, amounts, contributors)
        evidence = contributors.evidence
        if evidence:
            receipts = self.receipts.setdefault(row, {})
            for contributor, index in zip(added, contributors.find(added).tolist(), strict=True):
                receipt = evidence.get(index)
                if receipt is not None:
                    receipts[contributor] = receipt
            self.receipts[row] = bounded_receipts(receipts, hitters, self._k)

    def merge(self, other: StagedCredits) -> StagedCredits:
        """Fold ``other`` (a tick that will not be evaluated) into this one."""
        for row in list(other.tops):
            other.named(row)
        for row, hitters in other.hitters.items():
            top = hitters.top(self._k)
            names = [c for c, _ in top]
            receipts = other.receipts.get(row, {})
            self.add(row, names, [b for _, b in top], [receipts.get(c) for c in names])
            self.hitters[row].error = max(self.hitters[row].error, hitters.error)
        return self


class SurfaceTable:
    """Rows are surfaces: the declared ones in config order, then ``unclassified`` per kind."""

    def __init__(self, declared: Iterable[SurfaceKey], kinds: Iterable[str], heavy_hitters: int):
        keys = list(declared)
        keys += [(kind, UNCLASSIFIED) for kind in kinds if (kind, UNCLASSIFIED) not in keys]
        self.keys: list[SurfaceKey] = keys
        self.index: dict[SurfaceKey, int] = {k: i for i, k in enumerate(keys)}
        self.by_name: dict[str, int] = {n: i for i, (_, n) in enumerate(keys) if n != UNCLASSIFIED}
        n = len(keys)
        self.bytes_total = np.zeros(n, dtype=np.int64)
        self.events_total = np.zeros(n, dtype=np.int64)
        self.heavy_hitters = heavy_hitters
        self.hitters = [HeavyHitters(heavy_hitters) for _ in keys]
        # Hitters of the current alert window: cleared when a tick closes quiet, so an alert's
        # evidence names who wrote during the episode rather than who wrote most since start.
        self.recent = [HeavyHitters(heavy_hitters) for _ in keys]
        # Rows whose recent hitters or receipts hold anything: the only ones a quiet tick
        # has to clear (a Python call per quiet row was ~40 ms a tick at 100k surfaces).
        self.has_recent = np.zeros(n, dtype=bool)
        # Per row, the latest receipt of each recent contributor (bounded like the hitters).
        self.receipts: list[dict[Hashable, dict[str, Any]]] = [{} for _ in keys]
        # Per row, the batch's ContributorTable whose indexes stand for their names among
        # the row's recent contributors and receipts (None: all are names).  A tick's
        # contributors are credited unnamed (TickTop); names are made when evidence is read,
        # or once a batch where a row's contributors pass from one batch's to the next's.
        self.recent_table: list[ContributorTable | None] = [None for _ in keys]
        self.unknown_surface_events = 0  # events naming a surface the config does not declare

    def __len__(self) -> int:
        return len(self.keys)

    def unclassified_row(self, kind: str) -> int:
        return self.index[(kind, UNCLASSIFIED)]

    def count(self, rows: np.ndarray, nbytes: np.ndarray, events: np.ndarray) -> None:
        """Add cells to the surfaces' totals.  Summed per row that wrote, not over every
        row: a batch of 1,000 events made two bincounts of 100,000 rows at 100,000 surfaces
        (the same sums: bincount adds a row's cells in the batch's order either way)."""
        n = len(self.keys)
        if len(rows) * 8 >= n:
            self.bytes_total += np.bincount(rows, weights=nbytes, minlength=n).astype(np.int64)
            self.events_total += np.bincount(rows, weights=events, minlength=n).astype(np.int64)
            return
        wrote, at = np.unique(rows, return_inverse=True)
        self.bytes_total[wrote] += np.bincount(at, weights=nbytes).astype(np.int64)
        self.events_total[wrote] += np.bincount(at, weights=events).astype(np.int64)

    def credit_totals(self, row: int, contributors: list[str], amounts: list[int]) -> None:
        """Bytes to the contributors of a surface's totals, as soon as they are counted (the
        totals are too)."""
        self.hitters[row].add_many(contributors, amounts)

    def credit_totals_batch(
        self, row: int, ids: np.ndarray, amounts: np.ndarray, contributors: ContributorTable
    ) -> None:
        """``credit_totals`` in bulk (HeavyHitters.add_batch)."""
        self.hitters[row].add_batch(ids, amounts, contributors)

    def credit_staged(self, staged: StagedCredits) -> None:
        """What one tick's writers wrote, to the surfaces' recent contributors (the evidence
        of their current episode), now that the tick is evaluated."""
        k = self.heavy_hitters
        for row, tick_top in staged.tops.items():
            ids, amounts = tick_top.top(k)
            contributors = tick_top.contributors
            self._key_recent(row, contributors)
            recent = self.recent[row]
            held = ids.tolist()
            recent.add_keys(held, amounts.tolist())
            recent.error = max(recent.error, tick_top.error)
            self.has_recent[row] = True
            evidence = contributors.evidence
            if not evidence:
                continue
            receipts = self.receipts[row]
            for index in held:
                receipt = evidence.get(index)
                if receipt is not None:
                    receipts[index] = bounded_receipt(receipt)
            self.receipts[row] = bounded_receipts(receipts, recent, k)
        for row, hitters in staged.hitters.items():
            top = hitters.top(k)
            if not top:
                continue
            self._key_recent(row, None)
            recent = self.recent[row]
            recent.add_many([c for c, _ in top], [b for _, b in top])
            # What the tick's own pruning dropped bounds the counts' error too.
            recent.error = max(recent.error, hitters.error)
            self.has_recent[row] = True
            staged_receipts = staged.receipts.get(row)
            if not staged_receipts:
                continue
            receipts = self.receipts[row]
            for contributor, _ in top:
                receipt = staged_receipts.get(contributor)
                if receipt is not None:
                    receipts[contributor] = bounded_receipt(receipt)
            self.receipts[row] = bounded_receipts(receipts, recent, k)

    def evidence(self, row: int, top: int) -> list[tuple[str, int, dict[str, Any] | None]]:
        """The recent top contributors of a surface with their receipts."""
        receipts = self.receipts[row]
        listed = self.recent[row].top(top)
        contributors = self.recent_table[row]
        if contributors is None:
            return [(c, b, receipts.get(c)) for c, b in listed]
        names = _index_names(contributors, [c for c, _ in listed])
        return [(names.get(c, c), b, receipts.get(c)) for c, b in listed]  # type: ignore[misc]

    def _key_recent(self, row: int, contributors: ContributorTable | None) -> None:
        """Key row ``row``'s recent contributors and receipts by indexes of
        ``contributors`` where it holds them (None: by name).  A name is one index's only:
        ``names_distinct`` of each table keyed by, and an index found for a name is one
        that reads back as it (``find`` may read ``10.0.0.5:0443/TCP`` as port 443)."""
        held = self.recent_table[row]
        if held is contributors:
            return
        recent, receipts = self.recent[row], self.receipts[row]
        keys = list(dict.fromkeys([*recent.keys(), *receipts]))
        new: dict[Hashable, Hashable] = {}
        if held is not None:
            new.update(_index_names(held, keys))
        if contributors is not None and keys:
            names = [new.get(c, c) for c in keys]
            at = contributors.find(names)  # type: ignore[arg-type]
            found = np.flatnonzero(at >= 0)
            back = contributors.names(at[found])
            for j, index, name in zip(found.tolist(), at[found].tolist(), back, strict=True):
                if bounded_name(name) == names[j]:
                    new[keys[j]] = index
        if new:
            recent.rekey(new)
            self.receipts[row] = {new.get(c, c): r for c, r in receipts.items()}
        self.recent_table[row] = contributors

    def name_recent(self, rows: np.ndarray) -> None:
        """Key the recent contributors of ``rows`` (indices) by name: rows that keep them
        without writing (an episode still open) keep no batch's table alive."""
        for row in rows.tolist():
            if self.recent_table[row] is not None:
                self._key_recent(row, None)

    def holding_recent(self, rows: np.ndarray) -> np.ndarray:
        """The indices of the rows in the mask ``rows`` that hold recent contributors."""
        return np.flatnonzero(rows & self.has_recent)

    def forget_recent(self, rows: np.ndarray) -> None:
        """Clear the recent contributors of ``rows`` (indices): their episode is over."""
        for row in rows.tolist():
            self.recent[row].clear()
            self.receipts[row] = {}
            self.recent_table[row] = None
        self.has_recent[rows] = False

    def to_state(self) -> dict:
        """The counters and contributors of the surfaces that were ever written.  One never
        written (no bytes, no events, no contributors) is left out: a table made afresh, as
        load_state fills one, holds it so already.  Every save wrote all of them: at 100,000
        declared surfaces 8.5 MB of JSON and ~0.5-0.8 s of the pipeline thread a save, and
        700,000 short-lived objects whose promotion set off a full collection of the
        garbage collector (2-3 s there) every other save."""
        hitters = self.hitters
        written = (self.bytes_total != 0) | (self.events_total != 0)
        written[[i for i, h in enumerate(hitters) if h._counts or h.error]] = True
        keys = self.keys
        out = {}
        for i, nbytes, events in zip(
            np.flatnonzero(written).tolist(),
            self.bytes_total[written].tolist(),
            self.events_total[written].tolist(),
            strict=True,
        ):
            kind, name = keys[i]
            out[f"{kind}/{name}"] = {
                "bytes_total": nbytes,
                "events_total": events,
                "hitters": hitters[i].to_state(),
            }
        out["_unknown_surface_events"] = self.unknown_surface_events
        return out

    def load_state(self, state: dict) -> None:
        """Counters of the surfaces that are still declared; the others are gone (and so are
        their series)."""
        self.unknown_surface_events = int(state.get("_unknown_surface_events", 0))
        for i, (kind, name) in enumerate(self.keys):
            saved = state.get(f"{kind}/{name}")
            if isinstance(saved, dict):
                self.bytes_total[i] = int(saved.get("bytes_total", 0))
                self.events_total[i] = int(saved.get("events_total", 0))
                self.hitters[i].load_state(saved.get("hitters", {}))
