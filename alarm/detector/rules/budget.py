"""Budget rule: more bits carried above a surface's allowance than its tolerance, on any
horizon (a CUSUM per horizon, declared or derived from what the surface carries), or on the
seasonal budget where it is on (docs/detector.md, "Capacity budgets").

One file holds the rule: the budgets' settings and state (``BudgetBank``), the seasonal
budget's (``RelativeBank``), their figures, and what the alert says.  One numeric definition
judges and learns it: the native tick (``budgets`` of _whole_tick.c with ``_fused.c``'s
``budget_loop``; the seasonal budget's projection joins it there), which reads and writes these
arrays in place.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from alarm.config import BudgetRule
from alarm.detector.rules.base import CoreFigures, CoreRule
from alarm.detector.views import SurfaceFigures
from alarm.settings import parse_duration

# ----------------------------------------------------------------------------------------
# Lampson capacity budget: a one-sided CUSUM on the bits a surface could have carried.
#
# Each tick adds the tick's capacity bound (8 x bytes + a metadata allowance per event) and
# subtracts what the surface may carry (allowance k x tick length).  The sum never goes below 0,
# so quiet time earns no credit beyond zero; when it exceeds the tolerance h, more than h bits
# above the allowance have gone through: the largest leak tolerated has been reached.  Active from
# the first tick — no learning period excuses an open channel.
#
# Budgets that fit the surface.  A declared surface without a budget of its own (and a kind's
# aggregate) gets one *derived from what it carries*, horizon by horizon:
#
# - the allowance is its envelope — the largest mean capacity over a window of the horizon
#   (two sets of windows, the second half a window later, so that no boundary splits a job
#   shorter than half a window), the current windows included, forgetting over two weeks —
#   times ``ENVELOPE_MARGIN``, never below
#   the unclassified surface's allowance (the tightest budget there is).  While the surface is
#   new (``LEARNING_SECONDS``) the envelope follows the traffic freely; after that it may rise by
#   at most ``max_learn_up`` a day, so a drip on a quiet surface outruns it;
# - the tolerance, the margin in bits, is ``MARGIN_WINDOWS`` windows at that allowance (never
#   below the unclassified tolerance): to fire, a window must carry four times what the
#   allowance lets through, five times the most the surface carried in a window of the
#   horizon.  A quiet surface, whose envelope is a few stray packets an hour, gets a small one,
#   and a drip of 10 bit/s is caught within hours; a busy one a large one;
# - while the surface is new, the kind's default budget (what ``rules`` holds) protects it,
#   its allowance raised to the envelope (a busy surface is not a leak); after that a horizon
#   as short as ``BURST_WINDOW`` is off: bursts are the spike rule's, whose thresholds are
#   calibrated, while a minute's envelope cannot know a cache's next warm-up.
#
# One numeric definition: a tick of the budgets is ``budgets`` in alarm/detector/_whole_tick.c
# (the windows' means, then ``budget_loop`` of _fused.c per horizon: each cell's mode, envelope
# and sums), run by the whole native tick; this module holds the budgets' settings, state and
# figures.
#
# A declared budget that fires on a surface's ordinary traffic for more than
# ``MISCONFIGURED_SECONDS`` is reported as misconfigured (``misconfigured``) and from then on
# judges what comes on top of that traffic, as a derived one does, instead of holding one page
# open forever.

ENVELOPE_MARGIN = 1.25  # a derived allowance is this much above the envelope
# A derived tolerance is this many windows at the allowance: to fire, a window must carry four
# times the allowance, five times the most the surface carried in one (a cache's warm-up
# carries a few times an ordinary hour).
MARGIN_WINDOWS = 3.0
BURST_WINDOW = 60.0  # derived budgets have no horizon this short (bursts are spikes)
ENVELOPE_MEMORY = 14 * 86400.0  # the envelope forgets with this time constant
LEARNING_SECONDS = 86400.0
SETTLED_WINDOW = 86400.0  # windows this long are read over at least half a window
MISCONFIGURED_SECONDS = 86400.0
WINDOW_MAX = 7 * 86400.0


def horizon_window(name: str, allowance: float, tolerance: float) -> float:
    """A horizon's window in seconds: its name where it is a duration ("1m", "1h", "1d"),
    else the CUSUM's own time scale, tolerance / allowance."""
    try:
        return min(WINDOW_MAX, max(1.0, parse_duration(name)))
    except ValueError:
        return min(WINDOW_MAX, max(1.0, tolerance / max(allowance, 1e-9)))


def capacity_bits(nbytes: int, events: int, meta_bits_per_event: float) -> float:
    return 8.0 * nbytes + meta_bits_per_event * events


class BudgetBank:
    """Capacity budgets of every row on every horizon at once: ``S[H, n]``.

    Rows with fewer horizons than the widest are padded with an infinite allowance and
    tolerance, which keeps their sum at 0 and their ratio at 0.  The alarm looks one tick
    ahead: it fires when the sum would pass the tolerance on the next tick at the current
    rate, so a steady leak is stopped before h bits above the allowance, not a tick after.
    Only a rise sustained over two ticks is projected: a single legitimate burst is judged on
    what it carried, not on what it would carry if it went on.
    """

    STATE = (
        "excess",
        "last_step",
        "follow_excess",
        "envelope",
        "settled_envelope",
        "window_bits",
        "age",
        "misconfigured",
    )

    def __init__(
        self,
        rules: list[BudgetRule],
        tick: float = 10.0,
        derived: list[bool] | None = None,
        floors: list[BudgetRule] | None = None,
        max_learn_up: float = 4.0,
    ):
        """``derived``: rows whose budget is derived from what they carry (``rules`` holds
        what protects them while they are new); ``floors``: per row, the least a derived
        budget may allow, horizon by horizon (the unclassified budget of its kind)."""
        horizons = [_horizon_list(r) for r in rules]
        width = max((len(h) for h in horizons), default=1)
        n = len(rules)
        self.tick = tick
        self.names: list[list[str]] = [[name for name, _, _ in h] for h in horizons]
        self.declared_allowance = np.full((width, n), np.inf)
        self.declared_tolerance = np.full((width, n), np.inf)
        self.window = np.ones((width, n), dtype=np.int64)  # ticks
        for row, hs in enumerate(horizons):
            for i, (name, k, h) in enumerate(hs):
                self.declared_allowance[i, row] = k
                self.declared_tolerance[i, row] = h
                self.window[i, row] = max(1, round(horizon_window(name, k, h) / tick))
        self.derived = np.array(derived if derived is not None else [False] * n, dtype=bool)
        self.floor_allowance = np.zeros((width, n))
        self.floor_tolerance = np.zeros((width, n))
        for row, floor in enumerate(floors or []):
            fl = _horizon_list(floor)
            for i in range(width):
                _, k, h = fl[min(i, len(fl) - 1)]
                self.floor_allowance[i, row] = k
                self.floor_tolerance[i, row] = h
        self.enabled = np.array([r.enabled for r in rules], dtype=bool)
        self.allowance = self.declared_allowance.copy()
        self.tolerance = self.declared_tolerance.copy()
        self._inv_tolerance = 1.0 / self.tolerance  # 0 on padding
        self.excess = np.zeros((width, n))
        self.last_step = np.zeros((width, n))
        self.envelope = np.zeros((width, n))  # bits/s
        # While a row is new its envelope follows the windows' means so far, the first ticks
        # of a window included (a busy surface must not overrun its default budget on day 0);
        # the envelope it keeps afterwards is this one, of windows at least half full.
        self.settled_envelope = np.zeros((width, n))
        # Bits so far in the current windows: [0] aligned to the start, [1] half a window on.
        self.window_bits = np.zeros((2, width, n))
        self.age = np.zeros(n)
        self.misconfigured = np.zeros(n, dtype=bool)
        # Horizons a derived budget keeps (see the module docstring).
        self.fitted = self.window * tick > BURST_WINDOW

        self._forget = math.exp(-tick / ENVELOPE_MEMORY)
        self._rise = max_learn_up ** (tick / 86400.0)
        # The sum over the envelope's allowance, for every row: a declared budget may turn
        # out to be misconfigured, and then it follows what the surface carries too.
        self.follow_excess = np.zeros((width, n))

    def tick_arrays(self) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name."""
        names = ("excess", "last_step", "follow_excess", "envelope", "settled_envelope")
        names += ("window_bits", "age", "misconfigured", "declared_allowance")
        names += ("declared_tolerance", "window", "derived", "floor_allowance")
        names += ("floor_tolerance", "enabled", "allowance", "tolerance", "fitted")
        out = {f"budget.{a}": getattr(self, a) for a in names}
        out["budget.inv_tolerance"] = self._inv_tolerance
        return out

    def tick_constants(self) -> dict[str, float]:
        """The scalars the whole native tick needs of the budgets (fused.py)."""
        return {
            "learning_seconds": LEARNING_SECONDS,
            "settled_window": SETTLED_WINDOW,
            "envelope_margin": ENVELOPE_MARGIN,
            "margin_windows": MARGIN_WINDOWS,
            "forget": self._forget,
            "rise": self._rise,
        }

    def nbytes(self) -> int:
        fixed = (self.allowance, self.tolerance, self.declared_allowance, self.window)
        return sum(a.nbytes for a in fixed) + sum(getattr(self, a).nbytes for a in self.STATE)

    def mark_misconfigured(self, rows: np.ndarray) -> None:
        """Declared budgets that fired on ordinary traffic for too long: judge from now on what
        comes on top of it (the sum starts again, so the page closes)."""
        if not rows.size:
            return
        self.misconfigured[rows] = True
        self.excess[:, rows] = 0.0
        self.follow_excess[:, rows] = 0.0
        self.last_step[:, rows] = 0.0

    def start_again(self, row: int) -> None:
        """A derived budget's page was folded (rules/precedent.py): what it summed is known
        traffic or part of an incident already paged, so its sums start again and it judges
        what comes on top."""
        self.excess[:, row] = 0.0
        self.follow_excess[:, row] = 0.0
        self.last_step[:, row] = 0.0

    def binding(self, row: int) -> int:
        """The horizon closest to (or furthest past) its tolerance."""
        return int(np.argmax(self.excess[:, row] / self.tolerance[:, row]))


def look_ahead(after: np.ndarray, step: np.ndarray, last_step: np.ndarray) -> np.ndarray:
    """The CUSUM one tick ahead: ``after`` plus the rise sustained over the last two ticks (a
    single tick's rise, a burst, is not projected).  A new array."""
    projected = np.minimum(step, last_step)
    np.maximum(projected, 0.0, out=projected)
    projected += after
    return projected


def _horizon_list(rule: BudgetRule) -> list[tuple[str, float, float]]:
    out = [(rule.horizon, rule.allowance_bits_per_second, rule.tolerance_bits)]
    out += [(h.horizon, h.allowance_bits_per_second, h.tolerance_bits) for h in rule.horizons]
    return out


# ----------------------------------------------------------------------------------------
# Seasonal (relative) capacity budget: a CUSUM on what a surface carries *above what it
# normally carries at this hour*, for the low-and-slow leaks the absolute budgets cannot see.
#
# The absolute budgets (budget.py) allow a surface what its busiest hour needs.  A board or wiki
# that takes a few writes an hour by day is allowed that all night too, so a drip or a beacon
# that stays under the daytime allowance is never seen.  This rule judges each tick against the
# same hour's history instead.
#
# Per row and tick, with ``bits`` the tick's capacity bound (8 x bytes + metadata per event):
#
# - score ``g = ln(1 + bits / U)``, U = 64 bits (one event's metadata).  Every tick that carries
#   anything scores at least ln 2; a tick carrying 1000x more scores only ~7 more.  Legitimate
#   writes on sparse surfaces are rare and large, leaks are small and persistent: on the log
#   score the persistence dominates, and one big write cannot fire the rule.
# - seasonal level ``mu``: the mean of g per hour of the day (24 slots), learned only while the
#   clock is in the slot; the prediction is the highest ready value among the slot and its two
#   neighbours (a job that drifts by an hour).  Once a slot has seen one full occurrence, its
#   level may rise by at most ``max_learn_up`` (on mu + eps) per day: a patient attacker cannot
#   walk it up faster than that.
# - allowance ``a = max(ratio x mu, g(min_allowance x tick))``.  With ratio = (r - 1)/ln r this
#   is the CUSUM allowance that is optimal for a Bernoulli/Poisson activity rate rising r-fold
#   (ratio 3 ~ r 7): the test behaves like a count test on sparse surfaces and is inert on busy
#   ones, where every tick is active and the mean is already high.
# - tolerance ``H = tolerance x max(scale, g)``, scale = E[g^2]/E[g] over about a week (the
#   size-biased mean score of the surface's active ticks): H is "this many typical writes above
#   the allowance", and never less than that many copies of the current tick, so a single tick,
#   however large, cannot fire it alone (bursts are the spike rule's and the absolute budgets').
# - ``S = max(0, S + g - a)``; like the absolute budgets, it looks one tick ahead on a rise
#   sustained over two ticks.  It judges once the surface has ``min_history`` and the hour has a
#   ready level; it never judges before (the absolute budgets do, from the first tick).
#
# RelativeBank.update is numpy, vectorised over rows, between the native passes (the
# projection and ratio the native tick reads).

DAY = 86400.0
WEEK = 7 * DAY
SLOT = 3600.0
SLOTS = int(DAY / SLOT)
SCORE_UNIT_BITS = 64.0  # one event's metadata (DEFAULT_META_BITS_PER_EVENT)
PROFILE_MEMORY = 7.0  # occurrences (days) a slot's mean averages over
SCORE_FLOOR = math.log(2.0)  # the score of one empty event: the least a scale can be


def score(bits: np.ndarray) -> np.ndarray:
    return np.log1p(np.maximum(bits, 0.0) / SCORE_UNIT_BITS)


def score_to_bits(g: np.ndarray | float) -> np.ndarray | float:
    return SCORE_UNIT_BITS * np.expm1(g)


class RelativeBank:
    """Rows are surfaces; every method works on all rows at once."""

    STATE = (
        "level",
        "level_n",
        "ex",
        "ex2",
        "count",
        "excess",
        "last_step",
        "run_bits",
        "slot_start",
        "slot_at",
    )

    def __init__(self, rules: list[BudgetRule], tick: float):
        n = len(rules)
        rel = [r.relative for r in rules]
        f64 = np.float64
        self.tick = tick
        self.enabled = np.array([r.enabled and x.enabled for r, x in zip(rules, rel, strict=True)])
        self._any_enabled = bool(self.enabled.any())
        self.ratio = np.array([x.ratio for x in rel], dtype=f64)
        self.tolerance_scale = np.array([x.tolerance for x in rel], dtype=f64)
        self.min_allow = score(np.array([x.min_allowance_bits_per_second for x in rel]) * tick)
        # eps of the rise cap: the least level a slot counts as having.
        self.eps = np.maximum(self.min_allow, 1e-3).astype(np.float32)
        self.min_ticks = np.array([max(1, round(x.min_history / tick)) for x in rel], np.int64)
        self.slot_ticks = max(1.0, SLOT / tick)
        # Largest factor a ready slot's level (+ eps) may rise by in one occurrence (a day).
        self.rise = np.array([x.max_learn_up for x in rel], dtype=np.float32)
        self.alpha_slot = np.float32(1.0 / (PROFILE_MEMORY * self.slot_ticks))
        self.alpha_scale = min(1.0, tick / WEEK)

        f32 = np.float32
        self.level = np.zeros((SLOTS, n), dtype=f32)
        self.level_n = np.zeros((SLOTS, n), dtype=np.uint16)
        self.ex = np.zeros(n, dtype=f32)
        self.ex2 = np.zeros(n, dtype=f32)
        self.count = np.zeros(n, dtype=np.int64)
        self.excess = np.zeros(n)
        self.last_step = np.zeros(n)
        self.run_bits = np.zeros(n)  # capacity bits carried since the sum last stood at 0
        # The current slot's level when its occurrence began (what the rise cap is against).
        self.slot_start = np.zeros(n, dtype=f32)
        self.slot_at = np.full(n, -1, dtype=np.int64)  # that occurrence: start // SLOT
        # Last tick's figures (for alerts), per row.
        self._allow = np.zeros(n)  # score per tick
        self.judged = np.zeros(n, dtype=bool)
        self.threshold = np.full(n, np.inf)  # H, score
        self.mu = np.zeros(n)
        self._around = np.zeros(n, dtype=f32)  # max level of the current slot's neighbours
        self._around_slot = -1

    def nbytes(self) -> int:
        return sum(getattr(self, a).nbytes for a in self.STATE)

    def update(self, bits: np.ndarray, start: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One tick that began at ``start``.  Returns (projected S/H, S/H, judged)."""
        if not self._any_enabled:
            # Off everywhere (the default): nothing to judge or learn; a tenth of a tick's
            # cost at 100k surfaces is not spent on it.
            zeros = np.zeros(bits.size)
            return zeros, zeros, np.zeros(bits.size, dtype=bool)
        f32 = np.float32
        g = score(bits)
        s = int((start % DAY) // SLOT)
        # The neighbours' levels do not change during the hour (only the current slot learns):
        # their maximum is taken once per hour.
        if self._around_slot != s:
            self._around = np.full(g.size, -np.inf, dtype=f32)
            for slot in ((s - 1) % SLOTS, (s + 1) % SLOTS):
                ok = self.level_n[slot] >= self.slot_ticks
                np.maximum(self._around, np.where(ok, self.level[slot], -np.inf), out=self._around)
            self._around_slot = s
        ok = self.level_n[s] >= self.slot_ticks
        mu = np.where(ok, self.level[s], -np.inf)
        np.maximum(mu, self._around, out=mu)
        judged = np.isfinite(mu)
        judged &= self.enabled
        judged &= self.count >= self.min_ticks
        mu[~judged] = 0.0
        allow = mu * self.ratio
        np.maximum(allow, self.min_allow, out=allow)
        scale = np.divide(self.ex2, self.ex, out=np.zeros(g.size, f32), where=self.ex > 0)
        h = np.maximum(scale, SCORE_FLOOR)
        np.maximum(h, g, out=h)
        h *= self.tolerance_scale

        before = self.excess
        after = before + g
        after -= allow
        np.maximum(after, 0.0, out=after)
        after *= judged
        step = after - before
        ratio = after / h
        projected = look_ahead(after, step, self.last_step)
        projected /= h
        self.run_bits += bits
        self.run_bits *= after > 0
        self.excess = after
        self.last_step = step
        self._allow = allow
        self.judged = judged
        self.threshold = h
        self.mu = mu
        self._learn(g, s, start)
        return projected, ratio, judged

    def _learn(self, g: np.ndarray, s: int, start: float) -> None:
        f32 = np.float32
        g32 = g.astype(f32)
        n1 = (self.count + 1).astype(f32)
        a = np.maximum(f32(1.0) / n1, f32(self.alpha_scale))
        self.ex += a * (g32 - self.ex)
        self.ex2 += a * (g32 * g32 - self.ex2)

        c = self.level_n[s]
        lvl = self.level[s]
        now_slot = int(start // SLOT)
        new = self.slot_at != now_slot
        np.copyto(self.slot_start, lvl, where=new)
        self.slot_at[new] = now_slot
        nslot = c.astype(f32)
        a = np.maximum(f32(1.0) / (nslot + f32(1.0)), self.alpha_slot)
        lvl += a * (g32 - lvl)
        # A ready slot rises by at most max_learn_up (on level + eps) per occurrence.
        cap = (self.slot_start + self.eps) * self.rise - self.eps
        ready = nslot >= f32(self.slot_ticks)
        np.copyto(lvl, np.minimum(lvl, cap), where=ready)
        np.add(c, 1, out=c, where=c < 65535)
        self.count += 1

    def figures(self, row: int) -> dict[str, Any]:
        """The rule's figures for one row, in bits (what the last tick was judged by)."""
        t = self.tick
        allow = float(self._allow[row])
        judged = bool(self.judged[row])
        return {
            "judged": judged,
            "seasonal_level_bits_per_second": float(score_to_bits(self.mu[row])) / t,
            # The bit rate whose per-tick score is the allowance (None: not judged yet).
            "allowance_bits_per_second": float(score_to_bits(allow)) / t if judged else None,
            "excess_score": float(self.excess[row]),
            "tolerance_score": float(self.threshold[row]) if judged else None,
            "carried_bits": float(self.run_bits[row]),
        }

    def excess_ratio(self, row: int) -> float:
        """The row's sum over its tolerance (0 while the rule is not judging it)."""
        threshold = float(self.threshold[row])
        if not self.judged[row] or not math.isfinite(threshold) or threshold <= 0:
            return 0.0
        return float(self.excess[row]) / threshold


# ----------------------------------------------------------------------------------------
# The rule in the registry.


class Budget(CoreRule):
    name: ClassVar[str] = "budget"
    # A budget overrun is information already leaving.
    SEVERITY: ClassVar[str] = "critical"

    def describe_alert(
        self,
        row: int,
        core: CoreFigures,
        f: SurfaceFigures,
        figures: dict[str, Any],
        seasonal_binds: bool,
    ) -> tuple[float, float, str]:
        if seasonal_binds:
            seasonal = figures["budget_seasonal"]
            value, threshold = seasonal["excess_score"], seasonal["tolerance_score"]
            level = seasonal["seasonal_level_bits_per_second"]
            what = (
                f"carried {seasonal['carried_bits']:,.0f} bits in a sustained run above what "
                f"it usually carries at this hour ({level:,.1f} bit/s; seasonal budget "
                f"{value:,.1f} of {threshold:,.1f})"
            )
            return value, threshold, what
        excess, tol = figures["budget_excess_bits"], figures["budget_tolerance_bits"]
        allow, horizon = figures["budget_allowance_bits_per_second"], figures["budget_horizon"]
        # The budget fires a tick ahead, when the next tick at this rate would pass it.
        ahead = "; on course to pass it next tick" if excess <= tol else ""
        what = (
            f"carried {excess:,.0f} bits above its {horizon} allowance of {allow:,.0f} "
            f"bit/s (tolerance {tol:,.0f} bits{ahead})"
        )
        return excess, tol, what
