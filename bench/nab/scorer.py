"""NAB scoring, written from the rules NAB publishes (numenta/NAB at ea702d7: nab/sweeper.py,
nab/optimizer.py, nab/scorer.py; nab/runner.py's normalize; see docs/nab.md), in numpy.

The rules, in the order they are applied:

- Each labelled window is a row range [start, end].  A row inside it gets the "sweep score"
  S(-(end - i + 1) / width) * tpWeight / S(-1), with S(x) = 2 / (1 + e^(5x)) - 1 the scaled
  sigmoid (S(x) = -1 past x > 3): a detection on the window's first row earns exactly tpWeight,
  one on its last row almost nothing.
- A row outside every window gets -fpWeight before the first window and
  S(|prev_end - i| / (prev_width - 1)) * fpWeight after one: a detection just behind a window
  costs little, one far from it the full weight.
- The first min(floor(0.15 n), 750) rows of a file are probation and not scored at all.
- At a threshold t, a row is a detection when its anomaly score is >= t.  A file (or corpus)
  scores the sum of its false-positive sweep scores, plus for every window the best (= earliest)
  detection's sweep score, or -fnWeight when the window has no detection.
- The threshold is optimised per detector and profile over the whole set of files scored
  together: every distinct anomaly score is a candidate, and "no detection at all" is one too.
- The final score is 100 * (raw - null) / (perfect - null): the null detector (a constant 0.5,
  whose best threshold detects nothing) scores 0, and a detector that hits every window on its
  first row scores 100 (perfect = windows * tpWeight).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROFILES: tuple[str, ...] = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")
PROBATION_FRACTION = 0.15
# NAB caps probation at 0.15 * 5000 rows, so long files are not mostly probation.
PROBATION_CAP = PROBATION_FRACTION * 5000
# The null detector NAB normalises against writes this constant anomaly score on every row.
NULL_SCORE = 0.5

# The volume-like subset named in ../shared/data/nab/README.md: series whose value is an amount
# written, sent or counted per step, i.e. what capalarm meters.
VOLUME_SUBSET: tuple[str, ...] = (
    "realAWSCloudwatch/ec2_disk_write_bytes_1ef3de.csv",
    "realAWSCloudwatch/ec2_disk_write_bytes_c0d644.csv",
    "realAWSCloudwatch/ec2_network_in_257a54.csv",
    "realAWSCloudwatch/ec2_network_in_5abac7.csv",
    "realAWSCloudwatch/elb_request_count_8c0756.csv",
    "realAWSCloudwatch/iio_us-east-1_i-a2eb1cd9_NetworkIn.csv",
    "realKnownCause/nyc_taxi.csv",
    *(
        f"realTweets/Twitter_volume_{t}.csv"
        for t in ("AAPL", "AMZN", "CRM", "CVS", "FB", "GOOG", "IBM", "KO", "PFE", "UPS")
    ),
)


def scaled_sigmoid(x: np.ndarray | float) -> np.ndarray:
    """NAB's S(x) = 2 * sigmoid(-5x) - 1, and -1 for x > 3 (a false positive far from any
    window costs the full weight).  The clip only keeps exp() finite; S is flat out there."""
    arr = np.asarray(x, dtype=np.float64)
    s = 2.0 / (1.0 + np.exp(5.0 * np.clip(arr, -50.0, 50.0))) - 1.0
    return np.where(arr > 3.0, -1.0, s)


# A detection on a window's first row is worth S(-1); NAB divides by it so that row earns
# exactly tpWeight, which is what "perfect" assumes.
MAX_TP = float(scaled_sigmoid(-1.0))


@dataclass(frozen=True, slots=True)
class CostMatrix:
    tp: float
    fp: float
    fn: float


@dataclass(frozen=True, slots=True)
class Series:
    """One NAB data file: naive timestamps read as UTC unix seconds, and its values."""

    name: str  # NAB's key, e.g. "realTweets/Twitter_volume_AAPL.csv"
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64


@dataclass(frozen=True, slots=True)
class FileLayout:
    """What scoring needs to know about one file, independent of detector and profile."""

    name: str
    rows: int
    probation: int  # rows [0, probation) are not scored
    windows: tuple[tuple[int, int], ...]  # (first row, last row), inclusive
    window_of: np.ndarray  # int32 per row: index into `windows`, or -1 outside every window
    position: np.ndarray  # float64 per row: the unweighted sweep score (see module doc)


@dataclass(frozen=True, slots=True)
class Sweepable:
    """The scorable rows of a set of files, flattened, with one detector's anomaly scores."""

    scores: np.ndarray  # anomaly score per row
    window: np.ndarray  # corpus-wide window id, -1 outside every window
    position: np.ndarray  # unweighted sweep score
    n_windows: int  # windows with at least one scorable row
    n_labelled: int  # every labelled window of these files: NAB's "perfect" counts them all


@dataclass(frozen=True, slots=True)
class Outcome:
    threshold: float
    raw: float
    windows_detected: int
    fp_rows: int  # detections outside every window (after probation)


@dataclass(frozen=True, slots=True)
class ProfileResult:
    profile: str
    threshold: float
    raw: float
    null: float
    perfect: float
    score: float  # normalised: null 0, perfect 100
    windows_detected: int
    windows: int
    fp_rows: int


# -- reading NAB's files ------------------------------------------------------------------


def _unix_seconds(stamps: list[str]) -> np.ndarray:
    # NAB's timestamps carry no zone; reading them all as UTC keeps every step intact.
    return np.array(stamps, dtype="datetime64[s]").astype(np.int64)


def load_profiles(root: Path) -> dict[str, CostMatrix]:
    data = json.loads((root / "config/profiles.json").read_text())
    return {
        name: CostMatrix(
            tp=float(p["CostMatrix"]["tpWeight"]),
            fp=float(p["CostMatrix"]["fpWeight"]),
            fn=float(p["CostMatrix"]["fnWeight"]),
        )
        for name, p in data.items()
    }


def load_window_limits(root: Path) -> dict[str, list[tuple[int, int]]]:
    data = json.loads((root / "labels/combined_windows.json").read_text())
    return {
        name: [tuple(_unix_seconds(list(pair)).tolist()) for pair in limits]  # type: ignore[misc]
        for name, limits in data.items()
    }


def _read_columns(path: Path, columns: Iterable[str]) -> dict[str, list[str]]:
    wanted = list(columns)
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        idx = [header.index(c) for c in wanted]
        out: dict[str, list[str]] = {c: [] for c in wanted}
        appends = [out[c].append for c in wanted]
        for row in reader:
            for i, append in zip(idx, appends, strict=True):
                append(row[i])
    return out


def read_series(root: Path, name: str) -> Series:
    cols = _read_columns(root / "data" / name, ("timestamp", "value"))
    return Series(
        name=name,
        timestamps=_unix_seconds(cols["timestamp"]),
        values=np.array(cols["value"], dtype=np.float64),
    )


def result_path(root: Path, detector: str, name: str) -> Path:
    category, file = name.split("/", 1)
    return root / "results" / detector / category / f"{detector}_{file}"


def read_result_scores(root: Path, detector: str, name: str) -> np.ndarray:
    cols = _read_columns(result_path(root, detector, name), ("anomaly_score",))
    return np.array(cols["anomaly_score"], dtype=np.float64)


def load_published(root: Path) -> dict[str, dict[str, float]]:
    return json.loads((root / "results/final_results.json").read_text())


def corpus_names(root: Path) -> list[str]:
    """Every labelled file, in the labels' order."""
    return list(json.loads((root / "labels/combined_windows.json").read_text()))


# -- layout and sweep ---------------------------------------------------------------------


def probation_rows(n: int) -> int:
    return int(min(np.floor(PROBATION_FRACTION * n), PROBATION_CAP))


def _first_index(timestamps: np.ndarray, t: int, name: str) -> int:
    hits = np.flatnonzero(timestamps == t)
    if hits.size == 0:
        # NAB's labels are snapped to row timestamps; a miss means the wrong file.
        raise ValueError(f"{name}: window limit {t} is not a row timestamp")
    return int(hits[0])


def layout(name: str, timestamps: np.ndarray, limits: Iterable[tuple[int, int]]) -> FileLayout:
    n = len(timestamps)
    window_of = np.full(n, -1, dtype=np.int32)
    # Before the first window a detection is "far from any window": the full FP weight.
    position = np.full(n, -1.0)
    windows: list[tuple[int, int]] = []
    for k, (t1, t2) in enumerate(limits):
        start = _first_index(timestamps, t1, name)
        end = _first_index(timestamps, t2, name)
        if end < start or (windows and start <= windows[-1][1]):
            raise ValueError(f"{name}: windows overlap or run backwards")
        width = end - start + 1
        rows = np.arange(start, end + 1)
        window_of[start : end + 1] = k
        position[start : end + 1] = scaled_sigmoid(-(end - rows + 1) / width)
        # Until the next window starts, distance is measured from this window's end.
        after = np.arange(end + 1, n)
        if width > 1:
            position[end + 1 :] = scaled_sigmoid((after - end) / (width - 1))
        else:
            position[end + 1 :] = -1.0
        windows.append((start, end))
    return FileLayout(
        name=name,
        rows=n,
        probation=probation_rows(n),
        windows=tuple(windows),
        window_of=window_of,
        position=position,
    )


def sweepable(layouts: Iterable[FileLayout], scores: Mapping[str, np.ndarray]) -> Sweepable:
    """Flatten the scorable rows of ``layouts`` with the detector's ``scores`` (per file)."""
    parts_s, parts_w, parts_p = [], [], []
    offset = 0
    n_windows = 0
    n_labelled = 0
    for lay in layouts:
        s = np.asarray(scores[lay.name], dtype=np.float64)
        if s.shape != (lay.rows,):
            raise ValueError(f"{lay.name}: {s.shape[0]} scores for {lay.rows} rows")
        keep = slice(lay.probation, None)
        w = lay.window_of[keep]
        present = np.unique(w[w >= 0])
        # Renumber corpus-wide so windows of different files never merge.
        remap = np.full(len(lay.windows) + 1, -1, dtype=np.int64)
        remap[present] = offset + np.arange(present.size)
        parts_s.append(s[keep])
        parts_w.append(remap[w])  # remap[-1] is the trailing -1
        parts_p.append(lay.position[keep])
        offset += present.size
        n_windows += present.size
        n_labelled += len(lay.windows)
    return Sweepable(
        scores=np.concatenate(parts_s) if parts_s else np.empty(0),
        window=np.concatenate(parts_w) if parts_w else np.empty(0, dtype=np.int64),
        position=np.concatenate(parts_p) if parts_p else np.empty(0),
        n_windows=n_windows,
        n_labelled=n_labelled,
    )


def sweep_scores(sw: Sweepable, cost: CostMatrix) -> np.ndarray:
    return np.where(sw.window >= 0, sw.position * (cost.tp / MAX_TP), sw.position * cost.fp)


def threshold_curve(sw: Sweepable, cost: CostMatrix) -> tuple[np.ndarray, np.ndarray]:
    """Raw score at every candidate threshold, thresholds descending; the first candidate is
    +inf (nothing detected, every window missed), as NAB's sweep starts above every score."""
    weighted = sweep_scores(sw, cost)
    order = np.argsort(-sw.scores, kind="stable")
    a = sw.scores[order]
    w = weighted[order]
    g = sw.window[order]

    # Lowering the threshold past a row adds its weight if it is a false positive...
    delta = np.where(g < 0, w, 0.0)
    # ...and, inside a window, lifts the window from -fn (or its best so far) to the best
    # sweep score detected in it so far.  A running maximum per window, computed for all
    # windows at once by lifting each window's values onto its own band of the number line.
    inside = np.flatnonzero(g >= 0)
    if inside.size:
        by_window = inside[np.argsort(g[inside], kind="stable")]
        gw = g[by_window]
        vals = w[by_window]
        band = float(vals.max() - vals.min()) + 1.0
        lifted = vals + gw * band
        best = np.maximum.accumulate(lifted) - gw * band
        starts = np.ones(gw.size, dtype=bool)
        starts[1:] = gw[1:] != gw[:-1]
        before = np.empty_like(best)
        before[1:] = best[:-1]
        before[starts] = -cost.fn  # a window with no detection yet counts as a miss
        delta[by_window] = best - before

    total = -cost.fn * sw.n_windows + np.cumsum(delta)
    # A threshold t detects every row with score >= t: read the total after the last row of
    # each run of equal scores.
    last = np.ones(a.size, dtype=bool)
    last[:-1] = a[1:] != a[:-1]
    thresholds = np.concatenate(([np.inf], a[last]))
    raws = np.concatenate(([-cost.fn * sw.n_windows], total[last]))
    return thresholds, raws


def score_at(sw: Sweepable, cost: CostMatrix, threshold: float) -> Outcome:
    """Raw score with detections = rows whose anomaly score is >= threshold."""
    weighted = sweep_scores(sw, cost)
    det = sw.scores >= threshold
    fp = det & (sw.window < 0)
    hit = det & (sw.window >= 0)
    best = np.full(max(sw.n_windows, 1), -cost.fn)[: sw.n_windows]
    np.maximum.at(best, sw.window[hit], weighted[hit])
    return Outcome(
        threshold=float(threshold),
        raw=float(weighted[fp].sum() + best.sum()),
        windows_detected=int(np.unique(sw.window[hit]).size),
        fp_rows=int(fp.sum()),
    )


def optimise(sw: Sweepable, cost: CostMatrix) -> Outcome:
    """NAB's optimiser: the threshold with the highest raw score; on a tie the highest
    threshold, as NAB's stable sort of the sweep keeps the first one it met."""
    thresholds, raws = threshold_curve(sw, cost)
    k = int(np.argmax(raws))
    return score_at(sw, cost, float(thresholds[k]))


def null_and_perfect(layouts: list[FileLayout], cost: CostMatrix) -> tuple[float, float]:
    """The anchors of normalisation on exactly these files: NAB's null detector (constant
    score, optimised like any other) and a detector that hits every labelled window on time."""
    null_scores = {lay.name: np.full(lay.rows, NULL_SCORE) for lay in layouts}
    sw = sweepable(layouts, null_scores)
    return optimise(sw, cost).raw, sw.n_labelled * cost.tp


def normalise(raw: float, null: float, perfect: float) -> float:
    return 100.0 * (raw - null) / (perfect - null)


def evaluate(
    layouts: list[FileLayout],
    scores: Mapping[str, np.ndarray],
    profiles: Mapping[str, CostMatrix],
    thresholds: Mapping[str, float] | None = None,
) -> dict[str, ProfileResult]:
    """Score one detector on ``layouts`` under every profile: at the given thresholds, or at
    the threshold NAB's optimiser picks on these same files."""
    sw = sweepable(layouts, scores)
    out: dict[str, ProfileResult] = {}
    for profile, cost in profiles.items():
        if thresholds is None:
            outcome = optimise(sw, cost)
        else:
            outcome = score_at(sw, cost, thresholds[profile])
        null, perfect = null_and_perfect(layouts, cost)
        out[profile] = ProfileResult(
            profile=profile,
            threshold=outcome.threshold,
            raw=outcome.raw,
            null=null,
            perfect=perfect,
            score=normalise(outcome.raw, null, perfect),
            windows_detected=outcome.windows_detected,
            windows=sw.n_windows,
            fp_rows=outcome.fp_rows,
        )
    return out


# -- convenience: a set of NAB files loaded once ------------------------------------------


@dataclass(frozen=True, slots=True)
class Benchmark:
    root: Path
    profiles: dict[str, CostMatrix]
    series: dict[str, Series]
    layouts: dict[str, FileLayout]

    def layouts_for(self, names: Iterable[str]) -> list[FileLayout]:
        return [self.layouts[n] for n in names]

    def detector_scores(self, detector: str, names: Iterable[str]) -> dict[str, np.ndarray]:
        return {n: read_result_scores(self.root, detector, n) for n in names}


def load_benchmark(root: Path, names: Iterable[str] | None = None) -> Benchmark:
    limits = load_window_limits(root)
    wanted = list(limits) if names is None else list(names)
    series = {n: read_series(root, n) for n in wanted}
    layouts = {n: layout(n, series[n].timestamps, limits[n]) for n in wanted}
    return Benchmark(root=root, profiles=load_profiles(root), series=series, layouts=layouts)
