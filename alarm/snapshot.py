"""What the exporters read: a copy of the pipeline's figures at one moment, plain data only, so
that rendering (/metrics, the API, the status page) happens off the pipeline thread without
locks.

At 100,000 surfaces a Python object per surface per request was most of a scrape (1-3 s,
issues 28 and 29).  So a snapshot is columns (``SurfaceColumns``: numpy arrays copied from the
detector and the surface table, a few milliseconds at 100k), which /metrics writes and the
attention order ranks; a ``SurfaceView`` is made only for a row something reads
(``Snapshot.surfaces[i]``), and the top contributors, which live in Python dicts, are copied
only for the rows a ``SnapshotRequest`` asks for (a page of the API, the status page's
cards).  What stays while the surfaces do (their names, label tuples, budget horizon names)
is a ``SurfaceLayout`` built once and shared by every snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from alarm.events import SourceHealth

# The rules every surface has (a view's own fields); the others follow where they are on, in
# the registry's order (alarm/detector/rules/), as each view's ``rule_alert_states`` holds them.
CORE_RULES = ("spike", "budget")
# A page of the API resumes after a surface named "KIND/NAME" (a kind has no '/').
AFTER_SEP = "/"


@dataclass(slots=True)
class SurfaceView:
    kind: str
    name: str
    bytes_total: int
    events_total: int
    rate: float
    events_rate: float
    baseline: float
    threshold: float
    baseline_ready: bool
    capacity_bps: float
    budget_excess: float
    budget_allowance: float
    budget_tolerance: float
    spike_state: int
    budget_state: int
    contributors: list[tuple[str, int]]
    contributors_error: int
    # Every budget horizon: (name, allowance bit/s, tolerance bits, excess bits).
    budget_horizons: list[tuple[str, float, float, float]] = field(default_factory=list)
    seasonal_ratio: float = 0.0
    seasonal_judged: bool = False
    # The spike rule does not judge yet: its tails are not known (budgets and beacon protect).
    learning: bool = False
    # A declared budget that fired on ordinary traffic for a day: now judging what is on top.
    budget_misconfigured: bool = False
    # Aggregates only (None elsewhere, or where it is off): the members statistic and its
    # threshold (0 while not judged), alarm/detector/swarm.py.
    members_shift: float | None = None
    members_shift_threshold: float | None = None
    # The other rules (alarm/detector/rules/) on for this surface, and their states.
    rule_alert_states: dict[str, int] = field(default_factory=dict)

    def rule_states(self) -> dict[str, int]:
        """Every rule on the surface and its alert state (0 inactive, 1 pending, 2 firing)."""
        return {"spike": self.spike_state, "budget": self.budget_state} | self.rule_alert_states


@dataclass(slots=True)
class SourceView:
    name: str
    type: str  # the type it runs as (``auto`` shows as kmsg or journald)
    kind: str
    health: SourceHealth
    counters: dict[str, int]
    declared: Mapping[str, str]  # the counters it keeps and their help, exported even at 0
    watermark: float = 0.0  # event time up to which it has handed everything over


@dataclass(slots=True)
class HistoryWindow:
    """The last hour of some surfaces (alarm/history.py): ``rows`` index ``Snapshot.surfaces``;
    each array is (len(rows), slots), oldest slot first, slot ``j`` starting at ``starts[j]``;
    NaN where nothing was evaluated, and in ``threshold`` where the spike rule did not judge."""

    rows: list[int]
    starts: np.ndarray
    slot_seconds: float
    rate: np.ndarray  # bytes/s (the largest tick of the slot)
    threshold: np.ndarray  # bytes/s
    budget_ratio: np.ndarray  # budget excess / tolerance, largest horizon (1: fires)


@dataclass(slots=True)
class CanarySourceView:
    """What one kernel source made of the egress canaries (alarm/collectors/kernel/canary.py)."""

    source: str
    seen: int
    missed: int
    last_seen: float  # unix s the source read a canary's record (0: never)
    last_latency: float  # seconds from sending to reading, of the last one seen
    blind: str  # why the canary makes the source blind ("" while it sees)


@dataclass(slots=True)
class CanaryView:
    address: str
    port: int
    netns: str
    interval: float
    deadline: float
    sent: int
    send_errors: int
    last_sent: float
    last_error: str
    sources: list[CanarySourceView] = field(default_factory=list)


@dataclass(slots=True)
class StateSaveView:
    """The service's checkpoints (alarm/statesave.py): counts since start, the last one's
    figures, the WAL file's size now."""

    saves: int
    failures: int
    last_seconds: float  # wall time of the last checkpoint
    last_at: float  # unix s it ended (0: none yet)
    last_bytes: int  # bytes it wrote: changed array chunks, JSON texts, ledger rows
    last_chunks: int  # array chunks it wrote
    bytes_total: int
    chunks_total: int
    wal_bytes: int


@dataclass(slots=True)
class Snapshot:
    taken_at: float
    tick: float
    ticks: int
    last_tick_end: float
    last_tick_seconds: float
    surfaces: Sequence[SurfaceView]
    sources: list[SourceView]
    source_alerts: list[tuple[str, str, int]]  # source, rule, state
    unknown_surface_events: int
    open_ticks: int = 0
    backlog_skipped: int = 0
    internal_errors: int = 0  # the pipeline's calls that raised (alarm/failures.py)
    # Pages the detector folded as not news, by (rule, reason) (detector/rules/precedent.py).
    pages_folded: dict[tuple[str, str], int] = field(default_factory=dict)
    # Only when asked for (the status page, ?history=1): never for a scrape of /metrics.
    history: HistoryWindow | None = None
    egress_canary: CanaryView | None = None
    # The service's state saves (None: a pipeline without a state store: tests, backtest).
    state_save: StateSaveView | None = None
    # The page a SnapshotRequest asked for: its rows of ``surfaces`` and whether more follow
    # (None: none asked for); ``page_error``: why the page could not be found (a cursor that
    # names no surface), "" otherwise.
    page: list[int] | None = None
    more: bool = False
    page_error: str = ""
    _columns: SurfaceColumns | None = field(default=None, repr=False, compare=False)

    @property
    def columns(self) -> SurfaceColumns:
        """Every surface's figures as arrays (made from ``surfaces`` once when the snapshot
        was built from views, as tests build them)."""
        if self._columns is None:
            self._columns = SurfaceColumns.from_views(list(self.surfaces))
        return self._columns

    @property
    def surface_labels(self) -> list[tuple[str, str]]:
        """(name, kind) of every surface: one list, shared by every per-surface family of a
        scrape (so that their label texts are made once) and, from a pipeline, by every
        snapshot while the surfaces stay (so that a scrape finds them unchanged at once)."""
        return self.columns.layout.labels

    @classmethod
    def of_columns(
        cls,
        columns: SurfaceColumns,
        contributors: dict[int, tuple[list[tuple[str, int]], int]],
        **fields: object,
    ) -> Snapshot:
        """A snapshot whose ``surfaces`` are made from ``columns`` when read."""
        snap = cls(surfaces=SurfaceRows(columns, contributors), **fields)  # type: ignore[arg-type]
        snap._columns = columns
        return snap


class PageError(ValueError):
    """A page cursor (``after``) that names no surface."""


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """What a snapshot copies beyond its columns.  ``limit`` surfaces of a page, in ``order``
    ("config": as declared, resumed after the surface ``after`` names, "KIND/NAME";
    "attention": what needs a look first, from the top), detailed: their top contributors
    copied; ``history``: the last hour of that many surfaces in attention order (only those
    named in ``names`` when given), detailed too.  ``SnapshotRequest()``: columns only (a
    scrape of /metrics)."""

    limit: int = 0
    order: str = "config"
    after: str | None = None
    history: int = 0
    names: frozenset[str] | None = None


class SurfaceLayout:
    """What stays while a pipeline's surfaces do: their keys, the label tuples every
    per-surface family shares, their budget horizons' names; and what is worked out from
    those once, when first asked (the name order, a name's rows, the horizon label rows).
    Shared by every snapshot of a pipeline, read from the HTTP threads: what is worked out
    lazily is the same whichever thread does it first."""

    def __init__(
        self,
        keys: Sequence[tuple[str, str]],
        horizon_names: Sequence[Sequence[str]],
        aggregate_members: dict[int, np.ndarray] | None = None,
    ) -> None:
        self.keys = list(keys)  # (kind, name) of every row
        self.kinds = [k for k, _ in self.keys]
        self.names = [n for _, n in self.keys]
        self.labels: list[tuple[str, str]] = [(n, k) for k, n in self.keys]
        self.horizon_names = [tuple(h) for h in horizon_names]
        self.horizon_count = np.array([len(h) for h in self.horizon_names], dtype=np.int64)
        # Aggregate row -> its members' rows in the surface table.
        self.aggregate_members = aggregate_members or {}
        self._rank: np.ndarray | None = None
        self._index: dict[tuple[str, str], int] | None = None
        self._by_name: dict[str, list[int]] | None = None
        self._pairs: tuple[np.ndarray, np.ndarray] | None = None
        self._horizon_labels: list[tuple[str, ...]] | None = None
        self._info: tuple[np.ndarray, list[tuple[str, ...]]] | None = None
        self._groups: dict[str, dict[tuple[str, str], np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def rank(self) -> np.ndarray:
        """Each row's place in (kind, name) order: the attention order's last key."""
        if self._rank is None:
            order = sorted(range(len(self.keys)), key=self.keys.__getitem__)
            rank = np.empty(len(order), dtype=np.int64)
            rank[np.array(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
            self._rank = rank
        return self._rank

    def row_of(self, kind: str, name: str) -> int | None:
        if self._index is None:
            index: dict[tuple[str, str], int] = {}
            for i, key in enumerate(self.keys):
                index.setdefault(key, i)
            self._index = index
        return self._index.get((kind, name))

    def rows_named(self, names: frozenset[str]) -> np.ndarray:
        """Whether each row's surface is named in ``names``."""
        if self._by_name is None:
            by_name: dict[str, list[int]] = {}
            for i, name in enumerate(self.names):
                by_name.setdefault(name, []).append(i)
            self._by_name = by_name
        mask = np.zeros(len(self.keys), dtype=bool)
        for name in names:
            mask[self._by_name.get(name, [])] = True
        return mask

    def horizon_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (row, horizon) a surface has, row by row: the rows and the horizon indices."""
        if self._pairs is None:
            width = max(1, int(self.horizon_count.max(initial=0)))
            have = np.arange(width)[None, :] < self.horizon_count[:, None]
            self._pairs = np.nonzero(have)
        return self._pairs

    def horizon_labels(self) -> list[tuple[str, ...]]:
        """The label tuples (name, kind, horizon) of ``horizon_pairs``."""
        if self._horizon_labels is None:
            rows, index = self.horizon_pairs()
            self._horizon_labels = [
                (self.names[r], self.kinds[r], self.horizon_names[r][i])
                for r, i in zip(rows.tolist(), index.tolist(), strict=True)
            ]
        return self._horizon_labels

    def kind_horizon_groups(self, leave_out: str) -> dict[tuple[str, str], np.ndarray]:
        """(kind, horizon) -> where in ``horizon_pairs`` its pairs are, in order, the
        surfaces named ``leave_out`` left out; in the order each first occurs."""
        kept = self._groups.get(leave_out)
        if kept is None:
            rows, index = self.horizon_pairs()
            combos: dict[tuple[str, tuple[str, ...]], int] = {}
            combo = np.fromiter(
                (
                    combos.setdefault(key, len(combos))
                    for key in zip(self.kinds, self.horizon_names, strict=True)
                ),
                dtype=np.int64,
                count=len(self.keys),
            )
            kept_rows = np.array([name != leave_out for name in self.names], dtype=bool)
            pair_combo = np.where(kept_rows[rows], combo[rows], -1)
            masks: dict[tuple[str, str], np.ndarray] = {}
            for (kind, names), c in combos.items():
                for i, horizon in enumerate(names):
                    mask = (pair_combo == c) & (index == i)
                    got = masks.get((kind, horizon))
                    masks[(kind, horizon)] = mask if got is None else got | mask
            groups = {key: np.flatnonzero(mask) for key, mask in masks.items()}
            groups = {key: at for key, at in groups.items() if len(at)}
            kept = dict(sorted(groups.items(), key=lambda item: int(item[1][0])))
            self._groups[leave_out] = kept
        return kept

    def info_rows(self, codes: np.ndarray) -> list[tuple[str, ...]]:
        """capalarm_surface_info's label tuples for these state codes (4 bits a row: ready,
        learning, misconfigured, seasonal judged): the same list as last time when no code
        changed (so a scrape finds its labels unchanged at once), else a copy with the rows
        that changed made again."""
        bit = ("0", "1")

        def row(i: int, c: int) -> tuple[str, ...]:
            return (
                self.names[i],
                self.kinds[i],
                bit[c & 1],
                bit[(c >> 1) & 1],
                bit[(c >> 2) & 1],
                bit[(c >> 3) & 1],
            )

        kept = self._info
        if kept is not None and len(kept[0]) == len(codes):
            changed = np.flatnonzero(kept[0] != codes)
            if not len(changed):
                return kept[1]
            rows = list(kept[1])
            for i, c in zip(changed.tolist(), codes[changed].tolist(), strict=True):
                rows[i] = row(i, c)
        else:
            rows = [row(i, c) for i, c in enumerate(codes.tolist())]
        self._info = (codes.copy(), rows)
        return rows


@dataclass(slots=True)
class SurfaceColumns:
    """Every surface's figures at one moment, a numpy array each (row ``i`` is
    ``layout.keys[i]``): what ``SurfaceView`` holds for one surface.  Budget horizons are
    (horizon, row) arrays, padded past ``layout.horizon_count``; rule states are one array a
    rule, with where the rule is on (None: everywhere), in ``rule_states`` order."""

    layout: SurfaceLayout
    bytes_total: np.ndarray  # int64
    events_total: np.ndarray  # int64
    rate: np.ndarray
    events_rate: np.ndarray
    baseline: np.ndarray
    threshold: np.ndarray  # 0 where the spike rule does not judge
    baseline_ready: np.ndarray  # bool
    capacity_bps: np.ndarray
    allowance: np.ndarray  # (horizons, rows), bit/s
    tolerance: np.ndarray  # bits
    excess: np.ndarray  # bits
    seasonal_ratio: np.ndarray
    seasonal_judged: np.ndarray  # bool
    learning: np.ndarray  # bool
    budget_misconfigured: np.ndarray  # bool
    rules: dict[str, tuple[np.ndarray, np.ndarray | None]]
    members_shift: np.ndarray  # NaN where there is none (members, or off)
    members_shift_threshold: np.ndarray

    def __len__(self) -> int:
        return len(self.layout)

    # -- one row ------------------------------------------------------------------------
    def rule_states(self, row: int) -> dict[str, int]:
        return {
            rule: int(states[row])
            for rule, (states, on) in self.rules.items()
            if on is None or on[row]
        }

    def view(
        self, row: int, contributors: list[tuple[str, int]] | None = None, error: int = 0
    ) -> SurfaceView:
        """Row ``row`` as a SurfaceView (``contributors``: its top contributors, [] when the
        snapshot did not copy them)."""
        kind, name = self.layout.keys[row]
        count = int(self.layout.horizon_count[row])
        horizons = [
            (
                h,
                float(self.allowance[i, row]),
                float(self.tolerance[i, row]),
                float(self.excess[i, row]),
            )
            for i, h in enumerate(self.layout.horizon_names[row][:count])
        ]
        first = horizons[0] if horizons else ("", 0.0, 0.0, 0.0)
        states = self.rule_states(row)
        shift = float(self.members_shift[row])
        aggregate: dict[str, float] = {}
        if not math.isnan(shift):
            aggregate = {
                "members_shift": shift,
                "members_shift_threshold": float(self.members_shift_threshold[row]),
            }
        return SurfaceView(
            kind=kind,
            name=name,
            bytes_total=int(self.bytes_total[row]),
            events_total=int(self.events_total[row]),
            rate=float(self.rate[row]),
            events_rate=float(self.events_rate[row]),
            baseline=float(self.baseline[row]),
            threshold=float(self.threshold[row]),
            baseline_ready=bool(self.baseline_ready[row]),
            capacity_bps=float(self.capacity_bps[row]),
            budget_excess=first[3],
            budget_allowance=first[1],
            budget_tolerance=first[2],
            spike_state=states.pop("spike", 0),
            budget_state=states.pop("budget", 0),
            contributors=list(contributors or []),
            contributors_error=error,
            budget_horizons=horizons,
            seasonal_ratio=float(self.seasonal_ratio[row]),
            seasonal_judged=bool(self.seasonal_judged[row]),
            learning=bool(self.learning[row]),
            budget_misconfigured=bool(self.budget_misconfigured[row]),
            rule_alert_states=states,
            **aggregate,
        )

    # -- every row ----------------------------------------------------------------------
    def worst(self) -> np.ndarray:
        """Each row's worst rule state (0 inactive, 1 pending, 2 firing)."""
        worst = np.zeros(len(self), dtype=np.int64)
        for states, on in self.rules.values():
            s = states.astype(np.int64)
            if on is not None:
                s = np.where(on, s, 0)
            np.maximum(worst, s, out=worst)
        return worst

    def _horizon_valid(self, i: int) -> np.ndarray:
        return i < self.layout.horizon_count

    def near(self) -> np.ndarray:
        """How near each row is to a threshold or tolerance (1: at it), as the attention
        order weighs it: its budgets' sums over their tolerances, its rate over its spike
        threshold where that judges."""
        tol0, exc0 = self.tolerance[0], self.excess[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            near = np.where(tol0 > 0, exc0 / tol0, 0.0)
            for i in range(self.tolerance.shape[0]):
                tol, exc = self.tolerance[i], self.excess[i]
                ratio = exc / tol
                take = self._horizon_valid(i) & (tol > 0) & np.isfinite(tol) & (ratio > near)
                near = np.where(take, ratio, near)
            judged = self.baseline_ready & (self.threshold > 0)
            ratio = self.rate / self.threshold
            near = np.where(judged & (ratio > near), ratio, near)
        return near

    def attention_order(self) -> np.ndarray:
        """Rows, what needs a look first: firing, then pending, then the surfaces closest to
        their threshold or tolerance, then by kind and name (alarm/history.py's
        attention_order, on the columns)."""
        return np.lexsort((self.layout.rank, -self.near(), -self.worst()))

    def states(self) -> dict[str, int]:
        """How many surfaces are firing, pending (any rule), else judged or learning."""
        worst = self.worst()
        firing = int(np.count_nonzero(worst == 2))
        pending = int(np.count_nonzero(worst == 1))
        quiet = worst == 0
        judged = int(np.count_nonzero(quiet & self.baseline_ready))
        learning = int(np.count_nonzero(quiet & ~self.baseline_ready))
        return {"firing": firing, "pending": pending, "judged": judged, "learning": learning}

    def budget_figures(self) -> tuple[np.ndarray, np.ndarray]:
        """Each row's (budget ratio, hour allowance in bit/s): exporters.prometheus's
        budget_figures, on the columns."""
        ratio = np.where(self.seasonal_judged, self.seasonal_ratio, 0.0)
        hour = np.full(len(self), np.inf)
        with np.errstate(divide="ignore", invalid="ignore"):
            for i in range(self.tolerance.shape[0]):
                valid = self._horizon_valid(i)
                tol, exc = self.tolerance[i], self.excess[i]
                r = exc / tol
                ratio = np.where(valid & (tol > 0) & (r > ratio), r, ratio)
                h = self.allowance[i] + tol / 3600
                hour = np.where(valid & (h < hour), h, hour)
        return ratio, hour

    def page(self, limit: int, after: str | None, order: str) -> tuple[list[int], bool]:
        """The rows on one page and whether more follow: ``order`` "config", the declared
        order resumed after the surface ``after`` names ("KIND/NAME"); "attention", from the
        top (it changes every tick, so it has no ``after``).  PageError for a cursor that
        names no surface."""
        n = len(self)
        if order == "attention":
            if after is not None:
                raise PageError("after: not with order=attention (the order changes every tick)")
            return self.attention_order()[:limit].tolist(), limit < n
        start = 0
        if after is not None:
            kind, sep, name = after.partition(AFTER_SEP)
            found = self.layout.row_of(kind, name) if sep else None
            if found is None:
                raise PageError(f"after: no surface {after[:80]!r}")
            start = found + 1
        return list(range(start, min(start + limit, n))), start + limit < n

    def history_rows(self, limit: int, names: frozenset[str] | None) -> list[int]:
        """The ``limit`` rows that need a look first (of those named in ``names``)."""
        order = self.attention_order()
        if names is not None:
            order = order[self.layout.rows_named(names)[order]]
        return order[:limit].tolist()

    @classmethod
    def from_views(cls, views: Sequence[SurfaceView]) -> SurfaceColumns:
        """The columns of views made one by one (a test's snapshot)."""
        n = len(views)
        layout = SurfaceLayout(
            [(v.kind, v.name) for v in views],
            [[h[0] for h in v.budget_horizons] for v in views],
        )
        width = max(1, int(layout.horizon_count.max(initial=0)))
        allowance = np.zeros((width, n))
        tolerance = np.full((width, n), np.inf)
        excess = np.zeros((width, n))
        for row, v in enumerate(views):
            for i, (_, k, h, s) in enumerate(v.budget_horizons):
                allowance[i, row], tolerance[i, row], excess[i, row] = k, h, s
            if not v.budget_horizons:  # the surface's own figures stand for its first one
                allowance[0, row], tolerance[0, row] = v.budget_allowance, v.budget_tolerance
                excess[0, row] = v.budget_excess
        names: list[str] = [*CORE_RULES]
        for v in views:
            names += [r for r in v.rule_alert_states if r not in names]
        rules: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for rule in names:
            got = [v.rule_states().get(rule) for v in views]
            on = np.array([s is not None for s in got], dtype=bool)
            states = np.array([s or 0 for s in got], dtype=np.int8)
            if rule in CORE_RULES or on.all():
                rules[rule] = (states, None)
            elif on.any():
                rules[rule] = (states, on)

        def col(attr: str, dtype: type = np.float64) -> np.ndarray:
            return np.array([getattr(v, attr) for v in views], dtype=dtype)

        def opt(attr: str) -> np.ndarray:
            got = [getattr(v, attr) for v in views]
            return np.array([math.nan if x is None else x for x in got], dtype=np.float64)

        return cls(
            layout=layout,
            bytes_total=col("bytes_total", np.int64),
            events_total=col("events_total", np.int64),
            rate=col("rate"),
            events_rate=col("events_rate"),
            baseline=col("baseline"),
            threshold=col("threshold"),
            baseline_ready=col("baseline_ready", bool),
            capacity_bps=col("capacity_bps"),
            allowance=allowance,
            tolerance=tolerance,
            excess=excess,
            seasonal_ratio=col("seasonal_ratio"),
            seasonal_judged=col("seasonal_judged", bool),
            learning=col("learning", bool),
            budget_misconfigured=col("budget_misconfigured", bool),
            rules=rules,
            members_shift=opt("members_shift"),
            members_shift_threshold=opt("members_shift_threshold"),
        )


class SurfaceRows(Sequence[SurfaceView]):
    """``Snapshot.surfaces`` of a pipeline's snapshot: each view made from the columns when
    read.  ``contributors``: row -> (top contributors, error) of the rows the snapshot copied
    them for; any other row's view has none."""

    def __init__(
        self,
        columns: SurfaceColumns,
        contributors: dict[int, tuple[list[tuple[str, int]], int]],
    ) -> None:
        self._columns = columns
        self._contributors = contributors

    def __len__(self) -> int:
        return len(self._columns)

    @overload
    def __getitem__(self, i: int) -> SurfaceView: ...

    @overload
    def __getitem__(self, i: slice) -> list[SurfaceView]: ...

    def __getitem__(self, i: int | slice) -> SurfaceView | list[SurfaceView]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        row = i % n if n else i
        contributors, error = self._contributors.get(row, ([], 0))
        return self._columns.view(row, contributors, error)

    def __iter__(self) -> Iterator[SurfaceView]:
        for row in range(len(self)):
            yield self[row]
