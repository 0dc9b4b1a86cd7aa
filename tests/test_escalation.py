"""Escalation: a firing spike whose rate grows past ``escalate_ratio`` x the rate it was last
announced with is announced again (once per step up), survives a restart, and reaches each
destination once as an ``escalated`` notification."""

from __future__ import annotations

import json
import time

import numpy as np

from alarm.config import config_from_dict
from alarm.detector.engine import Detector
from exporters.notify import Notifications
from tests.fakes.kit import change, notify_config

TICK = 10.0
T0 = 1_780_000_000.0
KEYS = [("egress", "proxy")]


def never(_key):
    return []


def detector(escalate_ratio: float = 0.0, **spike) -> Detector:
    rule = {
        "min_history": "1m",
        "history": "10m",
        "floor_bytes_per_second": 0,
        "resolve_hold": "10m",
        "escalate_ratio": escalate_ratio,
        # A spike from the first tick (the calibrated thresholds need days of history).
        "absolute_bytes_per_second": 15_000,
        **spike,
    }
    config = config_from_dict(
        {
            "tick": "10s",
            "surfaces": [{"name": "proxy", "match": {"dport": [3128]}, "spike": rule}],
        }
    )
    return Detector(config, KEYS)


def run(d: Detector, rates: list[float], start: int = 0, rule: str = "spike") -> list:
    out = []
    for i, rate in enumerate(rates, start):
        nbytes = np.array([rate * TICK])
        out += d.evaluate_arrays(T0 + (i + 1) * TICK, TICK, nbytes, np.ones(1), never)
    return [c for c in out if c.rule == rule]


BASE = [1000.0 + 10 * (i % 7) for i in range(60)]


def test_a_spike_that_grows_is_announced_again_at_each_step_up():
    d = detector(4.0)
    changes = run(d, [*BASE, 20_000, 30_000, 90_000, 100_000, 400_000, 420_000])
    firing = [(c.previous, c.value, c.figures.get("escalated", False)) for c in changes]
    assert firing == [
        ("inactive", 20_000, False),
        ("firing", 90_000, True),  # past 4 x 20k; 30k was not
        ("firing", 400_000, True),  # past 4 x 90k; 100k was not
    ]
    assert "escalated" in changes[1].summary
    assert changes[1].started_at == changes[0].started_at  # the same incident


def test_no_escalation_when_off_and_the_peak_survives_a_restart():
    d = detector(0.0)
    assert [c.previous for c in run(d, [*BASE, 20_000, 1e6, 1e7])] == ["inactive"]

    d = detector(4.0)
    run(d, [*BASE, 20_000])
    saved = json.loads(json.dumps(d.to_state()))
    again = detector(4.0)
    again.load_state(saved)
    # Restored: still firing with 20k announced, so 60k is not news and 90k is.
    changes = run(again, [60_000, 90_000], start=len(BASE) + 1)
    assert [(c.previous, c.value) for c in changes] == [("firing", 90_000)]


def test_an_escalation_reaches_each_destination_once(tmp_path):
    n = Notifications(
        notify_config(
            tmp_path,
            {"destinations": [{"type": "webhook", "name": "w", "url": "http://127.0.0.1:9/a"}]},
        )
    )
    t0 = time.time()
    first = change(at=t0)
    n.record([first], t0)
    bigger = change(at=t0 + 10, started_at=first.started_at)
    bigger.previous = "firing"
    bigger.figures = {**bigger.figures, "escalated": True, "rate_bytes_per_second": 96000.0}
    n.record([bigger], t0 + 10)
    n.reconcile(t0 + 20)  # nothing new: the escalation was sent
    rows = n.outbox.head("w", 10)
    assert [r["event"] for r in rows] == ["firing", "escalated"]
    cur = n.outbox.db.execute("SELECT body FROM notify_outbox WHERE event = 'escalated'")
    (body,) = [json.loads(b) for (b,) in cur]
    assert body["change"]["figures"]["rate_bytes_per_second"] == 96000.0
    n.close()


def drop_detector(drop_ratio: float) -> Detector:
    return detector(
        floor_bytes_per_second=500, resolve_hold="1m", drop_ratio=drop_ratio, drop_hold="2m"
    )


def test_a_surface_that_stops_writing_fires_the_drop_rule_after_its_hold():
    d = drop_detector(3.0)
    changes = run(d, [*BASE, *[100.0] * 90], rule="drop")
    firing = [c for c in changes if c.state == "firing"]
    assert len(firing) == 1
    # pending once the five-minute rate is under a third, firing once that held two minutes
    assert firing[0].at - firing[0].started_at >= 120
    assert firing[0].value < 1000 / 3 and firing[0].threshold > 200
    resumed = run(d, [1000.0] * 60, start=len(BASE) + 90, rule="drop")
    assert [c.state for c in resumed] == ["resolved"]
    assert d.firing() == []


def test_no_drop_when_off_too_short_or_too_little_is_missing():
    assert run(drop_detector(0.0), [*BASE, *[0.0] * 90], rule="drop") == []
    short = run(drop_detector(3.0), [*BASE, *[100.0] * 52, *BASE[:30]], rule="drop")
    assert [c.state for c in short] == ["pending", "inactive"]
    # 1000 -> 400 B/s is not below a third: no drop, however long.
    assert run(drop_detector(3.0), [*BASE, *[400.0] * 90], rule="drop") == []
    # 400 -> 0 B/s is, but 400 B/s missing is under the 500 B/s floor: nothing that matters.
    low = [400.0 + 5 * (i % 3) for i in range(60)]
    assert run(drop_detector(3.0), [*low, *[0.0] * 90], rule="drop") == []
