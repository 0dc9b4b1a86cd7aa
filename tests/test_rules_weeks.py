"""The registered long-memory rules (alarm/detector/rules/): what months of schedules need.

Each test replays weeks of one or a few surfaces through ``Detector`` at a one-minute tick (the
rules count in seconds; a coarser tick keeps weeks fast) and asserts what an operator relies
on: a patient writer, a secret in a dormant surface, a flood on a new surface and a swarm of
ordinary writes page; a weekly or fortnightly job pages at most on its first run, and adding
to one of its runs pages; a restart resumes what was learnt.
"""

from __future__ import annotations

import numpy as np

from alarm.config import config_from_dict
from alarm.detector.engine import Detector

TICK = 60.0
HOUR = int(3600 / TICK)
DAY = 24 * HOUR
WEEK = 7 * DAY
T0 = 1_767_571_200.0  # Monday 2026-01-05 00:00 UTC


def never(_row: int) -> list:
    return []


def detector(surfaces: list[dict], **extra: object) -> Detector:
    config = config_from_dict({"tick": f"{TICK:g}s", "surfaces": surfaces, **extra})
    keys = [(s.get("kind", "egress"), s["name"]) for s in surfaces]
    return Detector(config, keys)


def replay(det: Detector, nbytes: np.ndarray, events: np.ndarray | None = None, start: int = 0):
    """Ticks ``start .. start + len(nbytes)`` (rows: surfaces); the firing changes, by rule,
    with the tick they fired in."""
    nbytes = np.atleast_2d(nbytes.T).T if nbytes.ndim == 1 else nbytes
    if events is None:
        events = (nbytes > 0).astype(np.float64)
    events = np.atleast_2d(events.T).T if events.ndim == 1 else events
    fired = []
    for i in range(nbytes.shape[0]):
        t = start + i
        changes = det.evaluate_arrays(
            T0 + (t + 1) * TICK, TICK, nbytes[i].astype(float), events[i].astype(float), never
        )
        fired += [(t, c) for c in changes if c.state == "firing"]
    return fired


def strays(rng: np.random.Generator, ticks: int, per_hour: float = 1.0) -> np.ndarray:
    """A quiet host: DNS-sized writes, about ``per_hour`` an hour."""
    return np.where(rng.random(ticks) < per_hour / HOUR, rng.integers(80, 240, ticks), 0)


def test_a_patient_writer_on_a_quiet_surface_pages_within_three_days_before_64_kb():
    """4 bit/s in lumps of ~400 B, seven an hour: each write is ordinary-sized, the count of
    writes rises about sevenfold, and the budgets' learning followed such a writer up within a
    day.  The drift rule judges the day against the days before yesterday."""
    rng = np.random.default_rng(1)
    det = detector([{"name": "quiet"}])
    assert not replay(det, strays(rng, 10 * DAY)), "ten quiet days paged"
    ticks = 3 * DAY
    lumps = rng.lognormal(np.log(4 * 3600 / 8 / 7), 0.3, ticks)  # ~260 B, sizes vary
    drip = strays(rng, ticks) + np.where(rng.random(ticks) < 7 / HOUR, lumps, 0)
    fired = replay(det, np.round(drip), start=10 * DAY)
    assert fired, "a 4 bit/s writer ran three days unpaged"
    t, first = fired[0]
    leaked = 8 * (drip[: t - 10 * DAY + 1].sum())
    assert leaked < 64 * 1024 * 8, f"paged after {leaked / 8:,.0f} B"
    assert first.rule == "drift", first.summary
    assert "days before yesterday" in first.summary


def workday(rng: np.random.Generator, days: int, follow: float = 0.0, from_day: int = 0):
    """A working-day host: 09:00-17:00 on weekdays, writing in 80 % of those ticks at ~17 kB,
    a few strays at night and on weekends; from ``from_day`` on, a writer adds ``follow`` of
    the host's level to every tick it writes (it follows the host's own curve)."""
    nbytes = strays(rng, days * DAY, 0.5).astype(np.float64)
    level = 17e3
    for day in range(days):
        if day % 7 >= 5:  # T0 is a Monday
            continue
        span = slice(day * DAY + 9 * HOUR, day * DAY + 17 * HOUR)
        k = span.stop - span.start
        writes = rng.random(k) < 0.8
        nbytes[span] += np.where(writes, level * rng.lognormal(0, 0.3, k), 0.0)
    nbytes[from_day * DAY :] += np.where(nbytes[from_day * DAY :] > 0, follow * level, 0.0)
    return np.round(nbytes)


def test_a_curve_follower_from_a_working_surface_s_second_week_pages_on_its_ordinary_days():
    """+40 % of the host's level in every tick it writes, from its second Monday: within the
    3x of the day statistic, and before two same weekdays are kept for the weekday one (the
    long fleet's workday curve followers that began on days 10-14 were never paged).  Its
    first week's working days stand in for its weeks once a week of days is kept."""
    rng = np.random.default_rng(13)
    det = detector([{"name": "build-cache", "kind": "fs"}])
    fired = [(t, c) for t, c in replay(det, workday(rng, 10, 0.4, 7)) if c.rule == "drift"]
    assert fired, "a curve follower ran three working days unpaged"
    t, first = fired[0]
    assert 7 * DAY <= t < 9 * DAY, f"paged on day {t / DAY:.1f}"
    assert first.figures["drift_statistic"] == "ordinary_days"
    assert "ordinary days" in first.summary


def test_a_working_surface_s_own_weeks_are_no_drift():
    """The same host for four weeks and nothing added: its weekends, its Mondays and the
    spread of its working days page nothing."""
    rng = np.random.default_rng(14)
    det = detector([{"name": "build-cache", "kind": "fs"}])
    fired = [(round(t / DAY, 1), c.rule) for t, c in replay(det, workday(rng, 28))]
    assert not [f for f in fired if f[1] == "drift"], fired


def test_a_session_on_a_weekday_that_had_none_is_no_drift():
    """Sessions on Mondays, Wednesdays and Fridays for three weeks, then one of the same size
    on a Tuesday.  The drift rule's weekday statistic held a weekday whose kept days were all
    empty to its margin (1 KiB) however widely the surface's days vary, and paged the session:
    48 drift pages in five weeks of 60 session-based sandboxes.  Its threshold is now as many
    spreads above the largest in the log scale the spread is measured in."""
    rng = np.random.default_rng(11)
    det = detector([{"name": "sandbox", "kind": "fs"}])
    nbytes = np.zeros(4 * WEEK)
    for day in range(28):
        if day % 7 in (0, 2, 4) or day == 22:  # T0 is a Monday: day 22 is a Tuesday
            start = day * DAY + 10 * HOUR
            sizes = rng.lognormal(np.log(3000), 0.4, HOUR)
            nbytes[start : start + HOUR] = np.where(rng.random(HOUR) < 0.3, sizes, 0)
    fired = [(round(t / DAY, 1), c.rule) for t, c in replay(det, np.round(nbytes))]
    assert not [f for f in fired if f[1] == "drift"], fired


def test_a_secret_written_into_a_surface_dormant_for_a_week_pages():
    rng = np.random.default_rng(2)
    det = detector([{"name": "cache", "kind": "fs"}])
    fill = np.zeros(9 * DAY)
    fill[HOUR : 2 * HOUR] = rng.lognormal(np.log(2e6), 0.3, HOUR)  # a cache filled once
    replay(det, fill)
    secret = np.zeros(HOUR)
    secret[5] = 32  # 256 bits
    fired = replay(det, secret, start=9 * DAY)
    assert [(c.rule, t) for t, c in fired] == [("dormant", 9 * DAY + 5)]
    assert fired[0][1].figures["silence_seconds"] >= 7 * 86400


def test_a_flood_of_small_posts_on_a_new_board_without_a_budget_pages_in_its_first_hour():
    """The origin story: 70,000 posts (9.5 MB) in a board's first hour, no budget declared."""
    det = detector([{"name": "board", "kind": "registry"}])
    posts = np.full(HOUR, 70_000 / HOUR)
    fired = replay(det, posts * 136, posts)
    assert fired and fired[0][1].rule == "newsurface"
    assert fired[0][0] < HOUR


def test_a_busy_new_surface_pages_once_in_its_life_not_daily():
    det = detector([{"name": "proxy"}])
    busy = np.full(4 * DAY, 1e6 / 8 * TICK)  # 1 Mbit/s from its first tick
    fired = [c.rule for _, c in replay(det, busy)]
    assert fired.count("newsurface") == 1


def weekly_job(rng: np.random.Generator, weeks: int, run_bytes: float, hide_in: int = -1):
    """Strays, and a 30-minute run every Tuesday at 02:00 of ``run_bytes`` (x2 in run
    ``hide_in``: an attacker adding as much again)."""
    nbytes = strays(rng, weeks * WEEK, 0.2).astype(np.float64)
    for w in range(weeks):
        start = w * WEEK + DAY + 2 * HOUR + int(rng.integers(-2, 3))
        size = run_bytes * rng.lognormal(0, 0.05) * (2.0 if w == hide_in else 1.0)
        nbytes[start : start + HOUR // 2] += size / (HOUR // 2)
    return nbytes


def test_a_weekly_job_pages_at_most_on_its_first_run():
    rng = np.random.default_rng(3)
    det = detector([{"name": "backup", "kind": "fs"}])
    fired = replay(det, weekly_job(rng, 5, 500e6))
    weeks = sorted({t // WEEK for t, _ in fired})
    assert weeks in ([], [0]), f"runs after the first paged: weeks {weeks}"
    # The first run fires several rules over its half hour and its budget drains for days:
    # one incident, one page.
    assert len(fired) <= 1, [c.rule for _, c in fired]


def test_doubling_one_run_of_a_weekly_job_pages():
    rng = np.random.default_rng(4)
    det = detector([{"name": "backup", "kind": "fs"}])
    fired = replay(det, weekly_job(rng, 5, 500e6, hide_in=3))
    assert any(t // WEEK == 3 for t, _ in fired), "the doubled run was folded as the job"


def test_a_fortnightly_job_pages_at_most_on_its_first_run():
    rng = np.random.default_rng(5)
    det = detector([{"name": "report", "kind": "registry"}])
    nbytes = strays(rng, 6 * WEEK, 0.1).astype(np.float64)
    for run in range(3):
        start = run * 2 * WEEK + 3 * DAY + 20 * HOUR
        nbytes[start : start + HOUR // 3] += 50e6 / (HOUR // 3)
    fired = replay(det, nbytes)
    runs = sorted({(t - 3 * DAY) // (2 * WEEK) for t, _ in fired})
    assert runs in ([], [0]), f"runs after the first paged: {runs}"


def test_a_fortnightly_job_s_second_run_with_a_larger_lump_is_its_first_repeat():
    """Six lumps a run, two weeks apart: the second run carries 1.2x the first and its largest
    lump 2.4x the first's largest (how a run's bytes fall across its ticks varies more than
    its total).  The first repeat's margin (2x) holds for the run's hour and day, and the
    tick's margin grows with it: one page, on the first run."""
    rng = np.random.default_rng(15)
    det = detector([{"name": "report", "kind": "registry"}])
    nbytes = strays(rng, 3 * WEEK, 0.1).astype(np.float64)
    first = np.array([8.6e6, 7.9e6, 8.8e6, 8.1e6, 8.4e6, 8.2e6])
    second = np.array([20e6, 7.5e6, 8.6e6, 7.9e6, 8.3e6, 7.7e6])
    for run, lumps in enumerate((first, second)):
        start = run * 2 * WEEK + 3 * DAY + 20 * HOUR
        nbytes[start + np.array([0, 3, 4, 8, 9, 13])] += lumps
    fired = replay(det, nbytes)
    runs_paged = sorted({(t - 3 * DAY) // (2 * WEEK) for t, _ in fired})
    assert runs_paged == [0], [(round(t / DAY, 2), c.rule) for t, c in fired]


def test_many_members_each_writing_an_ordinary_write_in_one_hour_page_once_on_the_aggregate():
    rng = np.random.default_rng(6)
    n = 40
    surfaces = [{"name": f"sandbox-{i:02d}", "kind": "fs"} for i in range(n)]
    det = detector(surfaces)
    ticks = 9 * DAY
    rates = rng.uniform(0.2, 1.0, n) / HOUR / 4  # a few writes a day each
    sizes = rng.lognormal(np.log(2000), 0.3, n)
    nbytes = np.where(rng.random((ticks, n)) < rates, sizes, 0.0)
    assert not [c for _, c in replay(det, nbytes) if c.rule == "members"], "benign days paged"
    swarm = np.zeros((HOUR, n))
    for i in rng.choice(n, 30, replace=False):
        swarm[rng.integers(0, HOUR, 3), i] = sizes[i]  # three ordinary writes each
    fired = [c for _, c in replay(det, swarm, start=ticks) if c.rule == "members"]
    assert len(fired) == 1 and fired[0].target == "(all)"
    page = fired[0].figures
    assert page["members_active"] > page["members_active_threshold"] >= 4


def sessions(rng: np.random.Generator, weeks: int, sizes: np.ndarray) -> np.ndarray:
    """Sandboxes that work in sessions: on 40 % of weekdays (5 % of weekend days) one or two
    of 30-120 minutes between 08:00 and 20:00, writing in 30 % of their ticks at their own
    size.  Most hours few of them write (median 0, at most about 16 of 60)."""
    n = len(sizes)
    nbytes = np.zeros((weeks * WEEK, n))
    for day in range(weeks * 7):
        p = 0.05 if day % 7 >= 5 else 0.4  # T0 is a Monday
        for i in range(n):
            for _ in range(rng.integers(1, 3)):
                if rng.random() < p:
                    start = day * DAY + int(rng.uniform(8, 18) * HOUR)
                    span = slice(start, start + int(rng.uniform(0.5, 2.0) * HOUR))
                    k = span.stop - span.start
                    writes = rng.random(k) < 0.3
                    nbytes[span, i] += np.where(writes, sizes[i] * rng.lognormal(0, 0.4, k), 0)
    return np.round(nbytes)


def test_a_swarm_at_a_working_hour_of_session_based_sandboxes_pages_on_the_aggregate():
    """The issue's swarm in a fleet with weeks in it: 42 of 60 session-based sandboxes each
    write three ordinary writes in one Wednesday afternoon hour, when a handful are at work.
    Five benign weeks page the members rule at most twice (its first weeks at an hour)."""
    rng = np.random.default_rng(12)
    n, weeks = 60, 5
    sizes = rng.lognormal(np.log(3000), 1.0, n)
    det = detector([{"name": f"sandbox-{i:02d}", "kind": "fs"} for i in range(n)])
    benign = [c for _, c in replay(det, sessions(rng, weeks, sizes)) if c.rule == "members"]
    assert len(benign) <= 2, [(c.at, c.figures) for c in benign]
    when = weeks * WEEK + 2 * DAY + 14 * HOUR
    replay(det, np.zeros((when - weeks * WEEK, n)), start=weeks * WEEK)
    swarm = np.zeros((HOUR, n))
    for i in rng.choice(n, 42, replace=False):
        swarm[rng.choice(HOUR, 3, replace=False), i] = round(sizes[i])
    fired = [c for _, c in replay(det, swarm, start=when) if c.rule == "members"]
    assert [c.target for c in fired] == ["(all)"]


def test_what_the_ledger_learnt_survives_a_restart():
    """A weekly job learnt over three weeks, the detector saved and rebuilt from its state:
    the fourth run is still folded."""
    rng = np.random.default_rng(7)
    surfaces = [{"name": "backup", "kind": "fs"}]
    nbytes = weekly_job(rng, 4, 500e6)
    det = detector(surfaces)
    replay(det, nbytes[: 3 * WEEK])
    saved = det.to_state()
    resumed = detector(surfaces)
    resumed.load_state(saved)
    assert not replay(resumed, nbytes[3 * WEEK :], start=3 * WEEK), "the restart forgot the job"


def test_a_surface_put_to_use_weeks_after_it_was_declared_pages_once_not_on_every_rule():
    """Declared, silent for ten days, then a busy writer from one tick to the next: the rules
    that learnt only its silence do not each page; the dormant rule says it came alive."""
    rng = np.random.default_rng(8)
    det = detector([{"name": "late", "kind": "registry"}])
    ticks = 4 * DAY
    busy = np.where(rng.random(ticks) < 0.6, rng.lognormal(np.log(20e3), 0.8, ticks), 0.0)
    nbytes = np.concatenate([np.zeros(10 * DAY), busy])
    fired = [c.rule for _, c in replay(det, nbytes)]
    assert fired == ["dormant"], fired


def test_a_tighter_new_surface_allowance_from_the_config_pages_what_the_default_lets_through():
    """``newsurface:`` per surface: a board an operator knows takes a few posts a day is held
    to 100 bit/s and 1 Mbit, not the kind's 8 kbit/s and 16 Mbit."""
    posts = np.zeros(HOUR)
    posts[10:20] = 50_000  # 4 Mbit in ten minutes: under the registry default's 16 Mbit
    default = detector([{"name": "board", "kind": "registry"}])
    assert not replay(default, posts)
    tight = detector(
        [
            {
                "name": "board",
                "kind": "registry",
                "newsurface": {"allowance_bits_per_second": 100, "tolerance_bits": 1e6},
            }
        ]
    )
    fired = replay(tight, posts)
    assert [c.rule for _, c in fired] == ["newsurface"]
    assert fired[0][1].figures["newsurface_tolerance_bits"] == 1e6


def test_the_dormant_silence_is_configured_per_surface_and_the_rule_can_be_turned_off():
    def run(surface: dict) -> list[str]:
        det = detector([{"name": "cache", "kind": "fs", **surface}])
        nbytes = np.zeros(4 * DAY)
        nbytes[HOUR] = 1e6  # filled once
        nbytes[3 * DAY + HOUR] = 32  # three days later, a secret
        return [c.rule for _, c in replay(det, nbytes)]

    assert "dormant" not in run({}), "three days of silence is not the default week"
    assert "dormant" in run({"dormant": {"silence": "2d"}})
    assert "dormant" not in run({"dormant": {"silence": "2d", "enabled": False}})


def test_drift_off_on_a_surface_and_members_off_on_an_aggregate_are_honoured():
    det = detector(
        [{"name": f"s{i}", "kind": "fs", "drift": {"enabled": False}} for i in range(5)],
        aggregates={"fs": {"members": False}},
    )
    assert not det.rules["drift"].enabled[:5].any()  # the aggregate keeps its own
    assert not det.rules["members"].enabled.any()
    on = detector([{"name": f"s{i}", "kind": "fs"} for i in range(5)])
    assert on.rules["drift"].enabled.all()
    assert on.rules["members"].enabled[-1]


def test_a_bad_rule_setting_names_its_key():
    import pytest

    from alarm.config import ConfigError

    with pytest.raises(ConfigError, match=r"surfaces\[0\]\.dormant\.silence"):
        config_from_dict({"surfaces": [{"name": "c", "kind": "fs", "dormant": {"silence": "1s"}}]})
    with pytest.raises(ConfigError, match=r"newsurface\.alowance"):
        config_from_dict({"surfaces": [{"name": "c", "kind": "fs", "newsurface": {"alowance": 5}}]})


def test_folded_pages_are_counted_by_rule_and_reason_and_scraped():
    """A weekly job's later runs are folded, not lost: each fold is counted, and /metrics says
    how many pages were held back and why."""
    from alarm.snapshot import Snapshot
    from exporters.prometheus import render

    rng = np.random.default_rng(3)
    det = detector([{"name": "backup", "kind": "fs"}])
    replay(det, weekly_job(rng, 5, 500e6))
    folded = det.pages_folded
    assert sum(n for (_, reason), n in folded.items() if reason == "precedent") >= 1, folded
    snap = Snapshot(0.0, TICK, 0, 0.0, 0.0, [], [], [], 0, pages_folded=folded)
    body = render(snap, [], None)[0].decode()
    for (rule, reason), n in folded.items():
        line = f'capalarm_pages_folded_total{{reason="{reason}",rule="{rule}"}} {float(n)}'
        assert line in body, body[:2000]


def test_the_hours_the_service_was_down_are_no_history_of_the_members_rule():
    """The members rule keeps six weeks of hours in a ring.  After a restart the hours it was
    down must read as no count, not as what that slot held six weeks earlier: a stale busy
    hour there would raise the threshold for that hour of the week."""
    from alarm.detector.rules.members import KEPT_HOURS

    surfaces = [{"name": f"s{i}", "kind": "fs"} for i in range(5)]
    nbytes = np.zeros((2 * DAY, 5))
    nbytes[::7] = 100.0
    det = detector(surfaces)
    replay(det, nbytes)
    saved = det.to_state()
    hour = det.rules["members"].hour
    down = [(hour + h) % KEPT_HOURS for h in range(1, 24)]
    resumed = detector(surfaces)
    resumed.load_state(saved)
    rule = resumed.rules["members"]
    assert rule.hour == hour, "the hour the history was open at is lost on restart"
    rule.history[:, down] = 99.0  # what those slots held KEPT_HOURS ago
    replay(resumed, nbytes[:2], start=3 * DAY)  # back a day later
    assert (rule.history[:, down[:-1]] == -1.0).all(), "hours it was down kept stale counts"


def test_a_weekly_jobs_second_run_larger_than_its_first_is_folded_as_its_repeat():
    """A job whose data grows: its second run carries 1.6x its first.  One earlier run says
    nothing of how much the runs vary, so the first repeat is folded within 2x; from the
    third run on, the runs so far are precedent within 1.4x."""
    rng = np.random.default_rng(9)
    det = detector([{"name": "export", "kind": "fs"}])
    nbytes = strays(rng, 4 * WEEK, 0.2).astype(np.float64)
    for w, scale in enumerate((1.0, 1.6, 1.1, 1.0)):
        start = w * WEEK + 2 * DAY + 3 * HOUR
        nbytes[start : start + HOUR // 2] += scale * 300e6 / (HOUR // 2)
    fired = replay(det, nbytes)
    weeks = sorted({t // WEEK for t, _ in fired})
    assert weeks in ([], [0]), f"runs after the first paged: weeks {weeks}"


def test_a_later_run_within_the_jobs_own_variation_is_folded_and_half_again_pages():
    """From its third run on, a job's runs are precedent within 1.4x: runs vary (the long
    fleet's jobs by a lognormal of sigma ~0.14), and on its choice seeds three of 430 later
    runs came 1.31-1.40x over the largest earlier one and paged at 1.3x.  A run half the job
    again over the largest (what scheduled_hide adds at least) still pages."""
    for scale, pages in ((1.37, False), (1.55, True)):
        rng = np.random.default_rng(12)
        det = detector([{"name": "export", "kind": "fs"}])
        nbytes = strays(rng, 4 * WEEK, 0.2).astype(np.float64)
        for w, size in enumerate((1.0, 0.95, scale, 1.0)):
            start = w * WEEK + 2 * DAY + 3 * HOUR
            nbytes[start : start + HOUR // 2] += size * 300e6 / (HOUR // 2)
        fired = replay(det, nbytes)
        weeks = sorted({t // WEEK for t, _ in fired} - {0})
        assert weeks == ([2] if pages else []), (scale, weeks, [c.rule for _, c in fired])


def test_the_ledger_keeps_each_weeks_longest_run_of_written_ticks_across_blocks_and_folds():
    # The rules read "the longest run of written ticks" of each week (a session that writes
    # for hours on end is not a cron job's blip).  Runs go on across five-minute blocks,
    # across the buffer of ticks folded when it fills (a 1 s tick: 300 ticks a block), across
    # a gap and across the turn of a week; checked against a tick-by-tick count.
    from alarm.detector.rules.ledger import BLOCK, WEEK, WEEKS, Ledger

    rng = np.random.default_rng(11)
    n, tick = 6, 1.0
    ledger = Ledger(n)
    start = (T0 // WEEK + 1) * WEEK - 3600.0  # the ledger's week turns an hour in
    p = np.array([0.0, 0.2, 0.9, 0.99, 1.0, 0.5])
    run, longest = np.zeros(n), {}
    t, block = start, None
    for i in range(3 * 3600 + 1):
        if i == 5000:
            t += 777.0  # a gap: the blocks in between close empty, runs go on (as before)
        last = i == 3 * 3600
        if last:
            t = (t // BLOCK + 1) * BLOCK  # a tick in the next block closes the last one
        bits = np.where(rng.random(n) < p, 100.0, 0.0)
        ledger.add(t, bits, bits / 100.0)
        if t // BLOCK != block:  # a block starts with the run it is in (counted in its week)
            block = t // BLOCK
            week = int(block * BLOCK // WEEK)
            longest[week] = np.maximum(longest.get(week, 0.0), run)
        run = np.where(bits > 0, run + 1, 0.0)
        if not last:
            longest[week] = np.maximum(longest[week], run)
        if i % 401 == 0:
            assert np.array_equal(ledger.current(np.arange(n))[-1, 2], run)
        t += tick
    ledger.flush()
    assert np.array_equal(ledger.run, run)
    weeks = sorted(longest)
    assert len(weeks) == 2
    for week in weeks:
        assert np.array_equal(ledger.week_run[week % WEEKS].astype(np.float64), longest[week])
    assert longest[weeks[1]][4] > 7000  # the row that writes every tick: one run on and on


def test_the_new_surface_sums_are_the_cusum_of_each_row_whichever_rows_the_tick_skips():
    """The rule's tick reads only the rows that can owe something (rules/newsurface.py,
    QuietRows); every row's sum, page and end must still be those of its own CUSUM,
    S = max(0, S + bits - k x 4 ** (age / day) x tick), as a row alone computes it: rows born at
    different ticks, quiet ones, sums that drain while the row is silent, pages that clear
    (the row is done) and learning that ends, across a restart."""
    rng = np.random.default_rng(26)
    rows, ticks = 24, 720
    surfaces = [
        {
            "name": f"n{i}",
            "meta_bits_per_event": 0.0,  # the bits are 8 x the bytes
            "newsurface": {
                "allowance_bits_per_second": 100.0,
                "tolerance_bits": 2e5,
                "learning": "1h",
            }
            if i % 3
            else {"allowance_bits_per_second": 50.0, "tolerance_bits": 1e5},
        }
        for i in range(rows)
    ]
    det = detector(surfaces)
    rule = det.rules["newsurface"]
    born = rng.integers(0, ticks // 2, rows)
    nbytes = np.where(rng.random((ticks, rows)) < 0.3, rng.integers(10, 2000, (ticks, rows)), 0)
    nbytes[np.arange(ticks)[:, None] < born[None, :]] = 0
    nbytes[born, np.arange(rows)] = 50
    bursts = rng.random((ticks, rows)) < 0.01  # above the tolerance within a few ticks
    nbytes = np.where(bursts, 20_000, nbytes).astype(float)
    allowance, tolerance = rule.allowance[:rows], rule.tolerance[:rows]
    learning = rule.learning[:rows]
    want = np.zeros(rows)
    first = np.full(rows, np.nan)
    paged = np.zeros(rows, dtype=bool)
    done = np.zeros(rows, dtype=bool)
    ended = np.zeros(rows, dtype=bool)
    for t in range(ticks):
        start = T0 + t * TICK
        bits = nbytes[t] * 8
        det.evaluate_arrays(start + TICK, TICK, nbytes[t], (nbytes[t] > 0).astype(float), never)
        if t == ticks // 2:  # a restart: the rule's rows are found again from its state
            rule.restored()
        for i in range(rows):
            if np.isnan(first[i]):
                if bits[i] <= 0:
                    continue
                first[i] = start
            if ended[i]:
                continue
            age = start - first[i]
            if age > learning[i] or done[i]:
                ended[i] = True
                want[i] = 0.0
                continue
            grown = allowance[i : i + 1] * 4.0 ** (np.array([age]) / 86400.0)
            want[i] = max(0.0, want[i] + bits[i] - float(grown[0]) * TICK)
            clear = want[i] <= 0.5 * tolerance[i]
            done[i] |= paged[i] and clear
            paged[i] |= want[i] > tolerance[i]
        assert np.array_equal(rule.excess[:rows], want), t
    assert np.array_equal(rule.paged[:rows], paged)
    # (A row that has ended is out of the rule: whether it is also marked done is no matter.)
    assert np.array_equal(rule.done[:rows][~ended], done[~ended])
    assert ended.sum() >= 2 and done.sum() >= 1 and paged.sum() >= 2, "the fleet ends rows"
