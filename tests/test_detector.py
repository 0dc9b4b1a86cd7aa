import pytest

from alarm.config import BudgetRule, SpikeRule, config_from_dict
from alarm.detector.alerts import AlertMachine, AlertState
from alarm.detector.baseline import RobustBaseline
from alarm.detector.budget import CapacityBudget, capacity_bits
from alarm.surfaces import HeavyHitters


def test_baseline_threshold_is_robust_to_a_single_outlier():
    b = RobustBaseline(SpikeRule(history=100, min_history=10, floor_bytes_per_second=0), tick=1)
    for i in range(50):
        b.learn(1000 + (i % 5) * 10)
    before = b.threshold()
    b.learn(1e9)  # a spike is clipped to the threshold, it does not drag the baseline
    assert b.median == pytest.approx(1020, abs=15)
    assert b.threshold() == pytest.approx(before, rel=0.05)


def test_sparse_surface_uses_the_mean_deviation_fallback_and_the_floor():
    b = RobustBaseline(SpikeRule(history=100, min_history=10, floor_bytes_per_second=500), tick=1)
    for i in range(60):
        b.learn(3000.0 if i % 20 == 0 else 0.0)
    assert b.median == 0
    assert b.spread > 0  # MAD is 0 on a mostly-zero surface
    assert b.threshold() >= 500


def test_baseline_not_ready_before_min_history():
    b = RobustBaseline(SpikeRule(history=600, min_history=60), tick=10)
    for _ in range(5):
        b.learn(1)
    assert not b.ready
    b.learn(1)
    assert b.ready


def test_cusum_budget_fires_only_past_tolerance_and_decays():
    budget = CapacityBudget(BudgetRule(allowance_bits_per_second=100, tolerance_bits=1000))
    assert budget.update(bits=100 * 10, seconds=10) == 0  # at allowance: no excess
    budget.update(bits=1500, seconds=1)  # 1400 above allowance
    assert budget.excess == 1400 and budget.exceeded
    budget.update(bits=0, seconds=10)
    assert budget.excess == 400 and not budget.exceeded
    budget.update(bits=0, seconds=100)
    assert budget.excess == 0  # never below zero: quiet time earns no credit


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


def test_source_alarms_cover_records_forged_before_the_first_tick_and_resolve():
    from alarm.collectors.base import SourceStats
    from alarm.detector.engine import SOURCE_RESOLVE_HOLD, Detector

    d = Detector(config_from_dict({}), [])
    stats = SourceStats(up=True, forged_records=5)  # restored from a previous run
    d.attach_source("kernel", stats)
    stats.forged_records += 1  # before the first tick
    changes = d.evaluate_sources(10, 10, {"kernel": stats})
    assert [(c.rule, c.state, c.value) for c in changes] == [("forged_records", "firing", 1.0)]
    t, resolved = 10, []
    while not resolved and t < 10 + SOURCE_RESOLVE_HOLD + 30:
        t += 10
        resolved = d.evaluate_sources(t, 10, {"kernel": stats})
    assert [(c.rule, c.state) for c in resolved] == [("forged_records", "resolved")]
