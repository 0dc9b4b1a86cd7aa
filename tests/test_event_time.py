"""Event time: every event counts in the tick its own timestamp falls in, however late it is
read.  A kern.log holding hours of backlog, read at start, is evaluated tick by tick — the same
ticks and alerts `capalarm backtest` gives on the same file — and a steady writer under its
budget never alarms."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

from alarm.backtest import run_backtest
from alarm.collectors.kernel.synthetic import fence_line
from alarm.config import config_from_dict
from alarm.events import NAMED, Batch, Event, SourceHealth, WriteEvents
from alarm.eventtime import EventClock
from alarm.pipeline import Pipeline
from tests.servicekit import running_service, surface_totals, wait_for

PREFIX = "EGRESS_FENCE tevt"
TICK = 10.0


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(ts))


def write_backlog(path: Path, start: float, seconds: int, spike: tuple[int, int]) -> int:
    """One 1000-byte record a second (8 kbit/s) from ``start``; 20 a second in ``spike``."""
    total = 0
    with open(path, "w") as fh:
        for s in range(seconds):
            n = 20 if spike[0] <= s < spike[1] else 1
            for k in range(n):
                line = fence_line(PREFIX, "10.20.1.5", 443, "TCP", 1000, 40000 + k)
                fh.write(f"{rfc3339(start + s)} host kernel: {line}\n")
                total += 1000
    return total


def config_dict(tmp_path: Path, log: Path) -> dict:
    return {
        "tick": f"{TICK:g}s",
        "state_dir": str(tmp_path / "state"),
        "sources": [
            {"name": "kern", "type": "file", "paths": [str(log)], "prefixes": [PREFIX]},
        ],
        "surfaces": [
            {
                "name": "proxy",
                "match": {"dst": ["10.20.0.0/16"]},
                "spike": {"absolute_bytes_per_second": 15_000, "resolve_hold": "30s"},
                # 16 kbit/s: twice the writer's 8 kbit/s, so only the burst may alarm.
                "budget": {
                    "allowance_bits_per_second": 16000,
                    "tolerance_bits": 4e6,
                    "horizons": [
                        {"horizon": "1h", "allowance_bits_per_second": 12000, "tolerance_bits": 2e7}
                    ],
                },
            }
        ],
        "unclassified_spike": {"enabled": False},
        "event_time": {"grace": "0.2s", "lateness": "5s"},
    }


def comparable(change: dict) -> dict:
    """An alert change without what depends on how the input was cut into batches (the
    contributors of the alert window)."""
    return {k: v for k, v in change.items() if k != "contributors"}


async def test_a_backlog_is_evaluated_tick_by_tick_as_the_backtest_does(tmp_path):
    log = tmp_path / "kern.log"
    # Two hours ending two minutes ago, on a tick boundary: the minute after the last record
    # is evaluated at once rather than waited for.
    start = (time.time() // TICK - 732) * TICK
    total = write_backlog(log, start, 7200 - 30, spike=(3600, 3900))
    cfg = config_dict(tmp_path, log)

    out = io.StringIO()
    run_backtest(config_from_dict(cfg), [str(log)], out, workers=2)
    expected = [comparable(json.loads(line)) for line in out.getvalue().splitlines()]
    proxy = [(c["rule"], c["state"]) for c in expected if c.get("surface") == "proxy"]
    assert proxy[0] == ("spike", "firing") and ("spike", "resolved") in proxy

    got: list[dict] = []
    async with running_service(cfg, on_change=lambda c: got.append(c.to_dict())) as service:
        last_event_tick_end = (start + 7200 - 30) // TICK * TICK + TICK
        await wait_for(
            lambda: service.pipeline.last_tick_end >= last_event_tick_end + 60, timeout=60
        )
        assert surface_totals(service, "proxy")[0] == total
    seen = [comparable(c) for c in got if c["at"] <= expected[-1]["at"]]
    assert seen == expected
    # On the records' own clock: the burst fired when it happened, an hour before the end,
    # at its own rate (20 kB/s), not the backlog's in one tick.
    first = next(c for c in seen if c.get("surface") == "proxy")
    assert start + 3600 <= first["at"] <= start + 3600 + 2 * TICK
    assert first["figures"]["rate_bytes_per_second"] == 20_000


async def test_a_steady_writer_under_its_budget_never_alarms_after_an_outage(tmp_path):
    log = tmp_path / "kern.log"
    start = (time.time() // TICK - 360) * TICK
    write_backlog(log, start, 3600 - 20, spike=(0, 0))
    got: list[dict] = []
    async with running_service(
        config_dict(tmp_path, log), on_change=lambda c: got.append(c.to_dict())
    ) as service:
        await wait_for(lambda: service.pipeline.last_tick_end >= time.time() - 30, timeout=60)
        rates = service.pipeline.detector.surfaces[("egress", "proxy")].figures
        assert rates.rate <= 1000.0
    assert [c for c in got if c.get("surface") == "proxy"] == []


def named(ts: float, surface: str, nbytes: int) -> Batch:
    ev = WriteEvents.of(NAMED, [Event(ts, (None, surface), nbytes, "x")])
    return Batch(ev, watermark=ts)


def test_late_and_future_events_are_counted_and_never_rewrite_an_evaluated_tick():
    config = config_from_dict({"tick": "10s", "surfaces": [{"name": "a", "kind": "fs"}]})
    p = Pipeline(config, {"w": ("external", "fs")})
    now = 1_780_000_000.0
    p.apply("w", named(now - 25, "a", 100), now)
    p.close_until(now - 10, now)  # evaluates the ticks up to now - 10
    evaluated = p.ticks
    p.apply("w", named(now - 25, "a", 50), now)  # its tick is gone: counted late
    p.apply("w", named(now + 3600, "a", 7), now)  # an hour ahead: counted now
    src = p.sources["w"]
    assert (src.counters["late_events"], src.counters["future_events"]) == (1, 1)
    p.close_until(now + 20, now + 20)
    assert p.ticks == evaluated + 3
    row = p.table.index[("fs", "a")]
    assert int(p.table.bytes_total[row]) == 157


def test_a_source_that_is_behind_holds_ticks_open_until_lateness_runs_out():
    config = config_from_dict(
        {"tick": "10s", "sources": [], "event_time": {"lateness": "30s", "grace": "1s"}}
    )
    p = Pipeline(config, {"fast": ("external", "egress"), "slow": ("external", "egress")})
    now = 1_780_000_000.0
    p.start(now)
    up = {"fast": SourceHealth(up=True, caught_up=True), "slow": SourceHealth(up=True)}
    p.apply("slow", named(now - 100, "unclassified", 1), now)
    # "slow" is up, behind, and advanced just now: nothing after its watermark closes.
    assert p.closable_end(now, up) == now - 100
    # Still stuck 30 s later (wall clock): it no longer holds the others.
    assert p.closable_end(now + 31, up) == now + 30


def test_open_ticks_survive_a_restart_and_a_removed_surface_takes_its_cells_along(tmp_path):
    both = {"tick": "10s", "surfaces": [{"name": "a", "kind": "fs"}, {"name": "b", "kind": "fs"}]}
    p = Pipeline(config_from_dict(both), {"w": ("external", "fs")})
    now = 1_780_000_000.0
    p.apply("w", named(now, "a", 100), now)
    p.apply("w", named(now, "b", 50), now)
    state = json.loads(json.dumps(p.to_state()))

    only_a = {"tick": "10s", "surfaces": [{"name": "a", "kind": "fs"}]}
    q = Pipeline(config_from_dict(only_a), {"w": ("external", "fs")})
    q.load_state(state, [], now)
    (result,) = q.close_until((now // 10 + 1) * 10, now + 10)
    row = q.table.index[("fs", "a")]
    assert q.detector.surfaces[("fs", "a")].figures.rate == 10.0
    assert int(q.table.bytes_total[row]) == 100
    assert np.isclose(q.detector.surfaces[("fs", "unclassified")].figures.rate, 0.0)
    assert result.changes == []


async def test_a_batch_is_applied_whole_before_the_service_saves(tmp_path):
    """Position, counters and events of one batch land together: what the store holds is
    always a position with exactly the counts it produced."""
    from alarm.state import StateStore

    log = tmp_path / "kern.log"
    start = (time.time() // TICK - 4) * TICK  # ended 25 s ago: its ticks close at once
    total = write_backlog(log, start, 15, spike=(0, 0))
    cfg = config_dict(tmp_path, log)
    async with running_service(cfg) as service:
        await wait_for(lambda: surface_totals(service, "proxy")[0] == total, timeout=20)
        await wait_for(lambda: service.pipeline.last_tick_end >= start + 20, timeout=20)
        await asyncio.sleep(0.2)
    saved = StateStore(tmp_path / "state").load()
    offset = saved["positions"]["kern"]["files"][str(log)]["offset"]
    assert offset == log.stat().st_size
    assert saved["sources"]["kern"]["counters"]["records_read"] == 15
    assert saved["surfaces"]["egress/proxy"]["bytes_total"] == total


def _arrival_sums(batches, n):
    """Per tick: each row's bytes, events and capacity of each batch summed in the order they
    arrived, the batches' sums added in turn; and its cells, one per batch and row that wrote.
    What an open tick must hold however a batch was placed."""
    sums: dict[int, np.ndarray] = {}
    cells: dict[int, int] = {}
    for idx, rows, columns in batches:
        batch: dict[int, np.ndarray] = {}
        wrote: dict[int, set[int]] = {}
        for j, (t, r) in enumerate(zip(idx.tolist(), rows.tolist(), strict=True)):
            cell = batch.setdefault(t, np.zeros((3, n)))
            for i in range(3):
                cell[i, r] = cell[i, r] + columns[i][j]
            wrote.setdefault(t, set()).add(r)
        for t, cell in batch.items():
            sums[t] = sums[t] + cell if t in sums else cell
            cells[t] = cells.get(t, 0) + len(wrote[t])
    return sums, cells


def test_a_batch_is_placed_in_its_ticks_as_the_sums_of_its_writes_in_arrival_order():
    # Placed without a sort where ticks x rows is small (a replayed batch), sorted where it is
    # wide: either way each open tick holds, bit for bit, every write summed in arrival order
    # (non-integer amounts, where the order of the additions shows), whether the tick was
    # empty, held cells of an earlier batch, or was staged for contributors only.  (Across
    # batches a tick adds each batch's sums: a batch is summed per tick and row when placed.)
    rng = np.random.default_rng(26)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        clock = EventClock(10.0, 1.0, 30.0, 1e9)
        batches = []
        for _ in range(int(rng.integers(1, 4))):
            m = int(rng.integers(1, 200))
            spread = int(rng.choice([1, 4, 60, 50_000]))  # the last too wide to be dense
            idx = 1000 + rng.integers(0, spread, m)
            rows = rng.integers(0, n, m)
            columns = [rng.random(m) * 10.0 ** int(rng.integers(0, 17)) for _ in range(3)]
            if trial % 5 == 0:
                clock.staged(int(idx[0]))  # credits only, no cells yet
            clock.add(idx, rows, *columns, table_rows=0 if trial % 7 == 0 else n)
            batches.append((idx, rows, columns))
        want, sizes = _arrival_sums(batches, n)
        for t, cells in clock.open.items():
            assert cells.sums(n).tobytes() == want.get(t, np.zeros((3, n))).tobytes()
            assert cells.size == sizes.get(t, 0)
        assert {t for t, c in clock.open.items() if c.size} == set(want)


def test_a_row_past_the_table_is_refused_not_counted_in_another_tick():
    clock = EventClock(10.0, 1.0, 30.0, 1e9)
    one = np.ones(2)
    with pytest.raises(IndexError):
        clock.add(np.array([5, 6]), np.array([0, 3]), one, one, one, table_rows=3)
