"""The beacon rule: writes of one size at a regular interval alarm, however small, while the
irregular writes of a sparse surface do not; restarts neither lose nor repeat the evidence."""

from __future__ import annotations

import numpy as np
import pytest

from alarm.config import BeaconRule, ConfigError, config_from_dict
from alarm.detector import fused
from alarm.detector.engine import Detector
from alarm.detector.rules.beacon import BeaconBank


def never(_row):
    return []


TICK = 60.0
T0 = 1_780_000_020.0  # a multiple of the tick
KEYS = [("registry", "board"), ("registry", "wiki")]


def sparse_writes(rng: np.random.Generator, ticks: int, per_hour: float = 3.0) -> np.ndarray:
    """A board's own writes: Poisson in time, lognormal in size (median 3 kB)."""
    count = rng.poisson(per_hour / 60.0, ticks)
    out = np.zeros(ticks)
    for i in np.flatnonzero(count):
        out[i] = np.round(rng.lognormal(np.log(3000), 0.8, count[i]).sum())
    return out


def beacon(ticks: int, every: int, size: float, start: int = 0, jitter: int = 0, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = np.zeros(ticks)
    t = start
    while t < ticks:
        out[t] += size
        t += every + (int(rng.integers(-jitter, jitter + 1)) if jitter else 0)
    return out


def first_evidence(bank: BeaconBank, writes: np.ndarray, start: int = 1000) -> int | None:
    for i, b in enumerate(writes):
        if bank.update(start + i, np.array([b]))[0]:
            return i
    return None


def test_a_beacon_among_a_boards_own_writes_is_seen_at_its_fifth_write():
    rng = np.random.default_rng(1)
    board = sparse_writes(rng, 2000)
    bank = BeaconBank([BeaconRule()], TICK)
    assert first_evidence(bank, board[:1000]) is None
    writes = board[1000:] + beacon(1000, 10, 1024.0, start=3)
    at = first_evidence(bank, writes, start=2000)
    # The 5th beacon is at tick 43; one of the five may share its tick with a board write.
    assert at is not None and 43 <= at <= 53
    assert bank.period[0] == 10 and bank.size[0] == 1024


@pytest.mark.parametrize("seed", range(8))
def test_a_beacon_on_a_surface_busy_between_its_beats_is_seen_by_its_tenth_beat(seed):
    # A board written ~4 times per 30-minute period: the ring has to keep the first beats
    # through every write in between.
    rng = np.random.default_rng(seed)
    board = sparse_writes(rng, 2000, per_hour=8.0)
    bank = BeaconBank([BeaconRule()], TICK)
    assert first_evidence(bank, board[:1000]) is None
    writes = board[1000:] + beacon(1000, 30, 1024.0, start=3)
    at = first_evidence(bank, writes, start=2000)
    assert at is not None and at <= 3 + 9 * 30
    assert bank.period[0] == 30 and bank.size[0] == 1024


def test_a_jittered_beacon_is_seen_and_a_padded_one_with_a_size_tolerance():
    bank = BeaconBank([BeaconRule(), BeaconRule(size_tolerance=0.1)], TICK)
    jittered = beacon(200, 30, 700.0, jitter=2, seed=3)
    rng = np.random.default_rng(2)
    padded = np.where(beacon(200, 30, 1.0) > 0, 1000.0 + rng.integers(0, 60, 200), 0.0)
    hits = np.zeros((200, 2), dtype=bool)
    for i in range(200):
        hits[i] = bank.update(i, np.array([jittered[i], padded[i]]))
    assert hits[:, 0].any(), "±2 ticks on a 30-tick period is within the 10% jitter"
    assert hits[:, 1].any(), "sizes within 6% match under a 10% size tolerance"
    strict = BeaconBank([BeaconRule()], TICK)
    assert first_evidence(strict, padded) is None, "exact sizes only by default"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_irregular_writes_are_not_a_beacon(seed):
    """Four weeks of a board's writes at 1-minute ticks; the quiet egress of a host too (one
    small write an hour, sizes varying): no evidence at all."""
    rng = np.random.default_rng(seed)
    ticks = 28 * 1440
    board = sparse_writes(rng, ticks, per_hour=4.0)
    quiet = np.round(rng.lognormal(np.log(150), 0.6, ticks)) * (rng.random(ticks) < 1 / 60)
    bank = BeaconBank([BeaconRule(), BeaconRule()], TICK)
    for i in range(ticks):
        assert not bank.update(i, np.array([board[i], quiet[i]])).any(), i


def test_a_steady_rate_is_left_to_the_budgets():
    """The same bytes every tick is a drip, not a beacon (period under two ticks)."""
    bank = BeaconBank([BeaconRule()], TICK)
    assert first_evidence(bank, np.full(100, 125.0)) is None


def detector(**beacon) -> Detector:
    surfaces = [
        {"name": name, "kind": "registry", "match": {"repository": [name]}}
        for i, (_, name) in enumerate(KEYS)
    ]
    surfaces[0]["budget"] = {
        "allowance_bits_per_second": 1e6,
        "tolerance_bits": 1e9,
        "beacon": {"max_period": "30m", "resolve_hold": "1h", **beacon},
    }
    surfaces[1]["budget"] = {
        "allowance_bits_per_second": 1e6,
        "tolerance_bits": 1e9,
        "beacon": {"enabled": False},
    }
    return Detector(config_from_dict({"tick": "60s", "surfaces": surfaces}), KEYS)


def run(d: Detector, board: np.ndarray, wiki: np.ndarray, start: int = 0) -> list:
    out = []
    for i in range(board.size):
        nbytes = np.array([board[i], wiki[i]])
        out += d.evaluate_arrays(T0 + (start + i + 1) * TICK, TICK, nbytes, nbytes > 0, never)
    return [c for c in out if c.rule == "beacon"]


def test_the_detector_fires_once_names_period_and_size_and_resolves():
    d = detector()
    signal = beacon(400, 10, 1024.0, start=5)
    signal[200:] = 0  # the last beacon is at tick 195
    changes = run(d, signal, signal)  # the wiki's beacon rule is off
    assert [(c.target, c.state) for c in changes] == [("board", "firing"), ("board", "resolved")]
    fired, resolved = changes
    assert fired.at == T0 + 46 * TICK  # the 5th write, at tick 45
    assert fired.figures["beacon_period_seconds"] == 600.0
    assert fired.figures["beacon_bytes"] == 1024.0
    assert "every 600 s" in fired.summary
    # Resolved after an hour (resolve_hold) without evidence, counted from the tick after
    # the last beacon's; the beacons in between are each new evidence, not a second page.
    assert resolved.at == T0 + (196 + 60) * TICK
    assert d.surfaces[("registry", "wiki")].beacon_alert is None
    assert d.surfaces[("registry", "board")].beacon_alert is not None


def test_a_restart_between_beacons_keeps_the_evidence():
    signal = beacon(120, 10, 1024.0, start=5)
    d = detector()
    assert run(d, signal[:30], signal[:30] * 0) == []  # three beacons seen
    restored = detector()
    restored.load_state(d.to_state())
    changes = run(restored, signal[30:], signal[30:] * 0, start=30)
    assert changes[0].state == "firing" and changes[0].at == T0 + 46 * TICK
    fresh = detector()
    assert run(fresh, signal[30:50], signal[30:50] * 0, start=30) == []


def test_config_rejects_a_resolve_hold_shorter_than_the_period():
    with pytest.raises(ConfigError) as err:
        config_from_dict(
            {
                "surfaces": [
                    {
                        "name": "board",
                        "kind": "registry",
                        "match": {"repository": ["board"]},
                        "budget": {
                            "allowance_bits_per_second": 1e6,
                            "tolerance_bits": 1e9,
                            "beacon": {"max_period": "2h", "resolve_hold": "1h"},
                        },
                    }
                ]
            }
        )
    text = "\n".join(err.value.problems)
    assert "surfaces[0].budget.beacon" in text and "resolve_hold" in text


def test_keepalives_and_other_small_periodic_packets_are_not_beacons():
    """A TCP keepalive every 75 s (66 B) and an NTP poll every 64 s (90 B) on a quiet host:
    periodic and of one size, but under min_bytes; the same at 300 B is a beacon."""
    ticks = 600
    bank = BeaconBank([BeaconRule(), BeaconRule()], 15.0)
    keepalive = beacon(ticks, 5, 66.0) + beacon(ticks, 4, 90.0, start=1)
    larger = beacon(ticks, 5, 300.0)
    hits = [bank.update(i, np.array([keepalive[i], larger[i]])) for i in range(ticks)]
    assert not any(h[0] for h in hits)
    assert any(h[1] for h in hits)


def test_a_constant_rate_stream_whose_tick_sums_alias_is_not_a_beacon():
    """600 B packets at 1.5 and 2.5 a tick: tick sums of 1, 2, 1, 2 (or 2, 3, 2, 3) packets,
    one size every two ticks, but the surface writes in every tick."""
    ticks = 400
    bank = BeaconBank([BeaconRule(), BeaconRule()], 1.0)
    t = np.arange(ticks)
    a = 600.0 * (np.floor((t + 1) * 1.5) - np.floor(t * 1.5))
    b = 600.0 * (np.floor((t + 1) * 2.5) - np.floor(t * 2.5))
    assert not any(bank.update(i, np.array([a[i], b[i]])).any() for i in range(ticks))


def run_with_fused(tmp_path, patch: str) -> list[str]:
    """``capalarm run`` on a small config after ``patch`` (Python, with ``fused`` imported)
    has changed the detector extension it finds; it must stop at start, with one line and no
    traceback.  Returns its ``capalarm:`` lines."""
    import subprocess
    import sys

    config = tmp_path / "capalarm.yaml"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\nsources: []\n"
        "surfaces: [{name: a, kind: fs}]\nhttp: {listen: '127.0.0.1:0'}\n"
    )
    script = (
        "import sys, types\n"
        "from alarm.detector import fused\n"
        f"{patch}\n"
        "from alarm import cli\n"
        "sys.exit(cli.main(['run', '--config', sys.argv[1]]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(config)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("capalarm:")]


def test_an_install_without_the_detector_extension_says_so_in_one_line(tmp_path):
    """The beacon rule's one definition is native (alarm/detector/_fused.c), and setup.py
    requires the extension; an install that lacks it anyway (a checkout never built) stops
    at start with one line naming what to do, not a traceback at the first tick."""
    assert run_with_fused(tmp_path, "fused.built = None") == [
        "capalarm: alarm.detector._fused is not built: reinstall capalarm where a C compiler "
        "is (pip install needs gcc and the Python headers)"
    ]


def test_an_extension_built_from_older_sources_says_so_in_one_line(tmp_path):
    """A checkout updated without reinstalling keeps a detector extension whose functions
    take other arguments (or lack ones the code calls): the service stops at start with one
    line saying to reinstall, not at the first tick (fused.API)."""
    stale = (
        "stale = types.ModuleType('alarm.detector._fused')\n"
        "stale.__dict__.update({k: v for k, v in vars(fused.built).items() if k != 'API'})\n"
        "fused.built = stale"
    )
    assert run_with_fused(tmp_path, stale) == [
        f"capalarm: alarm.detector._fused was built from other sources than this code (API 0, "
        f"this code needs {fused.API}): reinstall capalarm (pip install ., or pip install -e . "
        "in a checkout)"
    ]
