"""The *long* fleet: six weeks of an organisation's schedules, with attacks early and late.

The fleets of fleets.py are two weeks long: a job that runs once a week runs twice, one that
runs once a fortnight once, and a cache filled once is filled during its first days.  This
fleet runs 42 days (``long_fleet(seed, days=42)``; heldout.py ``--fleets long``) so that weekly
and fortnightly jobs recur (6 and 3 runs), sessions come and go with lighter and heavier
weeks, caches are filled once and then sit silent for weeks, surfaces appear mid-fleet, and
attacks start from day 2 (before a surface has shown a week of itself) up to day 38.

Time, randomness, writes and events are fleets.py's: 10 s ticks from Monday 2026-01-05 00:00
UTC; a surface draws from ``surface_rng(seed, family, index)``, an attack from
``attack_rng(seed, kind, host family, index)`` (stream 1: the shape its host must have); in a
written tick 1 + Poisson(lambda) writes; events are writes on ``fs`` and ``registry``, packets
(ceil(bytes / packet size), packet size U(500, 1400) B) on ``egress``.  LU(a, b) is
log-uniform on [a, b], U uniform, U{a..b} uniform on the integers.  The surfaces of fleets.py's
families draw with their index + 1000 (the long fleet of a seed shares no surface with the
main and sandbox fleets of that seed).  nbytes and events are int32 (six weeks x ~120
surfaces at int64 would be 0.7 GB; every value is checked to fit).

Families (fleets.py's table lists the families it defines; what is new here):

====================== ================ =====================================================
family                 kinds            behaviour and parameter ranges
====================== ================ =====================================================
weekly-job             fs egress reg.   a job at a fixed hour of the week, phase U(0, 7 d)
                                        (a weekly backup, a report), start jitter N(0, U(0,
                                        300) s); each run U(10, 60) min with every tick
                                        written, its bytes LU(10 MB, 2 GB) x lognormal(0,
                                        U(0.02, 0.15)) spread over the run's ticks by weights
                                        lognormal(0, U(0.1, 0.5)), U{1..200} files likewise
                                        (at least one a tick); between runs strays only (duty
                                        U(0, 0.01), median LU(100 B, 2 kB), sigma 0.5).  Its
                                        runs are its episodes: its *occurrences*
fortnightly-job        fs egress reg.   the same, every 14 days, phase U(0, 14 d)
session                egress fs reg.   interactive sessions: Poisson U(0.5, 5) a day (times a
                                        weekend factor U(0, 0.5) on Saturdays and Sundays and
                                        a weekly activity factor lognormal sd 0.5, mean 1:
                                        some days none, some weeks lighter), each starting at
                                        U(begin, end) with begin U(6, 10) h, end U(17, 23) h,
                                        lasting LU(20 min, 3 h), written in a share U(0.3, 1)
                                        of its ticks at a mean rate of LU(10, 150) bit/s (70 %
                                        of surfaces) or LU(150 bit/s, 4 kB/s) (30 %), x
                                        lognormal(0, 0.3) a session; lambda U(0, 2), write
                                        size lognormal sigma U(0.3, 1); idle between sessions
cache-once             fs registry      a cache filled once: at U(0, 5) d, LU(100 MB, 5 GB)
                                        over U(10, 60) min, every tick written, LU(100, 50k)
                                        files, weights as a job run's; nothing before; after,
                                        silent (half of them) or strays at U(0.05, 0.5) an
                                        hour, median U(100, 2000) B, sigma 0.5
late-start             a base family's  a surface declared from the start that writes nothing
                                        before day U(7, min(28, days - 7)): a base family's
                                        trace (workday, diurnal, intermittent-lognormal,
                                        session, weekly-job, cron, cache or quiet, drawn with
                                        its index + 2000) zeroed before that day; its benign
                                        time (surface-weeks) is the whole fleet
first-write            a base family's  the same (index + 3000), but the surface exists from its
                                        first write: its benign time starts there.  capalarm's
                                        config declares every surface up front
                                        (fleets.capalarm_config), so to capalarm both variants
                                        are a declared surface that has been silent; only the
                                        scoring differs (pages and surface-weeks from the first
                                        write on)
====================== ================ =====================================================

A job's or a cache fill's *level* is its run bytes per run tick during runs and its strays'
median between them; a session surface's level is its in-session write size x (1 + lambda).

The mix (LONG_MIX): workday 6, weekly-job 6, fortnightly-job 4, session 6, cache-once 4,
late-start 4, first-write 3, diurnal 3, cache 3, cron 4, quiet 4, intermittent-lognormal 4,
burst 3, level-shift 2 (52), then one host surface per attack but the swarm (13), then a block
of U{40..60} sandboxes (fleets.py's sandbox family, with the shared hourly campaign factor of
fleets.campaign_profile): 105-125 surfaces.

Attacks (ATTACK_PLAN; payload bits per tick = 8 x the bytes added; each on a held-out host of
its own, the swarm on the sandbox block).  Onset: U(2 d, min(days - 4, 38) d) for those whose
time is free, the latest start leaving the attack an hour before the end; the first drip and
the first burst U(2, 3) d (before a week of history):

- ``slow_drip`` (3: two quiet hosts, one silent cache-once): U(2, 5) bit/s, each tick's share
  in whole bytes, one event a tick that carries any, for U(3 d, to the end of the fleet);
- ``curve_follower`` (diurnal, workday): U(30, 60) % of the host's level added in every tick
  the host writes, for U(2, 7) d (it follows the host's day and week); events: egress its
  packets, fs and registry none (bigger writes, not more of them);
- ``scheduled_hide`` (weekly-job, fortnightly-job): one run of the job, its third or later
  (U{2..runs-1}, 0-based), carries U(50, 200) % more: bytes and events of each run tick x
  (1 + that); the fortnightly host's phase is U(0, min(12, days - 29)) d so that its third
  run is inside (hence 30 days at least: MIN_DAYS);
- ``secret_once`` (cache-once silent after its fill; late-start starting at U(14, 28) d): a
  single tick of 32 bytes (256 bits) and one event, at U(fill end + 7 d, end - 1 h) on the
  cache, U(7 d, start - 1 h) on the late starter (silent since the fleet began);
- ``swarm_members`` (the sandbox block): U(60, 80) % of the sandboxes each make U{2..4} writes
  of their own median size (one event each) in ticks of the same hour they would not have
  written in; one attack of many columns, detected on any member or on the fs aggregate;
- ``burst`` (intermittent-lognormal, session), ``ramp`` (workday), ``beacon`` (session):
  fleets.attack_bytes.

14 attacks a fleet.  Scheduled occurrences: score.score_fleet counts, on every surface of a
scheduled family (params ``scheduled``), the runs at which an incident started on it (from
the run's start to an hour after its end) — the floor being that a scheduled event pages at
most on its first occurrence.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.detection import fleets
from bench.detection.fleets import (
    TICK,
    Attack,
    Clock,
    Family,
    Fleet,
    Generated,
    SurfaceInfo,
    SurfaceTrace,
    attack_rng,
    campaign_profile,
    generate_surface,
    log_uniform,
    lognormal_sizes,
    surface_rng,
    ticks_per,
    written_ticks,
)

LONG_DAYS = 42.0
MIN_DAYS = 30.0  # a fortnightly job's third run, and one in which to hide
DAY_S = 86400.0
INT32_MAX = np.iinfo(np.int32).max
FLEETS_INDEX = 1000  # fleets.py's families draw with index + this in the long fleet
WRAP_INDEX = {"late-start": 2000, "first-write": 3000}
LATE_BASES = (
    "workday",
    "diurnal",
    "intermittent-lognormal",
    "session",
    "weekly-job",
    "cron",
    "cache",
    "quiet",
)
SCHEDULED_FAMILIES = ("weekly-job", "fortnightly-job")


# -- families ---------------------------------------------------------------------------------


def _run_weights(rng: np.random.Generator, n: int, sd: float) -> np.ndarray:
    w = rng.lognormal(0.0, sd, n)
    return w / w.sum()


def _spread(rng: np.random.Generator, total: float, count: int, w: np.ndarray) -> tuple:
    """``total`` bytes and ``count`` files over a run's ticks by weights ``w`` (a file a tick at
    least)."""
    b = np.round(total * w).astype(np.int64)
    f = np.maximum(rng.multinomial(count, w), 1).astype(np.int64)
    return b, f


def _scheduled(
    rng: np.random.Generator, clock: Clock, o: dict[str, Any], period_days: float
) -> Generated:
    period = period_days * DAY_S
    phase = float(o.get("phase_s", rng.uniform(0.0, period)))
    jitter = rng.uniform(0.0, 300.0)
    minutes = rng.uniform(10.0, 60.0)
    run_ticks = max(1, ticks_per(60.0 * minutes, clock.tick))
    run_bytes = log_uniform(rng, 10e6, 2e9)
    size_sigma = rng.uniform(0.02, 0.15)
    shape_sd = rng.uniform(0.1, 0.5)
    files = int(rng.integers(1, 201))
    background = rng.uniform(0.0, 0.01)
    bg_median = log_uniform(rng, 100.0, 2e3)
    nbytes, writes = written_ticks(
        rng, np.full(clock.ticks, background), 0.0, lognormal_sizes(bg_median, 0.5)
    )
    level = np.full(clock.ticks, bg_median)
    total = clock.ticks * clock.tick
    starts = phase + np.arange(int(total // period) + 1) * period
    starts = starts + rng.normal(0.0, jitter, starts.size)
    runs: list[tuple[int, int, float]] = []
    for s in starts:
        a = clock.at(max(float(s), 0.0))
        if a >= clock.ticks:
            continue
        b = min(clock.ticks, a + run_ticks)
        size = run_bytes * rng.lognormal(0.0, size_sigma)
        add_b, add_f = _spread(rng, size, files, _run_weights(rng, run_ticks, shape_sd))
        nbytes[a:b] += add_b[: b - a]  # a run the fleet's end cuts short keeps its first part
        writes[a:b] += add_f[: b - a]
        level[a:b] = run_bytes / run_ticks
        runs.append((a, b, 1.0))
    params = {"scheduled": True, "period_s": period, "phase_s": phase, "jitter_s": jitter}
    params |= {"run_bytes": run_bytes, "run_ticks": run_ticks, "size_sigma": size_sigma}
    params |= {"files": files, "runs": len(runs), "background_duty": background}
    params |= {"background_median": bg_median}
    return nbytes, writes, level, params, runs


def _session(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    per_day = o.get("per_day", rng.uniform(0.5, 5.0))
    weekend = rng.uniform(0.0, 0.5)
    begin = rng.uniform(6.0, 10.0)
    end = rng.uniform(17.0, 23.0)
    heavy = bool(rng.random() < 0.3)
    bps = log_uniform(rng, 150.0, 32e3) if heavy else log_uniform(rng, 10.0, 150.0)
    duty = rng.uniform(0.3, 1.0)
    extra = rng.uniform(0.0, 2.0)
    sigma = rng.uniform(0.3, 1.0)
    median = max(1.0, bps / 8.0 * clock.tick / (duty * (1.0 + extra) * np.exp(sigma**2 / 2)))
    days = int(np.ceil(clock.ticks * clock.tick / DAY_S))
    week_factor = rng.lognormal(-0.125, 0.5, -(-days // 7))
    p = np.zeros(clock.ticks)
    scale = np.ones(clock.ticks)
    sessions: list[tuple[int, int, float]] = []
    for d in range(days):
        rate = per_day * week_factor[d // 7] * (weekend if d % 7 >= 5 else 1.0)
        for _ in range(int(rng.poisson(rate))):
            start = clock.at((d + rng.uniform(begin, end) / 24.0) * DAY_S)
            length = max(1, ticks_per(60.0 * log_uniform(rng, 20.0, 180.0), clock.tick))
            f = float(rng.lognormal(0.0, 0.3))
            if start >= clock.ticks:
                continue
            stop = min(clock.ticks, start + length)
            p[start:stop] = duty
            scale[start:stop] = f
            sessions.append((start, stop, f))
    nbytes, writes = written_ticks(rng, p, extra, lognormal_sizes(median, sigma), scale)
    level = np.full(clock.ticks, median * (1.0 + extra))
    params = {"per_day": per_day, "weekend": weekend, "begin_hour": begin, "end_hour": end}
    params |= {"bits_per_second": bps, "duty": duty, "extra_writes": extra, "median": median}
    params |= {"sigma": sigma, "sessions": len(sessions), "expected_duty": float(p.mean())}
    params |= {"week_factors": [float(x) for x in week_factor]}
    return nbytes, writes, level, params, sessions


def _cache_once(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    fill_day = rng.uniform(0.0, 5.0)
    minutes = rng.uniform(10.0, 60.0)
    fill_ticks = max(1, ticks_per(60.0 * minutes, clock.tick))
    fill_bytes = log_uniform(rng, 100e6, 5e9)
    files = int(log_uniform(rng, 100.0, 50e3))
    shape_sd = rng.uniform(0.1, 0.5)
    silent = bool(o.get("silent", rng.random() < 0.5))
    per_hour = 0.0 if silent else rng.uniform(0.05, 0.5)
    median = rng.uniform(100.0, 2000.0)
    p = np.full(clock.ticks, -np.expm1(-per_hour * clock.tick / 3600.0))
    a = min(clock.at(fill_day * DAY_S), clock.ticks - 1)
    b = min(clock.ticks, a + fill_ticks)
    p[:b] = 0.0
    nbytes, writes = written_ticks(rng, p, 0.0, lognormal_sizes(median, 0.5))
    w = _run_weights(rng, b - a, shape_sd)
    add_b, add_f = _spread(rng, fill_bytes, files, w)
    nbytes[a:b] += add_b
    writes[a:b] += add_f
    level = np.full(clock.ticks, median)
    level[a:b] = fill_bytes / fill_ticks
    params = {"fill_day": fill_day, "fill_tick": a, "fill_end_tick": b, "fill_bytes": fill_bytes}
    params |= {"fill_ticks": fill_ticks, "files": files, "silent": silent}
    params |= {"stray_per_hour": per_hour, "stray_median": median}
    return nbytes, writes, level, params, [(a, b, 1.0)]


LONG_FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("weekly-job", ("fs", "egress", "registry"), lambda r, c, o: _scheduled(r, c, o, 7)),
        Family(
            "fortnightly-job", ("fs", "egress", "registry"), lambda r, c, o: _scheduled(r, c, o, 14)
        ),
        Family("session", fleets.KINDS, _session),
        Family("cache-once", ("fs", "registry"), _cache_once),
    )
}
ALL_FAMILIES: dict[str, Family] = {**fleets.FAMILIES, **LONG_FAMILIES}
WRAPPERS = ("late-start", "first-write")
FAMILY_ORDER = (*LONG_FAMILIES, *WRAPPERS)  # the report's order after fleets.FAMILIES


def generate(
    family: str,
    seed: int,
    index: int,
    clock: Clock,
    overrides: dict[str, Any] | None = None,
) -> SurfaceTrace:
    """A surface of any family of the long fleet (fleets.py's, LONG_FAMILIES, or a wrapper of a
    base family that appears mid-fleet), reproducible from (seed, family, index)."""
    o = dict(overrides or {})
    if family in fleets.FAMILIES:
        return generate_surface(family, seed, FLEETS_INDEX + index, clock, overrides=o)
    if family in LONG_FAMILIES:
        return generate_surface(family, seed, index, clock, overrides=o, families=LONG_FAMILIES)
    if family not in WRAPPERS:
        raise KeyError(family)
    rng = surface_rng(seed, family, index)
    base = o.pop("base", None) or LATE_BASES[int(rng.integers(len(LATE_BASES)))]
    days = clock.ticks * clock.tick / DAY_S
    start_day = float(o.pop("start_day", rng.uniform(7.0, max(7.0, min(28.0, days - 7.0)))))
    t = generate_surface(
        base, seed, WRAP_INDEX[family] + index, clock, overrides=o, families=ALL_FAMILIES
    )
    start = min(clock.at(start_day * DAY_S), clock.ticks)
    t.nbytes[:start] = 0
    t.events[:start] = 0
    written = np.flatnonzero(t.nbytes[start:] > 0)
    first = start + int(written[0]) if written.size else clock.ticks
    params = {k: v for k, v in t.params.items() if k != "expected_duty"}
    params |= {"base_family": base, "start_day": start_day, "start_tick": start}
    params["first_write_tick"] = first
    params["exists_from"] = first if family == "first-write" else 0
    episodes = [e for e in t.episodes if e[0] >= start]
    return SurfaceTrace(family, t.kind, t.nbytes, t.events, t.level, params, episodes)


# -- attacks ----------------------------------------------------------------------------------

# (attack kind, host family, host overrides drawn on stream 1, early onset)
ATTACK_PLAN: tuple[tuple[str, str, str, bool], ...] = (
    ("slow_drip", "quiet", "", True),
    ("slow_drip", "quiet", "", False),
    ("slow_drip", "cache-once", "silent", False),
    ("curve_follower", "diurnal", "", False),
    ("curve_follower", "workday", "", False),
    ("scheduled_hide", "weekly-job", "", False),
    ("scheduled_hide", "fortnightly-job", "early_phase", False),
    ("secret_once", "cache-once", "silent", False),
    ("secret_once", "late-start", "late", False),
    ("swarm_members", "sandbox", "", False),
    ("burst", "intermittent-lognormal", "", True),
    ("burst", "session", "", False),
    ("ramp", "workday", "", False),
    ("beacon", "session", "", False),
)
EARLY_DAYS = (2.0, 3.0)
ONSET_FROM_DAY = 2.0
ONSET_TO_DAY = 38.0  # at most; days - 4 on a shorter fleet
SECRET_BYTES = 32
SWARM_SHARE = (0.6, 0.8)
SWARM_WRITES = (2, 4)
SANDBOX_BLOCK = (40, 60)


def host_overrides(shape: str, rng: np.random.Generator, clock: Clock) -> dict[str, Any]:
    if shape == "silent":
        return {"silent": True}
    if shape == "early_phase":  # the third run inside the fleet, an hour before its end
        days = clock.ticks * clock.tick / DAY_S
        return {"phase_s": rng.uniform(0.0, min(12.0, days - 29.0) * DAY_S)}
    if shape == "late":
        days = clock.ticks * clock.tick / DAY_S
        return {"start_day": rng.uniform(14.0, max(14.0, min(28.0, days - 7.0)))}
    return {}


def onset_range(clock: Clock, length: int, early: bool) -> tuple[int, int]:
    days = clock.ticks * clock.tick / DAY_S
    if early:
        return clock.at(EARLY_DAYS[0] * DAY_S), clock.at(EARLY_DAYS[1] * DAY_S)
    lo = clock.at(ONSET_FROM_DAY * DAY_S)
    hi = min(clock.at(min(ONSET_TO_DAY, days - 4.0) * DAY_S), clock.ticks - length)
    hi -= ticks_per(3600.0, clock.tick)
    return lo, max(hi, lo + 1)


def drip(bps: float, n: int, tick: float) -> np.ndarray:
    """Whole bytes per tick whose running sum follows ``bps`` exactly (fleets.attack_bytes)."""
    cum = np.floor(bps / 8.0 * tick * np.arange(n + 1))
    return np.diff(cum)


def long_attack(
    kind: str,
    rng: np.random.Generator,
    host: SurfaceTrace,
    host_bytes: np.ndarray,
    host_events: np.ndarray,
    clock: Clock,
    early: bool,
) -> tuple[int, int, np.ndarray, np.ndarray, dict[str, Any]]:
    """(onset, end, bytes added, events added, params) of one attack of the long fleet on one
    host (not the swarm)."""
    hour = ticks_per(3600.0, clock.tick)
    if kind == "slow_drip":
        bps = float(rng.uniform(2.0, 5.0))
        lo, hi = onset_range(clock, ticks_per(3 * DAY_S, clock.tick), early)
        onset = int(rng.integers(lo, hi))
        shortest = ticks_per(3 * DAY_S, clock.tick)
        end = int(rng.integers(min(onset + shortest, clock.ticks), clock.ticks + 1))
        add = drip(bps, end - onset, clock.tick)
        return onset, end, add, (add > 0).astype(np.float64), {"bits_per_second": bps}
    if kind == "curve_follower":
        share = float(rng.uniform(0.3, 0.6))
        length = ticks_per(rng.uniform(2.0, 7.0) * DAY_S, clock.tick)
        lo, hi = onset_range(clock, length, early)
        onset = int(rng.integers(lo, hi))
        end = min(clock.ticks, onset + length)
        add = np.where(host_bytes[onset:end] > 0, np.round(share * host.level[onset:end]), 0.0)
        if host.kind == "egress":
            ev = np.ceil(add / host.params["packet_bytes"])
        else:
            ev = np.zeros_like(add)
        return onset, end, add, ev, {"share": share, "days": (end - onset) * clock.tick / DAY_S}
    if kind == "scheduled_hide":
        runs = [e for e in host.episodes if e[1] - e[0] == host.params["run_ticks"]]
        if len(runs) < 3:
            raise ValueError(f"a scheduled host with {len(runs)} whole runs: no third to hide in")
        k = int(rng.integers(2, len(runs)))
        onset, end = runs[k][0], runs[k][1]
        extra = float(rng.uniform(0.5, 2.0))
        add = np.round(extra * host_bytes[onset:end])
        ev = np.round(extra * host_events[onset:end])
        return onset, end, add, ev, {"occurrence": k, "extra": extra}
    if kind == "secret_once":
        week = ticks_per(7 * DAY_S, clock.tick)
        if host.family == "cache-once":  # silent after its fill
            lo, hi = host.params["fill_end_tick"] + week, clock.ticks - hour
        else:  # a late starter: silent until it starts
            lo, hi = week, min(host.params["start_tick"], clock.ticks) - hour
        onset = int(rng.integers(lo, max(hi, lo + 1)))
        add = np.array([float(SECRET_BYTES)])
        silent = onset - max([0, *np.flatnonzero(host_bytes[:onset] > 0) + 1])
        params = {"bytes": SECRET_BYTES, "silent_days": float(silent * clock.tick / DAY_S)}
        return onset, onset + 1, add, np.ones(1), params
    if kind in ("burst", "ramp", "beacon"):
        length = ticks_per(fleets.DURATION_S[kind], clock.tick)
        lo, hi = onset_range(clock, length, early)
        onset = int(rng.integers(lo, hi))
        end = min(clock.ticks, onset + length)
        add, ev, params = fleets.attack_bytes(kind, rng, host.level, clock, onset, end)
        return onset, end, add, ev, params
    raise ValueError(f"unknown attack {kind!r}")


def swarm_members(
    rng: np.random.Generator,
    nbytes: np.ndarray,
    medians: list[float],
    clock: Clock,
) -> tuple[int, int, list[int], np.ndarray, np.ndarray, dict[str, Any]]:
    """A share of the sandbox block each making a few writes of its own median size in ticks
    of one hour it had not written in.  ``nbytes``: the block's bytes, ticks x sandboxes."""
    hour = ticks_per(3600.0, clock.tick)
    lo, hi = onset_range(clock, hour, False)
    onset = int(rng.integers(lo, hi))
    end = onset + hour
    n = nbytes.shape[1]
    share = float(rng.uniform(*SWARM_SHARE))
    members = sorted(int(c) for c in rng.choice(n, int(np.ceil(share * n)), replace=False))
    add = np.zeros((hour, len(members)))
    for j, c in enumerate(members):
        free = np.flatnonzero(nbytes[onset:end, c] == 0)
        k = int(rng.integers(SWARM_WRITES[0], SWARM_WRITES[1] + 1))
        ticks = rng.choice(free, min(k, free.size), replace=False)
        add[ticks, j] = max(1.0, float(np.round(medians[c])))
    ev = (add > 0).astype(np.float64)
    return onset, end, members, add, ev, {"share": share, "members": len(members)}


# -- the fleet --------------------------------------------------------------------------------

LONG_MIX: dict[str, int] = {
    "workday": 6,
    "weekly-job": 6,
    "fortnightly-job": 4,
    "session": 6,
    "cache-once": 4,
    "late-start": 4,
    "first-write": 3,
    "diurnal": 3,
    "cache": 3,
    "cron": 4,
    "quiet": 4,
    "intermittent-lognormal": 4,
    "burst": 3,
    "level-shift": 2,
}


def _column(values: np.ndarray, what: str) -> np.ndarray:
    top = int(values.max(initial=0))
    if top > INT32_MAX or int(values.min(initial=0)) < 0:
        raise OverflowError(f"{what}: {top} does not fit the long fleet's int32")
    return values


def long_fleet(
    seed: int, days: float = LONG_DAYS, tick: float = TICK, attacks: bool = True
) -> Fleet:
    """LONG_MIX's surfaces, one held-out host per entry of ATTACK_PLAN but the swarm, and a
    block of sandboxes, with the attacks on top (``attacks=False``: its benign twin)."""
    if days < MIN_DAYS:
        raise ValueError(f"the long fleet needs {MIN_DAYS:g} days or more, not {days:g}")
    clock = Clock(ticks_per(days * DAY_S, tick), tick)
    count: dict[str, int] = {}
    plan: list[tuple[str, dict[str, Any] | None]] = [
        (f, None) for f, n in LONG_MIX.items() for _ in range(n)
    ]
    hosts: list[tuple[int, str, str, bool]] = []  # plan index, kind, host, early
    for i, (kind, host, shape, early) in enumerate(ATTACK_PLAN):
        if host == "sandbox":
            continue
        o = host_overrides(shape, attack_rng(seed, kind, host, i, stream=1), clock)
        hosts.append((i, kind, host, early))
        plan.append((host, o))
    block_rng = surface_rng(seed, "long-sandbox-block", 0)
    n_sandbox = int(block_rng.integers(SANDBOX_BLOCK[0], SANDBOX_BLOCK[1] + 1))
    width = len(plan) + n_sandbox
    nbytes = np.zeros((clock.ticks, width), dtype=np.int32)
    events = np.zeros((clock.ticks, width), dtype=np.int32)
    infos: list[SurfaceInfo] = []
    kept: dict[int, SurfaceTrace] = {}  # attack hosts' traces (levels, episodes)
    first_host = len(plan) - len(hosts)

    def place(t: SurfaceTrace, name: str) -> None:
        j = len(infos)
        nbytes[:, j] = _column(t.nbytes, name)
        events[:, j] = _column(t.events, name)
        exists = int(t.params.pop("exists_from", 0))
        params = {k: v for k, v in t.params.items() if not isinstance(v, np.ndarray)}
        infos.append(SurfaceInfo(name, t.kind, t.family, params, tuple(t.episodes), exists))
        if j >= first_host and j < len(plan):
            kept[j] = t

    for family, o in plan:
        index = count.get(family, 0)
        count[family] = index + 1
        place(generate(family, seed, index, clock, o), f"{family}-{index:02d}")
    campaign, sd = campaign_profile(seed, clock)
    medians: list[float] = []
    for i in range(n_sandbox):
        t = generate("sandbox", seed, i, clock, {"campaign": campaign})
        t.params["campaign_sd"] = sd
        medians.append(float(t.params["median"]))
        place(t, f"sandbox-{i:02d}")
    fleet = Fleet(f"long-s{seed}", seed, clock, nbytes, events, infos, [])
    if not attacks:
        return fleet
    host_col = {i: first_host + k for k, (i, *_rest) in enumerate(hosts)}
    for i, (kind, host, _, early) in enumerate(ATTACK_PLAN):
        rng = attack_rng(seed, kind, host, i)
        if host == "sandbox":
            block = slice(len(plan), width)
            onset, end, members, add_b, add_e, params = swarm_members(
                rng, nbytes[:, block], medians, clock
            )
            cols = tuple(len(plan) + m for m in members)
        else:
            col = host_col[i]
            t = kept[col]
            onset, end, add, ev, params = long_attack(
                kind, rng, t, nbytes[:, col], events[:, col], clock, early
            )
            cols, add_b, add_e = (col,), add[:, None], ev[:, None]
        for j, c in enumerate(cols):
            nb = nbytes[onset:end, c].astype(np.int64) + add_b[:, j].astype(np.int64)
            ne = events[onset:end, c].astype(np.int64) + add_e[:, j].astype(np.int64)
            nbytes[onset:end, c] = _column(nb, fleet.surfaces[c].name)
            events[onset:end, c] = _column(ne, fleet.surfaces[c].name)
        fleet.attacks.append(Attack(kind, host, cols, onset, end, 8.0 * add_b, params))
    return fleet
