"""Comparison detectors for the held-out fleets, vectorised over surfaces.

- ``cusum``: the issue's plain CUSUM reference, a one-sided CUSUM (Page, "Continuous inspection
  schemes", Biometrika 41, 1954) on each target's log-rate x = ln(1 + bytes/s), standardised by
  the mean and standard deviation of the day before the tick (z = (x - mean) / max(sd,
  SD_FLOOR)): S_t = max(0, S_{t-1} + z_t - k), alarm while S_t > h.  Nothing is frozen while it
  alarms and nothing is seasonal: it is the plain scheme.  The recursion is solved in closed form
  (Lindley): with C_t the running sum of z - k, S_t = C_t - min(0, min_{s<=t} C_s), so it runs
  as numpy cumulative sums over every target at once.  (k, h) is chosen per run on the choice
  seeds (heldout.py).
- ``static``, ``gitlab``, ``holt_winters``: comparisons.py's methods (a fixed Prometheus-style
  threshold from the first week's peak, GitLab's weekly z-score, Holt-Winters with Brutlag's
  band) at this fleet's tick; river's HalfSpaceTrees is left out here (~65 us a sample in
  Python: 121k ticks x 100 targets is 13 min a fleet).

Every method sees each surface's bytes/s per tick and each kind's aggregate (the sum over the
kind's surfaces, where capalarm has one too: score.targets).  A method's alarm is its score
above a threshold; its incidents are counted like capalarm's, re-alarms within
REFERENCE_RESOLVE_S of the last alarming tick being one incident (capalarm's default spike and
budget resolve_hold), so both are judged by the same scorer (score.score_fleet).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bench.detection import comparisons, fleets, score

REFERENCE_RESOLVE_S = 30.0
CUSUM_WINDOW_S = 86400.0
SD_FLOOR = 0.1  # in ln units: a surface that never changes is not infinitely sensitive
CUSUM_K = (0.5, 1.0, 2.0, 3.0, 5.0)
THRESHOLDS: dict[str, np.ndarray] = {
    "cusum": np.round(np.geomspace(2.0, 5000.0, 45), 3),
    "static": np.round(np.geomspace(0.5, 50.0, 41), 4),
    "gitlab": np.round(np.geomspace(1.0, 2000.0, 45), 3),
    "holt_winters": np.round(np.geomspace(1.0, 5000.0, 45), 3),
}
PUBLISHED = {"static": 1.0, "gitlab": 3.0, "holt_winters": 3.0}
METHODS = ("cusum", "static", "gitlab", "holt_winters")


@dataclass(frozen=True, slots=True)
class Setting:
    """One operating point: ``k`` is the CUSUM's allowance (None for the other methods)."""

    method: str
    threshold: float
    k: float | None = None
    published: bool = False

    @property
    def label(self) -> str:
        if self.method == "cusum":
            return f"k={self.k:g}, h={self.threshold:g}"
        return f"threshold {self.threshold:g}" + (" (published)" if self.published else "")


def grid(method: str) -> list[Setting]:
    """Every setting the choice seeds try, plus the published one where there is one."""
    if method == "cusum":
        return [Setting("cusum", float(h), k) for k in CUSUM_K for h in THRESHOLDS["cusum"]]
    out = [Setting(method, float(t)) for t in THRESHOLDS[method]]
    if method in PUBLISHED:
        out.append(Setting(method, PUBLISHED[method], published=True))
    return out


def target_rates(fleet: fleets.Fleet) -> tuple[list[str], np.ndarray]:
    """Target names (score.targets) and their bytes/s, ticks x targets."""
    names, cols = [], []
    for name, _, members in score.targets(fleet):
        names.append(name)
        cols.append(fleet.nbytes[:, list(members)].sum(axis=1))
    return names, np.column_stack(cols).astype(np.float64) / fleet.clock.tick


def trailing_mean_sd(x: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sd of x over the ``window`` ticks before each tick (fewer at the start; NaN at
    tick 0), per column."""
    n = x.shape[0]
    c1 = np.zeros((n + 1, x.shape[1]))
    c2 = np.zeros((n + 1, x.shape[1]))
    np.cumsum(x, axis=0, out=c1[1:])
    np.cumsum(x * x, axis=0, out=c2[1:])
    t = np.arange(n)
    lo = np.maximum(t - window, 0)
    cnt = (t - lo)[:, None].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (c1[t] - c1[lo]) / cnt
        var = (c2[t] - c2[lo]) / cnt - mean * mean
    return mean, np.sqrt(np.maximum(var, 0.0))


def cusum_z(rates: np.ndarray, tick: float, window_s: float = CUSUM_WINDOW_S) -> np.ndarray:
    """Standardised log-rate; NaN during the first window (no history to judge by)."""
    x = np.log1p(rates)
    window = fleets.ticks_per(window_s, tick)
    mean, sd = trailing_mean_sd(x, window)
    z = (x - mean) / np.maximum(sd, SD_FLOOR)
    z[:window] = np.nan
    return z


def cusum(z: np.ndarray, k: float) -> np.ndarray:
    """One-sided CUSUM statistic of z - k per column, 0 where z is NaN (warm-up), as the
    closed form of S_t = max(0, S_{t-1} + z_t - k) with S = 0 before the first judged tick."""
    y = np.where(np.isnan(z), 0.0, z - k)
    c = np.cumsum(y, axis=0)
    s = c - np.minimum(np.minimum.accumulate(c, axis=0), 0.0)
    s[np.isnan(z)] = 0.0
    return s


def method_scores(
    method: str, fleet: fleets.Fleet, rates: np.ndarray, ks: tuple[float, ...] = CUSUM_K
) -> Iterator[tuple[float | None, np.ndarray]]:
    """(k, score matrix) of a method on a fleet: one per CUSUM allowance, else one (k None)."""
    tick = fleet.clock.tick
    if method == "cusum":
        z = cusum_z(rates, tick)
        for k in ks:
            yield k, cusum(z, k)
    elif method == "static":
        history = fleets.ticks_per(fleets.ATTACKS_FROM_S, tick)
        cols = [comparisons.static(rates[:, j], history, tick) for j in range(rates.shape[1])]
        yield None, np.column_stack(cols)
    elif method == "gitlab":
        cols = [comparisons.gitlab(rates[:, j], tick) for j in range(rates.shape[1])]
        yield None, np.column_stack(cols)
    elif method == "holt_winters":
        yield None, comparisons.holt_winters(rates.T, tick=tick).T
    else:
        raise ValueError(f"unknown method {method!r}")


def starts_by_target(names: list[str], starts: np.ndarray) -> dict[str, np.ndarray]:
    rows, cols = np.nonzero(starts)
    order = np.argsort(cols, kind="stable")
    rows, cols = rows[order], cols[order]
    bounds = np.searchsorted(cols, np.arange(len(names) + 1))
    return {n: rows[bounds[j] : bounds[j + 1]] for j, n in enumerate(names)}


def evaluate(fleet: fleets.Fleet, settings: list[Setting]) -> dict[Setting, score.FleetScore]:
    """Each setting's score on the fleet (score matrices computed once per method and k)."""
    names, rates = target_rates(fleet)
    benign = score.benign_masks(fleet)
    window = fleets.ticks_per(REFERENCE_RESOLVE_S, fleet.clock.tick)
    out: dict[Setting, score.FleetScore] = {}
    for method in dict.fromkeys(s.method for s in settings):
        mine = [s for s in settings if s.method == method]
        ks = tuple(dict.fromkeys(s.k for s in mine if s.k is not None))
        for k, matrix in method_scores(method, fleet, rates, ks):
            clean = np.nan_to_num(matrix, nan=-np.inf)
            for s in mine:
                if s.k != k:
                    continue
                starts = score.mask_starts(clean > s.threshold, window)
                out[s] = score.score_fleet(fleet, starts_by_target(names, starts), None, benign)
    return out
