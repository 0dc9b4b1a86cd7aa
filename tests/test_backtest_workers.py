"""The backtest's workers read range after range of a log without mapping fresh memory for
each: a worker keeps what a range's buffer used for the next range (glibc mapped and unmapped
every 8 MB buffer, ~2,000 page faults a range, as much CPU as scanning the range)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from alarm import backtest

READS = """
import json, resource, sys
from alarm import backtest
kept = backtest.keep_freed_memory() if sys.argv[2] == "keep" else None
path, size = sys.argv[1], backtest.SPLIT_BYTES
faults = []
for i in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    data = backtest.read_range(path, i * size, (i + 1) * size)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert data.endswith(b"\\n") and len(data) >= size - 200
    del data
print(json.dumps({"kept": kept, "faults": faults}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's (mallopt)")
def test_a_worker_reuses_its_read_memory_from_range_to_range(tmp_path: Path) -> None:
    line = b"Nov 30 19:07:05 node-7 kernel: EGRESS_FENCE OUT=eth0 DST=10.0.0.1 LEN=60\n"
    path = tmp_path / "kern.log"
    path.write_bytes(line * (4 * backtest.SPLIT_BYTES // len(line) + 10))
    pages = backtest.SPLIT_BYTES // 4096

    def reads(mode: str) -> dict:
        res = subprocess.run(
            [sys.executable, "-c", READS, str(path), mode],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return json.loads(res.stdout)

    fresh = reads("default")
    kept = reads("keep")
    assert kept["kept"] is True
    # Without the setting every range maps its buffer afresh; with it, only the first does.
    assert min(fresh["faults"][1:]) > pages // 2
    assert max(kept["faults"][1:]) < pages // 10
