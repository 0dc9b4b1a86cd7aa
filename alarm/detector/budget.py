"""Lampson capacity budget: a one-sided CUSUM on the bits a surface could have carried.

Each tick adds the tick's capacity bound (8 x bytes + a metadata allowance per event) and
subtracts what the surface may carry (allowance k x tick length).  The sum never goes below 0,
so quiet time earns no credit beyond zero; when it exceeds the tolerance h, more than h bits
above the allowance have gone through: the largest leak tolerated has been reached.  Active from
the first tick — no learning period excuses an open channel.
"""

from __future__ import annotations

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
