"""The suite runs from a clone in any directory: no test reads data from beside the repository
(a data folder next to the clone), and the recorded kernel records are in tests/data."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Ways a test could reach outside the repository: that data folder by name, or a path
# built by climbing above the repository root (tests/ is parents[0], the root parents[1]).
# The folder's name is joined here, so that this guard is not itself a mention of it.
SHARED = "sha" + "red"
OUTSIDE = re.compile(rf"{SHARED}/data|\.\./{SHARED}|parents\[[2-9]\]|\.parent\.parent\.parent")


def test_no_test_reads_beside_the_repository():
    offenders = [
        f"{path.relative_to(TESTS)}:{n}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert offenders == []


def test_recorded_kernel_fence_records_are_in_the_repository():
    data = TESTS / "data/kernel-fence"
    kmsg = (data / "kmsg-records.txt").read_text().splitlines()
    dmesg = (data / "dmesg-lines.txt").read_text().splitlines()
    assert len(kmsg) >= 8 and all(";EGRESS_FENCE" in line for line in kmsg)
    assert dmesg and all("EGRESS_FENCE" in line for line in dmesg)
    assert (data / "README.md").is_file()
