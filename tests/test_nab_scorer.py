"""NAB scorer (bench/nab/scorer.py): NAB's rules on small cases, and NAB's file formats read
and scored — a hand-scored corpus in NAB's layout, written by the test (the real corpus, with
the published windowedGaussian scores, is a bench input: bench/nab/run.py)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `bench` is not an installed package

from bench.nab import scorer  # noqa: E402
from bench.nab.capalarm_nab import REFERENCE_RATE, SpikeSettings, encode, run_series  # noqa: E402
from bench.nab.run import by_other_categories, halves  # noqa: E402
from bench.nab.scorer import (  # noqa: E402
    CostMatrix,
    Series,
    evaluate,
    layout,
    optimise,
    score_at,
    sweepable,
    threshold_curve,
)

STANDARD = CostMatrix(tp=1.0, fp=0.11, fn=1.0)


# -- the rules on small cases -------------------------------------------------------------


def test_scaled_sigmoid_matches_nabs_anchor_values():
    s = scorer.scaled_sigmoid(np.array([-1.0, -0.5, 0.0, 1.0, 3.0, 3.01]))
    assert s == pytest.approx(
        [0.98661, 0.84828, 0.0, -0.98661, 2 / (1 + np.exp(15)) - 1, -1.0], abs=1e-5
    )


def one_file(
    n: int = 1000, windows: tuple[tuple[int, int], ...] = ((600, 699),), name: str = "f.csv"
) -> scorer.FileLayout:
    ts = np.arange(n, dtype=np.int64) * 300
    return layout(name, ts, [(int(ts[a]), int(ts[b])) for a, b in windows])


def test_probation_is_15_percent_capped_at_750_rows():
    assert scorer.probation_rows(1000) == 150
    assert scorer.probation_rows(4032) == 604
    assert scorer.probation_rows(15902) == 750


def test_first_row_of_a_window_earns_tp_and_a_miss_costs_fn():
    lay = one_file()
    scores = np.zeros(lay.rows)
    assert score_at(sweepable([lay], {"f.csv": scores}), STANDARD, 0.5).raw == -1.0
    scores[600] = 1.0
    assert score_at(sweepable([lay], {"f.csv": scores}), STANDARD, 0.5).raw == pytest.approx(1.0)
    scores[650] = 1.0  # only the earliest detection in a window counts
    assert score_at(sweepable([lay], {"f.csv": scores}), STANDARD, 0.5).raw == pytest.approx(1.0)


def test_false_positives_cost_full_weight_before_a_window_and_less_right_after_it():
    lay = one_file()
    before = np.zeros(lay.rows)
    before[300] = 1.0
    after = np.zeros(lay.rows)
    after[701] = 1.0
    in_probation = np.zeros(lay.rows)
    in_probation[10] = 1.0
    sc = {
        name: score_at(sweepable([lay], {"f.csv": s}), STANDARD, 0.5).raw + 1.0
        for name, s in (("before", before), ("after", after), ("probation", in_probation))
    }
    assert sc["before"] == pytest.approx(-0.11)
    assert -0.11 < sc["after"] < 0  # 2 rows past a 100-row window: S(2/99) * 0.11
    assert sc["after"] == pytest.approx(0.11 * scorer.scaled_sigmoid(2 / 99))
    assert sc["probation"] == 0.0


def test_sweep_curve_equals_direct_scoring_at_every_threshold():
    rng = np.random.default_rng(4)
    lays = [one_file(800, ((300, 340), (500, 560)), "a"), one_file(1200, ((900, 1000),), "b")]
    scores = {x.name: np.round(rng.random(x.rows), 2) for x in lays}
    sw = sweepable(lays, scores)
    for cost in (STANDARD, CostMatrix(1.0, 0.22, 1.0), CostMatrix(1.0, 0.11, 2.0)):
        thresholds, raws = threshold_curve(sw, cost)
        for t, r in zip(thresholds, raws, strict=True):
            assert score_at(sw, cost, t).raw == pytest.approx(r, abs=1e-9)
        best = optimise(sw, cost)
        assert best.raw == pytest.approx(raws.max())


def test_null_scores_0_and_perfect_scores_100():
    lay = one_file(1000, ((300, 340), (600, 699)))
    perfect = np.zeros(lay.rows)
    perfect[[300, 600]] = 1.0
    profiles = {"standard": STANDARD, "reward_low_FN_rate": CostMatrix(1.0, 0.11, 2.0)}
    for scores, expected in ((np.full(lay.rows, 0.5), 0.0), (perfect, 100.0)):
        result = evaluate([lay], {"f.csv": scores}, profiles)
        assert all(r.score == pytest.approx(expected) for r in result.values())


def test_each_category_is_scored_at_the_threshold_chosen_on_the_others():
    # Alone, a would choose 0.9 (below it, only its false positive at 0.6); b's window
    # scores 0.6, so the corpus chooses 0.6.  Each chosen without it, a is scored at b's 0.6
    # (its window and its false positive), b at a's 0.9 (its window missed).
    a, b = one_file(1000, ((300, 340),), "a/1.csv"), one_file(1000, ((300, 340),), "b/1.csv")
    scores = {"a/1.csv": np.zeros(1000), "b/1.csv": np.zeros(1000)}
    scores["a/1.csv"][[300, 800]] = [0.9, 0.6]
    scores["b/1.csv"][300] = 0.6
    bench = scorer.Benchmark(Path("."), {"standard": STANDARD}, {}, {x.name: x for x in (a, b)})
    results, chosen = by_other_categories(bench, ["a/1.csv", "b/1.csv"], scores)
    assert chosen == {"a": 0.6, "b": 0.9}
    held_out = results["standard"]
    assert held_out.raw == pytest.approx((1.0 - 0.11) - 1.0)
    assert (held_out.windows_detected, held_out.fp_rows, held_out.windows) == (1, 1, 2)
    assert evaluate([a, b], scores, {"standard": STANDARD})["standard"].threshold == 0.6


def test_the_halves_split_every_category():
    names = [f"{c}/{i}.csv" for c in "ab" for i in range(5)]
    chose, other = halves(names)
    assert chose == ["a/0.csv", "a/2.csv", "a/4.csv", "b/0.csv", "b/2.csv", "b/4.csv"]
    assert sorted(chose + other) == sorted(names)


# -- NAB's files, read and scored ---------------------------------------------------------
# A corpus of three series in NAB's own layout and formats (data/<category>/<file>.csv,
# labels/combined_windows.json, config/profiles.json, results/<detector>/..., the detector's
# per-file score table and final_results.json), small enough to score by hand.  The full NAB
# corpus is a bench input (bench/nab/run.py), not a test input.

DETECTOR = "handDetector"
STEP = 300  # seconds between rows
START = np.datetime64("2014-07-01T00:00:00", "s")
# name -> (rows, labelled windows as (first row, last row), rows the detector flags with 1.0)
FILES: dict[str, tuple[int, tuple[tuple[int, int], ...], tuple[int, ...]]] = {
    "synthVolume/one_window.csv": (1000, ((600, 699),), (600,)),  # on time: +tp
    # a false positive before any window (-fp), one window on time (+tp), one missed (-fn)
    "synthVolume/two_windows.csv": (1000, ((300, 340), (600, 699)), (200, 600)),
    "synthFlat/no_anomaly.csv": (500, (), ()),  # nothing labelled, nothing flagged
}
PROFILE_COSTS = {
    "standard": (1.0, 1.0, 0.11),
    "reward_low_FP_rate": (1.0, 1.0, 0.22),
    "reward_low_FN_rate": (1.0, 2.0, 0.11),
}  # (tpWeight, fnWeight, fpWeight)


def hand_raw(profile: str) -> float:
    tp, fn, fp = PROFILE_COSTS[profile]
    return tp + (-fp + tp - fn)  # one_window + two_windows; no_anomaly scores 0


def hand_score(profile: str) -> float:
    """100 * (raw - null) / (perfect - null) for three windows: the null detector's best
    threshold detects nothing (-3 fn), a perfect one scores 3 tp."""
    tp, fn, _ = PROFILE_COSTS[profile]
    null, perfect = -3 * fn, 3 * tp
    return 100.0 * (hand_raw(profile) - null) / (perfect - null)


def _stamp(row: int, micro: bool = False) -> str:
    text = str(START + np.timedelta64(row * STEP, "s")).replace("T", " ")
    return text + ".000000" if micro else text


def write_nab_corpus(root: Path) -> Path:
    labels: dict[str, list[list[str]]] = {}
    per_file = []
    for name, (rows, windows, flagged) in FILES.items():
        category, file = name.split("/")
        values = [100 + (i % 7) for i in range(rows)]
        data = root / "data" / category / file
        data.parent.mkdir(parents=True, exist_ok=True)
        with open(data, "w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(["timestamp", "value"])
            w.writerows([_stamp(i), v] for i, v in enumerate(values))
        labels[name] = [[_stamp(a, micro=True), _stamp(b, micro=True)] for a, b in windows]
        in_window = {i for a, b in windows for i in range(a, b + 1)}
        res = root / "results" / DETECTOR / category / f"{DETECTOR}_{file}"
        res.parent.mkdir(parents=True, exist_ok=True)
        with open(res, "w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(
                ["timestamp", "value", "anomaly_score", "label"]
                + [f"S(t)_{p}" for p in ("reward_low_FP_rate", "reward_low_FN_rate", "standard")]
            )
            for i, v in enumerate(values):
                score = 1.0 if i in flagged else 0.0
                w.writerow([_stamp(i), v, score, int(i in in_window), 0.0, 0.0, 0.0])
        fp = sum(1 for i in flagged if i not in in_window)
        tp_rows = len(flagged) - fp
        score = {1: 1.0, 2: -0.11}.get(len(windows), 0.0)  # the standard profile, by hand
        per_file.append(
            [DETECTOR, "standard", name, 1.0, score, tp_rows, rows - len(in_window) - fp, fp,
             len(in_window) - tp_rows, rows]
        )  # fmt: skip
    (root / "labels").mkdir()
    (root / "labels/combined_windows.json").write_text(json.dumps(labels, indent=4))
    (root / "config").mkdir()
    (root / "config/profiles.json").write_text(
        json.dumps(
            {
                p: {"CostMatrix": {"tpWeight": tp, "fnWeight": fn, "fpWeight": fp, "tnWeight": 1.0}}
                for p, (tp, fn, fp) in PROFILE_COSTS.items()
            }
        )
    )
    (root / "results/final_results.json").write_text(
        json.dumps({DETECTOR: {p: hand_score(p) for p in PROFILE_COSTS}}, indent=4)
    )
    with open(root / f"results/{DETECTOR}/{DETECTOR}_standard_scores.csv", "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["Detector", "Profile", "File", "Threshold", "Score", "TP", "TN", "FP", "FN",
                    "Total_Count"])  # fmt: skip
        w.writerows(per_file)
        w.writerow(["Totals", "", "", "", hand_raw("standard"), 0, 0, 0, 0, 0])
    return root


@pytest.fixture
def nab_root(tmp_path: Path) -> Path:
    return write_nab_corpus(tmp_path / "nab")


@pytest.fixture
def corpus(nab_root: Path) -> scorer.Benchmark:
    return scorer.load_benchmark(nab_root)


def test_nab_files_load_with_windows_on_their_rows(nab_root, corpus):
    assert scorer.corpus_names(nab_root) == list(FILES)
    assert set(corpus.profiles) == set(scorer.PROFILES)
    assert corpus.profiles["reward_low_FP_rate"] == CostMatrix(tp=1.0, fp=0.22, fn=1.0)
    for name, (rows, windows, _) in FILES.items():
        assert corpus.series[name].timestamps.size == rows
        assert np.all(np.diff(corpus.series[name].timestamps) == STEP)
        assert corpus.layouts[name].windows == windows, name
        assert corpus.layouts[name].probation == scorer.probation_rows(rows)


def test_published_scores_are_reproduced_from_the_result_files(nab_root, corpus):
    names = list(corpus.layouts)
    scores = corpus.detector_scores(DETECTOR, names)
    ours = evaluate(corpus.layouts_for(names), scores, corpus.profiles)
    published = scorer.load_published(nab_root)[DETECTOR]
    assert set(ours) == set(scorer.PROFILES)
    for profile, result in ours.items():
        assert result.score == pytest.approx(published[profile], abs=1e-9), profile
        assert result.raw == pytest.approx(hand_raw(profile), abs=1e-9), profile
        assert result.threshold == 1.0  # 0.0 flags every row: far worse
        assert result.null == -3.0 * corpus.profiles[profile].fn
        assert (result.windows_detected, result.windows, result.fp_rows) == (2, 3, 1)


def test_per_file_scores_match_the_score_table(nab_root, corpus):
    path = nab_root / f"results/{DETECTOR}/{DETECTOR}_standard_scores.csv"
    with open(path, newline="") as fh:
        published = {r["File"]: r for r in csv.DictReader(fh) if r["Detector"] != "Totals"}
    assert set(published) == set(FILES)
    for name, r in published.items():
        sw = sweepable([corpus.layouts[name]], corpus.detector_scores(DETECTOR, [name]))
        got = score_at(sw, corpus.profiles["standard"], float(r["Threshold"]))
        assert got.raw == pytest.approx(float(r["Score"]), abs=1e-9), name
        assert got.fp_rows == int(r["FP"]), name


def test_a_label_off_every_row_timestamp_names_the_file(nab_root):
    labels = json.loads((nab_root / "labels/combined_windows.json").read_text())
    labels["synthVolume/one_window.csv"][0][0] = "2014-07-03 02:01:00.000000"
    (nab_root / "labels/combined_windows.json").write_text(json.dumps(labels))
    with pytest.raises(ValueError, match=r"one_window\.csv: window limit"):
        scorer.load_benchmark(nab_root)


def test_result_files_are_found_where_nab_puts_them(nab_root):
    assert scorer.result_path(nab_root, "numenta", "realTweets/Twitter_volume_AAPL.csv") == (
        nab_root / "results/numenta/realTweets/numenta_Twitter_volume_AAPL.csv"
    )
    assert scorer.result_path(nab_root, DETECTOR, "synthVolume/one_window.csv").is_file()
    # The volume subset: 17 distinct NAB names, each "<category>/<file>.csv".
    assert len(set(scorer.VOLUME_SUBSET)) == 17
    assert all(n.count("/") == 1 and n.endswith(".csv") for n in scorer.VOLUME_SUBSET)


# -- capalarm's alerts become row scores ---------------------------------------------------


def test_capalarm_spike_alert_lands_on_the_spiking_row():
    rng = np.random.default_rng(1)
    n = 2000
    ts = 1_400_000_000 + np.arange(n, dtype=np.int64) * 300
    values = rng.normal(100.0, 5.0, n).clip(min=0)
    values[1500] = 400.0
    run = run_series(Series("x.csv", ts, values), SpikeSettings())  # the defaults
    assert run.tick == 300.0
    assert np.flatnonzero(run.binary).tolist() == [1500]
    assert 0.0 < run.graded[1500] < 1.0


def test_capalarm_encoding_gives_the_probation_mean_a_fixed_rate():
    ts = np.arange(1000, dtype=np.int64) * 1800
    values = np.r_[np.full(150, 4.0), np.full(850, 40.0)]  # probation: the first 150 rows
    enc, nbytes = encode(Series("y.csv", ts, values))
    assert enc.tick == 1800.0 and enc.shift == 0.0
    assert nbytes[0] / enc.tick == pytest.approx(REFERENCE_RATE)
    assert nbytes[-1] == 10 * nbytes[0]  # ratios are the series' own
