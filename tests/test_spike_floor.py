"""The spike rule's floor (``floor_bytes_per_second``): a 40x burst on a surface that writes a
few dozen bit/s in sessions is a spike, while its ordinary sessions are not.

At the old default (1 KiB/s) such a burst, 160 B/s for a minute, was never judged a spike: the
long fleet's session bursts were missed (docs/detector.md, "The rule", for how 128 B/s was
chosen).
"""

from __future__ import annotations

import numpy as np

from alarm.config import SpikeRule
from tests.spike_kit import SpikeRun

TICK = 10.0
T0 = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC
DAY = int(86400 / TICK)
HOUR = int(3600 / TICK)
MEDIAN = 40.0  # bytes a write: ~40 bit/s in a session written in half its ticks


def sessions(rng: np.random.Generator, days: int) -> np.ndarray:
    """Bytes per tick: two or three one-hour sessions a day between 09:00 and 18:00, written
    in half their ticks, lognormal sizes around MEDIAN; silent otherwise."""
    out = np.zeros(days * DAY)
    for d in range(days):
        for _ in range(int(rng.integers(2, 4))):
            start = d * DAY + int(rng.uniform(9, 17) * HOUR)
            written = rng.random(HOUR) < 0.5
            sizes = np.round(MEDIAN * rng.lognormal(0.0, 0.6, HOUR))
            out[start : start + HOUR] = np.where(written, sizes, 0.0)
    return out


def burst_day(floor: float | None) -> tuple[list[int], int]:
    """Four days of sessions, then a session with a minute at 40x its level; the spikes of the
    fourth day and the tick the burst starts."""
    rng = np.random.default_rng(7)
    series = sessions(rng, 4)
    onset = 3 * DAY + 14 * HOUR
    series[onset - HOUR // 2 : onset + HOUR // 2] = np.where(
        rng.random(HOUR) < 0.5, np.round(MEDIAN * rng.lognormal(0.0, 0.6, HOUR)), 0.0
    )
    series[onset : onset + 6] = 40 * MEDIAN  # 160 B/s for a minute: ~13 kB
    rule = SpikeRule() if floor is None else SpikeRule(floor_bytes_per_second=floor)
    run = SpikeRun([rule], TICK, T0)
    run.run(series[: 3 * DAY])
    return run.run(series[3 * DAY :], start=3 * DAY), onset


def test_a_small_surfaces_burst_is_a_spike_and_its_sessions_are_not():
    spikes, onset = burst_day(None)
    assert any(onset <= i < onset + 6 for i in spikes), spikes
    # Its ordinary sessions that day (the fourth, judged since the second) page nothing.
    assert [i for i in spikes if not onset <= i < onset + 6 + HOUR // 2] == []


def test_the_old_floor_hid_it():
    spikes, onset = burst_day(1024.0)
    assert not any(onset <= i < onset + 6 for i in spikes)
