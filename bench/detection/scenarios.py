"""Benchmark scenarios with ground truth, reproducible by seed.

A scenario is a *fleet* of surfaces traced tick by tick (bytes and events per tick), some
benign, some with one attack injected at a known onset.  Benign archetypes:

- ``busy``    egress proxy: diurnal (x8 day/night) and weekly (weekend x0.35) cycles, growth
              of 4 %/week, heavy-tailed noise (Student t, 5 d.o.f., in log-rate), deploys
              (x3-5 for 5-20 min, about 4 a week in working hours);
- ``ci``      fs cache: a weekday 08:00 warm-up at x15-25 for 10 min (a few minutes' jitter);
- ``mirror``  registry: a nightly mirror at 02:00, x20 for 20-30 min;
- ``sparse``  registry board/wiki: mostly zero, a few KB written a few times an hour by day;
- ``quiet``   egress with no declared traffic (strays: a DNS-sized packet about once an hour).

Attacks (payload bits are the ground truth; events are one per KB sent): burst x10 and x30 of
the surface's level, ramp to x10 over 6 h, drips of 1, 10 and 100 bit/s for up to 3 days, a
beacon (1 KB every 10 min), a 100 bit/s drip only in the busy hours (13-15 h), and a swarm: 12
of 16 board surfaces each drip half their own daily allowance at once.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np

TICK = 60.0
DAY_TICKS = int(86400 / TICK)
# Monday 2026-01-05 00:00 UTC: weekly cycles line up with the calendar.
T0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC).timestamp()
ARCHETYPE_KIND = {
    "busy": "egress",
    "ci": "fs",
    "mirror": "registry",
    "sparse": "registry",
    "quiet": "egress",
}


@dataclass(slots=True)
class Attack:
    pattern: str
    onset: int  # tick index
    end: int  # tick index (exclusive)
    bits: np.ndarray  # payload bits per tick (the ground truth), whole trace length


@dataclass(slots=True)
class Trace:
    name: str
    archetype: str
    kind: str
    nbytes: np.ndarray  # per tick
    events: np.ndarray
    level: np.ndarray  # noise-free benign level, bytes/s (what "x10 baseline" refers to)
    attack: Attack | None = None
    fleet: str = "main"
    declared: bool = True  # False: traffic nobody declared (kind defaults)
    members: list[str] = field(default_factory=list)  # for an aggregate trace


def _hours(ticks: int) -> tuple[np.ndarray, np.ndarray]:
    t = T0 + np.arange(ticks) * TICK
    hour = (t % 86400) / 3600.0
    dow = ((t - T0) // 86400).astype(int) % 7  # 0 = Monday
    return hour, dow


def _noise(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    return np.exp(scale * rng.standard_t(5, n))


def _busy(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    hour, dow = _hours(n)
    peak = rng.uniform(20e3, 80e3)
    diurnal = 0.125 + 0.875 * (0.5 - 0.5 * np.cos(2 * np.pi * (hour - 2) / 24)) ** 1.5
    weekly = np.where(dow >= 5, 0.35, 1.0)
    growth = 1.04 ** (np.arange(n) / (7 * DAY_TICKS))
    level = peak * diurnal * weekly * growth
    rate = level * _noise(rng, n, 0.18)
    weeks = n / (7 * DAY_TICKS)
    for _ in range(rng.poisson(4 * weeks)):
        day = int(rng.integers(0, n // DAY_TICKS))
        if day % 7 >= 5:
            continue
        start = day * DAY_TICKS + int(rng.uniform(9, 17) * 60)
        length = int(rng.integers(5, 21))
        rate[start : start + length] *= rng.uniform(3, 5)
    return level, rate


def _ci(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    hour, _ = _hours(n)
    base = rng.uniform(3e3, 8e3)
    level = base * (0.4 + 0.6 * np.exp(-(((hour - 13) / 5) ** 2)))
    rate = level * _noise(rng, n, 0.18)
    for day in range(n // DAY_TICKS + 1):
        if day % 7 >= 5:
            continue
        start = day * DAY_TICKS + 8 * 60 + int(rng.integers(-3, 4))
        rate[max(start, 0) : start + 10] *= rng.uniform(15, 25)
    return level, rate


def _mirror(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    hour, _ = _hours(n)
    base = rng.uniform(1e3, 3e3)
    level = base * (0.6 + 0.4 * np.sin(2 * np.pi * (hour - 8) / 24) ** 2)
    rate = level * _noise(rng, n, 0.18)
    for day in range(n // DAY_TICKS + 1):
        start = day * DAY_TICKS + 2 * 60 + int(rng.integers(-2, 3))
        rate[max(start, 0) : start + int(rng.integers(20, 31))] *= 20
    return level, rate


def _poisson_writes(
    rng: np.random.Generator, per_hour: np.ndarray, median: float, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    count = rng.poisson(per_hour * TICK / 3600.0)
    nbytes = np.zeros(count.size)
    hit = np.flatnonzero(count)
    for i in hit:
        nbytes[i] = rng.lognormal(np.log(median), sigma, count[i]).sum()
    return nbytes / TICK, count.astype(np.float64)


def _sparse(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    hour, dow = _hours(n)
    working = (hour >= 8) & (hour < 20) & (dow < 5)
    per_hour = np.where(working, rng.uniform(1.0, 4.0), 0.2)
    rate, events = _poisson_writes(rng, per_hour, 3000.0, 0.8)
    level = np.full(n, 3000.0 / TICK)  # a typical write in a tick: "its level"
    return level, rate, events


def _quiet(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rate, events = _poisson_writes(rng, np.full(n, 1.0), 150.0, 0.6)
    level = np.full(n, 150.0 / TICK)
    return level, rate, events


def benign(rng: np.random.Generator, archetype: str, name: str, n: int) -> Trace:
    if archetype in ("sparse", "quiet"):
        level, rate, events = (_sparse if archetype == "sparse" else _quiet)(rng, n)
    else:
        level, rate = {"busy": _busy, "ci": _ci, "mirror": _mirror}[archetype](rng, n)
        events = np.ceil(rate * TICK / 800.0)  # ~800-byte packets/writes
    nbytes = np.round(rate * TICK)
    return Trace(
        name,
        archetype,
        ARCHETYPE_KIND[archetype],
        nbytes,
        events,
        level,
        declared=archetype != "quiet",
    )


def inject(trace: Trace, pattern: str, onset: int, rng: np.random.Generator) -> None:
    """Add an attack to ``trace`` from tick ``onset``; payload bits are recorded as truth."""
    n = trace.nbytes.size
    rate = np.zeros(n)  # attack bytes/s per tick
    end = n
    lvl = trace.level
    if pattern.startswith("burst"):
        factor = float(pattern.removeprefix("burst_x"))
        end = min(n, onset + int(rng.integers(5, 16)))
        rate[onset:end] = (factor - 1) * lvl[onset:end]
    elif pattern == "ramp_x10":
        span = 6 * 60
        end = min(n, onset + span + 120)
        ramp = np.minimum(np.arange(end - onset) / span, 1.0)
        rate[onset:end] = 9 * ramp * lvl[onset:end]
    elif pattern.startswith("drip_"):
        bps = float(pattern.removeprefix("drip_").removesuffix("bps"))
        end = min(n, onset + 3 * DAY_TICKS)
        rate[onset:end] = bps / 8.0
    elif pattern == "beacon":
        end = min(n, onset + 2 * DAY_TICKS)
        rate[onset:end:10] = 1024.0 / TICK
    elif pattern == "busy_hour_drip":
        end = min(n, onset + 3 * DAY_TICKS)
        hour, _ = _hours(n)
        busy = (hour >= 13) & (hour < 15)
        rate[onset:end] = np.where(busy[onset:end], 100.0 / 8.0, 0.0)
    else:
        raise ValueError(pattern)
    add = np.round(rate * TICK)
    trace.nbytes = trace.nbytes + add
    trace.events = trace.events + np.ceil(add / 1024.0)
    trace.attack = Attack(pattern, onset, end, 8.0 * add)


# (pattern, host archetypes) of the attack scenarios in the main fleet.
ATTACKS: list[tuple[str, tuple[str, ...]]] = [
    ("burst_x10", ("busy", "ci", "mirror", "sparse")),
    ("burst_x30", ("busy", "ci", "mirror", "sparse")),
    ("ramp_x10", ("busy", "ci", "mirror")),
    ("drip_1bps", ("quiet", "sparse", "busy")),
    ("drip_10bps", ("quiet", "sparse", "busy")),
    ("drip_100bps", ("quiet", "sparse", "busy")),
    ("beacon", ("quiet", "sparse")),
    ("busy_hour_drip", ("sparse", "busy")),
]
BENIGN_MIX = ("busy", "busy", "ci", "mirror", "sparse", "sparse", "quiet")


@dataclass(slots=True)
class Fleet:
    name: str
    ticks: int
    traces: list[Trace]
    history_ticks: int  # the first week: what an operator looks at to declare budgets


def main_fleet(seed: int, days: int, replicas: int, with_attacks: bool = True) -> Fleet:
    """Benign surfaces of every archetype, plus one attacked surface per (pattern, host,
    replica); attacks start in the second half, after a week of history."""
    rng = np.random.default_rng(seed)
    n = days * DAY_TICKS
    traces = []
    for r in range(replicas):
        for i, arche in enumerate(BENIGN_MIX):
            traces.append(benign(rng, arche, f"b{r}-{arche}-{i}", n))
    if with_attacks:
        for pattern, hosts in ATTACKS:
            for host in hosts:
                for r in range(replicas):
                    t = benign(rng, host, f"a-{pattern}-{host}-{r}", n)
                    onset = int(rng.integers(8 * DAY_TICKS, n - 4 * DAY_TICKS))
                    if pattern.startswith("burst") and host in ("ci", "mirror"):
                        # Not on top of the surface's own scheduled burst.
                        onset = (onset // DAY_TICKS) * DAY_TICKS + int(rng.integers(10, 20)) * 60
                    inject(t, pattern, onset, rng)
                    traces.append(t)
    return Fleet(f"main-s{seed}", n, traces, 7 * DAY_TICKS)


def swarm_fleet(seed: int, days: int, with_attack: bool = True) -> Fleet:
    """16 board surfaces (registry kind); 12 of them each drip half of their own 1-day
    allowance (declared from the first week) at once."""
    from bench.detection.declare import envelope_budget

    rng = np.random.default_rng(seed + 1000)
    n = days * DAY_TICKS
    traces = [benign(rng, "sparse", f"board-{i:02d}", n) for i in range(16)]
    for t in traces:
        t.fleet = "swarm"
    if with_attack:
        onset = int(rng.integers(8 * DAY_TICKS, n - 4 * DAY_TICKS))
        end = min(n, onset + 3 * DAY_TICKS)
        for t in traces[:12]:
            day_k = envelope_budget(t.nbytes, t.events, 7 * DAY_TICKS)[-1][1]
            add = np.zeros(n)
            add[onset:end] = np.round(0.5 * day_k / 8.0 * TICK)
            t.nbytes = t.nbytes + add
            t.events = t.events + np.ceil(add / 1024.0)
            t.attack = Attack("swarm", onset, end, 8.0 * add)
    return Fleet(f"swarm-s{seed}", n, traces, 7 * DAY_TICKS)
