"""The methods users would otherwise pick, each as a score per tick (alarm when score > theta).

- ``static``: a Prometheus-rule-style fixed threshold, ``rate(x[5m]) > T``, with T set by an
  operator at 1.5x the highest 5-minute rate of the first week (score = rate5m / T; theta 1).
- ``gitlab``: GitLab's published anomaly method (Newdigate, "Anomaly detection using Prometheus",
  2019): z = (x - prediction) / stddev over 1 week, where the prediction is the median, over the
  last 1-3 weeks, of the same hour's average that week plus the change in the weekly average
  since; alarm at z > 3.
- ``holt_winters``: additive Holt-Winters with a daily season and Brutlag's confidence band
  (RRDtool's aberrant-behaviour detection): score = (x - forecast) / seasonal deviation;
  alarm at 3 deviations (Brutlag suggests 2-3).
- ``hst``: river's ``HalfSpaceTrees`` (the real library) behind a ``MinMaxScaler``, on
  log-rate and time of day; score in [0, 1].  River gives no default threshold: the bench
  tunes one.

Every method sees the same per-tick rates as capalarm (bytes/s); scores are NaN until the
method has the history it needs (then it cannot alarm).  Windows are set in time, not ticks:
``tick`` (seconds, default this bench's 60 s) converts them, so the held-out fleets' 10 s ticks
(heldout.py) use the same methods.
"""

from __future__ import annotations

import numpy as np

from bench.detection.scenarios import DAY_TICKS, T0, TICK


def _rolling_mean(x: np.ndarray, w: int) -> np.ndarray:
    c = np.concatenate([[0.0], np.cumsum(x)])
    out = np.empty_like(x)
    idx = np.arange(1, x.size + 1)
    lo = np.maximum(idx - w, 0)
    out[:] = (c[idx] - c[lo]) / (idx - lo)
    return out


def static(rate: np.ndarray, history: int, tick: float = TICK) -> np.ndarray:
    r5 = _rolling_mean(rate, max(1, round(300.0 / tick)))
    limit = max(1.5 * r5[:history].max(), 1.0)
    score = r5 / limit
    score[:history] = np.nan  # the rule is written after the first week
    return score


def gitlab(rate: np.ndarray, tick: float = TICK) -> np.ndarray:
    n = rate.size
    week = round(7 * 86400.0 / tick)
    half_hour = max(1, round(1800.0 / tick))
    c = np.concatenate([[0.0], np.cumsum(rate)])
    c2 = np.concatenate([[0.0], np.cumsum(rate * rate)])
    idx = np.arange(1, n + 1)
    lo = np.maximum(idx - week, 0)
    cnt = idx - lo
    avg = (c[idx] - c[lo]) / cnt
    sd = np.sqrt(np.maximum((c2[idx] - c2[lo]) / cnt - avg * avg, 0.0))
    preds = []
    for k in (1, 2, 3):
        centre = np.arange(n) - k * week
        a = np.clip(centre - half_hour, 0, n)
        b = np.clip(centre + half_hour, 0, n)
        ok = centre - half_hour >= 0
        hour_avg = np.where(b > a, (c[b] - c[a]) / np.maximum(b - a, 1), np.nan)
        prev = np.clip(np.arange(n) - k * week, 0, n - 1)
        trend = avg - avg[prev]
        preds.append(np.where(ok, hour_avg + trend, np.nan))
    stack = np.vstack(preds)
    pred = np.full(n, np.nan)
    have = ~np.isnan(stack).all(axis=0)
    pred[have] = np.nanmedian(stack[:, have], axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (rate - pred) / sd
    z[np.arange(n) < week] = np.nan
    z[sd <= 0] = np.where(rate[sd <= 0] > pred[sd <= 0], np.inf, 0.0)
    z[np.arange(n) < week] = np.nan
    return z


def holt_winters(
    rates: np.ndarray,
    alpha: float = 0.05,
    beta: float = 0.0005,
    gamma: float = 0.1,
    tick: float = TICK,
) -> np.ndarray:
    """Rows are surfaces; returns (x - forecast) / seasonal deviation per row and tick."""
    rows, n = rates.shape
    m = round(86400.0 / tick)
    out = np.full((rows, n), np.nan)
    first = rates[:, :m]
    level = first.mean(axis=1)
    trend = np.zeros(rows)
    season = first - level[:, None]
    dev = np.abs(first - first.mean(axis=1, keepdims=True)).mean(axis=1)[:, None].repeat(m, 1)
    dev = np.maximum(dev, 1e-3)
    for t in range(m, n):
        s = t % m
        x = rates[:, t]
        forecast = level + trend + season[:, s]
        out[:, t] = (x - forecast) / np.maximum(dev[:, s], 1e-3)
        err = x - forecast
        new_level = alpha * (x - season[:, s]) + (1 - alpha) * (level + trend)
        trend = beta * (new_level - level) + (1 - beta) * trend
        season[:, s] = gamma * (x - new_level) + (1 - gamma) * season[:, s]
        dev[:, s] = gamma * np.abs(err) + (1 - gamma) * dev[:, s]
        level = new_level
    out[:, : 2 * m] = np.nan  # a day to initialise, a day to settle
    return out


def hst(rate: np.ndarray, seed: int) -> np.ndarray:
    from river import anomaly, compose, preprocessing

    model = compose.Pipeline(
        preprocessing.MinMaxScaler(),
        anomaly.HalfSpaceTrees(n_trees=10, height=8, window_size=250, seed=seed),
    )
    hours = ((T0 + np.arange(rate.size) * TICK) % 86400) / 86400.0
    logs = np.log1p(rate)
    out = np.empty(rate.size)
    for i in range(rate.size):
        x = {"log_rate": float(logs[i]), "time_of_day": float(hours[i])}
        out[i] = model.score_one(x)
        model.learn_one(x)
    out[:DAY_TICKS] = np.nan  # a day of learning before its scores mean anything
    return out


# Published operating points; "tuned" rows use the threshold the bench finds on the
# calibration fleet for at most 1 false alarm per surface-week.
PUBLISHED = {"static": 1.0, "gitlab": 3.0, "holt_winters": 3.0, "hst": None}
GRIDS = {
    "static": np.round(np.arange(0.5, 20.01, 0.1), 3),
    "gitlab": np.round(np.arange(1.0, 200.01, 0.25), 3),
    "holt_winters": np.round(np.concatenate([np.arange(1, 20, 0.25), np.arange(20, 400, 2)]), 3),
    "hst": np.round(np.arange(0.50, 1.0001, 0.005), 4),
}
