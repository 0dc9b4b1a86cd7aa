#!/usr/bin/env python3
"""Figure: NAB, the protocol of NAB's scoreboard.  Validates the scorer against NAB's
published windowedGaussian scores (whole corpus, three profiles), then scores capalarm on the
whole corpus (58 files), one setting for every file, its threshold optimised by NAB's rules,
beside the published whole-corpus scores of ARTime, numenta (HTM), twitterADVec,
randomCutForest and windowedGaussian.  A second table scores every detector with this scorer
on the files whose peer result files are in ../shared.

    python bench/nab/run.py [--workers 2] [--repeat 1] [--sensitivity]

capalarm runs with its default settings (alarm/config.py, chosen on the held-out bench's
fleets, never on NAB).  ``--sensitivity`` adds rows for other false-alarm settings: chosen
while looking at NAB's scores, they are labelled so and are never the headline.
For the onset reading it also prints the score at the rule's own paging threshold (a
statistic past its calibrated threshold scores above 1/2), with each category at the threshold
NAB's optimiser picks on the other categories, and on the two halves of the files, one of
which chose the reading's form (docs/nab.md).
Floor (issue 11, issue 26): standard profile, above windowedGaussian's 39.65.  See docs/nab.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    # Run as a script: make `bench.nab` importable from the repository root (after
    # site-packages: an installed capalarm is what runs).
    sys.path.append(str(REPO))

from bench.nab.capalarm_nab import (  # noqa: E402
    SeriesRun,
    SpikeSettings,
    run_many,
    scores_of,
)
from bench.nab.scorer import (  # noqa: E402
    PROFILES,
    Benchmark,
    ProfileResult,
    evaluate,
    load_benchmark,
    load_published,
    normalise,
    null_and_perfect,
    optimise,
    result_path,
    score_at,
    sweepable,
)

NAB = REPO.parent / "shared/data/nab"
PEERS = ("ARTime", "numenta", "twitterADVec", "randomCutForest", "windowedGaussian")
SHORT = {"standard": "standard", "reward_low_FP_rate": "low FP", "reward_low_FN_rate": "low FN"}
DEFAULTS = SpikeSettings()
# Looked at with NAB's scores in view: reported apart, never the headline.
SENSITIVITY = (1.0, 10.0, 100.0)
# The onset reading is above 1/2 exactly where a statistic is past the calibrated threshold
# the spike rule pages at (SpikeModel.onset_score): the least score that pages.
PAGING_THRESHOLD = float(np.nextafter(0.5, 1.0))


T = TypeVar("T")

# The code whose behaviour the capalarm rows measure; its hash is printed with the figures,
# because the detector is still changing and a figure must say which version it is of.
MEASURED = ("alarm/detector", "alarm/config.py", "alarm/pipeline.py", "alarm/backtest.py")


def code_fingerprint() -> str:
    h = hashlib.sha256()
    for item in MEASURED:
        path = REPO / item
        # The native passes are behaviour too (their sources, not the built library).
        files = path.rglob("*") if path.is_dir() else [path]
        for f in sorted(f for f in files if f.suffix in (".py", ".c", ".h")):
            h.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def timed(fn: Callable[[], T], repeat: int) -> tuple[T, float]:
    """fn's result and the median of its wall times over ``repeat`` runs."""
    times = []
    result: T
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return result, statistics.median(times)


def validate(bench: Benchmark, repeat: int) -> bool:
    names = list(bench.layouts)
    scores = bench.detector_scores("windowedGaussian", names)
    published = load_published(bench.root)["windowedGaussian"]
    ours, seconds = timed(
        lambda: evaluate(bench.layouts_for(names), scores, bench.profiles), repeat
    )
    ok = True
    print(f"Validation: windowedGaussian, whole corpus ({len(names)} files, all 3 profiles)")
    for p in PROFILES:
        r = ours[p]
        diff = r.score - published[p]
        ok &= abs(diff) <= 0.5
        print(
            f"  {p:20s} ours {r.score:7.3f}   published {published[p]:7.3f}   "
            f"diff {diff:+.2e}   threshold {r.threshold:g}   raw {r.raw:.4f}"
        )
    print(f"  within 0.5 points: {'yes' if ok else 'NO'}; scoring median {seconds:.3f} s")
    return ok


def row(name: str, results: dict[str, ProfileResult], thr: str | None = None) -> str:
    """A table row; ``thr`` in place of the standard profile's threshold."""
    std = results["standard"]
    cells = "".join(f"{results[p].score:10.2f}" for p in PROFILES)
    if thr is None:
        thr = "none" if std.threshold == float("inf") else f"{std.threshold:.4g}"
    return (
        f"  {name:28s}{cells}   {std.windows_detected:3d}/{std.windows:<3d}{std.fp_rows:8d}   {thr}"
    )


def header() -> str:
    cols = "".join(f"{SHORT[p]:>10s}" for p in PROFILES)
    return f"  {'detector':28s}{cols}   hit/win  FP rows   threshold (standard)"


def published_row(name: str, published: dict[str, float]) -> str:
    cells = "".join(f"{published[p]:10.2f}" for p in PROFILES)
    return f"  {name:28s}{cells}   (NAB's published scoreboard)"


def peer_names(bench: Benchmark) -> list[str]:
    """The files for which every peer's result file is present in ../shared."""
    return [n for n in bench.layouts if all(result_path(bench.root, d, n).is_file() for d in PEERS)]


def corpus_table(bench: Benchmark, workers: int, repeat: int, sensitivity: bool) -> None:
    names = list(bench.layouts)
    lay = bench.layouts_for(names)
    windows = sum(len(x.windows) for x in lay)
    rows_total = sum(x.rows for x in lay)
    print()
    print(
        f"NAB whole corpus: {len(names)} files, {rows_total} rows, {windows} windows; one "
        "setting for every file; thresholds optimised per detector and profile on the corpus"
    )

    def run(settings: SpikeSettings) -> dict[str, SeriesRun]:
        return run_many((bench.series[n] for n in names), settings, workers)

    runs, seconds = timed(lambda: run(DEFAULTS), repeat)
    ours: dict[str, dict[str, dict[str, np.ndarray]]] = {
        "capalarm (defaults, binary)": scores_of(runs, "binary"),
        "capalarm (defaults, graded)": scores_of(runs, "graded"),
        "capalarm (defaults, onset)": scores_of(runs, "onset"),
    }
    if sensitivity:
        for fa in SENSITIVITY:
            other = dataclasses.replace(DEFAULTS, false_alarms_per_week=fa)
            ours[f"capalarm fa/week {fa:g} (seen NAB)"] = scores_of(run(other), "graded")
    table = {name: evaluate(lay, scores, bench.profiles) for name, scores in ours.items()}
    published = load_published(bench.root)
    lines = [(r["standard"].score, row(name, r)) for name, r in table.items()]
    lines += [(published[d]["standard"], published_row(d, published[d])) for d in PEERS]
    print(header())
    for _, line in sorted(lines, key=lambda x: -x[0]):
        print(line)
    print()
    print(f"capalarm settings (every file): {DEFAULTS.label()}")
    print(f"capalarm code measured: sha256 {code_fingerprint()} of {', '.join(MEASURED)}")
    print(
        f"capalarm firings on the corpus: {sum(r.firings for r in runs.values())}; "
        f"backtests {seconds:.1f} s ({workers} workers, median of {max(1, repeat)}), "
        f"{statistics.median(r.seconds for r in runs.values()):.2f} s per series (median)"
    )
    defaults = [name for name in ours if name.startswith("capalarm (defaults")]
    cap = max(table[name]["standard"].score for name in defaults)
    wg = published["windowedGaussian"]["standard"]
    htm = published["numenta"]["standard"]
    print(
        f"floor (standard, whole corpus, defaults): capalarm {cap:.2f} vs windowedGaussian "
        f"{wg:.2f}: {'MET' if cap > wg else 'NOT MET'}; HTM (numenta) {htm:.2f}"
    )

    onset_readings(bench, names, ours["capalarm (defaults, onset)"])

    # The peers' own result files in ../shared cover only some files: there, every
    # detector goes through the same scorer, thresholds optimised on that subset.
    subset = peer_names(bench)
    sub_lay = bench.layouts_for(subset)
    print()
    print(
        f"NAB subset with every peer's result file: {len(subset)} files, "
        f"{sum(len(x.windows) for x in sub_lay)} windows; all rows from this scorer"
    )
    sub = {d: evaluate(sub_lay, bench.detector_scores(d, subset), bench.profiles) for d in PEERS}
    for name in defaults:
        scores = {n: ours[name][n] for n in subset}
        sub[name] = evaluate(sub_lay, scores, bench.profiles)
    print(header())
    for name, results in sorted(sub.items(), key=lambda kv: -kv[1]["standard"].score):
        print(row(name, results))


def category(name: str) -> str:
    """A file's NAB category, e.g. realTweets."""
    return name.split("/")[0]


def halves(names: list[str]) -> tuple[list[str], list[str]]:
    """The files that chose the onset reading's form (in each category, sorted by name, the
    1st, 3rd, 5th...) and the others, on which it was first scored (docs/nab.md)."""
    chose: list[str] = []
    other: list[str] = []
    for c in sorted({category(n) for n in names}):
        files = sorted(n for n in names if category(n) == c)
        chose += files[0::2]
        other += files[1::2]
    return chose, other


def by_other_categories(
    bench: Benchmark, names: list[str], scores: dict[str, np.ndarray]
) -> tuple[dict[str, ProfileResult], dict[str, float]]:
    """Each category scored at the threshold NAB's optimiser picks on the other categories'
    files (per profile), raw scores summed over the categories and normalised on the whole
    corpus as NAB normalises; and the standard profile's threshold for each category."""
    everything = bench.layouts_for(names)
    n_windows = sweepable(everything, scores).n_windows
    results: dict[str, ProfileResult] = {}
    chosen: dict[str, float] = {}
    for profile, cost in bench.profiles.items():
        raw, hit, fp = 0.0, 0, 0
        for c in sorted({category(n) for n in names}):
            mine = bench.layouts_for(n for n in names if category(n) == c)
            others = bench.layouts_for(n for n in names if category(n) != c)
            threshold = optimise(sweepable(others, scores), cost).threshold
            outcome = score_at(sweepable(mine, scores), cost, threshold)
            raw, hit, fp = raw + outcome.raw, hit + outcome.windows_detected, fp + outcome.fp_rows
            if profile == "standard":
                chosen[c] = threshold
        null, perfect = null_and_perfect(everything, cost)
        score = normalise(raw, null, perfect)
        results[profile] = ProfileResult(
            profile, math.nan, raw, null, perfect, score, hit, n_windows, fp
        )
    return results, chosen


def onset_readings(bench: Benchmark, names: list[str], scores: dict[str, np.ndarray]) -> None:
    """The onset reading at other operating points than the corpus-optimised threshold."""
    lay = bench.layouts_for(names)
    print()
    print("capalarm (defaults, onset) at other operating points:")
    print(header())
    print(row("NAB's optimiser, corpus", evaluate(lay, scores, bench.profiles)))
    paging = dict.fromkeys(bench.profiles, PAGING_THRESHOLD)
    at_paging = evaluate(lay, scores, bench.profiles, paging)
    print(row("the rule's paging threshold", at_paging, "> 1/2"))
    held_out, chosen = by_other_categories(bench, names, scores)
    print(row("chosen on other categories", held_out, "per category, below"))
    print(
        "    standard's threshold for each category, chosen on the others: "
        + ", ".join(f"{c} {t:.4g}" for c, t in chosen.items())
    )
    chose, other = halves(names)
    for label, part in (("chose the form", chose), ("the other half", other)):
        result = evaluate(bench.layouts_for(part), scores, bench.profiles)
        print(row(f"{label} ({len(part)} files)", result))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="processes for capalarm backtests")
    ap.add_argument("--repeat", type=int, default=1, help="timed repetitions (median reported)")
    ap.add_argument("--sensitivity", action="store_true", help="rows for other settings")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    bench = load_benchmark(NAB)
    print(f"loaded NAB corpus from {NAB} in {time.perf_counter() - t0:.2f} s")
    ok = validate(bench, args.repeat)
    corpus_table(bench, args.workers, args.repeat, args.sensitivity)
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
