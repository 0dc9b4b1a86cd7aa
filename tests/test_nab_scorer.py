"""NAB scorer (bench/nab/scorer.py): NAB's rules on small cases, and the proof that it follows
them — the published windowedGaussian scores reproduced from that detector's per-row scores."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
NAB = Path(__file__).resolve().parents[2] / "shared/data/nab"
sys.path.insert(0, str(REPO))  # `bench` is not an installed package

from bench.nab import scorer  # noqa: E402
from bench.nab.capalarm_nab import REFERENCE_RATE, SpikeSettings, encode, run_series  # noqa: E402
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
needs_nab = pytest.mark.skipif(not NAB.is_dir(), reason="needs ../shared/data/nab")


@pytest.fixture(scope="module")
def corpus() -> scorer.Benchmark:
    return scorer.load_benchmark(NAB)


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


# -- the published scores, reproduced ------------------------------------------------------


@needs_nab
def test_published_windowed_gaussian_scores_are_reproduced(corpus):
    names = list(corpus.layouts)
    assert len(names) == 58
    scores = corpus.detector_scores("windowedGaussian", names)
    ours = evaluate(corpus.layouts_for(names), scores, corpus.profiles)
    published = scorer.load_published(NAB)["windowedGaussian"]
    assert set(ours) == set(scorer.PROFILES)
    for profile, result in ours.items():
        assert abs(result.score - published[profile]) <= 0.5, (profile, result, published)
        # The bar is 0.5 points; the rules are followed exactly, so the match is numerical.
        assert result.score == pytest.approx(published[profile], abs=1e-6)
        assert result.threshold == 1.0  # NAB's thresholds.json: 1.0 for all three profiles
        assert result.null == -116.0 * corpus.profiles[profile].fn


@needs_nab
def test_per_file_scores_match_nabs_score_table(corpus):
    path = NAB / "results/windowedGaussian/windowedGaussian_standard_scores.csv"
    with open(path, newline="") as fh:
        published = {r["File"]: r for r in csv.DictReader(fh) if r["Detector"] != "Totals"}
    assert len(published) == 58
    for name, r in published.items():
        sw = sweepable([corpus.layouts[name]], corpus.detector_scores("windowedGaussian", [name]))
        got = score_at(sw, corpus.profiles["standard"], float(r["Threshold"]))
        assert got.raw == pytest.approx(float(r["Score"]), abs=1e-9), name
        assert got.fp_rows == int(r["FP"]), name


@needs_nab
def test_volume_subset_is_the_readmes_and_every_peer_has_results(corpus):
    assert len(scorer.VOLUME_SUBSET) == 17
    for det in ("ARTime", "numenta", "twitterADVec", "randomCutForest", "windowedGaussian"):
        for name in scorer.VOLUME_SUBSET:
            assert scorer.result_path(NAB, det, name).is_file(), (det, name)
    assert sum(len(corpus.layouts[n].windows) for n in scorer.VOLUME_SUBSET) == 49


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
