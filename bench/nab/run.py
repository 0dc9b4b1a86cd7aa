#!/usr/bin/env python3
"""Figure: NAB.  Validates the scorer against NAB's published windowedGaussian scores (whole
corpus, three profiles), then scores ARTime, numenta (HTM), twitterADVec, randomCutForest,
windowedGaussian and capalarm on NAB's volume subset in one run.

    python bench/nab/run.py [--workers 2] [--repeat 3]
    python bench/nab/run.py --select     # re-pick capalarm's settings on corpus minus subset

Floor (issue 4): subset, standard profile, capalarm above windowedGaussian; gap to ARTime.
See docs/nab.md for the rules followed and every choice made.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    # Run as a script: make `bench.nab` importable from the repository root.
    sys.path.append(str(REPO))  # after site-packages: an installed capalarm is what runs

from bench.nab.capalarm_nab import (  # noqa: E402
    SeriesRun,
    SpikeSettings,
    run_many,
    scores_of,
)
from bench.nab.scorer import (  # noqa: E402
    PROFILES,
    VOLUME_SUBSET,
    Benchmark,
    ProfileResult,
    evaluate,
    load_benchmark,
    load_published,
)

NAB = REPO.parent / "shared/data/nab"
PEERS = ("ARTime", "numenta", "twitterADVec", "randomCutForest", "windowedGaussian")
SHORT = {"standard": "standard", "reward_low_FP_rate": "low FP", "reward_low_FN_rate": "low FN"}

# Picked by `--select`, leaving one file out (2026-12-01, capalarm code sha256 4778867053ff;
# docs/nab.md): each subset file is scored with the setting best on the other 57 labelled
# files.  13 of the 17 files get CHOSEN, four get the settings in CHOSEN_FOR.  (On the 41
# files outside the subset alone, the earlier protocol, the best is max_ratio 4, no escalation,
# drop 3, no weekday shift: subset 30.42.)  Re-run --select after a detector change.
CHOSEN = SpikeSettings(
    z=9.0,
    min_ratio=3.0,
    history=86400.0,
    min_history=6 * 3600.0,
    resolve_hold=6 * 3600.0,
    floor=1.0,
    max_ratio=8.0,
    seasonal_window=900.0,
    escalate_ratio=4.0,
    weekday_dip=1.0,
    drop_ratio=3.0,
    drop_hold=3600.0,
)
_WIDE = dataclasses.replace(CHOSEN, max_ratio=4.0, seasonal_window=7200.0)
# Earlier passes (same training files, partly on an earlier detector): resolve_hold 5 min
# scored 0 in all 20 settings tried (re-firing on every burst costs more than it finds);
# min_ratio 1.5 vs 3 and history 1 d vs 3 d moved the training score by under 1.5 points; z 12
# behaved like z 9; of z 6/9 x resolve_hold 2/6/24 h x floor 0-4 (max_ratio 8) the best was
# z 9, 6 h, floor 1 (train 24.36).  This grid adds max_ratio and seasonal_window around it.
GRID = {
    "z": (9.0,),
    "min_ratio": (3.0,),
    "history": (86400.0,),
    "resolve_hold": (6 * 3600.0,),
    "floor": (1.0,),
    "max_ratio": (4.0, 8.0),
    "seasonal_window": (900.0, 7200.0),
    "escalate_ratio": (0.0, 4.0),
    "drop_ratio": (0.0, 3.0),
    "weekday_dip": (1.0, 4.0),
}

# Leave one file out (select()): a subset file whose choice differs from CHOSEN is listed here.
CHOSEN_FOR: dict[str, SpikeSettings] = {
    "realAWSCloudwatch/ec2_disk_write_bytes_c0d644.csv": _WIDE,
    "realTweets/Twitter_volume_CRM.csv": _WIDE,
    "realTweets/Twitter_volume_CVS.csv": dataclasses.replace(CHOSEN, escalate_ratio=0.0),
    "realTweets/Twitter_volume_UPS.csv": dataclasses.replace(_WIDE, weekday_dip=4.0),
}


def chosen_for(name: str) -> SpikeSettings:
    return CHOSEN_FOR.get(name, CHOSEN)


T = TypeVar("T")

# The code whose behaviour the capalarm rows measure; its hash is printed with the figures,
# because the detector is still changing and a figure must say which version it is of.
MEASURED = ("alarm/detector", "alarm/config.py", "alarm/pipeline.py", "alarm/backtest.py")


def code_fingerprint() -> str:
    h = hashlib.sha256()
    for item in MEASURED:
        path = REPO / item
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
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


def row(name: str, results: dict[str, ProfileResult]) -> str:
    std = results["standard"]
    cells = "".join(f"{results[p].score:10.2f}" for p in PROFILES)
    thr = "none" if std.threshold == float("inf") else f"{std.threshold:.4g}"
    return (
        f"  {name:28s}{cells}   {std.windows_detected:3d}/{std.windows:<3d}{std.fp_rows:8d}   {thr}"
    )


def header() -> str:
    cols = "".join(f"{SHORT[p]:>10s}" for p in PROFILES)
    return f"  {'detector':28s}{cols}   hit/win  FP rows   threshold (standard)"


def capalarm_results(
    bench: Benchmark, names: list[str], runs: dict[str, SeriesRun]
) -> dict[str, dict[str, ProfileResult]]:
    lay = bench.layouts_for(names)
    return {
        "graded": evaluate(lay, scores_of(runs, graded=True), bench.profiles),
        "binary": evaluate(lay, scores_of(runs, graded=False), bench.profiles),
    }


def subset_table(bench: Benchmark, workers: int, repeat: int) -> None:
    names = list(VOLUME_SUBSET)
    lay = bench.layouts_for(names)
    windows = sum(len(x.windows) for x in lay)
    rows_total = sum(x.rows for x in lay)
    print()
    print(
        f"NAB volume subset: {len(names)} files, {rows_total} rows, {windows} windows; "
        "thresholds optimised per detector and profile on the subset; normalised with the "
        "null and perfect detectors on the subset"
    )
    table: dict[str, dict[str, ProfileResult]] = {}
    t0 = time.perf_counter()
    for det in PEERS:
        table[det] = evaluate(lay, bench.detector_scores(det, names), bench.profiles)
    peers_seconds = time.perf_counter() - t0

    def run_chosen() -> dict[str, SeriesRun]:
        runs: dict[str, SeriesRun] = {}
        for settings in dict.fromkeys(chosen_for(n) for n in names):
            group = [n for n in names if chosen_for(n) == settings]
            runs |= run_many((bench.series[n] for n in group), settings, workers)
        return runs

    runs, seconds = timed(run_chosen, repeat)
    cap = capalarm_results(bench, names, runs)
    table["capalarm (graded)"] = cap["graded"]
    table["capalarm (binary)"] = cap["binary"]

    print(header())
    for name, results in sorted(table.items(), key=lambda kv: -kv[1]["standard"].score):
        print(row(name, results))

    per_series = statistics.median(r.seconds for r in runs.values())
    merged = {n: r.merged_rows for n, r in runs.items() if r.merged_rows}
    print()
    for settings in dict.fromkeys(chosen_for(n) for n in names):
        files = [n.split("/")[-1] for n in names if chosen_for(n) == settings]
        print(f"capalarm settings for {len(files)} of {len(names)} files: {settings.label()}")
    print(f"capalarm code measured: sha256 {code_fingerprint()} of {', '.join(MEASURED)}")
    print(
        f"capalarm firings on the subset: {sum(r.firings for r in runs.values())}; "
        f"rows sharing a tick with another row (bytes summed): {merged or 'none'}"
    )
    print(
        f"timing: peers scored in {peers_seconds:.2f} s; capalarm backtests median "
        f"{seconds:.1f} s for the subset ({workers} workers, median of {max(1, repeat)}), "
        f"{per_series:.2f} s per series (median)"
    )
    cap_std = table["capalarm (graded)"]["standard"].score
    wg_std = table["windowedGaussian"]["standard"].score
    art_std = table["ARTime"]["standard"].score
    verdict = "MET" if cap_std > wg_std else "NOT MET"
    print(
        f"floor (standard, subset): capalarm {cap_std:.2f} vs windowedGaussian {wg_std:.2f}: "
        f"{verdict}; gap to ARTime {art_std - cap_std:.2f} points"
    )


def _standard(bench: Benchmark, names: list[str], scores: dict) -> float:
    lay = bench.layouts_for(names)
    profiles = {"standard": bench.profiles["standard"]}
    return evaluate(lay, {n: scores[n] for n in names}, profiles)["standard"].score


def select(bench: Benchmark, workers: int) -> None:
    """Grid over the spike settings, every setting on every labelled file (cached by setting and
    code hash in bench/out/nab-select/).  Two selections are printed:

    - leave one file out (the protocol the figures use): each subset file is scored with the
      setting that is best on the other 57 labelled files, 16 volume series among them; the
      file itself never takes part in its own choice;
    - the 41 files outside the subset (the earlier protocol, which sees no volume series).
    """
    subset = list(VOLUME_SUBSET)
    everything = list(bench.layouts)
    train = [n for n in everything if n not in set(subset)]
    keys = list(GRID)
    grid = [
        SpikeSettings(**dict(zip(keys, values, strict=True)), min_history=6 * 3600.0)
        for values in itertools.product(*GRID.values())
    ]
    cache = REPO / "bench/out/nab-select" / code_fingerprint()
    cache.mkdir(parents=True, exist_ok=True)
    print(f"selection grid: {len(grid)} settings, on all {len(everything)} labelled files")
    print(f"  capalarm code: sha256 {code_fingerprint()} of {', '.join(MEASURED)}")
    found = []
    for settings in grid:
        path = cache / (hashlib.sha256(repr(settings).encode()).hexdigest()[:16] + ".pkl")
        t0 = time.perf_counter()
        if path.exists():
            runs = pickle.loads(path.read_bytes())
        else:
            runs = run_many((bench.series[n] for n in everything), settings, workers)
            path.write_bytes(pickle.dumps(runs))
        scores = scores_of(runs, graded=True)
        tr, te = _standard(bench, train, scores), _standard(bench, subset, scores)
        found.append((settings, scores, tr, te))
        print(
            f"  41 others {tr:7.2f}  subset {te:7.2f}  "
            f"({time.perf_counter() - t0:.0f} s)  {settings.label()}",
            flush=True,
        )
    picked: dict[str, SpikeSettings] = {}
    combined = {}
    for f in subset:
        others = [n for n in everything if n != f]
        settings, scores, _, _ = max(found, key=lambda x: _standard(bench, others, x[1]))
        picked[f] = settings
        combined[f] = scores[f]
    print(f"leave one file out: subset {_standard(bench, subset, combined):.2f}")
    for settings in dict.fromkeys(picked.values()):
        files = [f.split("/")[-1] for f, s in picked.items() if s == settings]
        print(f"  {len(files)} files: {settings!r}")
        if len(files) < len(subset) / 2:
            print(f"    {', '.join(files)}")
    best41 = max(found, key=lambda x: x[2])
    oracle = max(found, key=lambda x: x[3])
    print(f"chosen on the 41 others: 41 others {best41[2]:.2f}, subset {best41[3]:.2f}")
    print(f"best on the subset (optimistic, not used): subset {oracle[3]:.2f}: {oracle[0]!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="processes for capalarm backtests")
    ap.add_argument("--repeat", type=int, default=1, help="timed repetitions (median reported)")
    ap.add_argument("--select", action="store_true", help="re-run the settings selection")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    bench = load_benchmark(NAB)
    print(f"loaded NAB corpus from {NAB} in {time.perf_counter() - t0:.2f} s")
    if args.select:
        select(bench, args.workers)
        return 0
    ok = validate(bench, args.repeat)
    subset_table(bench, args.workers, args.repeat)
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
