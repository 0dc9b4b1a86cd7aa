"""Held-out benign fleets with attacks on top, drawn per seed, for the detection benchmark.

A *fleet* is a set of surfaces traced tick by tick (bytes and events per tick, ticks x
surfaces), each surface one member of a *family* of benign behaviour with its parameters drawn
from the family's ranges below, and attacks injected on held-out surfaces with their payload
bits per tick as ground truth.  Settings are chosen on some seeds and reported on others
(bench/detection/heldout.py); an independent fleet written by someone else judges the result,
so the families aim at breadth, not at any one shape.

Time: 10 s ticks, 14 days by default, starting Monday 2026-01-05 00:00 UTC (weekly cycles line
up with the calendar).  Randomness: each surface draws from ``numpy.random.default_rng([seed,
crc32(family), index])``, so one surface does not change when another family's count does; an
attack draws from ``[seed, crc32(attack kind), crc32(host family), index, 0]`` (stream 1: the
shape its host must have).

Writes.  In a *written* tick a surface makes 1 + Poisson(lambda) writes (files, uploads,
requests), each of a size drawn from the family's size law; the tick's bytes are their sum.
Events per tick: the number of writes on ``fs`` and ``registry`` surfaces; on ``egress``
surfaces the packets, ceil(bytes / packet size) with a packet size ~ U(500, 1400) B per
surface, at least one per write.  LU(a, b) is log-uniform on [a, b]; U uniform.

Families (kinds a surface may have; what is drawn per surface):

====================== ================ =====================================================
family                 kinds            behaviour and parameter ranges
====================== ================ =====================================================
intermittent-lognormal egress fs reg.   written in a share ``duty`` ~ LU(0.01, 0.9) of ticks,
                                        modulated by hour of day (amplitude U(0, 0.6), peak
                                        hour U(0, 24)); lambda ~ U(0, 3); write size lognormal,
                                        median LU(200 B, 50 kB), sigma U(0.3, 1.5)
intermittent-pareto    egress fs reg.   the same duty and writes; write size Pareto (Type I),
                                        x_m LU(100 B, 20 kB), alpha U(1.2, 3), capped at 1 GiB
cache                  fs registry      duty U(0.25, 0.35); lambda U(1, 4); lognormal median
                                        LU(5 kB, 60 kB), sigma U(0.4, 0.6); warm-ups Poisson
                                        (U(2, 5) a week), each U(2, 15) min with every tick
                                        written and writes U(5, 20)x bigger
scratch                fs               sandbox scratch directory: duty U(0.4, 0.6); lambda
                                        U(0, 6); lognormal median LU(500 B, 30 kB), sigma
                                        U(0.5, 1.2)
diurnal                egress registry  busy proxy, written every tick: peak rate LU(5 kB/s,
                                        200 kB/s) at hour U(11, 17), night/peak U(0.08, 0.35),
                                        weekend factor U(0.25, 0.7), growth U(0, 8) %/week;
                                        log-rate noise AR(1) phi U(0.5, 0.95), stationary sd
                                        U(0.1, 0.4), plus white sd U(0.05, 0.2); registry
                                        events are uploads of LU(2 kB, 50 kB)
burst                  egress fs reg.   duty U(0.6, 1); lambda U(0, 4); lognormal median
                                        LU(500 B, 50 kB), sigma U(0.2, 0.6); legitimate bursts
                                        Poisson(U(2, 6) a week), U(1, 10) min, every tick
                                        written, U(5, 20)x the level
level-shift            egress fs reg.   duty U(0.5, 1); lambda U(0, 3); lognormal median
                                        LU(500 B, 50 kB), sigma U(0.2, 0.8); a deploy at day
                                        U(1, 13) sets a new normal U(2, 5)x, persisting; with
                                        probability 0.3 a second shift >= 1 day later, up
                                        U(2, 5)x or down 1/U(2, 5)x
cron                   fs egress reg.   a job every 15 min, 30 min, 1 h, 6 h or 1 day (weights
                                        .3 .15 .3 .1 .15), phase U(0, period), start jitter
                                        N(0, U(0, 60) s); run size lognormal sigma U(0.01, 0.1)
                                        around LU(10 kB, 20 MB) (daily: LU(50 MB, 1 GB)), spread
                                        evenly over U{1..6} ticks (daily: U{60..240}),
                                        U{1..50} files; between runs small writes (duty
                                        U(0, 0.05), median LU(100 B, 2 kB), sigma 0.5)
workday                registry egr. fs written Mon-Fri from hour U(7, 9) to U(17, 19) in a share
                                        U(0.2, 0.8) of ticks, otherwise U(0, 0.02); lambda
                                        U(0, 2); lognormal median LU(1 kB, 100 kB), sigma
                                        U(0.5, 1.2)
quiet                  egress fs reg.   strays only: Poisson U(0.2, 2) writes an hour, lognormal
                                        median U(60, 300) B (DNS-sized), sigma U(0.2, 0.6)
sandbox                fs               one of U{36..48} small sandboxes of the sandbox fleet:
                                        duty LU(0.01, 0.3) times the fleet's shared hourly
                                        campaign factor (lognormal, sd U(0.05, 0.2), mean 1);
                                        lambda U(0, 2); lognormal median LU(100 B, 5 kB), sigma
                                        U(0.5, 1.2)
====================== ================ =====================================================

A surface's *level* (what "30x" refers to) is its noise-free typical written tick: median write
size x mean writes per written tick, times its seasonal or shifted factor where it has one (the
diurnal family: its rate at that time x the tick; cron: a run's bytes per tick).

Attacks (payload bits per tick = 8 x the bytes added; events added: one per started KiB, one
per beat or drip tick); each on a held-out surface of its own, onset uniform from day 7 to the
latest start that ends an hour before the fleet does:

- ``burst``: U(30, 50)x the host's level added for a minute (6 ticks); hosts: every family
  with a level (intermittent-*, cache, scratch, diurnal, burst, level-shift, cron, workday);
- ``ramp``: added bytes rising linearly to 19x the level over 2 h (the tick's total reaches
  20x); hosts: diurnal, cache, scratch, intermittent-lognormal, level-shift, workday;
- ``drip_10bps``, ``drip_100bps``: that many bits every second, each tick's share in whole
  bytes, for 3 days (or to the end), on quiet surfaces (two of each);
- ``beacon``: one size (512, 1024 or 4096 B) every 5, 10, 20 or 30 min for a day, on a quiet
  surface and on an intermittent-lognormal one written in LU(1 %, 5 %) of ticks;
- ``swarm`` (sandbox fleet): 30 sandboxes each write 60 % more than they do (bytes and events
  of every written tick x 1.6) for 2 h.

The *long* fleet (six weeks of weekly and fortnightly jobs, sessions, caches filled once,
surfaces appearing mid-fleet, attacks from day 2; builders.py's ``FLEETS["long"]``) is longfleet.py's, with
its families and attacks documented there.
"""

from __future__ import annotations

import datetime as dt
import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

TICK = 10.0
DAYS = 14
# Monday 2026-01-05 00:00 UTC.
T0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC).timestamp()
KINDS = ("egress", "fs", "registry")
MAX_WRITE_BYTES = 1 << 30


def ticks_per(seconds: float, tick: float = TICK) -> int:
    return round(seconds / tick)


@dataclass(frozen=True, slots=True)
class Clock:
    """Calendar figures of every tick of a fleet."""

    ticks: int
    tick: float = TICK
    t0: float = T0

    @property
    def seconds(self) -> np.ndarray:
        return np.arange(self.ticks) * self.tick

    @property
    def hour(self) -> np.ndarray:
        """Hour of day (UTC), fractional."""
        return ((self.t0 + self.seconds) % 86400.0) / 3600.0

    @property
    def weekday(self) -> np.ndarray:
        """0 = Monday (the fleet starts on a Monday at 00:00)."""
        return (self.seconds // 86400.0).astype(np.int64) % 7

    def at(self, seconds: float) -> int:
        return int(seconds // self.tick)


@dataclass(slots=True)
class SurfaceTrace:
    """One surface's benign trace: bytes and events per tick, its noise-free level (bytes in a
    typical written tick), the parameters drawn, and its legitimate episodes (bursts, warm-ups,
    level shifts) as (start tick, end tick, factor)."""

    family: str
    kind: str
    nbytes: np.ndarray  # int64 per tick
    events: np.ndarray  # int64 per tick
    level: np.ndarray  # float64 per tick
    params: dict[str, Any]
    episodes: list[tuple[int, int, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SurfaceInfo:
    name: str
    kind: str
    family: str
    params: dict[str, Any]
    episodes: tuple[tuple[int, int, float], ...] = ()
    # The first tick the surface exists (its first write, for a surface that appears mid-fleet:
    # longfleet.py); its benign time starts there.  capalarm's config declares it all along.
    exists_from: int = 0


@dataclass(frozen=True, slots=True)
class Attack:
    """Ground truth: ``bits[i, j]`` payload bits added in tick ``onset + i`` to surface
    column ``columns[j]``; the attack runs over ticks [onset, end)."""

    kind: str
    host_family: str
    columns: tuple[int, ...]
    onset: int
    end: int
    bits: np.ndarray  # float64, (end - onset, len(columns))
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bits(self) -> float:
        return float(self.bits.sum())


@dataclass(slots=True)
class Fleet:
    name: str
    seed: int
    clock: Clock
    nbytes: np.ndarray  # int64, ticks x surfaces
    events: np.ndarray  # int64, ticks x surfaces
    surfaces: list[SurfaceInfo]
    attacks: list[Attack]

    @property
    def ticks(self) -> int:
        return self.clock.ticks

    def column(self, name: str) -> int:
        for i, s in enumerate(self.surfaces):
            if s.name == name:
                return i
        raise KeyError(name)


# -- drawing helpers -----------------------------------------------------------------------


def family_code(name: str) -> int:
    return zlib.crc32(name.encode())


def surface_rng(seed: int, family: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, family_code(family), index])


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


SizeLaw = Callable[[np.random.Generator, int], np.ndarray]


def lognormal_sizes(median: float, sigma: float) -> SizeLaw:
    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.lognormal(np.log(median), sigma, n)

    return draw


def pareto_sizes(x_m: float, alpha: float) -> SizeLaw:
    """Pareto Type I: P(X > x) = (x_m / x)^alpha for x >= x_m (numpy's ``pareto`` is the
    Lomax form, X / x_m - 1)."""

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(x_m * (1.0 + rng.pareto(alpha, n)), MAX_WRITE_BYTES)

    return draw


def written_ticks(
    rng: np.random.Generator,
    duty: np.ndarray,
    extra_writes: float,
    sizes: SizeLaw,
    scale: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Bytes and writes per tick: a tick is written with probability ``duty`` (per tick), then
    makes 1 + Poisson(extra_writes) writes of ``sizes``, times ``scale`` (per tick) if given."""
    active = rng.random(duty.size) < duty
    idx = np.flatnonzero(active)
    writes = np.zeros(duty.size, dtype=np.int64)
    nbytes = np.zeros(duty.size)
    if idx.size:
        count = 1 + rng.poisson(extra_writes, idx.size)
        draws = sizes(rng, int(count.sum()))
        starts = np.concatenate([[0], np.cumsum(count)[:-1]])
        nbytes[idx] = np.add.reduceat(draws, starts)
        writes[idx] = count
        if scale is not None:
            nbytes[idx] *= scale[idx]
    return np.maximum(np.round(nbytes), writes).astype(np.int64), writes


def daily_modulated(duty: float, amplitude: float, peak: float, hour: np.ndarray) -> np.ndarray:
    return np.clip(duty * (1.0 + amplitude * np.cos(2 * np.pi * (hour - peak) / 24.0)), 0.0, 1.0)


def episodes_poisson(
    rng: np.random.Generator,
    clock: Clock,
    per_week: float,
    minutes: tuple[float, float],
    factor: tuple[float, float],
) -> list[tuple[int, int, float]]:
    weeks = clock.ticks * clock.tick / (7 * 86400.0)
    out = []
    for _ in range(int(rng.poisson(per_week * weeks))):
        start = int(rng.integers(0, clock.ticks))
        length = max(1, ticks_per(60.0 * rng.uniform(*minutes), clock.tick))
        out.append((start, min(clock.ticks, start + length), float(rng.uniform(*factor))))
    return sorted(out)


def ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    """Stationary AR(1) with marginal sd ``sd``: x_t = phi x_{t-1} + sqrt(1 - phi^2) sd e_t,
    as the innovations convolved with phi^k (truncated where phi^k < 1e-9)."""
    eps = rng.standard_normal(n) * sd * np.sqrt(1.0 - phi * phi)
    taps = phi ** np.arange(int(np.ceil(np.log(1e-9) / np.log(phi))) + 1)
    return np.convolve(eps, taps)[:n]


# -- families --------------------------------------------------------------------------------

Generated = tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any], list]


def _intermittent(
    rng: np.random.Generator, clock: Clock, o: dict[str, Any], pareto: bool
) -> Generated:
    duty = o.get("duty", log_uniform(rng, 0.01, 0.9))
    amplitude = o.get("duty_amplitude", rng.uniform(0.0, 0.6))
    peak = rng.uniform(0.0, 24.0)
    extra = o.get("extra_writes", rng.uniform(0.0, 3.0))
    p = daily_modulated(duty, amplitude, peak, clock.hour)
    if pareto:
        x_m = o.get("x_m", log_uniform(rng, 100.0, 20e3))
        alpha = o.get("alpha", rng.uniform(1.2, 3.0))
        sizes, median = pareto_sizes(x_m, alpha), x_m * 2.0 ** (1.0 / alpha)
        params = {"x_m": x_m, "alpha": alpha}
    else:
        median = o.get("median", log_uniform(rng, 200.0, 50e3))
        sigma = o.get("sigma", rng.uniform(0.3, 1.5))
        sizes = lognormal_sizes(median, sigma)
        params = {"median": median, "sigma": sigma}
    nbytes, writes = written_ticks(rng, p, extra, sizes)
    level = np.full(clock.ticks, median * (1.0 + extra))
    params |= {
        "duty": duty,
        "duty_amplitude": amplitude,
        "duty_peak_hour": peak,
        "expected_duty": float(p.mean()),
        "extra_writes": extra,
    }
    return nbytes, writes, level, params, []


def _cache(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    duty = o.get("duty", rng.uniform(0.25, 0.35))
    extra = rng.uniform(1.0, 4.0)
    median = log_uniform(rng, 5e3, 60e3)
    sigma = o.get("sigma", rng.uniform(0.4, 0.6))
    warmups = episodes_poisson(rng, clock, rng.uniform(2.0, 5.0), (2.0, 15.0), (5.0, 20.0))
    p = np.full(clock.ticks, duty)
    scale = np.ones(clock.ticks)
    for a, b, f in warmups:
        p[a:b] = 1.0
        scale[a:b] = f
    nbytes, writes = written_ticks(rng, p, extra, lognormal_sizes(median, sigma), scale)
    level = np.full(clock.ticks, median * (1.0 + extra))
    params = {"duty": duty, "extra_writes": extra, "median": median, "sigma": sigma}
    params["expected_duty"] = float(p.mean())
    return nbytes, writes, level, params, warmups


def _scratch(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    duty = o.get("duty", rng.uniform(0.4, 0.6))
    extra = rng.uniform(0.0, 6.0)
    median = log_uniform(rng, 500.0, 30e3)
    sigma = rng.uniform(0.5, 1.2)
    p = np.full(clock.ticks, duty)
    nbytes, writes = written_ticks(rng, p, extra, lognormal_sizes(median, sigma))
    level = np.full(clock.ticks, median * (1.0 + extra))
    params = {"duty": duty, "expected_duty": duty, "extra_writes": extra}
    params |= {"median": median, "sigma": sigma}
    return nbytes, writes, level, params, []


def diurnal_shape(hour: np.ndarray, peak: float, night: float) -> np.ndarray:
    """1 at the peak hour, ``night`` twelve hours away."""
    return night + (1.0 - night) * ((1.0 + np.cos(2 * np.pi * (hour - peak) / 24.0)) / 2.0) ** 2


def _diurnal(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    peak_rate = log_uniform(rng, 5e3, 200e3)
    peak = rng.uniform(11.0, 17.0)
    night = o.get("night", rng.uniform(0.08, 0.35))
    weekend = o.get("weekend", rng.uniform(0.25, 0.7))
    growth = o.get("growth", rng.uniform(0.0, 0.08))
    phi = rng.uniform(0.5, 0.95)
    sd_ar = o.get("sd_ar", rng.uniform(0.1, 0.4))
    sd_white = o.get("sd_white", rng.uniform(0.05, 0.2))
    weeks = clock.seconds / (7 * 86400.0)
    level = (
        peak_rate
        * clock.tick
        * diurnal_shape(clock.hour, peak, night)
        * np.where(clock.weekday >= 5, weekend, 1.0)
        * (1.0 + growth) ** weeks
    )
    noise = ar1(rng, clock.ticks, phi, sd_ar) + sd_white * rng.standard_normal(clock.ticks)
    nbytes = np.maximum(np.round(level * np.exp(noise)), 1).astype(np.int64)
    upload = log_uniform(rng, 2e3, 50e3)
    writes = np.maximum(1, np.ceil(nbytes / upload)).astype(np.int64)
    params = {"peak_rate": peak_rate, "peak_hour": peak, "night": night, "weekend": weekend}
    params |= {"growth_per_week": growth, "phi": phi, "sd_ar": sd_ar, "sd_white": sd_white}
    params |= {"expected_duty": 1.0, "upload_bytes": upload}
    return nbytes, writes, level, params, []


def _burst(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    duty = o.get("duty", rng.uniform(0.6, 1.0))
    extra = rng.uniform(0.0, 4.0)
    median = log_uniform(rng, 500.0, 50e3)
    sigma = rng.uniform(0.2, 0.6)
    bursts = episodes_poisson(rng, clock, rng.uniform(2.0, 6.0), (1.0, 10.0), (5.0, 20.0))
    p = np.full(clock.ticks, duty)
    scale = np.ones(clock.ticks)
    for a, b, f in bursts:
        p[a:b] = 1.0
        scale[a:b] = f
    nbytes, writes = written_ticks(rng, p, extra, lognormal_sizes(median, sigma), scale)
    level = np.full(clock.ticks, median * (1.0 + extra))
    params = {"duty": duty, "expected_duty": float(p.mean()), "extra_writes": extra}
    params |= {"median": median, "sigma": sigma}
    return nbytes, writes, level, params, bursts


def _level_shift(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    duty = o.get("duty", rng.uniform(0.5, 1.0))
    extra = rng.uniform(0.0, 3.0)
    median = log_uniform(rng, 500.0, 50e3)
    sigma = rng.uniform(0.2, 0.8)
    day = clock.ticks * clock.tick / 86400.0
    first = clock.at(86400.0 * rng.uniform(min(1.0, day / 4), max(min(13.0, day - 0.5), 0.5)))
    shifts = [(first, clock.ticks, float(rng.uniform(2.0, 5.0)))]
    if rng.random() < 0.3 and first + ticks_per(86400.0, clock.tick) < clock.ticks - 1:
        second = int(rng.integers(first + ticks_per(86400.0, clock.tick), clock.ticks))
        f = float(rng.uniform(2.0, 5.0))
        shifts.append((second, clock.ticks, f if rng.random() < 0.5 else 1.0 / f))
    scale = np.ones(clock.ticks)
    for a, b, f in shifts:
        scale[a:b] *= f
    p = np.full(clock.ticks, duty)
    nbytes, writes = written_ticks(rng, p, extra, lognormal_sizes(median, sigma), scale)
    level = median * (1.0 + extra) * scale
    params = {"duty": duty, "expected_duty": duty, "extra_writes": extra}
    params |= {"median": median, "sigma": sigma}
    return nbytes, writes, level, params, shifts


CRON_PERIODS = (900.0, 1800.0, 3600.0, 21600.0, 86400.0)
CRON_WEIGHTS = (0.3, 0.15, 0.3, 0.1, 0.15)


def _cron(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    period = float(o.get("period", rng.choice(CRON_PERIODS, p=CRON_WEIGHTS)))
    daily = period >= 86400.0
    phase = rng.uniform(0.0, period)
    jitter = o.get("jitter_s", rng.uniform(0.0, 60.0))
    size_sigma = o.get("size_sigma", rng.uniform(0.01, 0.1))
    median = log_uniform(rng, 50e6, 1e9) if daily else log_uniform(rng, 10e3, 20e6)
    duration = int(rng.integers(60, 241) if daily else rng.integers(1, 7))
    files = int(rng.integers(1, 51))
    background = o.get("background_duty", rng.uniform(0.0, 0.05))
    bg_median = log_uniform(rng, 100.0, 2e3)
    nbytes, writes = written_ticks(
        rng, np.full(clock.ticks, background), 0.0, lognormal_sizes(bg_median, 0.5)
    )
    total = clock.ticks * clock.tick
    starts = phase + np.arange(int(total // period) + 1) * period
    starts = starts + rng.normal(0.0, jitter, starts.size) if jitter > 0 else starts
    runs = 0
    for s in starts:
        a = clock.at(max(s, 0.0))
        if a >= clock.ticks:
            continue
        b = min(clock.ticks, a + duration)
        size = median * rng.lognormal(0.0, size_sigma)
        nbytes[a:b] += np.round(size / duration).astype(np.int64)
        writes[a:b] += max(1, round(files / duration))
        runs += 1
    level = np.full(clock.ticks, median / duration)
    params = {"period_s": period, "phase_s": phase, "jitter_s": jitter, "size_sigma": size_sigma}
    params |= {"run_bytes": median, "run_ticks": duration, "files": files, "runs": runs}
    params |= {"background_duty": background, "background_median": bg_median}
    return nbytes, writes, level, params, []


def _workday(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    begin = rng.uniform(7.0, 9.0)
    end = rng.uniform(17.0, 19.0)
    inside = o.get("duty", rng.uniform(0.2, 0.8))
    outside = o.get("duty_outside", rng.uniform(0.0, 0.02))
    extra = rng.uniform(0.0, 2.0)
    median = log_uniform(rng, 1e3, 100e3)
    sigma = rng.uniform(0.5, 1.2)
    hour = clock.hour
    working = (clock.weekday < 5) & (hour >= begin) & (hour < end)
    p = np.where(working, inside, outside)
    nbytes, writes = written_ticks(rng, p, extra, lognormal_sizes(median, sigma))
    level = np.full(clock.ticks, median * (1.0 + extra))
    params = {"begin_hour": begin, "end_hour": end, "duty": inside, "duty_outside": outside}
    params |= {"expected_duty": float(p.mean()), "extra_writes": extra}
    params |= {"median": median, "sigma": sigma}
    return nbytes, writes, level, params, []


def _quiet(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    per_hour = o.get("per_hour", rng.uniform(0.2, 2.0))
    median = rng.uniform(60.0, 300.0)
    sigma = rng.uniform(0.2, 0.6)
    p = np.full(clock.ticks, -np.expm1(-per_hour * clock.tick / 3600.0))
    nbytes, writes = written_ticks(rng, p, 0.0, lognormal_sizes(median, sigma))
    level = np.full(clock.ticks, median)
    params = {"per_hour": per_hour, "expected_duty": float(p[0])}
    params |= {"median": median, "sigma": sigma}
    return nbytes, writes, level, params, []


def _sandbox(rng: np.random.Generator, clock: Clock, o: dict[str, Any]) -> Generated:
    campaign = o.get("campaign")
    if campaign is None:
        campaign = np.ones(clock.ticks)
    duty = o.get("duty", log_uniform(rng, 0.01, 0.3))
    extra = rng.uniform(0.0, 2.0)
    median = log_uniform(rng, 100.0, 5e3)
    sigma = rng.uniform(0.5, 1.2)
    p = np.clip(duty * campaign, 0.0, 1.0)
    nbytes, writes = written_ticks(rng, p, extra, lognormal_sizes(median, sigma))
    level = np.full(clock.ticks, median * (1.0 + extra))
    params = {"duty": duty, "expected_duty": float(p.mean()), "extra_writes": extra}
    params |= {"median": median, "sigma": sigma}
    return nbytes, writes, level, params, []


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    kinds: tuple[str, ...]
    generate: Callable[[np.random.Generator, Clock, dict[str, Any]], Generated]


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "intermittent-lognormal", KINDS, lambda r, c, o: _intermittent(r, c, o, pareto=False)
        ),
        Family("intermittent-pareto", KINDS, lambda r, c, o: _intermittent(r, c, o, pareto=True)),
        Family("cache", ("fs", "registry"), _cache),
        Family("scratch", ("fs",), _scratch),
        Family("diurnal", ("egress", "registry"), _diurnal),
        Family("burst", KINDS, _burst),
        Family("level-shift", KINDS, _level_shift),
        Family("cron", ("fs", "egress", "registry"), _cron),
        Family("workday", ("registry", "egress", "fs"), _workday),
        Family("quiet", KINDS, _quiet),
        Family("sandbox", ("fs",), _sandbox),
    )
}


def generate_surface(
    family: str,
    seed: int,
    index: int,
    clock: Clock,
    kind: str | None = None,
    overrides: dict[str, Any] | None = None,
    families: Mapping[str, Family] | None = None,
) -> SurfaceTrace:
    """One surface of ``family``, reproducible from (seed, family, index); ``overrides`` fixes
    named parameters (tests, and hosts an attack needs of a certain shape); ``families``: the
    registry to look ``family`` up in (FAMILIES unless given: longfleet.py has its own)."""
    spec = (FAMILIES if families is None else families)[family]
    rng = surface_rng(seed, family, index)
    drawn_kind = spec.kinds[int(rng.integers(len(spec.kinds)))]
    kind = kind or drawn_kind
    if kind not in spec.kinds:
        raise ValueError(f"family {family!r} has no {kind!r} surfaces (only {spec.kinds})")
    packet = rng.uniform(500.0, 1400.0)
    nbytes, writes, level, params, episodes = spec.generate(rng, clock, dict(overrides or {}))
    if kind == "egress":
        events = np.maximum(writes, np.ceil(nbytes / packet)).astype(np.int64)
        params["packet_bytes"] = packet
    else:
        events = writes
    params = {k: v for k, v in params.items() if not isinstance(v, np.ndarray)}
    return SurfaceTrace(family, kind, nbytes, events, level, params, episodes)


# -- attacks ---------------------------------------------------------------------------------

BURST_HOSTS = (
    "intermittent-lognormal",
    "intermittent-pareto",
    "cache",
    "scratch",
    "diurnal",
    "burst",
    "level-shift",
    "cron",
    "workday",
)
RAMP_HOSTS = ("diurnal", "cache", "scratch", "intermittent-lognormal", "level-shift", "workday")
# (attack kind, host family, host overrides)
ATTACK_PLAN: tuple[tuple[str, str, dict[str, Any]], ...] = (
    *(("burst", h, {}) for h in BURST_HOSTS),
    *(("ramp", h, {}) for h in RAMP_HOSTS),
    ("drip_10bps", "quiet", {}),
    ("drip_10bps", "quiet", {}),
    ("drip_100bps", "quiet", {}),
    ("drip_100bps", "quiet", {}),
    ("beacon", "quiet", {}),
    ("beacon", "intermittent-lognormal", {"duty": "low"}),
)
DURATION_S = {
    "burst": 60.0,
    "ramp": 7200.0,
    "drip_10bps": 3 * 86400.0,
    "drip_100bps": 3 * 86400.0,
    "beacon": 86400.0,
    "swarm": 7200.0,
}
ATTACKS_FROM_S = 7 * 86400.0
SWARM_SIZE = 30
SWARM_FACTOR = 0.6


def attack_rng(seed: int, kind: str, host: str, index: int, stream: int = 0) -> np.random.Generator:
    """Stream 0 draws the attack; stream 1 the shape its host must have."""
    return np.random.default_rng([seed, family_code(kind), family_code(host), index, stream])


def attack_window(rng: np.random.Generator, clock: Clock, kind: str) -> tuple[int, int]:
    """Onset uniform from day 7 to the last start whose attack ends an hour before the fleet
    (a drip that cannot fit its 3 days runs to the end, but starts by day 11)."""
    length = ticks_per(DURATION_S[kind], clock.tick)
    lo = ticks_per(ATTACKS_FROM_S, clock.tick)
    hi = clock.ticks - min(length, clock.ticks // 4) - ticks_per(3600.0, clock.tick)
    if hi <= lo:
        raise ValueError(f"a fleet of {clock.ticks} ticks is too short for attacks after day 7")
    onset = int(rng.integers(lo, hi))
    return onset, min(clock.ticks, onset + length)


def attack_bytes(
    kind: str, rng: np.random.Generator, level: np.ndarray, clock: Clock, onset: int, end: int
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Bytes and events the attack adds over ticks [onset, end)."""
    n = end - onset
    if kind == "burst":
        factor = float(rng.uniform(30.0, 50.0))
        add = np.round(factor * level[onset:end])
        return add, np.ceil(add / 1024.0), {"factor": factor}
    if kind == "ramp":
        add = np.round(19.0 * level[onset:end] * np.arange(1, n + 1) / n)
        return add, np.ceil(add / 1024.0), {"to_factor": 20.0}
    if kind.startswith("drip_"):
        bps = float(kind.removeprefix("drip_").removesuffix("bps"))
        # Whole bytes per tick whose running sum follows bps exactly.
        cum = np.floor(bps / 8.0 * clock.tick * np.arange(n + 1))
        add = np.diff(cum)
        return add, (add > 0).astype(np.float64), {"bits_per_second": bps}
    if kind == "beacon":
        period = float(rng.choice([300.0, 600.0, 1200.0, 1800.0]))
        size = float(rng.choice([512.0, 1024.0, 4096.0]))
        add = np.zeros(n)
        add[:: ticks_per(period, clock.tick)] = size
        return add, (add > 0).astype(np.float64), {"period_s": period, "beat_bytes": size}
    raise ValueError(f"unknown attack {kind!r}")


# -- fleets ----------------------------------------------------------------------------------

MAIN_MIX: dict[str, int] = {
    "intermittent-lognormal": 6,
    "intermittent-pareto": 5,
    "cache": 5,
    "scratch": 5,
    "diurnal": 4,
    "burst": 4,
    "level-shift": 4,
    "cron": 5,
    "workday": 4,
    "quiet": 5,
}
SANDBOXES = (36, 48)  # inclusive range of the sandbox fleet's size


def _assemble(
    name: str, seed: int, clock: Clock, traces: list[SurfaceTrace], names: list[str]
) -> Fleet:
    nbytes = np.empty((clock.ticks, len(traces)), dtype=np.int64)
    events = np.empty((clock.ticks, len(traces)), dtype=np.int64)
    for j, t in enumerate(traces):
        nbytes[:, j] = t.nbytes
        events[:, j] = t.events
    infos = [
        SurfaceInfo(n, t.kind, t.family, t.params, tuple(t.episodes))
        for n, t in zip(names, traces, strict=True)
    ]
    return Fleet(name, seed, clock, nbytes, events, infos, [])


def main_fleet(seed: int, days: float = DAYS, tick: float = TICK, attacks: bool = True) -> Fleet:
    """Every family but sandbox (MAIN_MIX surfaces each), plus one held-out host surface per
    entry of ATTACK_PLAN with its attack on top (``attacks=False``: the same fleet without
    them, its benign twin)."""
    clock = Clock(ticks_per(days * 86400.0, tick), tick)
    traces: list[SurfaceTrace] = []
    names: list[str] = []
    count: dict[str, int] = {}

    def add(family: str, overrides: dict[str, Any] | None = None) -> int:
        index = count.get(family, 0)
        count[family] = index + 1
        traces.append(generate_surface(family, seed, index, clock, overrides=overrides))
        names.append(f"{family}-{index:02d}")
        return len(traces) - 1

    for family, n in MAIN_MIX.items():
        for _ in range(n):
            add(family)
    planned: list[tuple[str, str, int, int]] = []  # kind, host, plan index, column
    for i, (kind, host, overrides) in enumerate(ATTACK_PLAN):
        o = dict(overrides)
        if o.get("duty") == "low":
            o["duty"] = log_uniform(attack_rng(seed, kind, host, i, stream=1), 0.01, 0.05)
            o["duty_amplitude"] = 0.0
        planned.append((kind, host, i, add(host, o)))
    fleet = _assemble(f"main-s{seed}", seed, clock, traces, names)
    for kind, host, i, col in planned if attacks else ():
        rng = attack_rng(seed, kind, host, i)
        onset, end = attack_window(rng, clock, kind)
        add_b, add_e, params = attack_bytes(kind, rng, traces[col].level, clock, onset, end)
        fleet.nbytes[onset:end, col] += add_b.astype(np.int64)
        fleet.events[onset:end, col] += add_e.astype(np.int64)
        fleet.attacks.append(Attack(kind, host, (col,), onset, end, (8.0 * add_b)[:, None], params))
    return fleet


def campaign_profile(seed: int, clock: Clock) -> tuple[np.ndarray, float]:
    """The sandbox fleet's shared activity: one lognormal factor per hour, mean 1."""
    rng = surface_rng(seed, "sandbox-campaign", 0)
    sd = float(rng.uniform(0.05, 0.2))
    per_hour = ticks_per(3600.0, clock.tick)
    hours = -(-clock.ticks // per_hour)
    factor = rng.lognormal(-sd * sd / 2.0, sd, hours)
    return np.repeat(factor, per_hour)[: clock.ticks], sd


def sandbox_fleet(seed: int, days: float = DAYS, tick: float = TICK, attacks: bool = True) -> Fleet:
    """Dozens of small sandboxes (fs), with a swarm on SWARM_SIZE of them: every written tick's
    bytes and events x (1 + SWARM_FACTOR) for 2 h (``attacks=False``: the benign twin)."""
    clock = Clock(ticks_per(days * 86400.0, tick), tick)
    campaign, sd = campaign_profile(seed, clock)
    rng = attack_rng(seed, "swarm", "sandbox", 0)
    n = int(rng.integers(SANDBOXES[0], SANDBOXES[1] + 1))
    traces = [
        generate_surface("sandbox", seed, i, clock, overrides={"campaign": campaign})
        for i in range(n)
    ]
    for t in traces:
        t.params["campaign_sd"] = sd
    fleet = _assemble(
        f"sandbox-s{seed}", seed, clock, traces, [f"sandbox-{i:02d}" for i in range(n)]
    )
    if attacks:
        onset, end = attack_window(rng, clock, "swarm")
        cols = tuple(sorted(int(c) for c in rng.choice(n, SWARM_SIZE, replace=False)))
        base_b = fleet.nbytes[onset:end, cols].astype(np.float64)
        add_b = np.round(SWARM_FACTOR * base_b)
        add_e = np.round(SWARM_FACTOR * fleet.events[onset:end, cols])
        fleet.nbytes[onset:end, cols] += add_b.astype(np.int64)
        fleet.events[onset:end, cols] += add_e.astype(np.int64)
        fleet.attacks.append(
            Attack("swarm", "sandbox", cols, onset, end, 8.0 * add_b, {"factor": 1 + SWARM_FACTOR})
        )
    return fleet


# -- capalarm's input ------------------------------------------------------------------------


def capalarm_config(fleet: Fleet) -> dict[str, Any]:
    """The config a user would write: every surface declared with its name and kind, nothing
    else (default settings)."""
    return {
        "tick": f"{fleet.clock.tick:g}s",
        "surfaces": [{"name": s.name, "kind": s.kind} for s in fleet.surfaces],
    }


def write_events(fleet: Fleet, out: TextIO, with_kind: bool = False) -> int:
    """capalarm's write-event JSON lines, ``{"ts", "surface", "bytes", "events"}`` (``kind``
    only when ``with_kind``: capalarm takes it from the declared surface), in time order, one
    line per surface and tick with writes, stamped mid-tick.  When the fleet's first or last
    tick has no writes, a zero line on its first surface marks it, so that a replay covers the
    fleet's whole time range.  Returns the number of lines."""
    clock = fleet.clock
    written = (fleet.nbytes > 0) | (fleet.events > 0)
    names = [json.dumps(s.name) for s in fleet.surfaces]
    kinds = [f',"kind":"{s.kind}"' if with_kind else "" for s in fleet.surfaces]
    lines = 0

    def marker(t: int) -> str:
        ts = clock.t0 + (t + 0.5) * clock.tick
        return f'{{"ts":{ts:.1f},"surface":{names[0]},"bytes":0,"events":0{kinds[0]}}}\n'

    if not written[0].any():
        out.write(marker(0))
        lines += 1
    rows, cols = np.nonzero(written)  # row-major: time order
    ts = clock.t0 + (rows + 0.5) * clock.tick
    b = fleet.nbytes[rows, cols].tolist()
    e = fleet.events[rows, cols].tolist()
    chunk: list[str] = []
    for t, c, nb, ne in zip(ts.tolist(), cols.tolist(), b, e, strict=True):
        chunk.append(
            f'{{"ts":{t:.1f},"surface":{names[c]},"bytes":{nb},"events":{ne}{kinds[c]}}}\n'
        )
        if len(chunk) >= 65536:
            out.write("".join(chunk))
            lines += len(chunk)
            chunk = []
    out.write("".join(chunk))
    lines += len(chunk)
    if fleet.ticks > 1 and not written[-1].any():
        out.write(marker(fleet.ticks - 1))
        lines += 1
    return lines


def write_inputs(fleet: Fleet, directory: Path, with_kind: bool = False) -> tuple[Path, Path]:
    """events.jsonl and config.yaml for ``capalarm backtest --config config.yaml events.jsonl``."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    events = directory / "events.jsonl"
    config = directory / "config.yaml"
    with open(events, "w") as fh:
        write_events(fleet, fh, with_kind)
    config.write_text(yaml.safe_dump(capalarm_config(fleet), sort_keys=False))
    return events, config
