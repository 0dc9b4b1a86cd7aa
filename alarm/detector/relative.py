"""Seasonal (relative) capacity budget: a CUSUM on what a surface carries *above what it
normally carries at this hour*, for the low-and-slow leaks the absolute budgets cannot see.

The absolute budgets (budget.py) allow a surface what its busiest hour needs.  A board or wiki
that takes a few writes an hour by day is allowed that all night too, so a drip or a beacon
that stays under the daytime allowance is never seen.  This rule judges each tick against the
same hour's history instead.

Per row and tick, with ``bits`` the tick's capacity bound (8 x bytes + metadata per event):

- score ``g = ln(1 + bits / U)``, U = 64 bits (one event's metadata).  Every tick that carries
  anything scores at least ln 2; a tick carrying 1000x more scores only ~7 more.  Legitimate
  writes on sparse surfaces are rare and large, leaks are small and persistent: on the log
  score the persistence dominates, and one big write cannot fire the rule.
- seasonal level ``mu``: the mean of g per hour of the day (24 slots), learned only while the
  clock is in the slot; the prediction is the highest ready value among the slot and its two
  neighbours (a job that drifts by an hour).  Once a slot has seen one full occurrence, its
  level may rise by at most ``max_learn_up`` (on mu + eps) per day: a patient attacker cannot
  walk it up faster than that.
- allowance ``a = max(ratio x mu, g(min_allowance x tick))``.  With ratio = (r - 1)/ln r this
  is the CUSUM allowance that is optimal for a Bernoulli/Poisson activity rate rising r-fold
  (ratio 3 ~ r 7): the test behaves like a count test on sparse surfaces and is inert on busy
  ones, where every tick is active and the mean is already high.
- tolerance ``H = tolerance x max(scale, g)``, scale = E[g^2]/E[g] over about a week (the
  size-biased mean score of the surface's active ticks): H is "this many typical writes above
  the allowance", and never less than that many copies of the current tick, so a single tick,
  however large, cannot fire it alone (bursts are the spike rule's and the absolute budgets').
- ``S = max(0, S + g - a)``; like the absolute budgets, it looks one tick ahead on a rise
  sustained over two ticks.  It judges once the surface has ``min_history`` and the hour has a
  ready level; it never judges before (the absolute budgets do, from the first tick).

Everything is vectorised over rows (numpy), like the rest of the detector.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from alarm.config import BudgetRule
from alarm.detector.budget import look_ahead

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
