"""The spike rule's seasonal level (alarm/detector/rules/spike.py holds its state; its one
definition is the native tick), driven through a real Detector: what it learns of the
half-hour rate it is given, and the threshold (bytes/s) it shows for it."""

import math

import numpy as np

from alarm.config import SpikeRule
from tests.spike_kit import SpikeRun

TICK = 60.0
T0 = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC
DAY = 1440


class Level:
    """Surfaces written at given rates (bytes/s), a tick at a time, and what their seasonal
    level was on each: its threshold, and the half-hour rate it judged and learned."""

    def __init__(self, rules: list[SpikeRule]):
        self.model = SpikeRun(rules, TICK, T0)
        self.next = 0
        self.rows = len(rules)

    def run(self, rates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per tick, surface 0's level threshold and its half-hour rate."""
        thresholds, averaged = np.empty(len(rates)), np.empty(len(rates))
        for k, row in enumerate(rates):
            j = self.model.step(self.next, np.asarray(row, dtype=float) * TICK)
            self.next += 1
            thresholds[k] = j.level.threshold[0]
            averaged[k] = self.model.spike.rates[1, 0]
        return thresholds, averaged

    def at(self, tick: int, rate: float | list[float]):
        """The level judged at ``tick``, the surfaces writing ``rate`` until then."""
        while self.next <= tick:
            j = self.model.step(self.next, np.asarray(rate, dtype=float) * TICK)
            self.next += 1
        return j.level

    @property
    def baseline(self):
        return self.model.det.baseline


def test_a_nightly_job_is_learned_but_a_burst_at_a_quiet_hour_is_not():
    rng = np.random.default_rng(1)
    b = Level([SpikeRule()])
    days = 3
    rates = 1000 * np.exp(0.15 * rng.standard_normal(days * DAY))
    for d in range(days):
        rates[d * DAY + 120 : d * DAY + 145] *= 20  # 02:00-02:25 mirror, every night
    thr, averaged = b.run(rates)
    night3 = slice(2 * DAY + 120, 2 * DAY + 145)
    assert (averaged[night3] <= thr[night3]).all(), "the third night's mirror is known by then"
    # A 10x burst at 15:00 on day 4, a time that was never busy: over threshold at once.
    p = b.at(3 * DAY + 900, 1000.0)
    assert p.threshold[0] < 10 * 1000
    assert 700 < p.baseline[0] < 1400


def test_a_sparse_surface_keeps_the_floor_and_a_level_near_zero():
    b = Level([SpikeRule(floor_bytes_per_second=1024)])
    rates = np.zeros(4 * DAY)
    rates[::DAY] = 300.0  # a small write a day: the half-hour rate is ~0 most of the day
    b.run(rates)
    assert b.baseline.meanad[0] > 0
    p = b.at(4 * DAY, 0.0)
    assert p.threshold[0] >= 1024
    assert p.baseline[0] < 50


def test_a_patient_attacker_cannot_walk_the_baseline_up_faster_than_the_cap():
    b = Level([SpikeRule(max_learn_up=4.0, seasonal=False)])
    b.run(np.full(DAY, 1000.0))
    # Then double the rate every hour, always staying just under the threshold.
    p = b.at(DAY, 1000.0)
    start = p.baseline[0]
    level = 1000.0
    for i in range(DAY):
        level = min(level * 2 ** (1 / 60), 0.99 * p.threshold[0])
        p = b.at(DAY + 1 + i, level)
    end = b.at(2 * DAY + 1, level).baseline[0]
    # The cap is on ln(1 + rate / unit): (end + unit) / (start + unit) <= 4.
    unit = b.model.spike.unit[0]
    assert (end + unit) / (start + unit) <= 4.0 * 1.001
    assert end > 1.5 * start  # it did move: the attacker reached the cap, not a stall
    assert math.isfinite(end)


def test_rows_are_independent_and_disabled_rows_never_judge():
    b = Level([SpikeRule(min_history="5m"), SpikeRule(enabled=False, min_history="5m")])
    b.run(np.tile([[1000.0, 1000.0]], (30, 1)))
    p = b.at(30, [1000.0, 1000.0])
    assert math.isfinite(p.threshold[0]) and p.ready[0]
    assert p.threshold[1] == math.inf


def test_seasonal_window_lets_a_job_drift_by_an_hour_without_a_spike():
    """A daily batch job whose start moves by up to an hour: with a one-hour window its runs
    on later days are within what is normal, with the default 15 minutes some are spikes;
    a burst five hours from the job (its half-hour rate has decayed by then) is a spike
    either way."""
    rng = np.random.default_rng(5)
    days = 8
    rates = 1000 * np.exp(0.15 * rng.standard_normal(days * DAY))
    starts = [600 + int(s) for s in rng.integers(-60, 61, days)]  # 10:00 +- 1 h
    for d, s in enumerate(starts):
        rates[d * DAY + s : d * DAY + s + 30] *= 30  # its half-hour rate reaches ~19x

    def spikes(window: float) -> tuple[int, float]:
        b = Level([SpikeRule(seasonal_window=window)])
        thr, averaged = b.run(rates)
        late = slice(4 * DAY, days * DAY)  # once several runs have been seen
        p = b.at(days * DAY + 900, 1000.0)  # 15:00, five hours after the job
        return int((averaged[late] > thr[late]).sum()), float(p.threshold[0])

    wide, wide_15h = spikes(3600.0)
    narrow, _ = spikes(900.0)
    assert wide == 0
    assert narrow > 0
    assert wide_15h < 10 * 1000  # a x10 burst away from the job still breaches


def test_a_weekend_is_judged_against_weekends_once_the_week_has_been_seen():
    """Weekdays at 10 kB/s, weekends at 3.5 kB/s, and a 10-minute CI warm-up at x20 every
    weekday at 08:00.  The daily profile is weekday-dominated; in the second week a burst of
    10x the Sunday level must still be over threshold, and the warm-ups must stay under it."""
    rng = np.random.default_rng(4)
    days = 14
    t = np.arange(days * DAY)
    weekend = (t // DAY) % 7 >= 5
    rates = np.where(weekend, 3500.0, 10000.0) * np.exp(0.15 * rng.standard_normal(t.size))
    for d in range(days):
        if d % 7 < 5:
            rates[d * DAY + 480 : d * DAY + 490] *= 20
    sunday_evening = 13 * DAY + 21 * 60 + 39
    # Row 1 has the shift off: judged against the weekday-dominated daily profile.
    b = Level([SpikeRule(), SpikeRule(weekday_dip_max=1.0)])
    thr, averaged = b.run(np.stack([rates, rates], axis=1)[:sunday_evening])
    p = b.at(sunday_evening, [3500.0, 3500.0])
    assert p.threshold[0] < 10 * 3500, "a x10 burst on a Sunday evening is a spike"
    assert p.threshold[0] > 3 * 3500, "but the Sunday level itself is not"
    assert p.threshold[1] > 10 * 3500, "without the shift it is not"
    # The first week's Sunday was judged against the weekday level: the week was not seen yet.
    assert thr[6 * DAY + 21 * 60 + 39] > 10 * 3500
    second_week = t[:sunday_evening] >= 7 * DAY
    over = second_week & (averaged > thr)
    assert not over.any(), f"benign ticks over threshold at {np.flatnonzero(over)[:5]}"
