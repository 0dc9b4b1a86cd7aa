"""The held-out fleets of the detection bench (bench/detection/fleets.py), their scorer
(score.incidents, score.score_fleet), the plain CUSUM reference and the seed protocol."""

from __future__ import annotations

import io
import json
from collections import defaultdict

import numpy as np
import pytest

from bench.detection import builders, fleets, heldout, longfleet, reference, score
from bench.detection.fleets import Attack, Clock, Fleet, SurfaceInfo

WEEK = Clock(fleets.ticks_per(7 * 86400.0))
DAY = 8640


@pytest.fixture(scope="module")
def main_pair() -> tuple[Fleet, Fleet]:
    """A 14-day main fleet and its benign twin."""
    return fleets.main_fleet(4), fleets.main_fleet(4, attacks=False)


@pytest.fixture(scope="module")
def sandbox_pair() -> tuple[Fleet, Fleet]:
    return fleets.sandbox_fleet(4), fleets.sandbox_fleet(4, attacks=False)


# -- reproducibility ---------------------------------------------------------------------------


def test_fleet_is_reproducible_by_seed_and_differs_across_seeds(main_pair):
    again = fleets.main_fleet(4)
    assert np.array_equal(again.nbytes, main_pair[0].nbytes)
    assert np.array_equal(again.events, main_pair[0].events)
    assert [(a.kind, a.onset, a.columns) for a in again.attacks] == [
        (a.kind, a.onset, a.columns) for a in main_pair[0].attacks
    ]
    other = fleets.main_fleet(5, days=10)
    assert not np.array_equal(other.nbytes[:DAY], main_pair[0].nbytes[:DAY])


def test_a_surface_depends_only_on_seed_family_and_index(main_pair):
    fleet = main_pair[1]
    col = fleet.column("cache-02")
    alone = fleets.generate_surface("cache", 4, 2, fleet.clock)
    assert np.array_equal(alone.nbytes, fleet.nbytes[:, col])
    assert alone.kind == fleet.surfaces[col].kind
    assert not np.array_equal(
        fleets.generate_surface("cache", 4, 3, fleet.clock).nbytes, alone.nbytes
    )


def test_fleet_starts_monday_midnight_utc_with_ten_second_ticks(main_pair):
    fleet = main_pair[0]
    assert fleet.clock.tick == 10.0 and fleet.ticks == 14 * DAY
    assert fleet.clock.weekday[0] == 0 and fleet.clock.hour[0] == 0.0
    assert fleet.clock.weekday[5 * DAY] == 5  # Saturday
    assert fleet.clock.t0 % 604800 == 4 * 86400  # the Unix epoch was a Thursday


# -- families --------------------------------------------------------------------------------


def test_written_share_of_ticks_is_each_surfaces_duty_cycle(main_pair, sandbox_pair):
    """Every surface with a stated duty writes in that share of its ticks (benign twins, so no
    attack adds writes); 4 binomial standard deviations plus 0.3 % of slack."""
    checked = 0
    for fleet in (main_pair[1], sandbox_pair[1]):
        written = (fleet.nbytes > 0).mean(axis=0)
        for j, s in enumerate(fleet.surfaces):
            p = s.params.get("expected_duty")
            if p is None:
                continue
            tol = 4 * np.sqrt(p * (1 - p) / fleet.ticks) + 0.003
            assert abs(written[j] - p) <= tol, (s.name, written[j], p)
            checked += 1
    assert checked > 60


@pytest.mark.parametrize(
    ("family", "lo", "hi"),
    [("intermittent-lognormal", 0.01, 0.9), ("cache", 0.25, 0.35), ("scratch", 0.4, 0.6)],
)
def test_drawn_duty_cycles_cover_the_stated_range(family, lo, hi):
    clock = Clock(DAY)
    duties = [fleets.generate_surface(family, s, 0, clock).params["duty"] for s in range(40)]
    assert lo <= min(duties) and max(duties) <= hi
    # Drawn over the range, not stuck at one value: both thirds of it are reached.
    assert min(duties) < lo + (hi - lo) / 3 and max(duties) > hi - (hi - lo) / 3


def test_lognormal_write_sizes_have_the_stated_sigma():
    for sigma in (0.3, 1.5):
        t = fleets.generate_surface(
            "intermittent-lognormal",
            1,
            0,
            WEEK,
            kind="fs",
            overrides={
                "duty": 0.5,
                "duty_amplitude": 0.0,
                "extra_writes": 0.0,
                "median": 5e3,
                "sigma": sigma,
            },
        )
        sizes = t.nbytes[t.events == 1]
        assert np.all(t.events[t.nbytes > 0] == 1)  # one write per written tick
        logs = np.log(sizes)
        assert abs(np.std(logs) / sigma - 1) < 0.03
        assert abs(np.exp(np.median(logs)) / 5e3 - 1) < 0.03


def test_pareto_write_sizes_have_the_stated_tail_index():
    for alpha in (1.2, 3.0):
        t = fleets.generate_surface(
            "intermittent-pareto",
            2,
            0,
            WEEK,
            kind="registry",
            overrides={
                "duty": 0.5,
                "duty_amplitude": 0.0,
                "extra_writes": 0.0,
                "x_m": 5e3,
                "alpha": alpha,
            },
        )
        sizes = t.nbytes[t.nbytes > 0].astype(float)
        assert sizes.min() >= 5e3 - 1
        # Maximum-likelihood (Hill) estimate of alpha with x_m known: n / sum(ln(x / x_m)).
        est = sizes.size / np.log(sizes / 5e3).sum()
        assert abs(est / alpha - 1) < 0.05, est
        # The tail itself: P(X > 4 x_m) = 4^-alpha.
        assert abs((sizes > 4 * 5e3).mean() / 4.0**-alpha - 1) < 0.2


def test_diurnal_family_has_its_day_night_and_weekend_ratios():
    clock = Clock(14 * DAY)
    o = {"night": 0.2, "weekend": 0.5, "growth": 0.0, "sd_ar": 0.1, "sd_white": 0.05}
    t = fleets.generate_surface("diurnal", 3, 0, clock, overrides=o)
    assert np.all(t.nbytes > 0)
    peak = t.params["peak_hour"]
    hour, day = clock.hour, clock.weekday
    near = lambda h: np.abs((hour - h + 12) % 24 - 12) < 0.25  # noqa: E731
    weekday = day < 5
    day_mean = t.nbytes[near(peak) & weekday].mean()
    night_mean = t.nbytes[near(peak + 12) & weekday].mean()
    assert abs(night_mean / day_mean / 0.2 - 1) < 0.1
    weekend_mean = t.nbytes[near(peak) & ~weekday].mean()
    assert abs(weekend_mean / day_mean / 0.5 - 1) < 0.1


def test_cron_runs_every_period_with_fixed_ish_sizes():
    t = fleets.generate_surface(
        "cron",
        5,
        0,
        WEEK,
        kind="fs",
        overrides={"period": 3600.0, "jitter_s": 20.0, "size_sigma": 0.05, "background_duty": 0.0},
    )
    written = t.nbytes > 0
    starts = np.flatnonzero(written & ~np.concatenate([[False], written[:-1]]))
    gaps = np.diff(starts)
    assert np.median(gaps) == 360  # an hour of 10 s ticks
    assert np.all(np.abs(gaps - 360) <= 20)  # jitter N(0, 20 s) is a few ticks at most
    run_ticks = t.params["run_ticks"]
    runs = [t.nbytes[s : s + run_ticks].sum() for s in starts[1:-1]]
    cv = np.std(runs) / np.mean(runs)
    assert 0.03 < cv < 0.07
    assert len(starts) in (t.params["runs"], t.params["runs"] - 1)


def test_legitimate_bursts_and_warmups_are_the_stated_multiple():
    clock = Clock(14 * DAY)
    ratios = []
    for family in ("burst", "cache"):
        for seed in range(6):
            t = fleets.generate_surface(family, seed, 0, clock)
            inside = np.zeros(clock.ticks, dtype=bool)
            for a, b, _ in t.episodes:
                inside[a:b] = True
            normal = t.nbytes[(~inside) & (t.nbytes > 0)].mean()
            for a, b, f in t.episodes:
                ratios.append(t.nbytes[a:b].mean() / normal / f)
            weeks = clock.ticks / (7 * DAY)
            assert len(t.episodes) <= 12 * weeks
            assert all(5 <= f <= 20 for _, _, f in t.episodes)
            assert all(6 <= b - a <= 90 for a, b, _ in t.episodes)
    assert len(ratios) > 30
    assert abs(np.median(ratios) - 1) < 0.15


def test_level_shift_persists_at_the_new_normal():
    clock = Clock(14 * DAY)
    seen = 0
    for seed in range(12):
        t = fleets.generate_surface("level-shift", seed, 0, clock)
        if len(t.episodes) != 1:
            continue
        start, end, factor = t.episodes[0]
        assert end == clock.ticks and 2 <= factor <= 5
        before = np.median(t.nbytes[:start][t.nbytes[:start] > 0])
        after = np.median(t.nbytes[start:][t.nbytes[start:] > 0])
        assert abs(after / before / factor - 1) < 0.15
        seen += 1
    assert seen >= 5


def test_workday_and_quiet_surfaces():
    clock = Clock(14 * DAY)
    t = fleets.generate_surface(
        "workday", 1, 0, clock, overrides={"duty": 0.5, "duty_outside": 0.0}
    )
    written = t.nbytes > 0
    assert not written[clock.weekday >= 5].any()
    working = (clock.weekday < 5) & (clock.hour >= 9.0) & (clock.hour < 17.0)
    assert abs(written[working].mean() - 0.5) < 0.02
    q = fleets.generate_surface("quiet", 1, 0, clock, overrides={"per_hour": 1.0})
    hours = clock.ticks / 360
    assert abs((q.nbytes > 0).sum() / hours - 1.0) < 0.1
    assert q.nbytes.max() < 2000  # strays: DNS-sized


def test_sandbox_fleet_is_dozens_of_small_fs_surfaces(sandbox_pair):
    fleet = sandbox_pair[1]
    assert fleets.SANDBOXES[0] <= len(fleet.surfaces) <= fleets.SANDBOXES[1]
    assert {s.kind for s in fleet.surfaces} == {"fs"}
    assert np.median(fleet.nbytes.mean(axis=0)) < 1000  # bytes a tick: tiny


def test_every_family_occurs_in_the_fleets_with_its_kinds(main_pair, sandbox_pair):
    got = {s.family for f in (main_pair[1], sandbox_pair[1]) for s in f.surfaces}
    assert got == set(fleets.FAMILIES)
    for f in (main_pair[1], sandbox_pair[1]):
        for s in f.surfaces:
            assert s.kind in fleets.FAMILIES[s.family].kinds
    with pytest.raises(ValueError, match="no 'egress' surfaces"):
        fleets.generate_surface("scratch", 1, 0, Clock(10), kind="egress")


# -- attacks ---------------------------------------------------------------------------------


def test_attack_bytes_are_where_the_ground_truth_says(main_pair, sandbox_pair):
    for attacked, benign in (main_pair, sandbox_pair):
        diff = attacked.nbytes - benign.nbytes
        truth = np.zeros_like(diff, dtype=np.float64)
        for a in attacked.attacks:
            truth[a.onset : a.end, list(a.columns)] += a.bits
            assert a.onset >= 7 * DAY
            assert a.bits[0].sum() > 0 or a.kind == "swarm"
        assert np.array_equal(8.0 * diff, truth)
    kinds = [a.kind for a in main_pair[0].attacks + sandbox_pair[0].attacks]
    for k in ("burst", "ramp", "drip_10bps", "drip_100bps", "beacon", "swarm"):
        assert k in kinds


def test_attack_shapes(main_pair, sandbox_pair):
    attacked = main_pair[0]
    for a in attacked.attacks:
        col = a.columns[0]
        add = a.bits[:, 0] / 8.0
        host = attacked.surfaces[col]
        assert a.host_family == host.family
        if a.kind == "burst":
            assert a.end - a.onset == 6  # a minute
            assert a.params["factor"] >= 30
        elif a.kind == "ramp":
            assert a.end - a.onset == 720  # 2 h
            assert (
                np.all(np.diff(add) >= -1) and add[-1] > 5 * add[len(add) // 10]
            )  # linear: ~9.9x from 1/10 of the way
        elif a.kind.startswith("drip_"):
            bps = a.params["bits_per_second"]
            assert host.family == "quiet"
            assert a.total_bits == pytest.approx(bps * (a.end - a.onset) * 10.0, abs=8)
            assert a.end - a.onset <= 3 * DAY
        elif a.kind == "beacon":
            beats = np.flatnonzero(add)
            assert set(add[beats]) == {a.params["beat_bytes"]}
            assert set(np.diff(beats)) == {a.params["period_s"] / 10.0}
    (swarm,) = sandbox_pair[0].attacks
    cols = list(swarm.columns)
    assert len(cols) == 30 and swarm.end - swarm.onset == 720
    base = sandbox_pair[1].nbytes[swarm.onset : swarm.end, cols]
    assert np.array_equal(swarm.bits / 8.0, np.round(0.6 * base))


# -- capalarm input -------------------------------------------------------------------------


def _small_fleet() -> Fleet:
    return fleets.main_fleet(2, days=1, attacks=False)


def test_jsonl_is_time_ordered_and_sums_to_the_arrays():
    fleet = _small_fleet()
    buf = io.StringIO()
    lines = fleets.write_events(fleet, buf)
    rows = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert len(rows) == lines
    ts = [r["ts"] for r in rows]
    assert ts == sorted(ts)
    names = {s.name: j for j, s in enumerate(fleet.surfaces)}
    got_b = np.zeros_like(fleet.nbytes)
    got_e = np.zeros_like(fleet.events)
    seen = set()
    for r in rows:
        assert set(r) == {"ts", "surface", "bytes", "events"}  # no kind: the config has it
        t = int((r["ts"] - fleet.clock.t0) // 10.0)
        key = (t, r["surface"])
        assert key not in seen  # one line per surface-tick
        seen.add(key)
        got_b[t, names[r["surface"]]] += r["bytes"]
        got_e[t, names[r["surface"]]] += r["events"]
    assert np.array_equal(got_b, fleet.nbytes) and np.array_equal(got_e, fleet.events)
    with_kind = io.StringIO()
    fleets.write_events(fleet, with_kind, with_kind=True)
    first = json.loads(with_kind.getvalue().splitlines()[0])
    assert first["kind"] == fleet.surfaces[names[first["surface"]]].kind


def test_quiet_first_and_last_ticks_are_marked_so_a_replay_covers_them():
    clock = Clock(5)
    nb = np.array([[0], [3], [0], [4], [0]], dtype=np.int64)
    fleet = Fleet("t", 0, clock, nb, nb.copy(), [SurfaceInfo("s", "fs", "quiet", {})], [])
    buf = io.StringIO()
    fleets.write_events(fleet, buf)
    rows = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert [(r["ts"] - clock.t0, r["bytes"]) for r in rows] == [(5, 0), (15, 3), (35, 4), (45, 0)]


def test_config_is_what_a_user_writes_and_capalarm_accepts_it():
    from alarm.config import config_from_dict

    fleet = _small_fleet()
    cfg = fleets.capalarm_config(fleet)
    assert set(cfg) == {"tick", "surfaces"} and cfg["tick"] == "10s"
    assert all(set(s) == {"name", "kind"} for s in cfg["surfaces"])
    parsed = config_from_dict(cfg)
    assert [(s.name, s.kind) for s in parsed.surfaces] == [(s.name, s.kind) for s in fleet.surfaces]
    assert parsed.tick == 10.0


# -- scorer ----------------------------------------------------------------------------------


def _fleet_with_attacks() -> Fleet:
    """Two days of 10 s ticks: a, b (egress), c (fs) benign; d attacked by a burst over ticks
    [1000, 1006) of 100 bits a tick; four fs sandboxes, three in a swarm over [5000, 5100)."""
    clock = Clock(2 * DAY)
    names = [("a", "egress", "cache"), ("b", "egress", "quiet"), ("c", "fs", "scratch")]
    names += [("d", "egress", "burst")] + [(f"s{i}", "fs", "sandbox") for i in range(4)]
    n = len(names)
    z = np.zeros((clock.ticks, n), dtype=np.int64)
    infos = [SurfaceInfo(nm, k, f, {}) for nm, k, f in names]
    attacks = [
        Attack("burst", "burst", (3,), 1000, 1006, np.full((6, 1), 100.0)),
        Attack("swarm", "sandbox", (4, 5, 6), 5000, 5100, np.full((100, 3), 8.0)),
    ]
    return Fleet("hand", 0, clock, z, z.copy(), infos, attacks)


def _change(target: str, rule: str, state: str, tick: int, kind: str = "egress", **fig) -> dict:
    at = fleets.T0 + (tick + 1) * 10.0
    return {"surface": target, "kind": kind, "rule": rule, "state": state, "at": at, "figures": fig}


WINDOWS = {"spike": 30.0, "budget": 30.0, "beacon": 7200.0}


def _window(target: str, rule: str) -> float:
    return WINDOWS[rule]


def test_refiring_within_the_resolve_window_is_one_incident():
    clock = Clock(2 * DAY)
    changes = [
        _change("a", "spike", "pending", 99),
        _change("a", "spike", "firing", 100),
        _change("a", "spike", "resolved", 103),
        _change("a", "spike", "firing", 106),  # 3 ticks = 30 s after resolving: same incident
        _change("a", "spike", "firing", 107),  # escalation while firing
        _change("a", "spike", "resolved", 108),
        _change("a", "spike", "firing", 112),  # 40 s after: a new incident
        _change("a", "spike", "resolved", 113),
        _change("a", "budget", "firing", 107),  # another rule: its own incident
        _change("b", "beacon", "firing", 200),
        _change("b", "beacon", "resolved", 300),
        _change("b", "beacon", "firing", 300 + 700),  # within the beacon's 2 h
    ]
    incs = score.incidents(changes, clock, _window)
    got = sorted((i.target, i.rule, i.start, i.end, i.firings) for i in incs)
    assert got == [
        ("a", "budget", 107, None, 1),
        ("a", "spike", 100, 108, 3),
        ("a", "spike", 112, 113, 1),
        ("b", "beacon", 200, None, 2),
    ]


def test_false_alarms_and_detection_on_hand_made_firings():
    fleet = _fleet_with_attacks()
    changes = [
        _change("a", "spike", "firing", 10),  # benign: FA
        _change("a", "spike", "resolved", 11),
        _change("a", "spike", "firing", 20),  # re-fires 80 s later: another FA
        _change("d", "spike", "firing", 500),  # before the attack: FA
        _change("d", "spike", "resolved", 501),
        _change("d", "budget", "firing", 1001, budget_tolerance_bits=1e6),  # detects, 2nd tick
        _change("d", "spike", "firing", 1003),  # same attack, later: neither FA nor detection
        _change("d", "spike", "resolved", 1010),
        _change("d", "spike", "firing", 1006 + 400),  # after end + 1 h grace (360 ticks): FA
        _change("(all)", "budget", "firing", 5030, kind="fs"),  # detects the swarm
        _change("(all)", "spike", "firing", 9000, kind="fs"),  # aggregate, benign: FA
        _change("unclassified", "budget", "firing", 50, kind="egress"),
        {"source": "kernel", "rule": "source_down", "state": "firing", "at": fleets.T0 + 100},
    ]
    incs = score.incidents(changes, fleet.clock, lambda t, r: 30.0)
    figures = {(i.target, i.start): i.figures for i in incs}
    res = score.score_fleet(fleet, score.incident_starts(incs), figures)
    assert res.false_alarms["cache"] == 2
    assert res.false_alarms["burst"] == 2
    assert res.false_alarms[score.AGGREGATE_FAMILY] == 1
    assert res.false_alarms["(unclassified)"] == 1 and res.false_alarms["(source)"] == 1
    assert res.false_alarms["quiet"] == 0
    # Surface-weeks: two days each, less the attack window (+1 h) on d.
    assert res.weeks["cache"] == pytest.approx(2 / 7)
    assert res.weeks["burst"] == pytest.approx((2 * DAY - 6 - 360) * 10 / 604800)
    # Aggregates exist for kinds with >= 4 surfaces: fs has c and 4 sandboxes, egress has 3.
    assert "(all):fs" in dict((n, f) for n, f, _ in score.targets(fleet))
    assert "(all):egress" not in dict((n, f) for n, f, _ in score.targets(fleet))
    burst, swarm = res.outcomes
    assert burst.detected and burst.delay_ticks == 2 and burst.delay_s == 20.0
    assert burst.leaked_bits == 200.0 and burst.total_bits == 600.0
    assert burst.figures == {"budget_tolerance_bits": 1e6} and burst.by == "d"
    # d paged twice on its benign time: that rate makes a 2-tick detection a near-certain
    # signal; the swarm's hosts include the aggregate, which paged once.
    benign_ticks = 2 * DAY - 6 - 360
    assert burst.chance == pytest.approx(-np.expm1(-2 / benign_ticks * 2))
    assert swarm.detected and swarm.by == "(all):fs" and swarm.delay_ticks == 31
    assert swarm.chance == pytest.approx(-np.expm1(-1 / (2 * DAY - 100 - 360) * 31))
    assert swarm.leaked_bits == 31 * 3 * 8.0
    total_fa = sum(res.false_alarms.values())
    assert res.rate() == pytest.approx(total_fa / sum(res.weeks.values()))


def test_a_missed_attack_leaked_everything():
    fleet = _fleet_with_attacks()
    res = score.score_fleet(fleet, {"d": np.array([100, 2000])})
    burst, swarm = res.outcomes
    assert not burst.detected and burst.leaked_bits == burst.total_bits == 600.0
    assert burst.delay_s == float("inf") and burst.beats == 6
    assert not swarm.detected
    assert res.false_alarms["burst"] == 2


def test_mask_starts_merges_within_the_window():
    m = np.zeros((20, 2), dtype=bool)
    m[[2, 3, 6, 11], 0] = True  # gaps: 2 clear ticks (merge), 4 clear ticks (new)
    m[[0, 19], 1] = True
    s = score.mask_starts(m, 3)
    assert np.flatnonzero(s[:, 0]).tolist() == [2, 11]
    assert np.flatnonzero(s[:, 1]).tolist() == [0, 19]


# -- references and protocol ---------------------------------------------------------------


def test_cusum_closed_form_matches_the_recursion():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 1.5, (500, 3))
    z[:50] = np.nan
    k = 0.7
    got = reference.cusum(z, k)
    want = np.zeros_like(z)
    s = np.zeros(3)
    for t in range(z.shape[0]):
        if np.isnan(z[t]).all():
            continue
        s = np.maximum(0.0, s + z[t] - k)
        want[t] = s
    assert np.allclose(got, want)


def test_plain_cusum_sees_a_sustained_rise_and_not_the_steady_state():
    clock = Clock(3 * DAY)
    rng = np.random.default_rng(1)
    rates = np.exp(rng.normal(np.log(1000.0), 0.3, (clock.ticks, 1)))
    rates[2 * DAY + 100 : 2 * DAY + 160] *= 4.0
    s = reference.cusum(reference.cusum_z(rates, clock.tick), 1.0)
    assert s[:DAY].max() == 0.0  # a day of history before it judges
    assert s[DAY : 2 * DAY + 100].max() < 20
    assert s[2 * DAY + 100 : 2 * DAY + 160].max() > 100


def test_choosing_keeps_the_most_sensitive_setting_within_the_fa_budget(monkeypatch):
    lo, hi = reference.Setting("static", 1.0), reference.Setting("static", 2.0)
    monkeypatch.setattr(reference, "grid", lambda m: [lo, hi])

    def fs(fa: int, detected: bool) -> score.FleetScore:
        o = score.AttackOutcome("burst", "x", "f", detected, 1, 10.0, 1.0, 8.0, 1)
        return score.FleetScore({"cache": fa}, {"cache": 1.0}, [o])

    result = heldout.JobResult("f", 1, 1, 1, 1, None, {lo: fs(3, True), hi: fs(1, False)}, {})
    setting, fa, met = heldout.choose("static", [result])
    assert setting == hi and fa == 1.0 and met  # lo detects more but pages 3 a week
    result.references[lo] = fs(1, True)
    assert heldout.choose("static", [result])[0] == lo


def test_seed_ranges_and_the_protocol_check(capsys):
    assert heldout.parse_seeds("6-9,12") == [6, 7, 8, 9, 12]
    assert heldout.span([6, 7, 8]) == "6-8"
    with pytest.raises(SystemExit):
        heldout.main(["--seeds", "3-6", "--choose", "1-5", "--no-capalarm"])
    assert "both chosen on and reported" in capsys.readouterr().err


@pytest.mark.slow
def test_capalarm_path_runs_on_a_fleet_and_is_scored(tmp_path):
    """The real backtest on a small fleet (half a day, every family): it runs, the replay covers the
    fleet, and its alert changes are read back as incidents on the fleet's own targets."""
    fleet = fleets.main_fleet(3, days=0.5, attacks=False)
    run = heldout.run_capalarm(fleet, tmp_path, with_kind=False)
    assert run.error == ""
    assert run.ticks >= fleet.ticks
    assert run.score is not None and run.score.outcomes == []
    assert sum(run.score.weeks.values()) == pytest.approx(
        len(score.targets(fleet)) * fleet.ticks * 10 / 604800
    )
    names = {n for n, _, _ in score.targets(fleet)}
    by_target: dict[str, int] = defaultdict(int)
    for line in (tmp_path / "alerts.jsonl").read_text().splitlines():
        change = json.loads(line)
        by_target[score.change_target(change)] += 1
    # What capalarm reports on is the fleet's own surfaces and aggregates (nothing misrouted).
    assert set(by_target) <= names
    assert run.incidents <= run.firings


def test_floors_are_judged_as_the_issue_states():
    def out(attack: str, delay: int, leaked: float, total: float, beats: int = 1, **kw):
        return score.AttackOutcome(
            attack, "h", "f", delay > 0, delay, delay * 10.0, leaked, total, beats, **kw
        )

    cap = score.FleetScore(
        {"cache": 1, "quiet": 0},
        {"cache": 0.5, "quiet": 10.0},
        [
            out("burst", 2, 1.0, 10.0),
            out("ramp", 100, 11.0, 100.0),  # more than a tenth of the ramp's bits
            out("drip_10bps", 50, 700.0, 1e6, figures={"budget_tolerance_bits": 1000.0}),
            out("beacon", 600, 11.0, 100.0, beats=11),  # the 11th beat
            out("swarm", 180, 5.0, 50.0, by="(all):fs"),
        ],
    )
    ref = score.FleetScore({}, {}, [out("drip_10bps", 10, 8000.0, 1e6), out("burst", 1, 5.0, 20.0)])
    rows = {r[0].split(":")[0]: r for r in heldout.floors(cap, {"cusum": ref}, 10.0)}
    assert rows["false alarms ≤ 0.5 per surface-week overall"][1] == f"{1 / 10.5:.2f}"
    assert rows["false alarms ≤ 0.5 per surface-week overall"][2] == "met"
    worst = rows["false alarms ≤ 1 per surface-week in the worst family"]
    assert worst[1] == "2.00 (cache)" and "not met" in worst[2]
    assert rows["bursts ≥ 30x for a minute"][2] == "met"
    assert "not met" in rows["ramps to 20x over 2 h"][2]
    assert rows["drips ≥ 10 bit/s on a quiet surface"][2] == "met"
    assert "not met" in rows["beacons"][2]
    assert rows["swarm of 30 surfaces each +60 % for 2 h"][1] == "1/1 (1 through the aggregate)"
    assert rows["drip_10bps"][2] == "met"  # 700 bits vs 8000: under a tenth
    assert "not met" in rows["burst"][2]  # 1 bit vs 5: x0.2


# -- the long fleet (longfleet.py) ------------------------------------------------------------


@pytest.fixture(scope="module")
def long_pair() -> tuple[Fleet, Fleet]:
    """A 42-day long fleet and its benign twin."""
    return builders.FLEETS["long"](4), longfleet.long_fleet(4, attacks=False)


def test_long_fleet_is_reproducible_by_seed(long_pair):
    fleet = long_pair[0]
    assert fleet.ticks == 42 * DAY and fleet.nbytes.dtype == np.int32
    assert 100 <= len(fleet.surfaces) <= 130
    short = longfleet.long_fleet(4, days=30)
    again = longfleet.long_fleet(4, days=30)
    assert np.array_equal(short.nbytes, again.nbytes)
    assert np.array_equal(short.events, again.events)
    assert [(a.kind, a.onset, a.columns) for a in short.attacks] == [
        (a.kind, a.onset, a.columns) for a in again.attacks
    ]
    other = longfleet.long_fleet(5, days=30)
    assert not np.array_equal(other.nbytes[:DAY], short.nbytes[:DAY])
    # A surface depends on (seed, family, index) alone.
    benign = long_pair[1]
    for name in ("session-02", "late-start-01", "diurnal-00"):
        family, _, index = name.rpartition("-")
        alone = longfleet.generate(family, 4, int(index), benign.clock)
        assert np.array_equal(alone.nbytes, benign.nbytes[:, benign.column(name)])
    with pytest.raises(ValueError, match="30 days"):
        longfleet.long_fleet(4, days=29)


def test_long_fleet_families_and_mid_fleet_surfaces(long_pair):
    fleet = long_pair[1]
    got = {s.family for s in fleet.surfaces}
    assert set(longfleet.LONG_MIX) | {"sandbox"} == got
    late = [s for s in fleet.surfaces if s.family in longfleet.WRAPPERS]
    assert len(late) == 8  # seven, and the late starter a secret is written into
    for s in late:
        j = fleet.column(s.name)
        start = s.params["start_tick"]
        assert 7 * DAY <= start <= 28 * DAY
        assert not fleet.nbytes[:start, j].any() and not fleet.events[:start, j].any()
        first = s.params["first_write_tick"]
        assert first >= start and (first == fleet.ticks or fleet.nbytes[first, j] > 0)
        assert s.exists_from == (first if s.family == "first-write" else 0)
        # Benign time of a first-write surface starts at its first write.
        assert score.benign_masks(fleet)[s.name].sum() == fleet.ticks - s.exists_from
    for s in fleet.surfaces:
        j = fleet.column(s.name)
        if s.family in ("weekly-job", "fortnightly-job"):
            runs = [a for a, _, _ in s.episodes]
            assert len(runs) == (6 if s.family == "weekly-job" else 3)
            gaps = np.diff(runs) * 10.0 / 86400.0
            period = 7.0 if s.family == "weekly-job" else 14.0
            assert np.all(np.abs(gaps - period) < 0.05)  # minutes of jitter
            assert all(fleet.nbytes[a:b, j].all() for a, b, _ in s.episodes)
        if s.family == "cache-once":
            ((a, b, _),) = s.episodes
            assert a < 5 * DAY + 1 and not fleet.nbytes[:a, j].any()
            assert fleet.nbytes[a:b, j].sum() >= 0.9 * s.params["fill_bytes"]
            if s.params["silent"]:
                assert not fleet.nbytes[b:, j].any()
    sandboxes = [s for s in fleet.surfaces if s.family == "sandbox"]
    assert longfleet.SANDBOX_BLOCK[0] <= len(sandboxes) <= longfleet.SANDBOX_BLOCK[1]


def test_long_fleet_attacks_ground_truth_and_onsets(long_pair):
    attacked, benign = long_pair
    assert 11 <= len(attacked.attacks) <= 16
    diff = attacked.nbytes.astype(np.int64) - benign.nbytes
    truth = np.zeros(diff.shape)
    for a in attacked.attacks:
        truth[a.onset : a.end, list(a.columns)] += a.bits
        assert a.onset >= 2 * DAY
    assert np.array_equal(8.0 * diff, truth)
    assert any(2 * DAY <= a.onset < 3 * DAY for a in attacked.attacks)
    kinds = {a.kind for a in attacked.attacks}
    assert kinds == {
        "slow_drip",
        "curve_follower",
        "scheduled_hide",
        "secret_once",
        "swarm_members",
        "burst",
        "ramp",
        "beacon",
    }
    for a in attacked.attacks:
        col = a.columns[0]
        host = attacked.surfaces[col]
        add = a.bits[:, 0] / 8.0
        base = benign.nbytes[a.onset : a.end, col]
        if a.kind != "swarm_members":
            assert a.host_family == host.family
        if a.kind == "slow_drip":
            assert 2 <= a.params["bits_per_second"] <= 5 and a.end - a.onset >= 3 * DAY
            assert a.total_bits == pytest.approx(
                a.params["bits_per_second"] * (a.end - a.onset) * 10.0, abs=8
            )
        elif a.kind == "curve_follower":
            assert not add[base == 0].any() and add[base > 0].any()
        elif a.kind == "scheduled_hide":
            assert a.params["occurrence"] >= 2
            assert (a.onset, a.end, 1.0) in host.episodes
        elif a.kind == "secret_once":
            assert a.end - a.onset == 1 and a.total_bits == 256.0
            assert attacked.events[a.onset, col] - benign.events[a.onset, col] == 1
            silent = benign.nbytes[a.onset - 7 * DAY : a.onset + 1, col]
            assert not silent.any()
        elif a.kind == "swarm_members":
            block = [j for j, s in enumerate(attacked.surfaces) if s.family == "sandbox"]
            assert len(a.columns) >= 0.6 * len(block) and a.end - a.onset == 360
            for j, c in enumerate(a.columns):
                added = np.flatnonzero(a.bits[:, j])
                assert 2 <= added.size <= 4
                assert not benign.nbytes[a.onset + added, c].any()  # ticks it did not write in
                median = attacked.surfaces[c].params["median"]
                assert set(a.bits[added, j] / 8.0) == {max(1.0, float(np.round(median)))}


def test_scheduled_occurrences_paged_after_the_first(long_pair):
    fleet = long_pair[1]
    job = next(s for s in fleet.surfaces if s.family == "weekly-job")
    runs = sorted(job.episodes)
    starts = {job.name: np.array([runs[0][0] + 3, runs[2][1] + 100, runs[2][1] + 120])}
    res = score.score_fleet(fleet, starts)
    first, first_paged, later, later_paged = res.scheduled["weekly-job"]
    weekly = sum(s.family == "weekly-job" for s in fleet.surfaces)
    assert (first, later) == (weekly, 5 * weekly)
    assert (first_paged, later_paged) == (1, 1)  # two pages an hour after run 3: one occurrence
    assert res.later_paged() == (1, res.later_paged()[1])
    assert res.false_alarms["weekly-job"] == 3


def test_heldout_picks_fleets_and_days():
    assert heldout.parse_fleets("long") == ["long"]
    assert heldout.parse_seeds("none") == []
    with pytest.raises(Exception, match="comma list"):
        heldout.parse_fleets("nope")
    assert builders.DEFAULT_FLEETS == ("main", "sandbox") and "long" in builders.FLEETS
    assert builders.DEFAULT_DAYS["long"] == longfleet.LONG_DAYS


def test_the_bench_reads_each_rules_resolve_window_as_the_service_holds_it():
    """A spike page resolves after the surface's ``spike.resolve_hold``, a budget's after its
    budget's: the bench's incidents must use those windows, not a registered rule's class
    default (spike and budget are in the registry since 7ec2aeb; the default, an hour, had
    taken their place and merged pages the service sends as separate incidents)."""
    from alarm.config import config_from_dict
    from alarm.detector.rules import RULES

    config = config_from_dict(
        {
            "surfaces": [
                {
                    "name": "s",
                    "kind": "fs",
                    "match": {"path": ["/x"]},
                    "spike": {"resolve_hold": "45s"},
                    "budget": {
                        "allowance_bits_per_second": 1000,
                        "tolerance_bits": 1e6,
                        "resolve_hold": "2m",
                    },
                }
            ]
        }
    )
    window = heldout.resolve_window(config, set())
    budget = config.surfaces[0].effective_budget()
    assert window("s", "spike") == 45.0
    assert window("s", "budget") == 120.0
    assert window("s", "beacon") == budget.beacon.resolve_hold
    assert window("s", "duty") == budget.duty.resolve_hold
    assert window("s", "drift") == RULES["drift"].RESOLVE_HOLD
