"""Robust baseline of a surface's byte rate: median and MAD over a sliding window of ticks."""

from __future__ import annotations

import numpy as np

from alarm.config import SpikeRule

# 1.4826 * MAD estimates the standard deviation of normal data; 1.2533 * mean absolute
# deviation does the same.  The second is the fallback on sparse, mostly-zero surfaces whose
# MAD is 0 and would otherwise make every non-zero tick a spike.
MAD_TO_SD = 1.4826
MEANAD_TO_SD = 1.2533


class RobustBaseline:
    __slots__ = ("_count", "_pos", "_window", "median", "min_samples", "rule", "spread")

    def __init__(self, rule: SpikeRule, tick: float):
        self.rule = rule
        size = max(1, round(rule.history / tick))
        self.min_samples = min(size, max(1, round(rule.min_history / tick)))
        self._window = np.zeros(size, dtype=np.float64)
        self._pos = 0
        self._count = 0
        self.median = 0.0
        self.spread = 0.0

    @property
    def ready(self) -> bool:
        return self._count >= self.min_samples

    def threshold(self) -> float:
        r = self.rule
        return max(
            self.median + r.z * self.spread, self.median * r.min_ratio, r.floor_bytes_per_second
        )

    def learn(self, rate: float) -> None:
        """Add a tick's rate.  Values above the threshold are clipped to it, so a spike never
        drags the baseline up and a level shift is learned only as fast as the threshold lets."""
        if self.ready:
            rate = min(rate, self.threshold())
        self._window[self._pos] = rate
        self._pos = (self._pos + 1) % self._window.size
        self._count = min(self._count + 1, self._window.size)
        self._refresh()

    def to_state(self) -> dict:
        if self._count < self._window.size:
            ordered = self._window[: self._count]
        else:
            ordered = np.roll(self._window, -self._pos)
        return {"values": ordered.tolist()}

    def load_state(self, state: dict) -> None:
        values = list(state.get("values", []))[-self._window.size :]
        self._window[:] = 0
        self._pos = 0
        self._count = 0
        for v in values:
            self._window[self._pos] = float(v)
            self._pos = (self._pos + 1) % self._window.size
            self._count = min(self._count + 1, self._window.size)
        if values:
            self._refresh()

    def _refresh(self) -> None:
        values = self._window[: self._count] if self._count < self._window.size else self._window
        self.median = float(np.median(values))
        dev = np.abs(values - self.median)
        mad = float(np.median(dev))
        self.spread = MAD_TO_SD * mad if mad > 0 else MEANAD_TO_SD * float(dev.mean())
