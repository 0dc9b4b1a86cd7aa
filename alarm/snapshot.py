"""What the exporters read: a copy of the pipeline's figures at one moment, plain data only, so
that rendering (/metrics, the API, the status page) happens off the pipeline thread without
locks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from alarm.events import SourceHealth


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
    drop_state: int | None = None  # None: the drop rule is off for this surface
    beacon_state: int | None = None  # None: the beacon rule is off for this surface
    duty_state: int | None = None  # None: the duty rule is off for this surface
    # The spike rule does not judge yet: its tails are not known (budgets and beacon protect).
    learning: bool = False
    # A declared budget that fired on ordinary traffic for a day: now judging what is on top.
    budget_misconfigured: bool = False
    # Aggregates only (None elsewhere, or where it is off): the members statistic and its
    # threshold (0 while not judged), alarm/detector/swarm.py.
    members_shift: float | None = None
    members_shift_threshold: float | None = None
    # The registered rules (alarm/detector/rules/) on for this surface, and their states.
    rule_alert_states: dict[str, int] = field(default_factory=dict)

    def rule_states(self) -> dict[str, int]:
        """Every rule on the surface and its alert state (0 inactive, 1 pending, 2 firing)."""
        optional = {"drop": self.drop_state, "beacon": self.beacon_state, "duty": self.duty_state}
        states = {"spike": self.spike_state, "budget": self.budget_state}
        states |= {rule: st for rule, st in optional.items() if st is not None}
        return states | self.rule_alert_states


@dataclass(slots=True)
class SourceView:
    name: str
    type: str  # the type it runs as (``auto`` shows as kmsg or journald)
    kind: str
    health: SourceHealth
    counters: dict[str, int]
    declared: list[str]  # the counters its type declares, exported even at 0
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
class Snapshot:
    taken_at: float
    tick: float
    ticks: int
    last_tick_end: float
    last_tick_seconds: float
    surfaces: list[SurfaceView]
    sources: list[SourceView]
    source_alerts: list[tuple[str, str, int]]  # source, rule, state
    unknown_surface_events: int
    open_ticks: int = 0
    backlog_skipped: int = 0
    # Pages the detector folded as not news, by (rule, reason) (detector/rules/precedent.py).
    pages_folded: dict[tuple[str, str], int] = field(default_factory=dict)
    # Only when asked for (the status page, ?history=1): never for a scrape of /metrics.
    history: HistoryWindow | None = None
    egress_canary: CanaryView | None = None
    _surface_labels: list[tuple[str, str]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def surface_labels(self) -> list[tuple[str, str]]:
        """(name, kind) of every surface: one list, shared by every per-surface family of a
        scrape (so that their label texts are made once)."""
        if self._surface_labels is None:
            self._surface_labels = [(s.name, s.kind) for s in self.surfaces]
        return self._surface_labels
