"""Lampson capacity budget: a one-sided CUSUM on the bits a surface could have carried.

Each tick adds the tick's capacity bound (8 x bytes + a metadata allowance per event) and
subtracts what the surface may carry (allowance k x tick length).  The sum never goes below 0,
so quiet time earns no credit beyond zero; when it exceeds the tolerance h, more than h bits
above the allowance have gone through: the largest leak tolerated has been reached.  Active from
the first tick — no learning period excuses an open channel.
"""

from __future__ import annotations

import numpy as np

from alarm.config import BudgetRule


def capacity_bits(nbytes: int, events: int, meta_bits_per_event: float) -> float:
    return 8.0 * nbytes + meta_bits_per_event * events


class CapacityBudget:
    __slots__ = ("excess", "rule")

    def __init__(self, rule: BudgetRule):
        self.rule = rule
        self.excess = 0.0  # bits above allowance, accumulated (the CUSUM statistic)

    def update(self, bits: float, seconds: float) -> float:
        self.excess = max(0.0, self.excess + bits - self.rule.allowance_bits_per_second * seconds)
        return self.excess

    @property
    def exceeded(self) -> bool:
        return self.excess > self.rule.tolerance_bits

    def to_state(self) -> dict:
        return {"excess": self.excess}

    def load_state(self, state: dict) -> None:
        self.excess = float(state.get("excess", 0.0))


class BudgetBank:
    """Capacity budgets of every row on every horizon at once: ``S[H, n]``.

    Rows with fewer horizons than the widest are padded with an infinite allowance and
    tolerance, which keeps their sum at 0 and their ratio at 0.  The alarm looks one tick
    ahead: it fires when the sum would pass the tolerance on the next tick at the current
    rate, so a steady leak is stopped before h bits above the allowance, not a tick after.
    Only a rise sustained over two ticks is projected: a single legitimate burst is judged on
    what it carried, not on what it would carry if it went on.
    """

    STATE = ("excess", "last_step")

    def __init__(self, rules: list[BudgetRule]):
        horizons = [_horizon_list(r) for r in rules]
        width = max((len(h) for h in horizons), default=1)
        n = len(rules)
        self.names: list[list[str]] = [[name for name, _, _ in h] for h in horizons]
        self.allowance = np.full((width, n), np.inf)
        self.tolerance = np.full((width, n), np.inf)
        for row, hs in enumerate(horizons):
            for i, (_, k, h) in enumerate(hs):
                self.allowance[i, row] = k
                self.tolerance[i, row] = h
        self.enabled = np.array([r.enabled for r in rules], dtype=bool)
        self._inv_tolerance = 1.0 / self.tolerance  # 0 on padding
        self.excess = np.zeros((width, n))
        self.last_step = np.zeros((width, n))

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.allowance, self.tolerance, *self._state()))

    def _state(self) -> tuple[np.ndarray, ...]:
        return self.excess, self.last_step

    def update(self, bits: np.ndarray, seconds: float) -> tuple[np.ndarray, np.ndarray]:
        """Add one tick.  Returns (projected ratio, ratio): the largest S/h over the horizons
        with and without the one-tick look-ahead."""
        before = self.excess
        after = before + bits
        after -= self.allowance * seconds
        np.maximum(after, 0.0, out=after)
        step = after - before
        ratio = after * self._inv_tolerance
        projected = look_ahead(after, step, self.last_step)
        projected *= self._inv_tolerance
        self.excess = after
        self.last_step = step
        return projected.max(axis=0), ratio.max(axis=0)

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
