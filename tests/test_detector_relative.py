"""The seasonal (relative) budget: drips and beacons under a surface's declared allowance are
caught against what the surface carries at that hour, without paging on its normal traffic."""

import json

import numpy as np

from alarm.config import BudgetRule, RelativeBudget, config_from_dict
from alarm.detector.engine import Detector
from alarm.detector.rules.budget import SLOT, RelativeBank, score

TICK = 60.0
DAY = 86400
DAY_TICKS = int(DAY / TICK)
T0 = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC
KEYS = [("registry", "board"), ("registry", "unclassified")]


def never(_key):
    return []


# What an operator would declare for a board that takes a few 3 KB writes an hour by day: an
# allowance its busiest hour and day fit under.
BOARD_BUDGET = {
    "allowance_bits_per_second": 100_000,
    "tolerance_bits": 8_000_000,
    "horizon": "1m",
    "horizons": [
        {"horizon": "1h", "allowance_bits_per_second": 200, "tolerance_bits": 2_000_000},
        {"horizon": "1d", "allowance_bits_per_second": 40, "tolerance_bits": 4_000_000},
    ],
}


def board_config(budget: dict = BOARD_BUDGET, **relative):
    # The seasonal budget is off by default (its tolerance is not calibrated): on here.
    budget = {**budget, "relative": {"enabled": True, **relative}}
    return config_from_dict(
        {
            "tick": f"{TICK:g}s",
            "surfaces": [
                {
                    "name": "board",
                    "kind": "registry",
                    "match": {"repository": ["board"]},
                    "spike": {"enabled": False},
                    "budget": budget,
                }
            ],
        }
    )


def board_traffic(days: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Bytes and events per tick: ~3 writes an hour of ~3 KB from 08 to 20 h, rare at night."""
    rng = np.random.default_rng(seed)
    n = days * DAY_TICKS
    hour = (np.arange(n) * TICK % DAY) / 3600
    per_tick = np.where((hour >= 8) & (hour < 20), 3.0, 0.2) / 60
    events = rng.poisson(per_tick).astype(float)
    nbytes = np.array([rng.lognormal(np.log(3000), 0.8, int(k)).sum() for k in events])
    return np.round(nbytes), events


def replay(d: Detector, nbytes, events, start_tick=0):
    out = []
    for i in range(start_tick, nbytes.size):
        b = np.array([nbytes[i], 0.0])
        e = np.array([events[i], 0.0])
        for c in d.evaluate_arrays(T0 + (i + 1) * TICK, TICK, b, e, never):
            out.append((i, c))
    return out


def budget_firings(changes):
    return [(i, c) for i, c in changes if c.rule == "budget" and c.state == "firing"]


def test_a_10_bit_per_second_drip_at_midday_is_caught_within_an_hour():
    days = 5
    nbytes, events = board_traffic(days)
    onset = 4 * DAY_TICKS + 11 * 60  # Friday 11:00, in the board's busiest hours
    drip = np.zeros_like(nbytes)
    drip[onset:] = 10 / 8 * TICK  # 75 bytes a minute, one write each
    d = Detector(board_config(), KEYS)
    fired = budget_firings(replay(d, nbytes + drip, events + (drip > 0)))
    assert fired, "the drip was never caught"
    i, c = fired[0]
    assert onset <= i < onset + 60
    assert c.figures["budget_horizon"] == "seasonal"
    # The absolute horizons were nowhere near their tolerance: only the seasonal rule sees it.
    assert c.figures["budget_excess_bits"] < c.figures["budget_tolerance_bits"]
    seasonal = c.figures["budget_seasonal"]
    assert seasonal["judged"] and seasonal["carried_bits"] >= 8 * 75
    assert "usually carries at this hour" in c.summary
    json.dumps(c.figures, allow_nan=False)  # figures stay valid JSON for every notifier
    # What the capalarm_surface_seasonal_budget_* gauges show: the drip still runs, past 1.
    f = d.surfaces[KEYS[0]].figures
    assert f.seasonal_judged and f.seasonal_ratio > 1


def test_the_boards_own_traffic_never_fires_the_seasonal_rule():
    nbytes, events = board_traffic(14, seed=11)
    d = Detector(board_config(), KEYS)
    assert budget_firings(replay(d, nbytes, events)) == []


def test_one_large_write_on_a_silent_surface_is_not_a_drip():
    nbytes = np.zeros(3 * DAY_TICKS)  # two silent days: the surface's scale is the least one
    events = np.zeros_like(nbytes)
    # One 100 kB write: under every absolute horizon's tolerance.
    nbytes[2 * DAY_TICKS + 123] = 100_000
    events[2 * DAY_TICKS + 123] = 1
    d = Detector(board_config(), KEYS)
    assert budget_firings(replay(d, nbytes, events)) == []


def test_nothing_is_judged_before_min_history_and_disabled_means_off():
    nbytes = np.full(DAY_TICKS // 2, 75.0)  # a drip from the first tick, for half a day
    events = np.ones_like(nbytes)
    d = Detector(board_config(), KEYS)
    assert budget_firings(replay(d, nbytes, events)) == []  # absolute budgets: under k

    nbytes, events = board_traffic(3)
    nbytes[2 * DAY_TICKS + 600 :] += 75
    events[2 * DAY_TICKS + 600 :] += 1
    off = Detector(board_config(enabled=False), KEYS)
    assert budget_firings(replay(off, nbytes, events)) == []
    on = Detector(board_config(), KEYS)
    assert budget_firings(replay(on, nbytes, events))


def test_a_patient_attacker_cannot_raise_an_hours_level_faster_than_the_cap():
    rule = BudgetRule(
        allowance_bits_per_second=1, tolerance_bits=1, relative=RelativeBudget(enabled=True)
    )
    bank = RelativeBank([rule], TICK)
    quiet = np.zeros(1)
    for i in range(DAY_TICKS):  # one quiet day: every hour's level is ready and near 0
        bank.update(quiet + (8 * 150 if i % 60 == 0 else 0), T0 + i * TICK)
    slot = 10
    before = float(bank.level[slot, 0])
    # The next day, the attacker fills hour 10 with as much as a tick can carry.
    for i in range(DAY_TICKS, 2 * DAY_TICKS):
        bank.update(np.array([8 * 1e6]), T0 + i * TICK)
    after = float(bank.level[slot, 0])
    eps = float(bank.eps[0])
    assert after <= (before + eps) * 4 - eps + 1e-6
    assert after < score(np.array([8e6]))[0] / 2  # far from what it was fed
    assert SLOT == 3600


def test_state_round_trip_keeps_the_seasonal_history():
    nbytes, events = board_traffic(4)
    onset = 3 * DAY_TICKS + 14 * 60
    nbytes[onset:] += 75
    events[onset:] += 1
    whole = Detector(board_config(), KEYS)
    expected = budget_firings(replay(whole, nbytes, events))

    first = Detector(board_config(), KEYS)
    cut = onset + 5
    replay(first, nbytes[:cut], events[:cut])
    saved = json.loads(json.dumps(first.to_state()))
    second = Detector(board_config(), KEYS)
    second.load_state(saved)
    resumed = budget_firings(replay(second, nbytes, events, start_tick=cut))
    assert expected and resumed
    assert resumed[0][0] == expected[0][0]


def test_a_busy_surface_never_trips_the_seasonal_rule():
    # Every tick carries ~40 kB with 25 % noise: the seasonal rule has nothing to say there.
    rng = np.random.default_rng(3)
    n = 6 * DAY_TICKS
    nbytes = np.round(40_000 * np.exp(0.25 * rng.standard_normal(n)) * TICK)
    events = np.ceil(nbytes / 800)
    big = {"allowance_bits_per_second": 1e9, "tolerance_bits": 1e12}
    d = Detector(board_config(big), KEYS)
    assert budget_firings(replay(d, nbytes, events)) == []
