"""The state store: detector arrays saved raw in groups, replaced whole and atomically with the
counters, read back into the rows of the same surfaces; the learned profiles (slow group) are
saved on a cadence, everything else every tick."""

from __future__ import annotations

import numpy as np

from alarm.config import config_from_dict
from alarm.detector.engine import SLOW_ARRAYS, Detector
from alarm.service import Service
from alarm.state import StateStore


def never(_row):
    return []


def test_groups_round_trip_raw_and_are_replaced_whole(tmp_path):
    store = StateStore(tmp_path)
    day = np.arange(12, dtype=np.float32).reshape(4, 3)
    counts = np.array([1, 65535, 7], dtype=np.uint16)
    store.save(
        {"positions": {"k": 5}},
        groups={
            "slow": ({"keys": ["a", "b", "c"]}, {"day": day, "counts": counts}),
            "fast": (
                {"keys": ["a", "b", "c"]},
                {
                    "state": np.array([0, 2, 1], dtype=np.int8),
                    # Per-aggregate arrays of a detector without aggregates: no rows at all.
                    "none": np.zeros((14, 6, 0), dtype=np.float32),
                },
            ),
        },
    )
    # A later save of one group replaces that group only, whole (``counts`` is gone).
    store.save({"positions": {"k": 9}}, groups={"slow": ({"keys": ["c"]}, {"day": day[:, 2:]})})
    # A row of a type nobody wrote is ignored, not a crash.
    store.db.execute("INSERT INTO arrays VALUES ('fast', 'evil', 'object', '[1]', x'00')")
    store.close()

    again = StateStore(tmp_path)
    assert again.load() == {"positions": {"k": 9}}
    groups = again.load_groups()
    assert set(groups) == {"slow", "fast"}
    head, arrays = groups["slow"]
    assert head == {"keys": ["c"]} and list(arrays) == ["day"]
    assert arrays["day"].dtype == np.float32 and arrays["day"].tolist() == day[:, 2:].tolist()
    assert groups["fast"][1]["state"].tolist() == [0, 2, 1]
    assert groups["fast"][1]["none"].shape == (14, 6, 0)
    assert "evil" not in groups["fast"][1]


def config(tmp_path):
    return config_from_dict(
        {
            "tick": "10s",
            "state_dir": str(tmp_path / "state"),
            "sources": [],
            "surfaces": [{"name": f"s{i}", "match": {"dport": [1000 + i]}} for i in range(3)],
        }
    )


def test_the_service_saves_profiles_on_a_cadence_and_restores_every_array(tmp_path):
    service = Service(config(tmp_path), collectors=[])
    det = service.pipeline.detector
    rng = np.random.default_rng(1)
    t0 = 1_780_000_000.0
    n = det.members  # the three surfaces and egress/unclassified
    # The profiles learn after the spike rule's warm-up hour (360 ticks): 40 ticks after it.
    for i in range(400):
        det.evaluate_arrays(t0 + 10 * i, 10.0, rng.integers(0, 5000, n) * 1.0, np.ones(n), never)
    service._save_state(final=False)
    slow_saved = service.store.db.execute("SELECT saved FROM kv WHERE key='arrays:slow'").fetchone()
    det.evaluate_arrays(t0 + 4000, 10.0, np.full(n, 9e7), np.ones(n), never)
    service._save_state(final=False)  # within a tick of the last: the fast group only
    assert (
        service.store.db.execute("SELECT saved FROM kv WHERE key='arrays:slow'").fetchone()
        == slow_saved
    )
    fast = {k: a.copy() for k, a in det.state_arrays("fast").items()}
    slow = {k: a.copy() for k, a in det.state_arrays("slow").items()}
    assert set(slow) == SLOW_ARRAYS and not set(fast) & SLOW_ARRAYS
    service.store.close()

    restored = Service(config(tmp_path), collectors=[]).pipeline.detector
    # The fast arrays are the last tick's (the 9 MB/s tick fired the budget), the slow ones the
    # previous save's.
    for name, a in restored.state_arrays("fast").items():
        assert np.array_equal(a, fast[name], equal_nan=True), name
    assert int(restored.budget_alerts.state.max()) == 2
    assert restored.baseline.day_n.sum() == 40 * len(restored.keys)
    assert isinstance(restored, Detector)


def test_a_source_alert_firing_at_a_restart_still_resolves():
    import json

    from alarm.detector.engine import SOURCE_RESOLVE_HOLD, SourceJudgement

    def judge(lost: int) -> list[SourceJudgement]:
        return [SourceJudgement("kernel", True, "", lost, 0, 0, 3, 0)]

    d = Detector(config_from_dict({}), [])
    fired = d.evaluate_sources(10, 10, judge(3))
    assert [(c.rule, c.state) for c in fired] == [("records_lost", "firing")]
    saved = json.loads(json.dumps(d.to_state()))

    again = Detector(config_from_dict({}), [])
    again.load_state(saved)
    changes, t = [], 10
    while t < 10 + SOURCE_RESOLVE_HOLD + 30:
        t += 10
        changes += again.evaluate_sources(t, 10, judge(0))  # nothing new was lost
    # The destinations were told it fired; they are told it resolved, with the same fingerprint.
    assert [(c.rule, c.state, c.fingerprint) for c in changes] == [
        ("records_lost", "resolved", fired[0].fingerprint)
    ]
