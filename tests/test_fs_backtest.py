"""``capalarm backtest`` on an fs event log: write-event JSON lines that name fs surfaces (with
no ``kind``: the declared surface gives it) replay through the same pipeline onto those fs
surfaces, and a burst in one of them is an alert line at the time it happened."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import yaml

T0 = 1_780_000_000
TICK = 10


def write_log(path: Path) -> dict[str, int]:
    """An hour of a scratch volume written steadily and a pip cache written now and then,
    with a 20-second burst into the cache at minute 40."""
    rng = random.Random(12)
    sent = {"scratch": 0, "pip-cache": 0}
    with path.open("w") as fh:
        for second in range(3600):
            rows = [("scratch", rng.randint(200, 400))]
            if second % 300 == 0:  # now and then, never the same size (not a beacon)
                rows.append(("pip-cache", rng.randint(10_000, 30_000)))
            if 2400 <= second < 2420:
                rows.append(("pip-cache", 500_000))
            for surface, nbytes in rows:
                line = {"ts": T0 + second + 0.5, "surface": surface, "bytes": nbytes, "events": 1}
                fh.write(json.dumps(line) + "\n")
                sent[surface] += nbytes
    return sent


def test_an_fs_event_log_replays_onto_fs_surfaces_and_alerts_on_the_burst(
    tmp_path: Path,
) -> None:
    log = tmp_path / "fs-events.jsonl"
    sent = write_log(log)
    config = {
        "tick": f"{TICK}s",
        "surfaces": [
            {"name": "scratch", "kind": "fs", "match": {"path": ["/srv/scratch"]}},
            {
                "name": "pip-cache",
                "kind": "fs",
                "match": {"path": ["/var/cache/pip/**/*.body"]},
                # A rate that is a spike whatever was learned (the history is too short for
                # a calibrated threshold): the burst's 500 kB/s is, the cache's 2 kB/s not.
                "spike": {"absolute_bytes_per_second": 200_000, "resolve_hold": "30s"},
                "budget": {"allowance_bits_per_second": 1e9, "tolerance_bits": 1e12},
            },
        ],
    }
    path = tmp_path / "capalarm.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "alerts.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "alarm.cli", "backtest", "--config", str(path),
         "--workers", "1", "--output", str(out), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stderr.strip().splitlines()[-1])["backtest"]
    assert summary["surface_bytes"]["fs/scratch"] == sent["scratch"]
    assert summary["surface_bytes"]["fs/pip-cache"] == sent["pip-cache"]
    assert summary["surface_bytes"].get("fs/unclassified", 0) == 0
    assert summary["undeclared_surfaces"] == {} and summary["unknown_surface_events"] == 0
    assert summary["parse_errors"] == 0 and summary["records"] == 3600 + 12 + 20

    changes = [json.loads(line) for line in out.read_text().splitlines()]
    spikes = [c for c in changes if c["rule"] == "spike"]
    assert [(c["surface"], c["kind"], c["state"]) for c in spikes] == [
        ("pip-cache", "fs", "firing"),
        ("pip-cache", "fs", "resolved"),
    ], changes
    firing = spikes[0]
    assert T0 + 2400 <= firing["at"] <= T0 + 2400 + 2 * TICK, "at the burst, by event time"
    assert firing["figures"]["rate_bytes_per_second"] >= 500_000
    assert not [c for c in changes if c.get("surface") != "pip-cache"]
