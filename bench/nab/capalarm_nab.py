"""capalarm on NAB: replay a NAB series as write events through `alarm.backtest.run_backtest`
and turn the spike alerts it writes into per-row anomaly scores that NAB's scorer can judge.

Mapping (documented in docs/nab.md):

- one event per row: ts = the row's timestamp (UTC unix seconds), surface "s", events = 1,
  bytes = round((value - shift) * scale).  shift = min(value) only when a series has negative
  values (none in the volume subset), else 0, so that ratios to the baseline are the series'
  own.  scale maps the mean of the probation rows (the first 15%, at most 750, which NAB does
  not score) to REFERENCE_RATE bytes/s.  NAB values have no unit; this gives them one, fixed by
  a rule, from rows that are not scored, so the floor can be set in the series' own terms:
  ``SpikeSettings.floor`` is a fraction of that probation mean (0 = no floor).
- tick = the series' step (median difference of timestamps), so that each row is one tick.
- the capacity budget is disabled by a huge allowance, the seasonal budget switched off: bits/s
  are meaningless for NAB's values.
- a row's anomaly score is 0, except on the row whose tick an alert fires on: 1.0 in the
  "binary" reading; 1 - threshold / value in the "graded" one (the threshold of the
  statistic that fired), so that NAB's threshold sweep can prefer strong firings over
  marginal ones.
- a third reading, "onset": the same series through ``Detector`` in-process (the detector the
  backtest runs, on the same ticks), each tick's ``spike_onset_scores()`` on the ticks where a
  statistic's incident reaches a new high: above 1/2 exactly where it is past the threshold
  the rule fires at (graded by how far, in its tail's scale), below 1/2 by its ratio to the
  largest incident the statistic keeps (1/4 level with it); 0 on the other ticks of an
  incident, so NAB's sweep can choose the operating point as it does for every detector on
  its board, while a spike's slowly decaying averages are not scored row after row.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alarm.backtest import run_backtest
from alarm.config import Config, config_from_dict
from alarm.detector.engine import Detector
from bench.nab.scorer import Series, probation_rows

SURFACE = "s"
# What the probation mean of every series becomes, in bytes/s: large enough that a thousandth
# of it is still hundreds of bytes per tick, so integer rounding is negligible.
REFERENCE_RATE = 1e6
# An allowance no NAB series comes near: the budget rule never accumulates excess; the
# seasonal budget is off too (NAB's values are not bits, and only spike alerts are scored).
NO_BUDGET = {
    "allowance_bits_per_second": 1e30,
    "tolerance_bits": 1e30,
    "relative": {"enabled": False},
}


@dataclass(frozen=True, slots=True)
class SpikeSettings:
    """The spike rule's settings for NAB: one set for every series (no per-series tuning).
    The defaults are the detector's own defaults (alarm/config.py), chosen on the held-out
    bench's fleets, never on NAB."""

    false_alarms_per_week: float = 0.1
    min_peaks: int = 12
    min_history: float = 86400.0
    resolve_hold: float = 30.0
    hysteresis: float = 0.8
    floor: float = 0.0  # as a fraction of the series' probation mean (see module doc)

    def rule(self) -> dict[str, float]:
        return {
            "false_alarms_per_week": self.false_alarms_per_week,
            "min_peaks": self.min_peaks,
            "min_history": self.min_history,
            "floor_bytes_per_second": self.floor * REFERENCE_RATE,
            "hold": 0.0,  # fire on the first breaching tick: NAB rewards early detection
            "resolve_hold": self.resolve_hold,
            "hysteresis": self.hysteresis,
        }

    def label(self) -> str:
        return (
            f"false_alarms_per_week={self.false_alarms_per_week:g} min_peaks={self.min_peaks} "
            f"min_history={self.min_history / 3600:g}h resolve_hold={self.resolve_hold / 60:g}m "
            f"hysteresis={self.hysteresis:g} floor={self.floor:g}x probation mean, hold=0"
        )


@dataclass(frozen=True, slots=True)
class Encoding:
    tick: float
    shift: float
    scale: float


@dataclass(frozen=True, slots=True)
class SeriesRun:
    name: str
    binary: np.ndarray  # per-row anomaly score, 1.0 where a spike alert fires
    graded: np.ndarray  # per-row anomaly score, 1 - threshold/value where one fires
    onset: np.ndarray  # per-row anomaly score, the detector's graded verdict at incident highs
    firings: int
    tick: float
    merged_rows: int  # rows that share a tick with an earlier row (their bytes add up)
    seconds: float  # wall time of the backtest itself


def series_tick(timestamps: np.ndarray) -> float:
    steps = np.diff(timestamps)
    steps = steps[steps > 0]
    step = float(np.median(steps)) if steps.size else 300.0
    return min(max(step, 1.0), 3600.0)  # capalarm's tick range


def encode(series: Series) -> tuple[Encoding, np.ndarray]:
    values = series.values
    lowest = float(values.min())
    shift = lowest if lowest < 0 else 0.0
    shifted = values - shift
    reference = float(shifted[: max(probation_rows(len(values)), 1)].mean())
    if reference <= 0:  # a series silent through probation: fall back to the whole mean
        reference = float(shifted.mean()) or 1.0
    tick = series_tick(series.timestamps)
    scale = REFERENCE_RATE * tick / reference
    nbytes = np.rint(shifted * scale).astype(np.int64)
    return Encoding(tick=tick, shift=shift, scale=scale), nbytes


def write_events(series: Series, path: Path) -> Encoding:
    enc, nbytes = encode(series)
    with open(path, "w") as fh:
        for ts, b in zip(series.timestamps.tolist(), nbytes.tolist(), strict=True):
            fh.write(f'{{"ts":{ts},"surface":"{SURFACE}","bytes":{b},"events":1}}\n')
    return enc


def make_config(settings: SpikeSettings, tick: float) -> Config:
    return config_from_dict(
        {
            "tick": tick,
            "surfaces": [
                {"name": SURFACE, "kind": "egress", "spike": settings.rule(), "budget": NO_BUDGET}
            ],
            "unclassified": {"egress": NO_BUDGET},
        }
    )


def run_series(series: Series, settings: SpikeSettings) -> SeriesRun:
    with tempfile.TemporaryDirectory(prefix="capalarm-nab-") as tmp:
        events = Path(tmp) / "events.jsonl"
        enc = write_events(series, events)
        out = io.StringIO()
        t0 = time.perf_counter()
        run_backtest(make_config(settings, enc.tick), [str(events)], out, workers=1)
        seconds = time.perf_counter() - t0

    # The backtest buckets a row into tick int(ts // tick); an alert's "at" is its tick's end.
    row_tick = (series.timestamps // enc.tick).astype(np.int64)
    ticks, first_row = np.unique(row_tick, return_index=True)
    row_of = dict(zip(ticks.tolist(), first_row.tolist(), strict=True))
    binary = np.zeros(len(series.values))
    graded = np.zeros(len(series.values))
    firings = 0
    for line in out.getvalue().splitlines():
        change = json.loads(line)
        rule = change.get("rule")
        if change.get("surface") != SURFACE or rule not in ("spike", "drop"):
            continue
        if change.get("state") != "firing":
            continue
        row = row_of.get(round(change["at"] / enc.tick) - 1)
        if row is None:
            continue  # a tick without a row cannot breach (its rate is 0); defensive
        firings += 1
        value, threshold = float(change["value"]), float(change["threshold"])
        figures = change.get("figures", {})
        statistic = figures.get("statistic")
        if statistic:
            threshold = float(figures.get(f"{statistic}_threshold_bytes_per_second") or threshold)
        binary[row] = 1.0
        if rule == "drop":  # fired below the threshold: graded by how far below
            graded[row] = max(graded[row], 1.0 - value / threshold if threshold > 0 else 1.0)
        else:
            graded[row] = max(graded[row], 1.0 - threshold / value if value > 0 else 1.0)
    return SeriesRun(
        name=series.name,
        binary=binary,
        graded=graded,
        onset=onset_scores(series, settings, enc, row_tick, ticks, first_row),
        firings=firings,
        tick=enc.tick,
        merged_rows=int(len(row_tick) - ticks.size),
        seconds=seconds,
    )


def onset_scores(
    series: Series,
    settings: SpikeSettings,
    enc: Encoding,
    row_tick: np.ndarray,
    ticks: np.ndarray,
    first_row: np.ndarray,
) -> np.ndarray:
    """Every tick from the first row's to the last (gaps are quiet ticks, as in the
    backtest) through the detector; each tick's score lands on its first row."""
    _, nbytes = encode(series)
    t0 = int(ticks[0])
    span = int(ticks[-1]) - t0 + 1
    per_tick = np.bincount(row_tick - t0, weights=nbytes, minlength=span)
    events = np.bincount(row_tick - t0, minlength=span).astype(np.float64)
    det = Detector(
        make_config(settings, enc.tick), [("egress", SURFACE), ("egress", "unclassified")]
    )
    scores = np.zeros(span)
    zero = np.zeros(1)
    for k in range(span):
        now = (t0 + k + 1) * enc.tick
        b = np.concatenate([per_tick[k : k + 1], zero])
        e = np.concatenate([events[k : k + 1], zero])
        det.evaluate_arrays(now, enc.tick, b, e, lambda _row: [])
        scores[k] = det.spike_onset_scores()[0]
    out = np.zeros(len(series.values))
    out[first_row] = scores[ticks - t0]
    return out


def _run_one(args: tuple[Series, SpikeSettings]) -> SeriesRun:
    return run_series(*args)


def run_many(
    series: Iterable[Series], settings: SpikeSettings, workers: int = 2
) -> dict[str, SeriesRun]:
    """Every series through its own backtest; series run in parallel, one process each."""
    jobs = [(s, settings) for s in series]
    if workers <= 1:
        return {r.name: r for r in map(_run_one, jobs)}
    with ProcessPoolExecutor(workers) as pool:
        return {r.name: r for r in pool.map(_run_one, jobs)}


def scores_of(runs: Mapping[str, SeriesRun], reading: str) -> dict[str, np.ndarray]:
    """``reading``: binary, graded or onset (the module docstring)."""
    return {n: getattr(r, reading) for n, r in runs.items()}
