"""The aggregate's members statistic (alarm/detector/swarm.py): a swarm of members each writing
60 % more per write pages through the aggregate within half an hour, while the fleet's own
swings in how often members write (a campaign), and one member's burst, do not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from alarm.config import config_from_dict
from alarm.detector.engine import Detector
from alarm.pipeline import Pipeline
from exporters.prometheus import render
from tests.servicekit import metric

TICK = 10.0
T0 = 1_767_571_200.0  # a Monday, 00:00 UTC
HOUR_TICKS = int(3600 / TICK)
MEMBERS = 40
SWARM = 30
DAYS = 3


def never(_row):
    return []


def fleet(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Members that write in a few ticks of ten, lognormal sizes of their own, and a fleet-wide
    factor on how often they write that changes every hour (sd 0.2)."""
    rng = np.random.default_rng(seed)
    ticks = DAYS * 24 * HOUR_TICKS
    duty = np.exp(rng.uniform(np.log(0.03), np.log(0.3), MEMBERS))
    median = np.exp(rng.uniform(np.log(100), np.log(5000), MEMBERS))
    sigma = rng.uniform(0.5, 1.2, MEMBERS)
    campaign = np.repeat(rng.lognormal(-0.02, 0.2, ticks // HOUR_TICKS + 1), HOUR_TICKS)[:ticks]
    written = rng.random((ticks, MEMBERS)) < np.clip(duty * campaign[:, None], 0, 1)
    sizes = median * np.exp(sigma * rng.standard_normal((ticks, MEMBERS)))
    nbytes = np.where(written, np.round(sizes), 0.0)
    return nbytes, written.astype(np.float64)


def detector(members: bool = True) -> Detector:
    surfaces = [{"name": f"sb{i:02d}", "kind": "fs"} for i in range(MEMBERS)]
    config = config_from_dict(
        {"tick": TICK, "surfaces": surfaces, "aggregates": {"fs": {"members": members}}}
    )
    return Detector(config, [("fs", f"sb{i:02d}") for i in range(MEMBERS)])


def replay(d: Detector, nbytes: np.ndarray, events: np.ndarray, start: int = 0, stop=None):
    fired = []
    stop = len(nbytes) if stop is None else stop
    for t in range(start, stop):
        for c in d.evaluate_arrays(T0 + (t + 1) * TICK, TICK, nbytes[t], events[t], never):
            if c.state == "firing" and c.previous != "firing":
                fired.append((t, c))
    return fired


ONSET = DAYS * 24 * HOUR_TICKS - 2 * HOUR_TICKS  # the last two hours are attacked


@pytest.fixture(scope="module")
def benign():
    """The benign fleet replayed to ONSET (its saved state, as JSON), then to the end."""
    nbytes, events = fleet(7)
    d = detector()
    fired = replay(d, nbytes, events, stop=ONSET)
    saved = json.loads(json.dumps(d.to_state()))
    fired += replay(d, nbytes, events, start=ONSET)
    return d, nbytes, events, fired, saved


def resumed(saved: dict, members: bool = True) -> Detector:
    d = detector(members)
    d.load_state(saved)
    return d


def test_the_fleets_own_swings_do_not_page_through_the_members_statistic(benign):
    d, _, _, fired, _ = benign
    aggregate = [c for _, c in fired if c.target == "(all)"]
    assert aggregate == []
    # It judges by now: the tail of Z is known after two days of peaks.
    assert d.swarm.judged[0] and np.isfinite(d.swarm.threshold()[0])


def test_a_swarm_of_members_each_writing_more_pages_through_the_aggregate(benign):
    _, nbytes, events, _, saved = benign
    attacked = nbytes.copy()
    attacked[ONSET:, :SWARM] = np.round(attacked[ONSET:, :SWARM] * 1.6)
    fired = replay(resumed(saved), attacked, events, start=ONSET)
    aggregate = [(t, c) for t, c in fired if c.target == "(all)"]
    assert aggregate, "the swarm was not seen through the aggregate"
    t, change = aggregate[0]
    assert (t - ONSET) * TICK <= 1800, f"seen after {(t - ONSET) * TICK / 60:.0f} min"
    assert change.rule == "spike" and change.figures["statistic"] == "members"
    assert change.figures["members_shift"] > change.figures["members_shift_threshold"] > 0
    shifted = change.figures["members_shifted"]
    assert shifted and all(int(s.split("sb")[1]) < SWARM for s in shifted)
    assert "members write more per write than their own normal" in change.summary
    # The aggregate's byte rate alone does not see it in that time.
    fired = replay(resumed(saved, members=False), attacked, events, start=ONSET)
    assert [c for t, c in fired if c.target == "(all)" and (t - ONSET) * TICK <= 1800] == []


def test_one_member_alone_cannot_carry_the_members_statistic(benign):
    _, nbytes, events, _, saved = benign
    burst = nbytes.copy()
    burst[ONSET:, 0] = np.round(burst[ONSET:, 0] * 20)  # sb00 writes 20x for two hours
    d = resumed(saved)
    fired = replay(d, burst, events, start=ONSET)
    assert [c for _, c in fired if c.target == "(all)"] == []
    assert {c.target for _, c in fired} <= {"sb00"}
    assert d.swarm.score[0] < d.swarm.threshold()[0]


def test_the_members_statistic_resumes_exactly_after_a_restart(benign):
    d, nbytes, events, _, saved = benign
    again, twin = resumed(saved), resumed(saved)
    assert again.swarm.tail.kept[np.isfinite(again.swarm.tail.kept)].size > 0
    replay(again, nbytes, events, start=ONSET)
    assert again.swarm.score.tolist() == d.swarm.score.tolist()
    assert again.swarm.threshold().tolist() == d.swarm.threshold().tolist()
    assert (again.swarm.tail.kept == d.swarm.tail.kept).all()
    assert twin.swarm.sum.tolist() != again.swarm.sum.tolist()  # it moved on after loading


def test_members_false_turns_the_statistic_off():
    d = detector(members=False)
    nbytes, events = fleet(8)
    replay(d, nbytes[:100], events[:100])
    assert not d.swarm.enabled.any() and not d.swarm.judged.any()


def test_the_members_statistic_is_exported_for_aggregates_only(benign):
    d, *_ = benign
    surfaces = [{"name": f"sb{i:02d}", "kind": "fs"} for i in range(MEMBERS)]
    p = Pipeline(config_from_dict({"tick": TICK, "surfaces": surfaces}), {})
    p.close_until(T0 + TICK)
    snap = p.snapshot(T0 + TICK, 5, {}, {})
    aggregate = [s for s in snap.surfaces if s.name == "(all)"]
    assert [s.members_shift for s in aggregate] == [0.0]
    assert all(s.members_shift is None for s in snap.surfaces if s.name != "(all)")
    body, _ = render(snap, [], None)
    text = body.decode()
    assert metric(text, "capalarm_aggregate_members_shift", kind="fs") == 0.0
    assert metric(text, "capalarm_aggregate_members_shift_threshold", kind="fs") == 0.0
    assert d.members_shift_of(d.index[("fs", "sb00")]) == {}
    row = d.index[("fs", "(all)")]
    assert d.members_shift_of(row)["members_shift_threshold"] > 0
