"""The aggregate's members statistic: many members each writing more per write than they
usually do, at once — a swarm that the aggregate's byte rate cannot see.

An aggregate's rate statistics judge the sum of its members' bytes.  That sum is dominated by
its few biggest members and moves with whatever the whole fleet does together (more sandboxes
busy this hour, a campaign): a swarm that adds 60 % to each of thirty members' writes raises
it by less than those fleet-wide swings, and a sum of bytes weighs a small member's doubling
at nothing.  Each member's own history, however, says how large its writes usually are at
this hour (the spike rule's ``size`` level, rules/spike.py), and fleet-wide activity changes how
*often* members write far more than how *much* each write carries.  So per member and written
tick, its size residual in its own spreads, ``u = (log bytes - size level) / spread``, clipped
to ±HUBER so that no single member (a cache's warm-up, one member's own spike) can stand for
many; and per aggregate the Stouffer combination over its members and the last minutes,

    Z = sum_i S_i / sqrt(sum_i V_i),
    S_i = exponentially weighted sum of u over member i's written ticks,
    V_i = the same weights squared (the variance of S_i for residuals of unit variance),

with time constant ``SCALE`` (20 minutes, chosen on the bench's choice seeds: a shorter window
holds too few writes of members that write in one tick of ten, a longer one answers later).
``Z`` is large when many members write larger than their own normal at the same time,
whatever their sizes: a member writing 100 B counts as much as one writing 100 kB.  It is
one more statistic of the aggregate's spike rule, with its own calibrated tail (tail.py) and
an equal share of the rule's false-page budget, judged once its tail is known, like the other
three.
"""

from __future__ import annotations

import math

import numpy as np

from alarm.config import SpikeRule
from alarm.detector.tail import TailBank, target_rate

# Seconds: the time constant of the members' weighted sums (chosen: docs/detector.md).
SCALE = 1200.0
HUBER = 3.0  # a member's residual counts at most this many of its spreads
# Written member ticks (in the weighted sum) before an aggregate's Z is judged: fewer, and a
# handful of writes stand for the whole fleet.
MIN_WRITES = 20.0


class MemberShift:
    """``Z`` for every aggregate, and its calibrated tail.

    Per-member sums are kept for every row (aggregate rows' entries unused) so that they are
    saved and restored by surface key like every per-row array; the tail is per aggregate."""

    STATE = ("sum", "var", "writes")

    def __init__(
        self,
        rows: int,
        aggregate_of: list[slice | np.ndarray],
        rules: list[SpikeRule],
        enabled: list[bool],
        tick: float,
        statistics: int,
    ):
        self.decay = math.exp(-tick / SCALE)
        self.sum = np.zeros(rows)
        self.var = np.zeros(rows)
        self.writes = np.zeros(rows)
        self._u = np.empty(0)
        self.aggregate_of = aggregate_of
        self.enabled = np.array(
            [r.enabled and e for r, e in zip(rules, enabled, strict=True)],
            dtype=bool,
        )
        m = len(aggregate_of)
        self.tail = TailBank(
            m,
            np.full(m, max(1, round(SCALE / tick))),
            np.array([target_rate(r.false_alarms_per_week, statistics) for r in rules]),
            np.array([r.min_peaks for r in rules]),
            np.array([r.min_history for r in rules], dtype=np.float64),
            np.log([r.max_learn_up for r in rules]),
        )
        self.log_hyst = np.log(np.array([r.hysteresis for r in rules]))
        self.score = np.zeros(m)
        self.judged = np.zeros(m, dtype=bool)

    def nbytes(self) -> int:
        return sum(getattr(self, a).nbytes for a in self.STATE) + self.tail.nbytes()

    def tick_arrays(self) -> dict[str, np.ndarray]:
        """The arrays the whole native tick reads and writes (fused.py), by name."""
        names = ("sum", "var", "writes", "score", "judged", "enabled", "log_hyst")
        out = {f"swarm.{a}": getattr(self, a) for a in names}
        return out | self.tail.tick_arrays("swarm.tail")

    def tick_constants(self) -> dict[str, float]:
        """The scalars the whole native tick needs of the members statistic (fused.py)."""
        return {"swarm_decay": self.decay, "swarm_huber": HUBER, "min_writes": MIN_WRITES}

    def threshold(self) -> np.ndarray:
        """Per aggregate, the Z its members must pass (+inf where it does not judge)."""
        return np.where(self.judged, self.tail.threshold(), np.inf)

    def top_members(self, j: int, count: int) -> list[int]:
        """Members of aggregate ``j`` whose writes stood furthest above their own normal."""
        members = np.arange(self.sum.size)[self.aggregate_of[j]]
        shift = self.sum[members]
        order = np.argsort(-shift, kind="stable")[:count]
        return [int(members[i]) for i in order if shift[i] > 0]


__all__ = ["MemberShift"]
