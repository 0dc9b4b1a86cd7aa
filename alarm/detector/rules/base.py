"""What a registered rule is: its rows, its state, its judgement each tick, and its words.

A rule sees every row (members, then each kind's aggregate), the tick's totals and the shared
ledger (ledger.py), and returns which rows breach and which are clear; the detector steps its
alert bank and builds the alert documents, with the rule's own figures and sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from alarm.detector.rules.ledger import Ledger
from alarm.detector.views import SurfaceFigures


@dataclass(slots=True, frozen=True)
class RuleRows:
    """What a rule knows of the rows when it is built."""

    targets: list[str]  # "kind/name" per row
    kinds: list[str]
    members: int  # rows [0, members) are surfaces, the rest aggregates
    derived: np.ndarray  # bool per row: the budget is derived (none declared)
    ledger: Ledger
    # For aggregate row members + j: the member rows it sums.
    aggregate_of: list[np.ndarray]
    # Per row, what was configured for it (rows.RowPlan.settings).
    settings: list[Any]
    # Per row, the budget in force (declared, derived or the kind's; rows.RowPlan.budget),
    # which holds the timing rules' settings (beacon, duty).
    budgets: list[Any]
    # Per row, the spike rule in force (rows.RowPlan.spike), which holds the drop rule's.
    spikes: list[Any]
    tick: float  # the configured tick, seconds

    def section(self, name: str) -> list[Any]:
        """Each row's configuration of rule ``name`` (None where the row has none: an
        unclassified row, or an aggregate for a surface rule)."""
        return [getattr(s, name, None) for s in self.settings]


@dataclass(slots=True)
class TickInput:
    """One closed tick, every row: its totals and when it began."""

    now: float
    tick: float
    start: float
    nbytes: np.ndarray
    events: np.ndarray
    bits: np.ndarray  # the capacity bound: 8 x bytes carried + metadata per event
    # The spike rule's view of the tick: its rate level (bytes/s) and whether that level is
    # ready, and the rates averaged over 5 and 30 minutes (2, rows).
    baseline: np.ndarray
    baseline_ready: np.ndarray
    rates: np.ndarray


class CoreFigures(Protocol):
    """What the core rules' words read of the detector (engine.Detector) for one row."""

    members: int

    def spike_figures_of(self, row: int) -> dict[str, Any]: ...

    def spike_threshold_of(self, row: int) -> float: ...

    def spike_absolute_of(self, row: int) -> float: ...

    def members_figures(self, j: int, figures: dict[str, Any]) -> str | None: ...


class Rule:
    """A rule registered by name (rules/__init__.py)."""

    name: ClassVar[str]
    # What the rule's page means for whoever is paged (notify_config's default severity).
    SEVERITY: ClassVar[str] = "warning"
    # Every surface shows this rule's state (the API, the status page), not only where it is on.
    EVERYWHERE: ClassVar[bool] = False
    # Its pages say the surface's rate against its threshold (what the pages' summaries lead
    # with).
    RATE_PAGE: ClassVar[bool] = False
    # Which of its new pages rules/precedent.py folds when they are not news: a scheduled
    # run's (``precedent``), a late starter's first days (``young``); ``clock_only``: only a
    # precedent on the clock (a scheduled write) folds it, never one at any time.
    FOLDS: ClassVar[frozenset[str]] = frozenset()
    # Judged inside the native tick (whole_tick.py), not by ``judge``: the core rules.
    NATIVE_CORE: ClassVar[bool] = False
    # Per-row state arrays (rows last), saved with the detector; SLOW among them on the slow
    # cadence (they change when a window closes, not every tick).
    STATE: ClassVar[tuple[str, ...]] = ()
    SLOW: ClassVar[frozenset[str]] = frozenset()
    RESOLVE_HOLD: ClassVar[float] = 3600.0
    # Whether the STATE arrays have a column per aggregate rather than per row.
    PER_AGGREGATE: ClassVar[bool] = False
    # Whether the rule judges (and its alerts step) only when the ledger closes a block.
    PER_BLOCK: ClassVar[bool] = False

    def __init__(self, rows: RuleRows) -> None:
        self.rows = rows
        n = len(rows.targets)
        self.enabled = np.ones(n, dtype=bool)
        # How long each row's breach lasts before its alert fires (0: on the first tick).
        self.hold = np.zeros(n)
        # How long each row's alert stays clear before it resolves.
        self.resolve_hold = np.full(n, self.RESOLVE_HOLD)

    def configured(self) -> list[Any]:
        """Each row's configuration of this rule (None where it has none)."""
        return self.rows.section(self.name)

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        """(breached, clear) per row, or None when nothing can change this tick.  The arrays
        are read during the tick only (the alert bank's step): a rule may hand over its own."""
        raise NotImplementedError

    def restored(self) -> None:
        """Saved state was loaded into the rule's arrays: rebuild what is derived from them."""

    def describe(self, row: int) -> tuple[float, float, str, dict[str, Any]]:
        """(value, threshold, what the surface did, figures) for an alert on ``row``."""
        raise NotImplementedError

    def describe_alert(
        self,
        row: int,
        core: CoreFigures,
        f: SurfaceFigures,
        figures: dict[str, Any],
        seasonal_binds: bool,
    ) -> tuple[float, float, str]:
        """(value, threshold, what the surface did) for an alert on ``row``, whose last tick
        is ``f``, the rule's own figures added to ``figures`` (the detector's common ones:
        engine.Detector._change)."""
        value, threshold, what, extra = self.describe(row)
        figures |= extra
        return value, threshold, what

    def nbytes(self) -> int:
        return sum(getattr(self, a).nbytes for a in self.STATE)


class CoreRule(Rule):
    """A core rule (spike, budget): judged inside the native tick, shown on every surface, its
    pages leading with the rate, folded as news or not like the rules that learn a normal."""

    EVERYWHERE: ClassVar[bool] = True
    RATE_PAGE: ClassVar[bool] = True
    FOLDS: ClassVar[frozenset[str]] = frozenset({"precedent", "young"})
    NATIVE_CORE: ClassVar[bool] = True

    def judge(self, t: TickInput) -> tuple[np.ndarray, np.ndarray] | None:
        return None  # judged by the native tick (whole_tick.py)
