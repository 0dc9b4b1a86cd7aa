"""The surfaces' byte and event totals: a batch adds to the rows it wrote, the same sums
whichever way they are taken (over every row for a batch as large as the table, over the
rows that wrote otherwise)."""

from __future__ import annotations

import numpy as np
import pytest

from alarm.surfaces import SurfaceTable


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_adds_the_same_totals_as_a_sum_over_every_row(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    table = SurfaceTable([("egress", f"s{i}") for i in range(n)], ["egress"], 10)
    rows_n = len(table)
    want_b = np.zeros(rows_n, dtype=np.int64)
    want_e = np.zeros(rows_n, dtype=np.int64)
    for _ in range(5):
        size = int(rng.choice([0, 1, 7, rows_n // 9 + 1, rows_n * 2]))
        rows = rng.integers(0, rows_n, size)
        nbytes = rng.integers(0, 1 << 40, size).astype(np.float64)
        events = rng.integers(1, 50, size).astype(np.float64)
        table.count(rows, nbytes, events)
        want_b += np.bincount(rows, weights=nbytes, minlength=rows_n).astype(np.int64)
        want_e += np.bincount(rows, weights=events, minlength=rows_n).astype(np.int64)
        assert table.bytes_total.tolist() == want_b.tolist()
        assert table.events_total.tolist() == want_e.tolist()
