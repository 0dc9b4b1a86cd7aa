"""The seasonal robust baseline (alarm/detector/seasonal.py), on its own."""

import math

import numpy as np

from alarm.config import SpikeRule
from alarm.detector.seasonal import SeasonalBaseline

TICK = 60.0
T0 = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC
DAY = 1440


def run(b: SeasonalBaseline, rates: np.ndarray, start_tick: int = 0) -> np.ndarray:
    """Feed ticks; returns, per tick, the threshold each was judged by (row 0)."""
    thresholds = np.empty(rates.shape[0])
    for i, row in enumerate(rates):
        p = b.predict(T0 + (start_tick + i) * TICK)
        thresholds[i] = p.threshold[0]
        b.learn(np.atleast_1d(row).astype(float), p)
    return thresholds


def test_a_nightly_job_is_learned_but_a_burst_at_a_quiet_hour_is_not():
    rng = np.random.default_rng(1)
    b = SeasonalBaseline([SpikeRule()], TICK)
    days = 3
    rates = 1000 * np.exp(0.15 * rng.standard_normal(days * DAY))
    for d in range(days):
        rates[d * DAY + 120 : d * DAY + 145] *= 20  # 02:00-02:25 mirror, every night
    thr = run(b, rates)
    night3 = slice(2 * DAY + 120, 2 * DAY + 145)
    assert (rates[night3] <= thr[night3]).all(), "the third night's mirror is known by then"
    # A 10x burst at 15:00 on day 4, a time that was never busy: over threshold at once.
    p = b.predict(T0 + (3 * DAY + 900) * TICK)
    assert p.threshold[0] < 10 * 1000
    assert 700 < p.baseline[0] < 1400


def test_sparse_surface_falls_back_to_the_mean_deviation_and_keeps_the_floor():
    b = SeasonalBaseline([SpikeRule(floor_bytes_per_second=1024)], TICK)
    rates = np.zeros(600)
    rates[::60] = 300.0  # a small write an hour
    run(b, rates)
    assert b.mad[0] <= 1e-3  # the MAD of a mostly-zero surface collapses
    assert b.meanad[0] > 0
    p = b.predict(T0 + 600 * TICK)
    assert p.threshold[0] >= 1024
    assert p.baseline[0] < 50


def test_a_patient_attacker_cannot_walk_the_baseline_up_faster_than_the_cap():
    rule = SpikeRule(max_learn_up=4.0, seasonal=False)
    b = SeasonalBaseline([rule], TICK)
    run(b, np.full(DAY, 1000.0))
    # Then double the rate every hour, always staying just under the threshold.
    start = b.predict(T0 + DAY * TICK).baseline[0]
    level = 1000.0
    for i in range(DAY):
        p = b.predict(T0 + (DAY + i) * TICK)
        level = min(level * 2 ** (1 / 60), 0.99 * p.threshold[0])
        b.learn(np.array([level]), p)
    end = b.predict(T0 + 2 * DAY * TICK).baseline[0]
    # The cap is on ln(1 + rate / unit): (end + unit) / (start + unit) <= 4.
    assert (end + b.unit[0]) / (start + b.unit[0]) <= 4.0 * 1.001
    assert math.isfinite(end)


def test_rows_are_independent_and_disabled_rows_never_judge():
    rules = [SpikeRule(min_history="5m"), SpikeRule(enabled=False, min_history="5m")]
    b = SeasonalBaseline(rules, TICK)
    run(b, np.tile([[1000.0, 1000.0]], (30, 1)))
    p = b.predict(T0 + 30 * TICK)
    assert math.isfinite(p.threshold[0]) and p.ready[0]
    assert p.threshold[1] == math.inf


def test_seasonal_window_lets_a_job_drift_by_an_hour_without_a_spike():
    """A daily batch job whose start moves by up to an hour: with a one-hour window its runs
    on later days are within what is normal, with the default 15 minutes some are spikes;
    a burst three hours from the job is a spike either way."""
    rng = np.random.default_rng(5)
    days = 8
    rates = 1000 * np.exp(0.15 * rng.standard_normal(days * DAY))
    starts = [600 + int(s) for s in rng.integers(-60, 61, days)]  # 10:00 +- 1 h
    for d, s in enumerate(starts):
        rates[d * DAY + s : d * DAY + s + 20] *= 12

    def spikes(window: float) -> tuple[int, float]:
        b = SeasonalBaseline([SpikeRule(seasonal_window=window)], TICK)
        thr = run(b, rates)
        late = slice(4 * DAY, days * DAY)  # once several runs have been seen
        p = b.predict(T0 + (days * DAY + 780) * TICK)  # 13:00, three hours after the job
        return int((rates[late] > thr[late]).sum()), float(p.threshold[0])

    wide, wide_13h = spikes(3600.0)
    narrow, _ = spikes(900.0)
    assert wide == 0
    assert narrow > 0
    assert wide_13h < 10 * 1000  # a x10 burst away from the job still breaches


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
    # Row 1 has the shift off: judged against the weekday-dominated daily profile.
    b = SeasonalBaseline([SpikeRule(), SpikeRule(weekday_dip_max=1.0)], TICK)
    thr = run(b, np.stack([rates, rates], axis=1))
    sunday_evening = 13 * DAY + 21 * 60 + 39
    p = b.predict(T0 + sunday_evening * TICK)
    assert p.threshold[0] < 10 * 3500, "a x10 burst on a Sunday evening is a spike"
    assert p.threshold[0] > 3 * 3500, "but the Sunday level itself is not"
    assert p.threshold[1] > 10 * 3500, "without the shift it is not"
    # The first week's Sunday was judged against the weekday level: the week was not seen yet.
    assert thr[6 * DAY + 21 * 60 + 39] > 10 * 3500
    second_week = t >= 7 * DAY
    over = second_week & (rates > thr)
    assert not over.any(), f"benign ticks over threshold at {np.flatnonzero(over)[:5]}"
