"""Detector: evaluates every surface (and every kind's aggregate) once per closed tick, and
holds the source rules (sources.py).

Surface state lives in numpy arrays, one row per surface (rows.py): the spike rule's levels
and tails (rules/spike.py, tail.py), the capacity budgets on every horizon (rules/budget.py),
the ledger of weeks (rules/ledger.py) and an alert bank per rule (alerts.AlertBank).  A tick
is the native tick (whole_tick.py: the core rules' one definition), then the registered rules
(rules/), then the fold of pages that are not news (rules/precedent.py); Python runs per
surface only for the few rows whose alert state changes.  Views (views.py) give the
per-surface objects the snapshot and the tests read.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from alarm.config import BudgetRule
from alarm.detector import fused, persist
from alarm.detector.alerts import AlertBank, AlertChange, AlertState, fingerprint, state_name
from alarm.detector.rows import AGGREGATE, as_slice, plan_rows
from alarm.detector.rules import RULES, Rule, RuleRows, TickInput
from alarm.detector.rules.budget import (
    ENVELOPE_MARGIN,
    MISCONFIGURED_SECONDS,
    BudgetBank,
    RelativeBank,
)
from alarm.detector.rules.ledger import Ledger
from alarm.detector.rules.precedent import LATE, Incidents, Precedent
from alarm.detector.rules.spike import (
    DAY,
    DAY_SLOTS_PER_HOUR,
    STATISTICS,
    Prediction,
    SeasonalBaseline,
    SizeLevel,
    SpikeJudgement,
    SpikeModel,
)
from alarm.detector.sources import REMOVED, SourceRules
from alarm.detector.swarm import MemberShift
from alarm.detector.tail import TailBank
from alarm.detector.views import SurfaceFigures, SurfaceMap
from alarm.detector.whole_tick import WholeTick
from alarm.surfaces import SurfaceKey

if TYPE_CHECKING:  # the assembled model: importing it imports every source type's settings
    from alarm.config import Config

log = logging.getLogger("capalarm.detector")

# The learned profiles: saved on a slower cadence than the rest of the state (state_arrays).
SLOW_ARRAYS = frozenset(
    {
        "baseline.day",
        "baseline.day_n",
        "baseline.week",
        "baseline.week_n",
        "size.hour",
        "size.hour_n",
        "relative.level",
        "relative.level_n",
        # The tails' kept peaks change only when an incident ends, and are 1 kB a surface.
        "spike.tail.kept",
        "swarm.tail.kept",
        *(f"ledger.{a}" for a in Ledger.SLOW),
    }
)
# The core rules' state a surface that starts late learns again from its first write.
RELEARNED = frozenset({"baseline", "size", "spike", "budget", "relative", "beacon", "duty"})
# An aggregate's alert names the members that wrote most in the tick, with their contributors.
AGGREGATE_EVIDENCE_MEMBERS = 5

# row -> its recent top contributors: (name, bytes, receipt or None)
Evidence = Callable[[int], list[tuple[str, int, dict[str, Any] | None]]]


class Detector:
    def __init__(self, config: Config, keys: list[SurfaceKey]):
        plan = plan_rows(config, keys)
        self._config = config
        self.tick = config.tick
        self.keys: list[SurfaceKey] = plan.keys
        self.index: dict[SurfaceKey, int] = {k: i for i, k in enumerate(self.keys)}
        self.members = plan.members
        self._member_keys = list(keys)
        self.targets = plan.targets
        n = len(self.keys)

        m = len(STATISTICS)
        shares = [m] * plan.members + [m + int(on) for on in plan.members_statistic]
        self.spike = SpikeModel(plan.spike, config.tick, shares)
        self.baseline = self.spike.baseline  # the rate level (what drop and figures read)
        self.budget = BudgetBank(plan.budget, config.tick, plan.derived, plan.floors)
        self.relative = RelativeBank(plan.budget, config.tick)
        self._relative_on = bool(self.relative.enabled.any())
        self._meta = plan.meta_bits
        self.spike_alerts = AlertBank(
            self.targets,
            "spike",
            np.array([r.hold for r in plan.spike]),
            np.array([r.resolve_hold for r in plan.spike]),
        )
        self._escalate = np.array([r.escalate_ratio for r in plan.spike], dtype=np.float64)
        self._escalate[self._escalate <= 0] = np.inf

        def at_once(rule: str, rules: Sequence[BudgetRule]) -> AlertBank:
            """The alert bank of a rule that fires on its first breached tick."""
            resolve = np.array([r.resolve_hold for r in rules])
            return AlertBank(self.targets, rule, np.zeros(n), resolve)

        self.budget_alerts = at_once("budget", plan.budget)
        self._budget_hyst = np.array([r.hysteresis for r in plan.budget])
        # Every surface rule's alert bank, by rule name.
        self.alert_banks: dict[str, AlertBank] = {
            "spike": self.spike_alerts,
            "budget": self.budget_alerts,
        }

        # Member row -> its aggregate's index (or the dummy index len(aggregates)).
        self.aggregates: dict[SurfaceKey, list[SurfaceKey]] = {}
        self._agg_count = len(plan.aggregate_of)
        self._agg_index = np.full(self.members, self._agg_count, dtype=np.int64)
        for j, members in enumerate(plan.aggregate_of):
            self._agg_index[members] = j
            self.aggregates[self.keys[self.members + j]] = [self.keys[i] for i in members]
        # Each aggregate's members, a slice where they are one run of rows.  Where some are
        # not (kinds declared interleaved) the native tick sums every aggregate by one gather
        # of the member rows grouped by aggregate (whole_tick.py), not by a slice each.
        self._agg_members: list[slice | np.ndarray] | None = None
        if self._agg_count:
            self._agg_members = [as_slice(np.asarray(m)) for m in plan.aggregate_of]
        self._agg_interleaved = self._agg_members is not None and not all(
            isinstance(m, slice) for m in self._agg_members
        )
        # The aggregates' members statistic (swarm.py), one more statistic of their spike rule.
        self.swarm = MemberShift(
            n,
            self._agg_members or plan.aggregate_of,
            plan.spike[self.members :],
            plan.members_statistic,
            config.tick,
            m + 1,
        )
        self._swarm_breach = np.zeros(self._agg_count, dtype=bool)

        # Last tick's figures, per row.
        self._rate = np.zeros(n)
        self._events_rate = np.zeros(n)
        self._capacity = np.zeros(n)
        self._base = np.zeros(n)
        self._bytes = np.zeros(n)
        # The last tick's bytes, events and capacity bits, every row (the registered rules').
        self._columns: tuple[np.ndarray, np.ndarray, np.ndarray] = (self._bytes,) * 3
        self._judgement: SpikeJudgement | None = None
        self._tick_seconds = config.tick
        self._spike_columns: tuple[np.ndarray, np.ndarray] | None = None

        self.surfaces = SurfaceMap(self)
        self.sources = SourceRules()  # the source rules (sources.py)
        # The registered rules (rules/), after the core ones, on the shared ledger of weeks.
        self.ledger = Ledger(n)
        derived = np.array(plan.derived, dtype=bool)
        rule_rows = RuleRows(
            self.targets,
            [k for k, _ in self.keys],
            self.members,
            derived,
            self.ledger,
            plan.aggregate_of,
            plan.settings,
            plan.budget,
            plan.spike,
            config.tick,
        )
        # Every surface rule by name (its words: ``describe_alert``); the core ones are judged
        # by the native tick, the others (``rules``) after it.
        self.surface_rules: dict[str, Rule] = {
            name: rule(rule_rows) for name, rule in RULES.items()
        }
        self.rules = {n: r for n, r in self.surface_rules.items() if not r.NATIVE_CORE}
        for name, rule in self.rules.items():
            self.alert_banks[name] = AlertBank(self.targets, name, rule.hold, rule.resolve_hold)
        self.drop_alerts = self.alert_banks["drop"]
        self.beacon_alerts = self.alert_banks["beacon"]
        self.duty_alerts = self.alert_banks["duty"]
        self.precedent = Precedent(self.ledger, derived)
        # Per registered rule: whether any of its alerts may be away from rest (a rule with
        # nothing to judge this tick steps its bank only then).
        self._rule_alerts_open = dict.fromkeys(self.rules, True)
        # What the tick's loop over the registered rules reads of each, looked up once.
        self._rule_banks = [
            (name, rule, self.alert_banks[name], rule.PER_BLOCK)
            for name, rule in self.rules.items()
        ]
        self.incidents = Incidents(n, list(self.alert_banks))
        # Pages folded since start, by (rule, reason): young, precedent or incident (_fold).
        self.pages_folded: dict[tuple[str, str], int] = {}
        # Saved arrays with a column per aggregate (restored by the aggregates' keys).
        self._per_aggregate = frozenset(
            f"{name}.{a}"
            for name, rule in self.rules.items()
            if rule.PER_AGGREGATE
            for a in rule.STATE
        )
        self._whole_slots: tuple[int, int] | None = None  # the slots the judgement's level is of
        # The days the tails last rolled to (whole tick; the swarm's and the spike rule's).
        self._whole_day: tuple[int, int] | None = None
        self._whole = self._whole_tick(plan.aggregate_of)

    def _whole_tick(self, aggregate_of: list[np.ndarray]) -> WholeTick | None:
        """The native whole tick (whole_tick.py) over the rows (None: there are none)."""
        if not len(self.keys):
            return None
        native = fused.required()
        judgement = self.spike.new_judgement()
        arrays = self.spike.tick_arrays() | self.budget.tick_arrays()
        arrays |= self.swarm.tick_arrays()
        for rule in ("spike", "budget"):
            arrays |= self.alert_banks[rule].tick_arrays()
        arrays |= {
            "meta_bits": self._meta,
            "budget.hysteresis": self._budget_hyst,
            "residuals": judgement.residuals,
            "judged": judgement.judged,
            "thresholds": judgement.thresholds,
            "over": judgement.over,
            "breach": judgement.breach,
            "clear": judgement.clear,
            "settled": judgement.settled,
            "size_level": judgement.size_level,
            "pred_y": judgement.level.pred_y,
            "baseline": judgement.level.baseline,
            "level_threshold": judgement.level.threshold,
            "ready": judgement.level.ready,
        }
        constants = self.spike.tick_constants() | self.budget.tick_constants()
        constants |= self.swarm.tick_constants()
        constants |= TailBank.tick_constants()
        constants |= {
            "gather": float(self._agg_interleaved),
        }
        whole = WholeTick(
            native,
            arrays,
            constants,
            self.members,
            aggregate_of,
            self.budget.excess.shape[0],
            len(self.keys),
        )
        judgement.log_bytes = whole.log_bytes
        self._native_judgement = judgement
        # The last tick's figures are the whole tick's buffers, filled in place each tick.
        self._judgement = judgement
        self._bytes = whole.columns[0]
        self._columns = (whole.columns[0], whole.columns[1], whole.columns[2])
        self._rate = whole.rate
        self._events_rate = whole.events_rate
        self._capacity = whole.capacity
        self._base = judgement.level.baseline
        self._swarm_breach = whole.swarm_breach
        return whole

    # -- surfaces ----------------------------------------------------------------------
    def evaluate_arrays(
        self,
        now: float,
        tick: float,
        nbytes: np.ndarray,
        events: np.ndarray,
        contributors: Evidence,
        capacity: np.ndarray | None = None,
    ) -> list[AlertChange]:
        """One tick for every row: ``nbytes``/``events`` are the members' tick totals in row
        order (the order of ``keys`` given to the constructor), ``capacity`` the bytes they
        could carry (None: ``nbytes``), which with the events' metadata bounds the bits."""
        changes = self._evaluate_core(now, tick, nbytes, events, contributors, capacity)
        return self._evaluate_rules(now, tick, changes, contributors)

    def _evaluate_rules(
        self, now: float, tick: float, changes: list[AlertChange], contributors: Evidence
    ) -> list[AlertChange]:
        """The registered rules on the tick the core rules judged, then the precedent fold
        of the short-memory rules' new pages (rules/precedent.py)."""
        start = now - tick
        nbytes, events, bits = self._columns
        ledger = self.ledger
        ledger.add(start, bits, events)
        if ledger.born.size:
            self._relearn(ledger.late(ledger.born, start, LATE))
        level = self._judgement.level if self._judgement is not None else None
        t = TickInput(
            now,
            tick,
            start,
            nbytes,
            events,
            bits,
            self._base if level is None else level.baseline,
            np.zeros(len(self.keys), dtype=bool) if level is None else level.ready,
            self.spike.rates,
        )
        closed = ledger.closed
        alerts_open = self._rule_alerts_open
        for name, rule, bank, per_block in self._rule_banks:
            if per_block and not closed:
                continue  # judged, and its alerts stepped, when a block closes
            judged = rule.judge(t)
            if judged is None:
                if not alerts_open[name]:
                    continue
                n = len(self.keys)
                judged = (np.zeros(n, dtype=bool), np.ones(n, dtype=bool))
            breached, clear = judged
            for row, prev, new in bank.step(now, tick, breached & rule.enabled, clear):
                changes.append(self._change(row, name, prev, new, now, contributors))
            alerts_open[name] = bool(bank.state.any())
        if changes and any(c.state == "firing" for c in changes):
            changes = self._fold(changes, now, tick)
        return changes

    def _fold(self, changes: list[AlertChange], now: float, tick: float) -> list[AlertChange]:
        """New pages that are not news are folded: the alert goes back to rest and nobody is
        paged.  A learning rule's page on a surface in its first days of life, or a
        short-memory rule's page on what the surface has done before (rules/precedent.py);
        and any page during an open incident on the surface (Incidents): one incident on a
        surface is one page, named by the rule that paged first, not one per rule."""
        kept = []
        precedent = self.precedent
        start = now - tick
        for c in changes:
            row = self.index.get((c.kind, c.target)) if c.target_type == "surface" else None
            if row is None or c.state != "firing" or c.previous == "firing":
                kept.append(c)
                continue
            if precedent.young(c.rule, row, start):
                reason = "young"
            elif precedent.foldable(c.rule, row) and precedent.recurs(c.rule, row, start):
                reason = "precedent"
            elif self.incidents.joins(c.rule, row, now):
                reason = "incident"
            else:
                reason = None
            if reason is not None:
                key = (c.rule, reason)
                self.pages_folded[key] = self.pages_folded.get(key, 0) + 1
                bank = self.alert_banks[c.rule]
                bank.state[row] = AlertState.INACTIVE
                bank.clear_since[row] = np.nan
                if c.rule == "budget" and self.budget.derived[row]:
                    self.budget.start_again(row)
                continue
            self.incidents.opened(c.rule, row, now)
            kept.append(c)
        return kept

    def _relearn(self, rows: np.ndarray) -> None:
        """Surfaces that first wrote a day or more after they were first watched learn from
        that first write: the core rules' state of each is set to a new surface's, as if it
        had been declared then.  Their days and weeks of silence taught the spike levels,
        the derived budget's envelope and the duty rule's days only that it writes nothing
        (docs/weeks.md).  Alerts, the ledger and the registered rules keep theirs."""
        for row in rows.tolist():
            if row >= self.members:
                continue
            key = self.keys[row]
            surfaces = [s for s in self._config.surfaces if (s.kind, s.name) == key]
            fresh = Detector(self._config.model_copy(update={"surfaces": surfaces}), [key])
            arrays = {
                name: array
                for name, array in fresh._state_arrays().items()
                if name.split(".", 1)[0] in RELEARNED
            }
            header = fresh.state_header()
            self.load_arrays({"keys": header["keys"], "horizons": header["horizons"]}, arrays)
            log.info(
                "%s/%s: first written a day or more after it was declared: learning it from now",
                *key,
            )

    def _evaluate_core(
        self,
        now: float,
        tick: float,
        nbytes: np.ndarray,
        events: np.ndarray,
        contributors: Evidence,
        capacity: np.ndarray | None = None,
    ) -> list[AlertChange]:
        """The core rules (spike, budget, the aggregates' members statistic) on one tick, on
        the native whole tick (whole_tick.py).  An ordinary tick (every alert at rest, no new
        day for the tails) is one native call; any other runs the passes one by one from
        here (``_evaluate_phases``)."""
        if self._whole is None:  # no rows
            return []
        native = self._whole.native
        nbytes, events = _float64(nbytes), _float64(events)
        capacity = None if capacity is None else _float64(capacity)
        spike_tail, swarm_tail = self.spike.tail, self.swarm.tail
        self._tick_seconds = tick
        self._spike_columns = None
        if self._relative_on:  # the seasonal budget judges between the native passes
            return self._evaluate_phases(now, tick, nbytes, events, contributors, capacity)
        roll = self._whole_day or (-(1 << 62), -(1 << 62))
        done = native.step(
            nbytes,
            events,
            capacity,
            now,
            tick,
            *roll,
            spike_tail.block,
            swarm_tail.block,
        )
        if isinstance(done, int):  # 0: not an ordinary tick, nothing done yet
            return self._evaluate_phases(now, tick, nbytes, events, contributors, capacity)
        if isinstance(done, tuple):  # tails to refit
            self._refit_tails(*done)
        elif isinstance(done, list):  # alert changes: built here, then the tick finished
            self._set_level_slots(now - tick)
            changes = self._whole_changes(done, now, contributors)
            self._refit_tails(*native.finish(tick, spike_tail.block, swarm_tail.block))
            return changes
        return []

    def _evaluate_phases(
        self,
        now: float,
        tick: float,
        nbytes: np.ndarray,
        events: np.ndarray,
        contributors: Evidence,
        capacity: np.ndarray | None,
    ) -> list[AlertChange]:
        """A tick that is not ordinary (``_evaluate_core``), pass by pass."""
        whole = self._whole
        assert whole is not None
        native = whole.native
        start = now - tick
        day_slot, week_slot = self._set_level_slots(start)
        native.begin(
            nbytes,
            events,
            capacity,
            tick,
            start,
            day_slot,
            (week_slot % 24) * DAY_SLOTS_PER_HOUR,
            week_slot,
            self.spike.hour_of(start),
        )
        if self._relative_on:
            projected, ratio, _ = self.relative.update(whole.columns[2], start)
            whole.relative_projected[:] = projected
            whole.relative_ratio[:] = ratio
        with np.errstate(over="ignore"):  # a level past float32's range is +inf, as in numpy
            np.exp(whole.exp_in, out=whole.exp_in)
        np.log(whole.log_bytes, out=whole.log_bytes)
        np.log(whole.log_rates, out=whole.log_rates)
        raw = native.rules(now, tick)
        changes = self._whole_changes(raw, now, contributors)
        # Learning: the tails' days roll first, as their update does.
        days = (int(now // DAY), int((start + tick) // DAY))
        if days != self._whole_day:
            self._whole_day = days
            if self._agg_count:
                self.swarm.tail.roll(now)
            self.spike.tail.roll(start + tick)  # the tick's end: the spike tails' clock
        self._refit_tails(*native.finish(tick, self.spike.tail.block, self.swarm.tail.block))
        return changes

    def _set_level_slots(self, start: float) -> tuple[int, int]:
        """The judgement's level names the slots of the tick that began at ``start``."""
        slots = self.baseline.slots(start)
        if slots != self._whole_slots:
            self._whole_slots = slots
            p = self._native_judgement.level
            self._native_judgement.level = Prediction(
                p.pred_y, p.baseline, p.threshold, p.ready, *slots
            )
        return slots

    def _whole_changes(
        self, raw: list[tuple[int, int, int, int]], now: float, contributors: Evidence
    ) -> list[AlertChange]:
        """The alert changes of the native tick's rules (bank, row, previous, new), built in
        the order evaluate_arrays builds them, with escalations and misconfigured budgets."""
        by_bank: list[list[tuple[int, AlertState, AlertState]]] = [[], []]
        for bank, row, prev, new in raw:
            by_bank[bank].append((row, AlertState(prev), AlertState(new)))
        spike_changes = by_bank[0]
        changes = [
            self._change(row, "spike", prev, new, now, contributors)
            for row, prev, new in spike_changes
        ]
        if spike_changes or self.spike_alerts.state.any():
            rate = self._rate
            for row in self.spike_alerts.escalations(rate, self._escalate, spike_changes):
                changes.append(
                    self._change(
                        row, "spike", AlertState.FIRING, AlertState.FIRING, now, contributors
                    )
                )
        for row, prev, new in by_bank[1]:
            changes.append(self._change(row, "budget", prev, new, now, contributors))
        self._misconfigured(now)
        return changes

    def _refit_tails(self, spike_rows: int, swarm_rows: int) -> None:
        """Refit the tails whose kept peaks the native tick changed (TailBank.end_incidents
        refits them at once)."""
        whole = self._whole
        assert whole is not None
        if swarm_rows:
            self.swarm.tail.refit(whole.swarm_tail_refit[:swarm_rows])
        if spike_rows:
            self.spike.tail.refit(whole.tail_refit[:spike_rows])

    def _misconfigured(self, now: float) -> None:
        """A declared budget firing on the surface's ordinary traffic for more than a day is
        misconfigured: say so once, and judge what comes on top of that traffic from now on."""
        bank = self.budget
        alerts = self.budget_alerts
        if not alerts.state.any():
            return  # every budget alert at rest: the usual tick
        rows = np.flatnonzero(alerts.state == AlertState.FIRING)
        if not rows.size:
            return
        # Read at the firing rows only: at 100k rows, passes over every row were most of it.
        long = ~bank.derived[rows] & ~bank.misconfigured[rows]
        long &= now - alerts.started_at[rows] > MISCONFIGURED_SECONDS
        rows = rows[long]
        ordinary = ENVELOPE_MARGIN * bank.envelope[:, rows] > bank.declared_allowance[:, rows]
        rows = rows[ordinary.any(axis=0)]
        for row in rows.tolist():
            log.warning(
                "%s: its declared budget has fired on its ordinary traffic for more than a day "
                "(misconfigured); from now on it judges what comes on top of that traffic",
                self.targets[row],
            )
        bank.mark_misconfigured(rows)

    def _spike_figures(self) -> tuple[np.ndarray, np.ndarray]:
        """The last tick's spike threshold (bytes/s a written tick must pass; +inf where not
        judged) and whether every statistic judged, per row.  Computed when first read: most
        ticks nobody reads them, and at 100k rows the exp alone is a millisecond."""
        if self._spike_columns is None:
            j = self._judgement
            if j is None:
                n = len(self.keys)
                return np.full(n, np.inf), np.zeros(n, dtype=bool)
            self._spike_columns = self._spike_figures_at(j, slice(None))
        return self._spike_columns

    def _spike_figures_of(self, row: int) -> tuple[float, bool]:
        """``_spike_figures`` of one row, without computing every row's: a tick's alert
        changes read a few rows, and the exp over 100k rows was a millisecond of each such
        tick.  numpy's exp of one value is the one it gives that value in the whole array."""
        if self._spike_columns is not None:
            threshold, ready = self._spike_columns
            return float(threshold[row]), bool(ready[row])
        j = self._judgement
        if j is None:
            return math.inf, False
        threshold, ready = self._spike_figures_at(j, slice(row, row + 1))
        return float(threshold[0]), bool(ready[0])

    def _spike_figures_at(self, j: SpikeJudgement, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        """The spike threshold (bytes/s) and readiness of ``rows`` from judgement ``j``."""
        ready = np.isfinite(j.thresholds[:, rows]).all(axis=0)
        threshold = np.exp(j.size_level[rows] + j.thresholds[0, rows]) / self._tick_seconds
        return threshold, ready

    def figures_of(self, row: int) -> SurfaceFigures:
        bank = self.budget
        spike_threshold, spike_ready = self._spike_figures_of(row)
        horizons = [
            (
                name,
                float(bank.allowance[i, row]),
                float(bank.tolerance[i, row]),
                float(bank.excess[i, row]),
            )
            for i, name in enumerate(bank.names[row])
        ]
        _, k0, h0, s0 = horizons[0]
        return SurfaceFigures(
            rate=float(self._rate[row]),
            events_rate=float(self._events_rate[row]),
            baseline=float(self._base[row]),
            # 0 where the spike rule does not judge (not ready, or disabled: +inf inside).
            threshold=(spike_threshold if spike_ready and math.isfinite(spike_threshold) else 0.0),
            baseline_ready=spike_ready,
            capacity_bps=float(self._capacity[row]),
            budget_excess=s0,
            budget_allowance=k0,
            budget_tolerance=h0,
            horizons=horizons,
            seasonal_ratio=self.relative.excess_ratio(row),
            seasonal_judged=bool(self.relative.judged[row]),
        )

    def spike_onset_scores(self) -> np.ndarray:
        """Every row's graded spike verdict for the last tick, at incident highs only
        (SpikeModel.onset_score); 0 where the rule does not judge."""
        if self._judgement is None:
            return np.zeros(len(self.keys))
        return self.spike.onset_score(self._judgement)

    def last_tick_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row's last tick, as copies: its rate (bytes/s), its spike threshold (NaN
        where the rule does not judge) and its budget excess over tolerance on the horizon
        nearest to firing (NaN where the budget is off)."""
        spike_threshold, spike_ready = self._spike_figures()
        judged = spike_ready & np.isfinite(spike_threshold)
        threshold = np.where(judged, spike_threshold, np.nan)
        bank = self.budget
        # Horizons a row lacks are padded with an infinite tolerance: their ratio is 0.
        ratio = np.where(bank.enabled, np.max(bank.excess / bank.tolerance, axis=0), np.nan)
        return self._rate.copy(), threshold, ratio

    def beacon_on(self, row: int) -> bool:
        return bool(self.rules["beacon"].enabled[row])

    def duty_on(self, row: int) -> bool:
        return bool(self.rules["duty"].enabled[row])

    def drop_on(self, row: int) -> bool:
        return bool(self.rules["drop"].enabled[row])

    def _change(
        self,
        row: int,
        rule: str,
        prev: AlertState,
        new: AlertState,
        now: float,
        contributors: Evidence,
    ) -> AlertChange:
        f = self.figures_of(row)
        binding = self.budget.binding(row)
        horizon, allow, tol, excess = f.horizons[binding]
        figures: dict[str, Any] = {
            "rate_bytes_per_second": f.rate,
            "events_per_second": f.events_rate,
            "baseline_bytes_per_second": f.baseline,
            "threshold_bytes_per_second": f.threshold,
            "capacity_bits_per_second": f.capacity_bps,
            # The horizon closest to its tolerance (the one that fired, for a budget alert).
            "budget_excess_bits": excess,
            "budget_allowance_bits_per_second": allow,
            "budget_tolerance_bits": tol,
            "budget_horizon": horizon,
            "budget_horizons": {
                name: {"allowance_bits_per_second": k, "tolerance_bits": h, "excess_bits": s}
                for name, k, h, s in f.horizons
            },
        }
        seasonal = self.relative.figures(row)
        figures["budget_seasonal"] = seasonal
        seasonal_ratio = self.relative.excess_ratio(row)
        seasonal_binds = rule == "budget" and seasonal_ratio > excess / tol
        if seasonal_binds:
            figures["budget_horizon"] = "seasonal"
        kind, name = self.keys[row]
        aggregate = row >= self.members
        if aggregate:
            figures["members"] = len(self.aggregates[self.keys[row]])
        value, threshold, what = self.surface_rules[rule].describe_alert(
            row, self, f, figures, seasonal_binds
        )
        state = state_name(new)
        if prev == new == AlertState.FIRING:
            figures["escalated"] = True
            what += " — escalated"
        bank = self.alert_banks[rule]
        who = f"all {kind} surfaces" if aggregate else f"{kind} surface {name}"
        summary = f"{who} {what}" + ("" if state != "resolved" else " — resolved")
        evidence: list[tuple[str, int, dict[str, Any] | None]] = []
        if state != "resolved":
            if aggregate:
                evidence = self._aggregate_evidence(row, contributors)
            else:
                evidence = contributors(row)
        return AlertChange(
            fingerprint=bank.fingerprint(row),
            target_type="surface",
            target=name,
            kind=kind,
            rule=rule,
            state=state,
            previous=state_name(prev),
            at=now,
            started_at=float(bank.started_at[row]),
            value=value,
            threshold=threshold,
            figures=figures,
            contributors=[(c, b) for c, b, _ in evidence],
            receipts={c: r for c, _, r in evidence if r},
            summary=summary,
        )

    # -- what the core rules' words read (rules/spike.py, rules/budget.py) ----------------
    def spike_figures_of(self, row: int) -> dict[str, Any]:
        """The spike rule's figures of ``row`` on the last tick (each statistic's)."""
        return self.spike.figures(row, self._judgement)

    def spike_threshold_of(self, row: int) -> float:
        """The rate (bytes/s) a tick of ``row`` had to pass (+inf where not judged)."""
        return self._spike_figures_of(row)[0]

    def spike_absolute_of(self, row: int) -> float:
        """``row``'s configured absolute_bytes_per_second (+inf: none)."""
        return float(self.spike.absolute[row])

    def members_shift_of(self, row: int) -> dict[str, float]:
        """An aggregate row's members statistic and its threshold (0 while not judged);
        nothing for a member row or where the statistic is off."""
        j = row - self.members
        if j < 0 or not self.swarm.enabled[j]:
            return {}
        threshold = float(self.swarm.threshold()[j])
        return {
            "members_shift": float(self.swarm.score[j]),
            "members_shift_threshold": threshold if math.isfinite(threshold) else 0.0,
        }

    def members_figures(self, j: int, figures: dict[str, Any]) -> str | None:
        """The members statistic's figures on aggregate ``j``; what it says when it is what
        fired (None otherwise)."""
        figures |= self.members_shift_of(self.members + j)
        if not self._swarm_breach[j]:
            return None
        score, threshold = figures["members_shift"], figures["members_shift_threshold"]
        shifted = self.swarm.top_members(j, AGGREGATE_EVIDENCE_MEMBERS)
        figures["statistic"] = "members"
        figures["members_shifted"] = [self.targets[i] for i in shifted]
        return (
            f"members write more per write than their own normal, many at once (members "
            f"shift {score:,.1f}, threshold {threshold:,.1f}; furthest above: "
            f"{', '.join(self.keys[i][1] for i in shifted) or 'none'})"
        )

    def _aggregate_evidence(
        self, row: int, contributors: Evidence
    ) -> list[tuple[str, int, dict[str, Any] | None]]:
        """The members that wrote most this tick, each with its own top contributors."""
        members = np.flatnonzero(self._agg_index == row - self.members)
        written = self._bytes[members]
        top = members[np.argsort(-written, kind="stable")[:AGGREGATE_EVIDENCE_MEMBERS]]
        out: list[tuple[str, int, dict[str, Any] | None]] = []
        for i in top.tolist():
            if self._bytes[i] <= 0:
                break
            name = self.keys[i][1]
            listed = [(f"{name}: {c}", b, r) for c, b, r in contributors(i)[:3]]
            out += listed or [(name, int(self._bytes[i]), None)]
        return out

    def firing(self) -> list[tuple[str, str, str]]:
        out = []
        for bank in self.alert_banks.values():
            for row in np.flatnonzero(bank.state == AlertState.FIRING):
                out.append((bank.targets[row], bank.rule, bank.fingerprint(int(row))))
        return out + self.sources.firing()

    def in_episode(self, rows: np.ndarray) -> np.ndarray:
        """Per row of ``rows``: whether an episode is still open on it — a rule pending or
        firing, or a capacity budget still carrying bits above its allowance (a drip's
        writes, however far apart, are one episode until its sum drains)."""
        open_ = self.budget.excess[:, rows].max(axis=0) > 0
        for bank in self.alert_banks.values():
            open_ |= bank.state[rows] != AlertState.INACTIVE
        return open_

    # -- state -------------------------------------------------------------------------
    def _state_arrays(self) -> dict[str, np.ndarray]:
        out = {f"baseline.{a}": getattr(self.baseline, a) for a in SeasonalBaseline.STATE}
        out |= {f"size.{a}": getattr(self.spike.size, a) for a in SizeLevel.STATE}
        out["spike.rates"] = self.spike.rates
        # The spike's tails are one bank of (statistic, row) pairs: saved with rows last, as
        # every state array is, so that restoring matches them by surface key.
        m = len(STATISTICS)
        for a in TailBank.STATE:
            flat = getattr(self.spike.tail, a)
            out[f"spike.tail.{a}"] = np.moveaxis(flat.reshape(m, -1, *flat.shape[1:]), 1, -1)
        out |= {f"swarm.{a}": getattr(self.swarm, a) for a in MemberShift.STATE}
        # The members statistic's tail has one row per aggregate (rows last, as above).
        for a in TailBank.STATE:
            out[f"swarm.tail.{a}"] = np.moveaxis(getattr(self.swarm.tail, a), 0, -1)
        out |= {f"budget.{a}": getattr(self.budget, a) for a in BudgetBank.STATE}
        out |= {f"relative.{a}": getattr(self.relative, a) for a in RelativeBank.STATE}
        out |= {f"ledger.{a}": getattr(self.ledger, a) for a in Ledger.STATE}
        out |= {f"incidents.{a}": getattr(self.incidents, a) for a in Incidents.STATE}
        for name, rule in self.rules.items():
            out |= {f"{name}.{a}": getattr(rule, a) for a in rule.STATE}
        for rule, bank in self.alert_banks.items():
            out |= {f"{rule}_alerts.{a}": getattr(bank, a) for a in AlertBank.STATE}
        return out

    def memory_bytes(self) -> int:
        """Bytes of per-row state and figures (not counting Python objects)."""
        figures = (
            self._rate,
            self._events_rate,
            self._capacity,
            self._base,
            *self._spike_figures(),
            self._bytes,
        )
        return (
            self.spike.nbytes()
            + self.budget.nbytes()
            + self.relative.nbytes()
            + self.swarm.nbytes()
            + self.ledger.nbytes()
            + sum(rule.nbytes() for rule in self.rules.values())
            + sum(bank.nbytes() for bank in self.alert_banks.values())
            + sum(a.nbytes for a in figures)
        )

    def to_state(self) -> dict:
        """Everything as one JSON-able dict (backtests, tests; older services saved this)."""
        self.ledger.flush()  # the ticks it keeps as they came are folded in, then saved
        return {
            **self.state_header(),
            "arrays": {name: persist.pack(a) for name, a in self._state_arrays().items()},
        }

    def state_header(self) -> dict:
        """What saved arrays need to be matched to rows again: keys and budget horizons."""
        return {
            "version": persist.VERSION,
            "keys": self.targets,
            "horizons": ["|".join(h) for h in self.budget.names],
            "sources": self.sources.to_state(),
            # Which day each block of the spike tails' kept peaks holds (shared by all rows).
            "tail_days": self.spike.tail.day.tolist(),
            "swarm_tail_days": self.swarm.tail.day.tolist(),
            "ledger": self.ledger.clock_state(),
        }

    def state_arrays(self, group: str) -> dict[str, np.ndarray]:
        """The state arrays of one save group: ``slow`` is the learned profiles (most of the
        bytes, and losing a few minutes of their learning costs nothing), ``fast`` the rest
        (alert states, CUSUM sums, recent levels: what must survive a crash to the tick)."""
        slow = group == "slow"
        self.ledger.flush()  # the ticks it keeps as they came are folded in, then saved
        return {n: a for n, a in self._state_arrays().items() if (n in SLOW_ARRAYS) == slow}

    def load_state(self, state: dict) -> None:
        if not isinstance(state, dict):
            return
        if state.get("version") == persist.VERSION:
            self.sources.load(state.get("sources"))
            arrays = state.get("arrays")
            if isinstance(arrays, dict):
                self.load_arrays(state, {n: persist.unpack(a) for n, a in arrays.items()})
        elif isinstance(state.get("surfaces"), dict):
            self._load_v1(state["surfaces"])

    def load_sources(self, header: dict, live: set[str], now: float) -> list[AlertChange]:
        """Restore the source alerts in ``header``; those of sources no longer declared are
        returned resolved, "removed from the configuration"."""
        self.sources.load(header.get("sources"))
        return self.sources.resolve_removed(live, now)

    def load_arrays(
        self, header: dict, arrays: Mapping[str, np.ndarray | None], now: float = 0.0
    ) -> list[AlertChange]:
        """Restore saved arrays (any subset of the state's) into the rows of the same keys.
        Rows no longer declared are left behind; each alert of theirs that was firing is
        returned resolved, "removed from the configuration", so that whoever was paged hears
        it ended."""
        changes = self._removed_rows(header, arrays, now)
        pairs = persist.match_rows(header.get("keys"), self.targets)
        if not pairs[0].size:
            return changes
        # Budget sums carry over only where the row's horizons are the same as when saved.
        saved_h = header.get("horizons")
        same = np.array(
            [
                isinstance(saved_h, list)
                and j < len(saved_h)
                and saved_h[j] == "|".join(self.budget.names[i])
                for j, i in zip(*pairs, strict=True)
            ],
            dtype=bool,
        )
        budget_pairs = (pairs[0][same], pairs[1][same])
        saved_keys = header.get("keys")
        aggregate_pairs = persist.match_rows(
            [k for k in saved_keys if str(k).endswith(f"/{AGGREGATE}")],
            self.targets[self.members :],
        )
        for name, target in self._state_arrays().items():
            if name in arrays:
                use = budget_pairs if name.startswith("budget.") else pairs
                if name.startswith("swarm.tail.") or name in self._per_aggregate:
                    use = aggregate_pairs
                persist.restore_rows(target, arrays[name], use)
        for rule in self.rules.values():
            rule.restored()
        self._whole_day = None  # the tails' days were restored: roll them on the next tick
        self.spike.tail.restore_days(header.get("tail_days"))
        self.ledger.load_clock(header.get("ledger"))
        self.swarm.tail.restore_days(header.get("swarm_tail_days"))
        return changes

    def _removed_rows(
        self, header: dict, arrays: Mapping[str, np.ndarray | None], now: float
    ) -> list[AlertChange]:
        saved_keys = header.get("keys")
        if not isinstance(saved_keys, list):
            return []
        current = set(self.targets)
        changes = []
        for rule in self.alert_banks:
            state = arrays.get(f"{rule}_alerts.state")
            started = arrays.get(f"{rule}_alerts.started_at")
            if state is None or state.shape != (len(saved_keys),):
                continue
            for j in np.flatnonzero(state == AlertState.FIRING).tolist():
                target = str(saved_keys[j])
                if target in current:
                    continue
                kind, _, name = target.partition("/")
                changes.append(
                    AlertChange(
                        fingerprint=fingerprint(target, rule),
                        target_type="surface",
                        target=name,
                        kind=kind,
                        rule=rule,
                        state="resolved",
                        previous="firing",
                        at=now,
                        started_at=float(started[j]) if started is not None else now,
                        value=0.0,
                        threshold=0.0,
                        figures={"removed": True},
                        summary=f"{kind} surface {name} was {REMOVED} — resolved",
                    )
                )
        return changes

    def _load_v1(self, surfaces: dict) -> None:
        """State saved by detector v1: per-surface window, CUSUM and alert dicts."""
        for row, target in enumerate(self.targets):
            saved = surfaces.get(target)
            if not isinstance(saved, dict):
                continue
            try:
                values = [float(v) for v in saved.get("baseline", {}).get("values", [])]
                if values:
                    self.baseline.seed(row, float(np.median(values)), len(values))
                self.budget.excess[0, row] = max(
                    0.0, float(saved.get("budget", {}).get("excess", 0.0))
                )
                self.spike_alerts.load_row(row, saved.get("spike_alert", {}))
                self.budget_alerts.load_row(row, saved.get("budget_alert", {}))
            except (TypeError, ValueError, AttributeError):
                continue


F64 = np.dtype(np.float64)


def _float64(values: np.ndarray) -> np.ndarray:
    """``values`` as C-contiguous float64, without a call where they already are."""
    if values.dtype is F64 and values.flags.c_contiguous:
        return values
    return np.ascontiguousarray(values, dtype=np.float64)


__all__ = ["AGGREGATE", "Detector", "SurfaceFigures"]
