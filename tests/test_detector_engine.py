"""Detector v2 as the pipeline uses it: multi-horizon budgets, aggregates, alert bank, state."""

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from alarm.config import config_from_dict
from alarm.detector.alerts import AlertBank, AlertMachine
from alarm.detector.engine import Detector
from alarm.events import NAMED, Batch, Event, WriteEvents
from alarm.pipeline import Pipeline

TICK = 10.0
T0 = 1_780_000_000.0


def never(_key):
    return []


def drip_config(**budget):
    return config_from_dict(
        {
            "tick": "10s",
            "surfaces": [
                {
                    "name": "board",
                    "match": {"dport": [80]},
                    "spike": {"enabled": False},
                    "budget": {
                        "allowance_bits_per_second": 1000,
                        "tolerance_bits": 8000,
                        "horizon": "1m",
                        "horizons": [
                            {
                                "horizon": "1d",
                                "allowance_bits_per_second": 1,
                                "tolerance_bits": 4096,
                            }
                        ],
                        **budget,
                    },
                }
            ],
        }
    )


def test_a_drip_under_the_minute_allowance_fires_on_the_day_horizon_before_h_leaks():
    d = Detector(drip_config(), [("egress", "board"), ("egress", "unclassified")])
    fired = []
    for i in range(2000):
        # 11 bit/s: 10 above the day's allowance, far below the minute's.
        nbytes = np.array([11 / 8 * TICK, 0.0])
        changes = d.evaluate_arrays(T0 + (i + 1) * TICK, TICK, nbytes, np.zeros(2), never)
        fired += [c for c in changes if c.state == "firing"]
        if fired:
            break
    (c,) = fired
    assert c.rule == "budget" and c.figures["budget_horizon"] == "1d"
    assert c.value <= c.threshold  # stopped before h bits above the allowance
    assert c.figures["budget_horizons"]["1m"]["excess_bits"] == 0
    view = d.surfaces[("egress", "board")]
    assert int(view.budget_alert.state) == 2
    assert view.figures.horizons[1][0] == "1d"


def test_one_burst_under_the_tolerance_does_not_fire():
    d = Detector(drip_config(horizons=[]), [("egress", "board")])
    # 7 kbit above the minute allowance in one tick (tolerance 8 kbit), then nothing: a
    # single tick is not projected forward.
    bits = 1000 * TICK + 7000
    changes = d.evaluate_arrays(T0 + TICK, TICK, np.array([bits / 8]), np.zeros(1), never)
    changes += d.evaluate_arrays(T0 + 2 * TICK, TICK, np.zeros(1), np.zeros(1), never)
    assert [c for c in changes if c.rule == "budget"] == []


def swarm_config():
    surfaces = [
        {
            "name": f"board{i}",
            "kind": "registry",
            "match": {"repository": [f"board{i}"]},
            "spike": {"enabled": False},
            "budget": {"allowance_bits_per_second": 100, "tolerance_bits": 10_000},
        }
        for i in range(6)
    ]
    return config_from_dict({"tick": "10s", "surfaces": surfaces})


def test_a_swarm_under_every_member_budget_fires_the_aggregate_only():
    config = swarm_config()
    keys = [("registry", f"board{i}") for i in range(6)] + [("registry", "unclassified")]
    d = Detector(config, keys)
    assert ("registry", "(all)") in d.surfaces
    # Default aggregate: half the members' summed allowance (7 x 100 bit/s).
    assert d.surfaces[("registry", "(all)")].figures.budget_allowance == 350
    fired = []
    for i in range(200):
        nbytes = np.array([90 / 8 * TICK] * 6 + [0.0])  # 90 bit/s each: under 100
        fired += [c for c in d.evaluate_arrays(T0 + i * TICK, TICK, nbytes, np.zeros(7), never)]
    assert {(c.target, c.rule, c.state) for c in fired} == {("(all)", "budget", "firing")}
    assert fired[0].figures["members"] == 7


def test_aggregate_stays_quiet_when_a_member_already_alarms():
    d = Detector(swarm_config(), [("registry", f"board{i}") for i in range(6)])
    fired = []
    for i in range(100):
        nbytes = np.array([3000 / 8 * TICK] + [0.0] * 5)  # one member far over its budget
        fired += d.evaluate_arrays(T0 + i * TICK, TICK, nbytes, np.zeros(6), never)
    assert {(c.target, c.state) for c in fired} == {("board0", "firing")}


def test_state_round_trips_through_json_and_survives_foreign_shapes():
    config = swarm_config()
    keys = [("registry", f"board{i}") for i in range(6)]
    d = Detector(config, keys)
    rng = np.random.default_rng(3)
    for i in range(50):
        d.evaluate_arrays(T0 + i * TICK, TICK, rng.integers(0, 200, 6) * 1.0, np.ones(6), never)
    saved = json.loads(json.dumps(d.to_state()))
    # A new config that reorders and drops surfaces keeps the history of those that remain.
    again = Detector(config, list(reversed(keys[1:])))
    again.load_state(saved)
    row_old, row_new = d.index[("registry", "board3")], again.index[("registry", "board3")]
    assert again.baseline.recent[row_new] == d.baseline.recent[row_old]
    assert (again.budget.excess[:, row_new] == d.budget.excess[:, row_old]).all()
    assert again.baseline.day[:, row_new].tolist() == d.baseline.day[:, row_old].tolist()
    for junk in ({}, {"version": 2, "keys": "x", "arrays": 5}, {"surfaces": {"a/b": 1}}, [], None):
        Detector(config, keys).load_state(junk)  # type: ignore[arg-type]
    broken = json.loads(json.dumps(saved))
    broken["arrays"]["baseline.day"]["shape"] = [3, 3]
    Detector(config, keys).load_state(broken)


def test_v1_state_is_loaded():
    config = drip_config()
    d = Detector(config, [("egress", "board")])
    d.load_state(
        {
            "surfaces": {
                "egress/board": {
                    "baseline": {"values": [100.0] * 40},
                    "budget": {"excess": 5000.0},
                    "spike_alert": {"state": 2, "started_at": 5.0},
                    "budget_alert": {"state": 0},
                }
            },
            "sources": {},
        }
    )
    assert d.budget.excess[0, 0] == 5000.0
    assert int(d.surfaces[("egress", "board")].spike_alert.state) == 2
    assert d.baseline.count[0] == 40


def test_snapshot_lists_aggregates_with_summed_totals_and_horizons():
    p = Pipeline(swarm_config(), {"b": ("external", "registry")})
    rows = [("registry", f"board{i}") for i in range(6)]
    events = WriteEvents.of(NAMED, [Event(T0 + 1, row, 100, "c") for row in rows])
    p.apply("b", Batch(events), None)
    p.close_until(T0 + TICK)
    snap = p.snapshot(T0 + TICK, 5, {}, {})
    agg = [s for s in snap.surfaces if s.name == "(all)"]
    assert len(agg) == 1 and agg[0].bytes_total == 600 and agg[0].events_total == 6
    assert agg[0].budget_horizons and agg[0].budget_horizons[0][0] == "base"
    assert agg[0].rate == 600 / TICK


_steps = st.lists(st.tuples(st.floats(0, 3), st.booleans()), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(_steps, st.sampled_from([0.0, 10.0, 30.0]), st.sampled_from([0.0, 20.0, 40.0]))
def test_alert_bank_matches_the_alert_machine(steps, hold, resolve_hold):
    machine = AlertMachine("egress/x", "spike", hold, resolve_hold, 0.5)
    bank = AlertBank(["egress/x"], "spike", np.array([hold]), np.array([resolve_hold]))
    for i, (value, _) in enumerate(steps):
        now = T0 + (i + 1) * TICK
        expected = machine.step(now, TICK, value, 1.0)
        got = bank.step(now, TICK, np.array([value > 1.0]), np.array([value <= 0.5]))
        assert (got[0][1:] if got else None) == expected
        assert int(bank.state[0]) == int(machine.state)
