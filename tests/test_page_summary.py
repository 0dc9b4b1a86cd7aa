"""The sentence every destination pages with says what the firing rule saw (issue 27): the
detector's own words for each rule, as the backtest and the log say them."""

from __future__ import annotations

import numpy as np

from exporters.payload import summary
from tests.test_rules_weeks import DAY, HOUR, detector, replay, strays


def test_each_rules_page_says_what_that_rule_saw_not_the_budget_sentence():
    rng = np.random.default_rng(2)
    det = detector([{"name": "cache", "kind": "fs"}])
    fill = np.zeros(9 * DAY)
    fill[HOUR : 2 * HOUR] = rng.lognormal(np.log(2e6), 0.3, HOUR)
    replay(det, fill)
    secret = np.zeros(HOUR)
    secret[5] = 32
    (_, change), *_ = replay(det, secret, start=9 * DAY)
    assert change.rule == "dormant"
    text = summary(change.to_dict(), now=change.at)
    assert "days of silence" in text and change.summary in text
    assert "capacity budget" not in text


def test_a_beacons_page_is_the_beacon_sentence():
    det = detector([{"name": "quiet"}])
    rng = np.random.default_rng(4)
    nbytes = strays(rng, DAY).astype(float)
    beats = np.zeros(2 * HOUR)
    beats[::10] = 1024.0  # 1 KiB every 10 minutes
    replay(det, nbytes)
    fired = [c for _, c in replay(det, beats, start=DAY) if c.rule == "beacon"]
    assert fired, "no beacon page"
    text = summary(fired[0].to_dict(), now=fired[0].at)
    assert "a beacon" in text and "capacity budget" not in text
