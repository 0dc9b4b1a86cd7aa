"""The duty rule (alarm/detector/rules/duty.py): a quiet surface written in every tick pages in
minutes, through the detector a service runs; its ordinary strays never do; a cache written in
a third of its ticks, with warm-ups, pages on a leak that writes without a pause for far
longer than any warm-up, and never on its warm-ups; a restart keeps what it learned."""

from __future__ import annotations

import numpy as np

from alarm.config import config_from_dict
from alarm.detector.alerts import AlertState
from alarm.detector.engine import Detector
from alarm.surfaces import SurfaceKey

TICK = 10.0
DAY = 8640  # ticks
WEEK = 7 * DAY
KEY: SurfaceKey = ("egress", "quiet")


def _detector(**duty: object) -> Detector:
    surface: dict = {"name": "quiet"}
    if duty:
        surface["budget"] = {"allowance_bits_per_second": 1e6, "tolerance_bits": 1e9, "duty": duty}
    return Detector(config_from_dict({"surfaces": [surface]}), [KEY])


def _run(det: Detector, start: int, nbytes: np.ndarray) -> list:
    changes = []
    for i, b in enumerate(nbytes):
        t = start + i + 1
        changes += det.evaluate_arrays(
            t * TICK, TICK, np.array([float(b)]), np.array([float(b > 0)]), lambda row: []
        )
    return [c for c in changes if c.rule == "duty"]


def _strays(rng: np.random.Generator, ticks: int) -> np.ndarray:
    """One DNS-sized write every half hour or so, at random."""
    return np.where(rng.random(ticks) < TICK / 1800.0, rng.integers(60, 300, ticks), 0)


def test_a_quiet_surface_written_in_every_tick_pages_within_minutes_and_strays_never_do():
    det = _detector()
    rng = np.random.default_rng(11)
    history = _strays(rng, 2 * DAY)
    assert not _run(det, 0, history), "its ordinary strays paged"
    assert np.isfinite(det.rules["duty"].bank.threshold[0]), "not judged after a full day"
    # 10 bit/s as 12-13 bytes every tick.
    drip = np.diff(np.floor(10.0 / 8.0 * TICK * np.arange(DAY // 4 + 1)))
    changes = _run(det, 2 * DAY, drip)
    fired = [c for c in changes if c.state == "firing"]
    assert fired, "a drip in every tick was never seen"
    first = fired[0]
    delay_s = first.at - 2 * DAY * TICK
    assert delay_s <= 120.0, f"paged after {delay_s:.0f} s"
    assert len(fired) == 1, "one incident, not a page per tick"
    leading = (
        "duty_run_threshold_seconds"
        if first.figures["duty_statistic"] == "run"
        else "duty_threshold"
    )
    assert first.figures[leading] == first.threshold > 0
    assert first.value >= first.threshold
    assert "written far more often than ever" in first.summary
    # The drip stops: the page resolves after its hold, not before.
    tail = _run(det, 2 * DAY + DAY // 4, np.zeros(2 * 360))
    resolved = [c for c in tail if c.state == "resolved"]
    assert len(resolved) == 1
    assert resolved[0].at - (2 * DAY + DAY // 4) * TICK >= 3600.0


def test_the_count_is_mute_on_a_surface_written_in_most_ticks_but_a_run_without_a_pause_pages():
    """A 60 % writer: the count's threshold is beyond what any writer can reach (window /
    tick), but its runs break every few ticks, so 100 minutes written without a pause page
    through the run statistic, once it has a week of days."""
    det = _detector()
    rng = np.random.default_rng(3)
    busy = np.where(rng.random(WEEK + 60) < 0.6, 1000, 0)
    assert not _run(det, 0, busy[: WEEK - 1]), "its ordinary writes paged"
    assert det.rules["duty"].bank.threshold[0] > 1.0 / (1.0 - det.rules["duty"].bank.decay[0])
    assert not np.isfinite(det.rules["duty"].bank.run_threshold[0]), "the run judged before a week"
    assert not _run(det, WEEK - 1, busy[WEEK - 1 :])
    assert np.isfinite(det.rules["duty"].bank.run_threshold[0]), "the run not judged after a week"
    fired = [c for c in _run(det, WEEK + 60, np.full(600, 1000)) if c.state == "firing"]
    assert len(fired) == 1
    first = fired[0]
    assert first.figures["duty_statistic"] == "run"
    longest = first.figures["duty_longest_run_seconds"]
    assert 0 < longest < 60 * TICK, "a 60 % writer's runs are short"
    assert first.threshold == 2.0 * longest + 2.0 * TICK
    assert first.value == first.threshold, "paged on the tick the run reached its threshold"
    assert "without a pause" in first.summary


def _cache(rng: np.random.Generator, ticks: int, warmups: list[tuple[int, int]]) -> np.ndarray:
    """Written in a third of the ticks, lognormal sizes; in each warm-up (start, ticks), every
    tick written at ten times the size."""
    nbytes = np.where(rng.random(ticks) < 0.3, rng.lognormal(np.log(20e3), 0.5, ticks), 0.0)
    for start, n in warmups:
        nbytes[start : start + n] = rng.lognormal(np.log(200e3), 0.5, n)
    return np.round(nbytes)


def test_a_cache_pages_on_a_leak_written_without_a_pause_and_never_on_its_warm_ups():
    det = _detector()
    rng = np.random.default_rng(5)
    # A week with warm-ups of 15, 5, 12 and 8 minutes (90, 30, 72, 48 ticks), on four days.
    warmups = [(3000, 90), (DAY + 5000, 30), (3 * DAY + 1000, 72), (5 * DAY + 700, 48)]
    assert not _run(det, 0, _cache(rng, WEEK, warmups)), "its writes or warm-ups paged"
    longest = det.rules["duty"].bank.figures(0)["duty_longest_run_seconds"]
    assert 900 <= longest < 1000, "the longest kept run is the 15-minute warm-up's"
    # Another warm-up as long as the longest: not a page.
    assert not _run(det, WEEK, _cache(rng, DAY // 4, [(100, 90)]))
    # A leak in every tick on top of the cache's own writes, for an hour.
    leak = _cache(rng, 360, []) + 5000
    fired = [c for c in _run(det, WEEK + DAY // 4, leak) if c.state == "firing"]
    assert len(fired) == 1
    delay_s = fired[0].at - (WEEK + DAY // 4) * TICK
    assert delay_s == fired[0].threshold <= 2 * longest + 2 * TICK, "paged at the run's threshold"


def test_a_surface_written_in_every_tick_always_is_mute():
    det = _detector()
    assert not _run(det, 0, np.full(WEEK + 600, 1000)), "a writer of every tick paged"
    assert np.isfinite(det.rules["duty"].bank.run_threshold[0])


def test_a_restart_keeps_the_learned_days_and_an_open_page():
    det = _detector()
    rng = np.random.default_rng(7)
    _run(det, 0, _strays(rng, 2 * DAY))
    fired = _run(det, 2 * DAY, np.full(60, 13))
    assert [c.state for c in fired] == ["firing"]
    restored = _detector()
    restored.load_state(det.to_state())
    assert restored.rules["duty"].bank.threshold[0] == det.rules["duty"].bank.threshold[0]
    assert restored.rules["duty"].bank.run_threshold[0] == det.rules["duty"].bank.run_threshold[0]
    assert restored.surfaces[KEY].duty_alert.state == AlertState.FIRING
    # Still dripping after the restart: the same incident goes on, no second page.
    assert not [c for c in _run(restored, 2 * DAY + 60, np.full(60, 13)) if c.state == "firing"]


def test_turned_off_it_never_judges():
    det = _detector(enabled=False)
    _run(det, 0, np.zeros(DAY + 10))
    assert det.surfaces[KEY].duty_alert is None
    assert not _run(det, DAY + 10, np.full(100, 13))
