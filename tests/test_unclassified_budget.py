"""The unclassified surface's default budget (default deny): a beacon nobody declared is caught
within a few of its lumps, and the stray packets every host sends are not."""

import numpy as np

from alarm.config import DEFAULT_BUDGETS, UNCLASSIFIED, config_from_dict
from alarm.detector.engine import Detector

TICK = 60.0
HOUR_TICKS = int(3600 / TICK)
T0 = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC
KEYS = [("egress", "proxy"), ("egress", "unclassified")]
LUMP = 1024  # bytes: one beacon
EVERY = 10  # ticks (minutes) between beacons


def never(_key):
    return []


def detector() -> Detector:
    # One declared surface; everything else egresses through the kind's unclassified surface,
    # which keeps every default (spike rule, absolute horizons, seasonal budget).
    config = config_from_dict(
        {"tick": f"{TICK:g}s", "surfaces": [{"name": "proxy", "match": {"dport": [443]}}]}
    )
    return Detector(config, KEYS)


def strays(ticks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """About one DNS-sized packet an hour (60-512 B, Poisson in time)."""
    rng = np.random.default_rng(seed)
    events = rng.poisson(1.0 / HOUR_TICKS, ticks).astype(float)
    nbytes = np.array([rng.integers(60, 513, int(k)).sum() for k in events], dtype=float)
    return nbytes, events


def replay(d: Detector, nbytes, events, first_tick: int = 0):
    out = []
    for j in range(nbytes.size):
        i = first_tick + j
        b = np.array([0.0, nbytes[j]])
        e = np.array([0.0, events[j]])
        out += [(i, c) for c in d.evaluate_arrays(T0 + (i + 1) * TICK, TICK, b, e, never)]
    return out


def firings(changes, rule=None):
    return [
        (i, c)
        for i, c in changes
        if c.state == "firing" and c.target == "unclassified" and rule in (None, c.rule)
    ]


def beacon(ticks: int, nbytes, events) -> tuple[np.ndarray, np.ndarray]:
    nbytes, events = nbytes.copy(), events.copy()
    nbytes[::EVERY] += LUMP
    events[::EVERY] += 1
    return nbytes, events


def test_the_default_hour_horizon_is_a_few_packets_an_hour_not_a_beacon():
    hour = next(h for h in DEFAULT_BUDGETS[UNCLASSIFIED]["horizons"] if h["horizon"] == "1h")
    k, h = hour["allowance_bits_per_second"], hour["tolerance_bits"]
    assert 0.1 <= k <= 10  # inside TCSEC's must-be-audited band, far below its 100 bit/s edge
    assert h > 2 * (1500 * 8 + 64)  # two full-size packets at once never page on their own
    assert h < 4 * (LUMP * 8 + 64)  # four 1 KB lumps in a row always do


def test_a_beacon_on_unclassified_egress_fires_the_budget_by_its_fourth_lump():
    for seed in range(3):
        ticks = 6 * EVERY
        nbytes, events = beacon(ticks, *strays(ticks, seed))
        fired = firings(replay(detector(), nbytes, events))
        assert fired, seed
        i, c = fired[0]
        assert c.rule == "budget" and c.figures["budget_horizon"] == "1h"
        assert i <= 3 * EVERY, (seed, i)  # on or before the 4th lump (ticks 0, 10, 20, 30)


def test_a_week_of_strays_never_fires_and_a_beacon_after_it_still_does_by_the_fourth_lump():
    week = 7 * 24 * HOUR_TICKS
    for seed in (11, 12):
        d = detector()
        nbytes, events = strays(week, seed)
        assert firings(replay(d, nbytes, events)) == []
        ticks = 6 * EVERY
        nbytes, events = beacon(ticks, *strays(ticks, seed + 100))
        fired = firings(replay(d, nbytes, events, first_tick=week), rule="budget")
        assert fired, seed
        assert fired[0][0] - week <= 3 * EVERY, (seed, fired[0][0] - week)
