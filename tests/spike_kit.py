"""The spike rule of a real Detector driven a tick at a time, for the tests that judge it on
one or two surfaces: what each tick's judgement was, the rule's levels and tails after it.

The rule's one definition is the detector's native tick (alarm/detector/whole_tick.py); the
tests drive it through ``Detector.evaluate_arrays`` as the service does.
"""

from __future__ import annotations

import numpy as np

from alarm.config import SpikeRule, config_from_dict
from alarm.detector.engine import Detector
from alarm.detector.rules.spike import SpikeJudgement


def _no_evidence(row: int) -> list:
    return []


class SpikeRun:
    """One egress surface per rule (rows 0..k-1), judged on the bytes each tick carries."""

    def __init__(self, rules: list[SpikeRule], tick: float, t0: float):
        surfaces = [
            {
                "name": f"s{i}",
                "match": {"dport": [i + 1]},
                "spike": rule.model_dump(exclude_unset=True),
            }
            for i, rule in enumerate(rules)
        ]
        config = config_from_dict({"tick": f"{tick:g}s", "surfaces": surfaces})
        keys = [("egress", f"s{i}") for i in range(len(rules))]
        self.det = Detector(config, keys)
        self.rows = len(rules)
        self.tick = tick
        self.t0 = t0

    def step(self, i: int, nbytes: np.ndarray | float) -> SpikeJudgement:
        """Tick ``i`` (it begins at t0 + i x tick) with each surface writing ``nbytes``: the
        judgement, filled in place (read it before the next step)."""
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=np.float64), (self.rows,))
        self.det.evaluate_arrays(
            self.t0 + (i + 1) * self.tick,
            self.tick,
            np.ascontiguousarray(nbytes),
            np.zeros(self.rows),
            _no_evidence,
        )
        judgement = self.det._judgement
        assert judgement is not None
        return judgement

    def run(self, series: np.ndarray, start: int = 0) -> list[int]:
        """Ticks (numbered from ``start``) whose judgement of surface 0 was a spike, with
        ``series`` the bytes of each tick."""
        return [i for i, b in enumerate(series, start) if self.step(i, b).breach[0]]

    @property
    def spike(self):
        return self.det.spike
