import json

import numpy as np

from alarm.config import config_from_dict
from alarm.detector.alerts import AlertMachine, AlertState
from alarm.detector.engine import Detector
from alarm.detector.rules.budget import capacity_bits
from alarm.surfaces import HeavyHitters


def test_cusum_budget_fires_only_past_tolerance_and_decays():
    config = config_from_dict(
        {
            "tick": "10s",
            "surfaces": [
                {
                    "name": "s",
                    "match": {"dport": [1]},
                    "budget": {"allowance_bits_per_second": 100, "tolerance_bits": 1000},
                }
            ],
        }
    )
    det = Detector(config, [("egress", "s")])
    states = []

    def tick(i: int, nbytes: float) -> float:
        changes = det.evaluate_arrays(
            1_780_000_000.0 + 10 * (i + 1), 10.0, np.array([nbytes]), np.zeros(1), lambda r: []
        )
        states.extend((c.rule, c.state) for c in changes if c.target == "s")
        return float(det.budget.excess[0, 0])

    assert tick(0, 125) == 0  # 1000 bits in 10 s: at the allowance, no excess
    assert tick(1, 300) == 1400  # 2400 bits: 1400 above the allowance, past the tolerance
    assert states == [("budget", "firing")]
    assert tick(2, 0) == 400  # a quiet tick takes the allowance off
    assert tick(3, 0) == 0  # never below zero: quiet time earns no credit


def test_capacity_bits_counts_metadata_per_event():
    assert capacity_bits(100, 2, 64) == 800 + 128


def test_alert_machine_hold_hysteresis_and_resolution():
    m = AlertMachine("egress/x", "spike", hold=20, resolve_hold=20, hysteresis=0.8)
    assert m.step(10, 10, 5, 10) is None
    assert m.step(20, 10, 50, 10) == (AlertState.INACTIVE, AlertState.PENDING)
    assert m.step(30, 10, 50, 10) == (AlertState.PENDING, AlertState.FIRING)
    assert m.started_at == 10
    assert m.step(40, 10, 9, 10) is None  # below threshold but above 0.8x: still firing
    assert m.step(50, 10, 1, 10) is None  # clear for 10s < resolve_hold
    assert m.step(60, 10, 1, 10) == (AlertState.FIRING, AlertState.RESOLVED)
    assert m.state == AlertState.INACTIVE


def test_pending_that_clears_never_fires():
    m = AlertMachine("egress/x", "spike", hold=30, resolve_hold=0, hysteresis=1)
    assert m.step(10, 10, 50, 10) == (AlertState.INACTIVE, AlertState.PENDING)
    assert m.step(20, 10, 1, 10) == (AlertState.PENDING, AlertState.INACTIVE)


def test_fingerprint_is_stable():
    a = AlertMachine("egress/x", "spike", 0, 0, 1)
    b = AlertMachine("egress/x", "spike", 5, 5, 0.5)
    c = AlertMachine("egress/x", "budget", 0, 0, 1)
    assert a.fingerprint == b.fingerprint != c.fingerprint


def test_heavy_hitters_bounded_and_keeps_the_heavy_ones():
    hh = HeavyHitters(8)
    for i in range(100_000):
        hh.add(f"10.{i % 250}.{i // 250 % 250}.{i % 7}:443/TCP", 1)
        if i % 10 == 0:
            hh.add("203.0.113.9:443/TCP", 100)
    top = hh.top(3)
    assert top[0][0] == "203.0.113.9:443/TCP"
    assert len(hh._counts) <= 16
    assert top[0][1] >= 10_000 * 100


def test_default_unclassified_budget_is_the_tightest():
    c = config_from_dict({"surfaces": [{"name": "proxy", "match": {"dport": [443]}}]})
    assert c.unclassified_budget("egress").allowance_bits_per_second <= 100
    assert c.surfaces[0].effective_budget().allowance_bits_per_second > 100


def judge(name="kernel", up=True, lost=0, unknown=0, forged=0):
    from alarm.detector.sources import SourceJudgement

    return [SourceJudgement(name, up, "", lost, unknown, forged, lost, forged)]


def test_source_alarms_fire_on_what_a_tick_forged_and_resolve():
    from alarm.detector.engine import Detector
    from alarm.detector.sources import SOURCE_RESOLVE_HOLD

    d = Detector(config_from_dict({}), [])
    changes = d.sources.evaluate(10, 10, judge(forged=1))
    assert [(c.rule, c.state, c.value) for c in changes] == [("forged_records", "firing", 1.0)]
    t, resolved = 10, []
    while not resolved and t < 10 + SOURCE_RESOLVE_HOLD + 30:
        t += 10
        resolved = d.sources.evaluate(t, 10, judge())
    assert [(c.rule, c.state) for c in resolved] == [("forged_records", "resolved")]


def test_a_gap_of_unknown_size_is_a_records_lost_alarm_that_says_so():
    from alarm.detector.engine import Detector

    d = Detector(config_from_dict({}), [])
    (change,) = d.sources.evaluate(10, 10, judge(unknown=1))
    assert (change.rule, change.state) == ("records_lost", "firing")
    assert "unknown number" in change.summary and change.figures["gap_unknown"] is True


def test_a_rows_derived_budget_does_not_depend_on_the_phase_of_the_other_rows():
    # Rows declared together share their windows' phase; one row restored from an older
    # state has its own.  The rows in common must see the same budgets either way, through
    # learning, the end of learning, and a budget found misconfigured.
    from alarm.detector.rules.budget import LEARNING_SECONDS

    rule = {
        "allowance_bits_per_second": 2000.0,
        "tolerance_bits": 1e5,
        "horizon": "1m",
        "horizons": [
            {"horizon": "1h", "allowance_bits_per_second": 800.0, "tolerance_bits": 1e6},
            {"horizon": "1d", "allowance_bits_per_second": 100.0, "tolerance_bits": 1e7},
        ],
    }

    def detector(rows: int) -> Detector:
        surfaces = [
            {"name": f"s{i}", "match": {"dport": [i + 1]}}
            | ({"budget": rule} if i % 4 == 0 else {})
            for i in range(rows)
        ]
        config = config_from_dict({"tick": "60s", "surfaces": surfaces})
        return Detector(config, [("egress", f"s{i}") for i in range(rows)])

    n = 40
    together, mixed = detector(n), detector(n + 1)
    mixed.budget.age[n] = 7 * 3600.0  # the restored row
    rng = np.random.default_rng(11)
    ticks = int(LEARNING_SECONDS / 60) + 600
    for t in range(ticks):
        nbytes = rng.lognormal(7, 1.5, n + 1) * (rng.random(n + 1) < 0.4)
        if t == ticks - 300:
            together.budget.mark_misconfigured(np.array([0, 4]))
            mixed.budget.mark_misconfigured(np.array([0, 4]))
        for det, rows in ((together, n), (mixed, n + 1)):
            det.evaluate_arrays(60.0 * (t + 1), 60.0, nbytes[:rows], np.zeros(rows), lambda r: [])
        for name in ("excess", "tolerance", "allowance", "envelope"):
            x, y = getattr(together.budget, name), getattr(mixed.budget, name)
            np.testing.assert_allclose(x[:, :n], y[:, :n], rtol=1e-12, err_msg=name)
    assert not together.budget.misconfigured[1] and together.budget.misconfigured[4]


def test_a_source_slow_to_open_at_start_is_not_down_but_one_that_stops_is_at_once():
    from alarm.detector.engine import Detector
    from alarm.detector.sources import SOURCE_START_GRACE

    d = Detector(config_from_dict({}), [])
    t = 100.0
    while t < 100 + SOURCE_START_GRACE - 1:  # still opening: no page
        assert d.sources.evaluate(t, 1, judge(up=False)) == []
        t += 1
    assert d.sources.evaluate(t, 1, judge()) == []  # up
    (change,) = d.sources.evaluate(t + 1, 1, judge(up=False))  # stopped: down at once
    assert (change.rule, change.state) == ("source_down", "firing")
    # One that never comes up is down once the grace is over.
    d = Detector(config_from_dict({}), [])
    d.sources.evaluate(0, 1, judge(up=False))
    (change,) = d.sources.evaluate(SOURCE_START_GRACE, 1, judge(up=False))
    assert (change.rule, change.state) == ("source_down", "firing")


def test_a_restart_that_evaluates_the_ticks_it_missed_is_no_source_down_before_the_grace():
    """Restarted after an hour down, the service evaluates the 360 ticks it missed within a
    second, before its kmsg reader has opened: counted in those ticks' times, the start grace
    was over at the second of them, and a restart after more than a few seconds down paged
    source_down (and, stopped again soon, left that page open).  The grace runs on the wall
    clock from the first judgement."""
    from alarm.detector.sources import SOURCE_START_GRACE
    from alarm.events import SourceHealth
    from alarm.pipeline import Pipeline

    config = config_from_dict({"tick": "10s", "sources": []})
    now = 1_780_000_000.0
    before = Pipeline(config, {"kernel": ("external", "egress")})
    before.start(now - 3600)
    before.close_until(now - 3600, now - 3600, {"kernel": SourceHealth(up=True)})
    state = json.loads(json.dumps(before.to_state()))
    p = Pipeline(config, {"kernel": ("external", "egress")})
    p.load_state(state, [], now)
    opening = {"kernel": SourceHealth(up=False)}

    def fired(end: float) -> list[str]:
        return [c.rule for r in p.close_until(end, end, opening) for c in r.changes]

    assert fired(now) == []  # the missed hour, while the reader opens
    assert fired(now + SOURCE_START_GRACE - 2) == []
    assert fired(now + SOURCE_START_GRACE + 10) == ["source_down"]  # it never came up


def test_a_10_bit_per_second_drip_on_a_quiet_surface_is_caught_by_its_derived_budget():
    """A surface that writes one ~200-byte record an hour gets a day allowance of about what
    it carries: one write at the start of a day is not read as its size over a few ticks
    (that kept the allowance at several times the surface's rate, and the day horizon learned
    the drip faster than it summed it: never caught in three days)."""
    config = config_from_dict({"surfaces": [{"name": "q", "match": {"dport": [1]}}]})
    det = Detector(config, [("egress", "q")])
    rng = np.random.default_rng(5)
    tick, day = 10.0, 8640

    def budget_fires(t: int, nbytes: float, events: float) -> bool:
        changes = det.evaluate_arrays(
            (t + 1) * tick, tick, np.array([nbytes]), np.array([events]), lambda r: []
        )
        return any(c.rule == "budget" and c.target == "q" for c in changes)

    writes = rng.random(9 * day) < tick / 3600.0
    t = 0
    for t in range(9 * day):
        fired = budget_fires(t, 200.0 if writes[t] else 0.0, 1.0 if writes[t] else 0.0)
        assert not fired, f"fired on ordinary traffic on day {t / day:.2f}"
    day_horizon = det.budget.names[0].index("1d")
    assert det.budget.allowance[day_horizon, 0] < 1.0  # ~0.5 bit/s carried, the floor
    # 10 bit/s as 12-13 bytes every tick, one event each (64 bits of metadata).  The duty
    # rule pages it first (written in every tick); the budget's own page, when its sum
    # passes the tolerance, is folded into that open incident: one page, not two.
    drip = np.diff(np.floor(10.0 / 8.0 * tick * np.arange(day + 1)))
    for i in range(day):
        extra = 200.0 if rng.random() < tick / 3600.0 else 0.0
        fired = budget_fires(t + 1 + i, drip[i] + extra, 1.0 + (extra > 0))
        if fired or det.pages_folded.get(("budget", "incident")):
            break
    assert i * tick <= 8 * 3600.0, f"caught after {i * tick / 3600:.1f} h"
