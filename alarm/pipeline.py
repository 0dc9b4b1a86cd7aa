"""Pipeline: batches in, evaluated ticks and alert changes out — the same for every kind of
surface, and the same in the service and in the backtest.

``apply(source, batch, now)`` classifies the batch's write events by the kind's classifier
(alarm/classify/), counts them in the surfaces' totals and in the open tick of their own
timestamp (alarm/eventtime.py), and takes the source's counter deltas, position and ledger rows
in the same step.  ``close_until(end)`` evaluates every tick that ends by ``end``, in order,
each once: the detector on the tick's sums, then the sources.  The service calls it with the
end its sources' watermarks allow (``closable_end``); the backtest with the end of what it has
replayed.  So a backtest previews exactly what the service would page.

All of it is owned by one thread (the service runs every call on a single-worker executor;
the backtest calls it directly), so it needs no locks and the event loop never does its CPU
work.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from alarm.collectors import SOURCE_TYPES
from alarm.detector.alerts import AlertChange
from alarm.detector.engine import Detector
from alarm.detector.sources import SourceJudgement
from alarm.detector.views import figure_columns
from alarm.events import (
    CORE_COUNTERS,
    FORGED_SAMPLE_CHARS,
    NAMED,
    Batch,
    SourceHealth,
    WriteEvents,
)
from alarm.eventtime import EventClock
from alarm.history import History, HistoryRequest
from alarm.kind import Classifier
from alarm.kinds import KINDS
from alarm.sanitize import sanitize
from alarm.settings import UNCLASSIFIED
from alarm.snapshot import (
    PageError,
    Snapshot,
    SnapshotRequest,
    SourceView,
    SurfaceColumns,
    SurfaceLayout,
)
from alarm.surfaces import StagedCredits, SurfaceKey, SurfaceTable, contributor_table

if TYPE_CHECKING:  # the assembled model: importing it imports every source type's settings
    from alarm.config import Config

# Source counters the source alarms judge, tick by tick.
JUDGED = ("records_lost", "records_lost_unknown", "forged_records")
# A batch's (surface, contributor) pairs are indexed by their own key, without sorting them,
# where there are at most this many times as many possible pairs as the batch has cells
# (their sums are then bincounts over every possible pair).
DENSE_PAIRS = 4


@dataclass(slots=True)
class SourceState:
    """A source as the pipeline knows it: its type and its counters (saved with positions)."""

    name: str
    type: str
    kind: str
    counters: Counter[str] = field(default_factory=Counter)
    # Deltas of the judged counters since the last evaluated tick.
    pending: Counter[str] = field(default_factory=Counter)
    # The forged-records alert's sample line: the first forged record handed over since the
    # source was last judged, else the last one kept (saved with the counters).
    forged_sample: str = ""
    sample_fresh: bool = False

    @property
    def declared_counters(self) -> dict[str, str]:
        """Every counter the source keeps, with its help text: the core ones, its type's own
        and its kind's classifier's."""
        extra = SOURCE_TYPES[self.type].counters if self.type in SOURCE_TYPES else {}
        kind = KINDS.get(self.kind)
        classified = (
            {f"classifier_{c}": doc for c, doc in kind.classifier_counters.items()} if kind else {}
        )
        return {**CORE_COUNTERS, **extra, **classified}


@dataclass(slots=True)
class TickResult:
    end: float
    changes: list[AlertChange] = field(default_factory=list)


class Pipeline:
    def __init__(
        self,
        config: Config,
        extra_sources: Mapping[str, tuple[str, str]] = {},
        extra_kinds: Iterable[str] = (),
        keep_history: bool = True,
    ):
        """``extra_sources``: name -> (type, kind) of sources not in ``config.sources`` (the
        demo's and tests' own collectors, the backtest's inputs); ``extra_kinds``: kinds to
        keep an ``unclassified`` surface for although nothing declares or feeds them;
        ``keep_history``: keep the last hour of every surface for the status page (a
        backtest, which serves no page, does not)."""
        self.config = config
        self.tick = config.tick
        kinds = set(config.kinds_in_use()) | {kind for _, kind in extra_sources.values()}
        kinds |= set(extra_kinds)
        unknown = sorted(kinds - set(KINDS))
        if unknown:  # a source of a kind no module in alarm/kinds/ declares: nowhere to count
            raise ValueError(f"no kind {unknown[0]!r} is registered (alarm/kinds/)")
        kinds_in_use = [k for k in KINDS if k in kinds]
        self.table = SurfaceTable(
            [(s.kind, s.name) for s in config.surfaces], kinds_in_use, config.heavy_hitters
        )
        self.classifiers: dict[str, Classifier] = {}
        # kind -> table row of each of the kind's declared surfaces in rule order, then the
        # kind's unclassified row (so a classifier's -1 indexes it).
        self._kind_rows: dict[str, np.ndarray] = {}
        for kind in kinds_in_use:
            declared = [s for s in config.surfaces if s.kind == kind]
            self.classifiers[kind] = KINDS[kind].classifier(
                [s.name for s in declared], [s.match for s in declared]
            )
            rows = [self.table.index[(kind, s.name)] for s in declared]
            self._kind_rows[kind] = np.array(
                [*rows, self.table.unclassified_row(kind)], dtype=np.int64
            )
        self.detector = Detector(config, list(self.table.keys))
        top = config.http.top_contributors or 10
        table = self.table
        self._evidence = lambda row: table.evidence(row, top)  # an alert's evidence, by row
        # -- history (status page): the last hour of every detector row -------------------
        self.history = History(len(self.detector.keys), config.tick) if keep_history else None
        et = config.event_time
        self.clock = EventClock(config.tick, et.grace, et.lateness, et.max_backlog)
        self.sources: dict[str, SourceState] = {}
        for s in config.sources:
            self.sources[s.name] = SourceState(s.name, s.type, SOURCE_TYPES[s.type].kind)
        for name, (type_, kind) in extra_sources.items():
            self.sources[name] = SourceState(name, type_, kind)
        self.positions: dict[str, Any] = {}
        # Ledger rows handed over since the last save, per source (key -> JSON text or None).
        self.ledger: dict[str, dict[str, str | None]] = {}
        self.ticks = 0
        self.last_tick_end = 0.0
        self.last_tick_seconds = 0.0  # CPU time of the last evaluation
        self.backlog_skipped = 0  # cells of ticks older than max_backlog, counted late
        # The surfaces' layout for snapshots, with what it was made of (_layout).
        self._surface_layout: tuple[object, object, SurfaceLayout] | None = None

    # -- applying batches ----------------------------------------------------------------
    def start(self, now: float) -> None:
        """Begin judging the sources' watermarks (at service start)."""
        for name in self.sources:
            self.clock.attach(name, now)

    def apply(self, source: str, batch: Batch, now: float | None) -> None:
        """One batch of one source, in one step.  ``now`` None: a replay (no clock)."""
        state = self.sources.get(source)
        if state is None:
            kind = batch.events.kind if batch.events is not None else "egress"
            state = self.sources[source] = SourceState(source, "external", kind)
        for name, n in batch.counts.items():
            if n:
                state.counters[name] += n
                if name in JUDGED:
                    state.pending[name] += n
        if batch.forged_sample and not state.sample_fresh:
            state.forged_sample = sanitize(batch.forged_sample, FORGED_SAMPLE_CHARS)
            state.sample_fresh = True
        if batch.events is not None and len(batch.events):
            self._count(state, batch.events, now)
        if batch.position is not None:
            self.positions[source] = batch.position
        if batch.ledger:
            self.ledger.setdefault(source, {}).update(batch.ledger)
        self.clock.advance(source, batch.watermark, 0.0 if now is None else now)

    def _subject_rows(self, state: SourceState, ev: WriteEvents) -> np.ndarray:
        if ev.kind == NAMED:
            return self._named_rows(ev)
        kind_rows = self._kind_rows.get(ev.kind)
        if kind_rows is None:  # a kind nothing declares or feeds: nowhere to count it
            raise ValueError(f"source {state.name!r} handed over {ev.kind!r} events")
        classifier = self.classifiers[ev.kind]
        counted = KINDS[ev.kind].classifier_counters
        if not counted:
            return kind_rows[classifier.classify(ev.subjects, state.name)]
        # What the classifier counts while it classifies this source's batch is the source's.
        before = [getattr(classifier, c) for c in counted]
        surfaces = classifier.classify(ev.subjects, state.name)
        for c, was in zip(counted, before, strict=True):
            if getattr(classifier, c) != was:
                state.counters[f"classifier_{c}"] += getattr(classifier, c) - was
        return kind_rows[surfaces]

    def _named_rows(self, ev: WriteEvents) -> np.ndarray:
        """Subjects that name their surface ``(kind or None, name)``: the declared surface of
        that name (its kind is the declared one), else the stated kind's unclassified, counted
        in ``unknown_surface_events``."""
        table = self.table
        rows = np.empty(len(ev.subjects), dtype=np.int64)
        unknown = np.zeros(len(ev.subjects), dtype=bool)
        keys = ev.subjects.keys  # type: ignore[attr-defined]
        for i, (kind, name) in enumerate(keys):
            row = table.by_name.get(name)
            if row is None:
                unknown[i] = True
                row = table.index.get((kind, UNCLASSIFIED))
                if row is None:
                    row = table.index.get(("egress", UNCLASSIFIED), len(table) - 1)
            rows[i] = row
        if unknown.any():
            events = np.bincount(ev.subject, weights=ev.events, minlength=len(rows))
            table.unknown_surface_events += int(events[unknown].sum())
        return rows

    def _count(self, state: SourceState, ev: WriteEvents, now: float | None) -> None:
        subject_rows = self._subject_rows(state, ev)
        rows = subject_rows[ev.subject]
        keep = rows >= 0
        if not keep.all():
            rows, ev = rows[keep], _select(ev, keep)
        nbytes = ev.nbytes.astype(np.float64)
        events = ev.events.astype(np.float64)
        capacity = ev.capacity_bytes().astype(np.float64)
        idx, late, future = self.clock.place(ev.ts, now)
        if late:
            state.counters["late_events"] += late
        if future:
            state.counters["future_events"] += future
        self.table.count(rows, nbytes, events)
        self.clock.add(idx, rows, nbytes, events, capacity, len(self.table))
        self._stage_contributors(ev, subject_rows, idx, nbytes, capacity)

    def _stage_contributors(
        self,
        ev: WriteEvents,
        subject_rows: np.ndarray,
        ticks: np.ndarray,
        nbytes: np.ndarray,
        capacity: np.ndarray,
    ) -> None:
        """What each contributor wrote, tick by tick and surface by surface, staged in the tick
        its events count in (credited as evidence when that tick is evaluated), and added to
        the surfaces' totals.

        Summed in numpy per (tick, surface, contributor); only the contributors that can stay
        in a bounded heavy-hitter summary reach Python (HeavyHitters.add_batch): a Python
        step per (tick, flow) cell was most of a backtest's CPU, and grew with the flows."""
        contributors = contributor_table(ev.subjects)
        if contributors is None:
            # No subject names a contributor (write events replayed without one): nothing to
            # credit.
            return
        cid = contributors.of_subject[ev.subject]
        rows = subject_rows[ev.subject]
        keep = (cid >= 0) & (rows >= 0)
        if not keep.all():
            cid, rows, ticks = cid[keep], rows[keep], ticks[keep]
            nbytes, capacity = nbytes[keep], capacity[keep]
        if not len(cid):
            return
        n_c = contributors.count
        # One key per (tick, row, contributor), ordered that way: (row, contributor) pairs
        # made dense first, so the key stays far inside int64 whatever the table's size.
        # Where every pair of the table's rows and the batch's contributors is not many more
        # than the cells, the pair's own key is that dense index (no sort of the cells).
        pair = rows * n_c + cid
        if len(self.table) * n_c <= DENSE_PAIRS * max(len(pair), 1):
            pairs = np.arange(len(self.table) * n_c, dtype=np.int64)
        else:
            pairs, pair = np.unique(pair, return_inverse=True)
        first = int(ticks.min())
        cells, inverse = np.unique((ticks - first) * len(pairs) + pair, return_inverse=True)
        wrote = np.bincount(inverse, weights=nbytes, minlength=len(cells))
        carried = np.bincount(inverse, weights=capacity, minlength=len(cells))
        held = np.flatnonzero((wrote > 0) | (carried > 0))
        if not len(held):
            return
        cells, amounts = cells[held], wrote[held].astype(np.int64)
        tick, dense = cells // len(pairs) + first, cells % len(pairs)
        row, cid = pairs[dense] // n_c, pairs[dense] % n_c
        table = self.table
        # The surfaces' totals: per (row, contributor) over the whole batch.
        summed = np.bincount(dense, weights=amounts, minlength=len(pairs)).astype(np.int64)
        present = np.bincount(dense, minlength=len(pairs)) > 0
        totals, summed = pairs[present], summed[present]
        total_rows = totals // n_c
        for lo, hi in _runs(total_rows):
            table.credit_totals_batch(
                int(total_rows[lo]), totals[lo:hi] % n_c, summed[lo:hi], contributors
            )
        # The ticks' evidence: per (tick, row); cells are sorted by (tick, row, contributor).
        k = table.heavy_hitters
        for lo, hi in _runs(tick, row):
            cells_of_tick = self.clock.staged(int(tick[lo]))
            if cells_of_tick.credits is None:
                cells_of_tick.credits = StagedCredits(k)
            cells_of_tick.credits.add_batch(int(row[lo]), cid[lo:hi], amounts[lo:hi], contributors)

    # -- evaluating ticks ----------------------------------------------------------------
    def closable_end(self, now: float, health: Mapping[str, SourceHealth]) -> float:
        return self.clock.closable_end(now, health)

    def behind(self, end: float) -> bool:
        """Whether ticks ending by ``end`` are still to be evaluated."""
        nxt = self.clock.next_index
        return nxt is not None and math.isfinite(end) and (nxt + 1) * self.tick <= end + 1e-9

    def close_until(
        self,
        end: float,
        now: float | None = None,
        health: Mapping[str, SourceHealth] = {},
        limit: int | None = None,
    ) -> list[TickResult]:
        """Evaluate, in order, every tick that ends by ``end`` (at most ``limit`` of them:
        call again for the rest)."""
        if not math.isfinite(end):
            return []  # some source has not said how far it is yet
        clock = self.clock
        self.backlog_skipped += clock.begin(end, now)
        results = []
        n = len(self.table)
        # Between batches nothing changes the sources: when none has anything to be judged
        # on (quiet), none has for every tick of this call.  Contributors are held only
        # where a tick credited some.
        quiet = self._sources_quiet(health)
        recent = bool(self.table.has_recent.any())
        while clock.next_index is not None and (clock.next_index + 1) * self.tick <= end + 1e-9:
            if limit is not None and len(results) >= limit:
                break
            index = clock.next_index
            cells = clock.take(index)
            if cells.credits is not None:
                self.table.credit_staged(cells.credits)
                recent = True
            sums = cells.sums(n)  # (3, n): indexed, as unpacking it costs twice as much
            nbytes, events, capacity = sums[0], sums[1], sums[2]
            result, recent = self._evaluate(
                (index + 1) * self.tick, nbytes, events, capacity, health, quiet, recent, now
            )
            results.append(result)
        return results

    def _sources_quiet(self, health: Mapping[str, SourceHealth]) -> bool:
        """Whether judging the sources can change nothing: each is up and sees, has lost and
        forged nothing since it was last judged, and has no alert open."""
        detector = self.detector
        for name, s in self.sources.items():
            h = health.get(name)
            if (
                s.pending
                or not (h is None or (h.up and not h.blind))
                or not detector.sources.quiet(name)
            ):
                return False
        return True

    def _evaluate(
        self,
        end: float,
        nbytes: np.ndarray,
        events: np.ndarray,
        capacity: np.ndarray,
        health: Mapping[str, SourceHealth],
        quiet: bool,
        recent: bool,
        now: float | None = None,
    ) -> tuple[TickResult, bool]:
        """One tick: ``quiet``, no source to judge (_sources_quiet); ``recent``, some surface
        may hold recent contributors; ``now``, the wall clock (None in a backtest).  Returns
        the result and whether some still may."""
        tick = self.tick
        table = self.table
        detector = self.detector
        changes = detector.evaluate_arrays(end, tick, nbytes, events, self._evidence, capacity)
        if self.history is not None:
            self.history.record(end, *detector.last_tick_columns())
        judged = []
        for name, s in () if quiet else self.sources.items():
            h = health.get(name)
            if (
                not s.pending
                and (h is None or (h.up and not h.blind))
                and detector.sources.quiet(name)
            ):
                continue  # nothing to judge: up, seeing, nothing lost or forged, no alert
            judged.append(
                SourceJudgement(
                    name=name,
                    up=True if h is None else h.up,
                    last_error="" if h is None else h.last_error,
                    lost=s.pending["records_lost"],
                    lost_unknown=s.pending["records_lost_unknown"],
                    forged=s.pending["forged_records"],
                    lost_total=s.counters["records_lost"],
                    forged_total=s.counters["forged_records"],
                    blind="" if h is None else h.blind,
                )
            )
            s.pending.clear()
            s.sample_fresh = False
        if judged:
            for change in detector.sources.evaluate(end, tick, judged, now):
                sample = self.sources[change.target].forged_sample
                if change.rule == "forged_records" and sample:
                    change.figures["forged_sample"] = sample
                changes.append(change)
        # Forget the "recent" contributors of surfaces whose episode is over (quiet, no rule
        # pending or firing, no budget sum left), so the next alert's evidence is about the
        # next episode.  Only rows that hold any are looked at: most rows, most ticks, none.
        if recent and table.has_recent.any():
            holding = table.holding_recent((nbytes == 0) & (capacity == 0))
            if len(holding):
                open_ = self.detector.in_episode(holding)
                table.forget_recent(holding[~open_])
                table.name_recent(holding[open_])
                recent = bool(table.has_recent.any())
        else:
            recent = False
        self.ticks += 1
        self.last_tick_end = end
        return TickResult(end, changes), recent

    # -- state -------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """Everything but the detector's arrays (saved raw, see StateStore) as JSON."""
        return {
            "surfaces": self.table.to_state(),
            "positions": dict(self.positions),
            "sources": {
                n: {"type": s.type, "counters": dict(s.counters), "pending": dict(s.pending)}
                | ({"forged_sample": s.forged_sample} if s.forged_sample else {})
                for n, s in self.sources.items()
            },
            "event_time": self.clock.to_state(len(self.table)),
            "surface_keys": [f"{k}/{n}" for k, n in self.table.keys],
            "ticks": self.ticks,
            "last_tick_end": self.last_tick_end,
            "backlog_skipped": self.backlog_skipped,
        }

    def load_state(
        self,
        state: dict[str, Any],
        arrays: list[tuple[dict[str, Any], Mapping[str, np.ndarray | None]]] = (),  # type: ignore[assignment]
        now: float = 0.0,
    ) -> list[AlertChange]:
        """Restore a saved state (from disk, or from the pipeline a reload replaces).  Sources
        and surfaces no longer declared are dropped; each of their alerts that was firing is
        returned resolved ("removed from the configuration"), so no page stays open."""
        self.table.load_state(state.get("surfaces", {}))
        self.positions = {
            n: p for n, p in dict(state.get("positions", {})).items() if n in self.sources
        }
        for name, saved in dict(state.get("sources", {})).items():
            s = self.sources.get(name)
            if s is None or not isinstance(saved, dict):
                continue
            counters = saved.get("counters", saved)  # older states: the counters themselves
            for key, value in counters.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    s.counters[str(key)] = value
            for key, value in dict(saved.get("pending", {})).items():
                if key in JUDGED and isinstance(value, int):
                    s.pending[key] = value
            sample = saved.get("forged_sample")
            if isinstance(sample, str):
                s.forged_sample = sanitize(sample, FORGED_SAMPLE_CHARS)
        saved_keys = state.get("surface_keys")
        if isinstance(saved_keys, list):
            where = {key: i for i, key in enumerate(f"{k}/{n}" for k, n in self.table.keys)}
            rows_map = np.array([where.get(str(k), -1) for k in saved_keys], dtype=np.int64)
            self.clock.load_state(state.get("event_time", {}), rows_map, now)
        self.clock.sources = {n: c for n, c in self.clock.sources.items() if n in self.sources}
        self.ticks = int(state.get("ticks", 0))
        self.last_tick_end = float(state.get("last_tick_end", 0.0))
        self.backlog_skipped = int(state.get("backlog_skipped", 0))
        changes: list[AlertChange] = []
        if arrays:
            changes += self.detector.load_sources(arrays[0][0], set(self.sources), now)
        for header, group in arrays:
            changes += self.detector.load_arrays(header, group, now)
        return changes

    # -- what the exporters read -------------------------------------------------------
    def adopt_history(self, old: Pipeline) -> None:
        """Keep the charts of the surfaces a reload keeps."""
        where = {key: i for i, key in enumerate(old.detector.keys)}
        rows = np.array([where.get(key, -1) for key in self.detector.keys], dtype=np.int64)
        if self.history is not None and old.history is not None:
            self.history.adopt(old.history, rows)

    def snapshot(
        self,
        now: float,
        top: int,
        health: Mapping[str, SourceHealth],
        types: Mapping[str, str],
        request: SnapshotRequest | HistoryRequest | None = None,
    ) -> Snapshot:
        """A copy of everything the exposition needs, taken on the pipeline thread so that
        rendering can happen elsewhere without locks: every surface's figures as columns
        (alarm/snapshot.py), the top contributors of the surfaces ``request`` details, and
        the last hour of those it asks for.  ``types``: source name -> the type it is running
        as (``auto`` resolves to kmsg or journald).  ``request`` None: every surface
        detailed (what every snapshot cost before columns: tests, the demo); a
        ``HistoryRequest``: the last hour of, and details of, those surfaces (the status
        page); ``SnapshotRequest()``: columns only (/metrics)."""
        columns = self._columns()
        if isinstance(request, HistoryRequest):
            request = SnapshotRequest(history=request.limit, names=request.names)
        page: list[int] | None = None
        more, page_error = False, ""
        window = None
        if request is None:
            detail: Iterable[int] = range(len(columns))
        else:
            detail = []
            if request.limit:
                try:
                    page, more = columns.page(request.limit, request.after, request.order)
                except PageError as exc:
                    page_error = str(exc)
                detail = list(page or [])
            if request.history and self.history is not None:
                rows = columns.history_rows(request.history, request.names)
                window = self.history.window(rows)
                detail = [*detail, *rows]
        table = self.table
        contributors: dict[int, tuple[list[tuple[str, int]], int]] = {}
        for row in detail:
            if row < len(table) and row not in contributors:
                hitters = table.hitters[row]
                contributors[row] = (hitters.top(top), hitters.error)
        det = self.detector
        return Snapshot.of_columns(
            columns,
            contributors,
            taken_at=now,
            tick=self.tick,
            ticks=self.ticks,
            last_tick_end=self.last_tick_end,
            last_tick_seconds=self.last_tick_seconds,
            sources=self._source_views(health, types),
            source_alerts=[(n, r, int(m.state)) for (n, r), m in det.sources.alerts.items()],
            unknown_surface_events=table.unknown_surface_events,
            open_ticks=len(self.clock.open),
            backlog_skipped=self.backlog_skipped,
            pages_folded=dict(det.pages_folded),
            history=window,
            page=page,
            more=more,
            page_error=page_error,
        )

    def _layout(self) -> SurfaceLayout:
        """The surfaces' layout, made once (the detector's keys and horizons do not change
        in a pipeline's life; checked by identity all the same)."""
        det = self.detector
        kept = self._surface_layout
        if kept is not None and kept[0] is det.keys and kept[1] is det.budget.names:
            return kept[2]
        table = self.table
        members = {
            det.index[key]: np.array([table.index[m] for m in group], dtype=np.int64)
            for key, group in det.aggregates.items()
        }
        layout = SurfaceLayout(det.keys, det.budget.names, members)
        self._surface_layout = (det.keys, det.budget.names, layout)
        return layout

    def _columns(self) -> SurfaceColumns:
        """Every surface's figures as arrays, copied: a few milliseconds at 100,000
        surfaces, where a view per surface cost seconds."""
        det = self.detector
        layout = self._layout()
        table = self.table
        n = len(layout)
        bytes_total = np.zeros(n, dtype=np.int64)
        events_total = np.zeros(n, dtype=np.int64)
        members = len(table)
        bytes_total[:members] = table.bytes_total
        events_total[:members] = table.events_total
        for row, rows in layout.aggregate_members.items():
            bytes_total[row] = table.bytes_total[rows].sum()
            events_total[row] = table.events_total[rows].sum()
        figures = figure_columns(det)  # type: ignore[arg-type]
        rel = det.relative
        threshold = np.asarray(rel.threshold, dtype=np.float64)
        seasonal = np.zeros(n)
        judging = rel.judged & np.isfinite(threshold) & (threshold > 0)
        np.divide(rel.excess, threshold, out=seasonal, where=judging)
        bank = det.budget
        rules: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
            "spike": (det.spike_alerts.state.copy(), None),
            "budget": (det.budget_alerts.state.copy(), None),
        }
        for name, rule in det.rules.items():  # drop, beacon, duty and the rules on weeks
            rules[name] = (det.alert_banks[name].state.copy(), np.array(rule.enabled, dtype=bool))
        shift = np.full(n, np.nan)
        shift_threshold = np.full(n, np.nan)
        on = np.flatnonzero(det.swarm.enabled)
        if len(on):
            limit = det.swarm.threshold()[on]
            shift[det.members + on] = det.swarm.score[on]
            shift_threshold[det.members + on] = np.where(np.isfinite(limit), limit, 0.0)
        return SurfaceColumns(
            layout=layout,
            bytes_total=bytes_total,
            events_total=events_total,
            rate=figures.rate,
            events_rate=figures.events_rate,
            baseline=figures.baseline,
            threshold=figures.threshold,
            baseline_ready=figures.baseline_ready,
            capacity_bps=figures.capacity_bps,
            allowance=bank.allowance.copy(),
            tolerance=bank.tolerance.copy(),
            excess=bank.excess.copy(),
            seasonal_ratio=seasonal,
            seasonal_judged=np.array(rel.judged, dtype=bool),
            learning=np.array(det.spike.learning, dtype=bool),
            budget_misconfigured=np.array(bank.misconfigured, dtype=bool),
            rules=rules,
            members_shift=shift,
            members_shift_threshold=shift_threshold,
        )

    def _source_views(
        self, health: Mapping[str, SourceHealth], types: Mapping[str, str]
    ) -> list[SourceView]:
        sources = []
        for name, s in self.sources.items():
            h = health.get(name) or SourceHealth()
            clock = self.clock.sources.get(name)
            wm = clock.watermark if clock is not None and math.isfinite(clock.watermark) else 0.0
            sources.append(
                SourceView(
                    name=name,
                    type=types.get(name, s.type),
                    kind=s.kind,
                    health=_copy_health(h),
                    counters=dict(s.counters),
                    declared=s.declared_counters,
                    watermark=wm,
                )
            )
        return sources


def _runs(*columns: np.ndarray) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of each run of equal values (in every column at once)."""
    size = len(columns[0])
    change = np.zeros(max(size - 1, 0), dtype=bool)
    for column in columns:
        change |= column[1:] != column[:-1]
    cuts = [0, *(np.flatnonzero(change) + 1).tolist(), size]
    return pairwise(cuts)


def _copy_health(h: SourceHealth) -> SourceHealth:
    return SourceHealth(**{f: getattr(h, f) for f in SourceHealth.__slots__})  # type: ignore[attr-defined]


def _select(ev: WriteEvents, keep: np.ndarray) -> WriteEvents:
    return WriteEvents(
        ev.kind,
        ev.subjects,
        ev.subject[keep],
        ev.ts[keep],
        ev.nbytes[keep],
        ev.events[keep],
        None if ev.capacity is None else ev.capacity[keep],
    )


__all__ = ["JUDGED", "Pipeline", "SourceState", "SurfaceKey", "TickResult"]
