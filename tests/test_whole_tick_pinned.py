"""The native whole tick (alarm/detector/_whole_tick.c, _fused.c) on a seeded fleet, bit for
bit as it was before its loops were rewritten for speed: a rewrite of a loop may change how
it runs, never what it computes.

The fleet mixes derived and declared budgets (horizons of other windows, one horizon or
three), rows of many ages (some stop learning during the run, some off the tick grid), bursts,
drips, beacons and two aggregates (one of a run of rows, one not), over 2,000 ticks
(sixty-six closes of the ledger's windows and a day's roll).  Two digests:

- the budgets' state (BudgetBank's arrays): double arithmetic alone, the same wherever the
  extension builds (no FMA: setup.py's -ffp-contract=off);
- every array the native tick holds, the registered rules' state and the alert changes: these
  go through numpy's float32 exp and log, whose SIMD loops may round differently on another
  numpy or CPU, so that digest is checked where it was recorded (``WHERE``) and skipped
  elsewhere.

The digests were recorded with the code of 8974b90, before the rewrite.  A change that is
meant to change results records new ones, and says so.
"""

from __future__ import annotations

import hashlib
import platform

import numpy as np
import pytest

from alarm.config import config_from_dict
from alarm.detector.engine import Detector

TICK = 10.0
T0 = 1_780_000_000.0  # 20:26 UTC: the day rolls after 1,280 ticks
ROWS = 200
TICKS = 2_000
# The tick's judgement and figures the Python side reads (whole_tick.py's buffers); its
# scratch buffers are the code's own business.
FIGURES = (
    "col",
    "rate",
    "events_rate",
    "capacity",
    "residuals",
    "judged",
    "thresholds",
    "over",
    "breach",
    "clear",
    "settled",
    "size_level",
    "pred_y",
    "spread",
    "baseline",
    "level_threshold",
    "ready",
    "projected",
    "budget_ratio",
    "budget_breach",
    "learning",
    "swarm_breach",
    "tail_judged",
    "tail_breach",
    "swarm_tail_judged",
    "swarm_tail_breach",
)

BUDGETS = "bf6ce17d058c1cd08b2dbf2fed7c82167637fa560f82a0f59fc26b7be4b2abbc"
EVERYTHING = "67dcff2fceb05c052d94effc02432e56ca6e42c77900613f8b062138fc1190ce"
WHERE = "numpy 2.4.6 x86_64 AVX512F"


def _where() -> str:
    """What numpy's exp and log round by: its version and its widest SIMD on this CPU."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as cpu
    except ImportError:  # pragma: no cover - another numpy layout
        return f"numpy {np.__version__} {platform.machine()} unknown"
    widest = "AVX512F" if cpu.get("AVX512F") else "AVX2" if cpu.get("AVX2") else "other"
    return f"numpy {np.__version__} {platform.machine()} {widest}"


def _kind(i: int) -> str:
    """The last ten rows are fs surfaces: that aggregate's members are a run of rows, the
    egress one's are not (the unclassified row comes after the fs rows)."""
    return "fs" if i >= ROWS - 10 else "egress"


def _surface(i: int) -> dict:
    s: dict = {
        "name": f"s{i}",
        "match": {"dport": [i + 1]},
        "spike": {"min_history": "10m", "min_peaks": 6},
    }
    if _kind(i) == "fs":
        s["kind"] = "fs"
        s["match"] = {"path": [f"/srv/s{i}"]}
    if i % 5 == 1:  # declared: a window of its own (tolerance / allowance), up to three
        horizons = [
            {"horizon": "2h", "allowance_bits_per_second": 500.0, "tolerance_bits": 5e6},
            {
                "horizon": f"odd{i}",
                "allowance_bits_per_second": 100.0,
                "tolerance_bits": 130.0 * (i + 7),
            },
        ]
        s["budget"] = {
            "allowance_bits_per_second": 2000.0 + i,
            "tolerance_bits": 1e6,
            "horizons": horizons[: i % 3],
        }
    if i % 17 == 4:  # the beacon rule's inexact sizes
        s.setdefault("budget", {"allowance_bits_per_second": 8000.0, "tolerance_bits": 4e6})
        s["budget"]["beacon"] = {"size_tolerance": 0.05, "repeats": 4}
    return s


def _run() -> tuple[str, str]:
    rng = np.random.default_rng(11)
    config = config_from_dict(
        {"tick": f"{TICK:g}s", "surfaces": [_surface(i) for i in range(ROWS)]}
    )
    keys = [(_kind(i), f"s{i}") for i in range(ROWS)] + [("egress", "unclassified")]
    det = Detector(config, keys)
    # Rows of many ages, as a restore leaves them: most stop learning (a day) during the run,
    # a few are off the tick grid.
    age = det.budget.age
    age[:] = rng.integers(7_500, 9_000, age.size) * TICK * (rng.random(age.size) < 0.7)
    age[::13] += 3.7
    rows = np.arange(len(keys))
    level = rng.lognormal(6, 1.5, len(keys))
    silent = rng.random(len(keys)) < 0.3
    changes = hashlib.sha256()
    for t in range(TICKS):
        nbytes = np.round(level * TICK * np.exp(0.3 * rng.standard_t(5, level.size)))
        nbytes[silent] = 0.0
        if t % 97 == 50:  # bursts: spikes and budget pages
            hit = rng.random(level.size) < 0.05
            nbytes[hit] *= rng.uniform(5, 500, hit.sum())
        if t % 400 == 200:  # a drip on quiet rows
            nbytes[silent & (rng.random(level.size) < 0.2)] = 3000.0
        beat = (rows % 11 == 3) & (t % (6 + rows % 5) == 0)
        nbytes[beat] = 1000.0 + (rows[beat] % 3) * (t % 2)  # beacons, some of two sizes
        now = T0 + (t + 1) * TICK
        for c in det.evaluate_arrays(now, TICK, nbytes, np.ceil(nbytes / 800), lambda _k: []):
            figures = sorted(c.figures.items())
            changes.update(repr((c.target, c.rule, c.state, c.previous, c.at, figures)).encode())
    budgets = hashlib.sha256()
    for name, array in sorted(det.budget.tick_arrays().items()):
        budgets.update(name.encode() + np.ascontiguousarray(array).tobytes())
    everything = hashlib.sha256(changes.digest())
    for name, array in sorted(det._whole._held.items()):
        if "." in name or name in FIGURES:  # the detector's state, and the figures
            everything.update(name.encode() + np.ascontiguousarray(array).tobytes())
    for name, rule in sorted(det.rules.items()):
        for attr in rule.STATE:
            value = getattr(rule, attr, None)
            if isinstance(value, np.ndarray):
                everything.update(f"{name}.{attr}".encode() + value.tobytes())
    return budgets.hexdigest(), everything.hexdigest()


def test_the_native_tick_computes_what_it_did_before_its_rewrite():
    budgets, everything = _run()
    assert budgets == BUDGETS
    if _where() != WHERE:
        pytest.skip(f"the rest was recorded on {WHERE}, this is {_where()}")
    assert everything == EVERYTHING
