"""The detector's whole tick in native code: the buffers it fills and the calls in order.

The core rules (spike, budget, the aggregates' members statistic) have one numeric
definition, this tick (``_fused.Tick`` in ``_whole_tick.c``, with ``_fused.c``'s loops): a
tick is one native call where every alert is at rest, or its passes called one by one from
``Detector._evaluate_phases`` around the Python work (alert documents, the seasonal budget,
the tails' days).  Between its passes it calls numpy's exp and log, in place: they were what
the deleted numpy code used, so the thresholds and figures are the ones the held-out
benchmarks measured, and numpy's SIMD loops are faster than libm's at 100k rows.

The detector's arrays are held by the native object for its life, so every path that
changes them does so in place (restores, the tails' refits, misconfigured budgets); the
buffers here are this object's.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from types import ModuleType

import numpy as np

from alarm.detector.rows import members_in_order


class WholeTick:
    """The buffers of one detector's native tick and the native object over them."""

    def __init__(
        self,
        native: ModuleType,
        arrays: Mapping[str, np.ndarray],
        constants: Mapping[str, float],
        members: int,
        aggregate_of: list[np.ndarray],
        horizons: int,
        rows: int,
    ):
        n, a = rows, len(aggregate_of)
        f32 = np.float32
        self.columns = np.zeros((3, n))  # bytes, events, capacity bits of the tick
        self.rate = np.zeros(n)
        self.events_rate = np.zeros(n)
        self.capacity = np.zeros(n)
        self.exp_in = np.zeros((2, n), dtype=f32)  # numpy's exp, in place
        self.log_bytes = np.zeros(n)  # numpy's log, in place
        self.log_rates = np.zeros((2, n), dtype=f32)  # numpy's log, in place
        self.learn_y = np.zeros(n, dtype=f32)  # numpy's log, in place
        self.tail_ended = np.zeros(3 * n, dtype=bool)
        self.swarm_tail_ended = np.zeros(a, dtype=bool)
        # The rows of each tail whose kept peaks changed this tick (their first ``count``).
        self.tail_refit = np.zeros(3 * n, dtype=np.int64)
        self.swarm_tail_refit = np.zeros(a, dtype=np.int64)
        self.swarm_breach = np.zeros(a, dtype=bool)
        self.relative_projected = np.zeros(n)
        self.relative_ratio = np.zeros(n)
        order, bounds = members_in_order(aggregate_of)
        cells = (horizons, n)
        buffers = {
            "col": self.columns,
            "rate": self.rate,
            "events_rate": self.events_rate,
            "capacity": self.capacity,
            "exp_in": self.exp_in,
            "log_bytes": self.log_bytes,
            "log_rates": self.log_rates,
            "learn_y": self.learn_y,
            "tail_ended": self.tail_ended,
            "swarm_tail_ended": self.swarm_tail_ended,
            "tail_refit": self.tail_refit,
            "swarm_tail_refit": self.swarm_tail_refit,
            "swarm_breach": self.swarm_breach,
            "gather_order": order,
            "gather_bounds": bounds,
            "spread": np.zeros(n),
            "window_mean": np.zeros(cells),
            "projected": np.zeros(n),
            "budget_ratio": np.zeros(n),
            "budget_breach": np.zeros(n, dtype=bool),
            # The seasonal budget's, written before ``rules`` where it is on (0: off).
            "relative.projected": self.relative_projected,
            "relative.ratio": self.relative_ratio,
            "learning": np.zeros(n, dtype=bool),
            "tail_judged": np.zeros(3 * n, dtype=bool),
            "tail_breach": np.zeros(3 * n, dtype=bool),
            "swarm_tail_judged": np.zeros(a, dtype=bool),
            "swarm_tail_breach": np.zeros(a, dtype=bool),
            "mask": np.zeros(n, dtype=bool),
        }
        self._held = {**arrays, **buffers}  # what the native object reads and writes
        # numpy's exp and logs, in place, for the native object to call between its passes
        # (``out`` positional: a keyword costs a small fleet's call half as much again).
        calls = (
            partial(np.exp, self.exp_in, self.exp_in),
            partial(np.log, self.log_bytes, self.log_bytes),
            partial(np.log, self.log_rates, self.log_rates),
            partial(np.log, self.learn_y, self.learn_y),
        )
        self.native = native.Tick(self._held, dict(constants), calls, n, members, a, horizons)


__all__ = ["WholeTick"]
