"""The state store: detector arrays saved raw in groups, atomically with the counters, read
back into the rows of the same surfaces; each array kept as chunks, of which a save writes the
ones that changed; the learned profiles (slow group) are saved on a cadence, everything else
every tick."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import alarm.state
from alarm.config import config_from_dict
from alarm.detector.engine import SLOW_ARRAYS, Detector
from alarm.service import Service
from alarm.state import SCHEMA_VERSION, StateStore


def never(_row):
    return []


def test_groups_round_trip_raw_and_are_replaced_whole(tmp_path):
    store = StateStore(tmp_path)
    day = np.arange(12, dtype=np.float32).reshape(4, 3)
    counts = np.array([1, 65535, 7], dtype=np.uint16)
    store.save(
        {"positions": {"k": 5}},
        groups={
            "slow": ({"keys": ["a", "b", "c"]}, {"day": day, "counts": counts}),
            "fast": (
                {"keys": ["a", "b", "c"]},
                {
                    "state": np.array([0, 2, 1], dtype=np.int8),
                    # Per-aggregate arrays of a detector without aggregates: no rows at all.
                    "none": np.zeros((14, 6, 0), dtype=np.float32),
                },
            ),
        },
    )
    # A later save of one group replaces that group only, whole (``counts`` is gone).
    store.save({"positions": {"k": 9}}, groups={"slow": ({"keys": ["c"]}, {"day": day[:, 2:]})})
    # A row of a type nobody wrote is ignored, not a crash.
    store.db.execute("INSERT INTO arrays VALUES ('fast', 'evil', 'object', '[1]', x'00')")
    store.close()

    again = StateStore(tmp_path)
    assert again.load() == {"positions": {"k": 9}}
    groups = again.load_groups()
    assert set(groups) == {"slow", "fast"}
    head, arrays = groups["slow"]
    assert head == {"keys": ["c"]} and list(arrays) == ["day"]
    assert arrays["day"].dtype == np.float32 and arrays["day"].tolist() == day[:, 2:].tolist()
    assert groups["fast"][1]["state"].tolist() == [0, 2, 1]
    assert groups["fast"][1]["none"].shape == (14, 6, 0)
    assert "evil" not in groups["fast"][1]


def config(tmp_path):
    return config_from_dict(
        {
            "tick": "10s",
            "state_dir": str(tmp_path / "state"),
            "sources": [],
            "surfaces": [{"name": f"s{i}", "match": {"dport": [1000 + i]}} for i in range(3)],
        }
    )


def test_the_service_saves_profiles_on_a_cadence_and_restores_every_array(tmp_path):
    service = Service(config(tmp_path), collectors=[])
    det = service.pipeline.detector
    rng = np.random.default_rng(1)
    t0 = 1_780_000_000.0
    n = det.members  # the three surfaces and egress/unclassified
    # The profiles learn after the spike rule's warm-up hour (360 ticks): 40 ticks after it.
    for i in range(400):
        det.evaluate_arrays(t0 + 10 * i, 10.0, rng.integers(0, 5000, n) * 1.0, np.ones(n), never)
    service._save_state(final=False)
    slow_saved = service.store.db.execute("SELECT saved FROM kv WHERE key='arrays:slow'").fetchone()
    det.evaluate_arrays(t0 + 4000, 10.0, np.full(n, 9e7), np.ones(n), never)
    service._save_state(final=False)  # within a tick of the last: the fast group only
    assert (
        service.store.db.execute("SELECT saved FROM kv WHERE key='arrays:slow'").fetchone()
        == slow_saved
    )
    fast = {k: a.copy() for k, a in det.state_arrays("fast").items()}
    slow = {k: a.copy() for k, a in det.state_arrays("slow").items()}
    assert set(slow) == SLOW_ARRAYS and not set(fast) & SLOW_ARRAYS
    service.store.close()

    restored = Service(config(tmp_path), collectors=[]).pipeline.detector
    # The fast arrays are the last tick's (the 9 MB/s tick fired the budget), the slow ones the
    # previous save's.
    for name, a in restored.state_arrays("fast").items():
        assert np.array_equal(a, fast[name], equal_nan=True), name
    assert int(restored.budget_alerts.state.max()) == 2
    assert restored.baseline.day_n.sum() == 40 * len(restored.keys)
    assert isinstance(restored, Detector)


def test_the_service_exports_what_each_save_wrote_and_cost(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from exporters.prometheus import render

    service = Service(config(tmp_path), collectors=[])
    det = service.pipeline.detector
    n = det.members
    t0 = 1_780_000_000.0
    wrote = []
    for i in range(3):
        det.evaluate_arrays(t0 + 10 * i, 10.0, np.full(n, 100.0 * (i + 1)), np.ones(n), never)
        service._save_state(final=False)
        wrote.append((service.store.last_save.total_bytes, service.store.last_save.chunks_written))
    assert wrote[0][0] > wrote[0][1] > 0  # the first save writes every array
    body, _ = render(service._snapshot(time.time(), {}, None), [], None)
    got = {
        s.name: s.value
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
        if s.name.startswith("capalarm_state_")
    }
    assert got["capalarm_state_saves_total"] == 3
    assert got["capalarm_state_save_failures_total"] == 0
    assert got["capalarm_state_save_written_bytes"] == wrote[-1][0]
    assert got["capalarm_state_save_written_chunks"] == wrote[-1][1]
    assert got["capalarm_state_written_bytes_total"] == sum(b for b, _ in wrote)
    assert got["capalarm_state_written_chunks_total"] == sum(c for _, c in wrote)
    assert 0 < got["capalarm_state_save_duration_seconds"] < 60
    assert abs(got["capalarm_state_last_save_timestamp_seconds"] - time.time()) < 60
    assert got["capalarm_state_wal_bytes"] == service.store.wal_bytes()
    service.store.close()


def test_the_saved_counters_leave_out_surfaces_never_written_and_load_back_whole():
    """Every save wrote every declared surface's counters and contributors as JSON: at
    100,000 surfaces 8.5 MB and ~0.5-0.8 s a save, and a full garbage collection (2-3 s)
    every other save, for surfaces that were never written."""
    from alarm.events import NAMED, Batch, Event, WriteEvents
    from alarm.pipeline import Pipeline

    config = config_from_dict(
        {"tick": "10s", "surfaces": [{"name": n, "kind": "fs"} for n in ("a", "b", "c")]}
    )
    now = 1_780_000_000.0
    p = Pipeline(config, {"w": ("external", "fs")})
    for ts, nbytes, who in ((now - 25, 100, "x"), (now - 24, 50, "y"), (now - 23, 7, "x")):
        ev = WriteEvents.of(NAMED, [Event(ts, (None, "b"), nbytes, who)])
        p.apply("w", Batch(ev, watermark=ts), now)
    p.close_until(now - 10, now)
    state = json.loads(json.dumps(p.to_state()))
    assert set(state["surfaces"]) == {"fs/b", "_unknown_surface_events"}
    b = p.table.index[("fs", "b")]
    assert p.table.hitters[b].to_state()["counts"]  # contributors are saved with it
    q = Pipeline(config, {"w": ("external", "fs")})
    q.load_state(state, [], now)
    assert q.table.keys == p.table.keys
    assert q.table.bytes_total.tolist() == p.table.bytes_total.tolist()
    assert int(q.table.bytes_total[b]) == 157 and int(q.table.bytes_total.sum()) == 157
    assert q.table.events_total.tolist() == p.table.events_total.tolist()
    for mine, theirs in zip(q.table.hitters, p.table.hitters, strict=True):
        assert mine.to_state() == theirs.to_state()


def test_a_source_alert_firing_at_a_restart_still_resolves():
    import json

    from alarm.detector.sources import SOURCE_RESOLVE_HOLD, SourceJudgement

    def judge(lost: int) -> list[SourceJudgement]:
        return [SourceJudgement("kernel", True, "", lost, 0, 0, 3, 0)]

    d = Detector(config_from_dict({}), [])
    fired = d.sources.evaluate(10, 10, judge(3))
    assert [(c.rule, c.state) for c in fired] == [("records_lost", "firing")]
    saved = json.loads(json.dumps(d.to_state()))

    again = Detector(config_from_dict({}), [])
    again.load_state(saved)
    changes, t = [], 10
    while t < 10 + SOURCE_RESOLVE_HOLD + 30:
        t += 10
        changes += again.sources.evaluate(t, 10, judge(0))  # nothing new was lost
    # The destinations were told it fired; they are told it resolved, with the same fingerprint.
    assert [(c.rule, c.state, c.fingerprint) for c in changes] == [
        ("records_lost", "resolved", fired[0].fingerprint)
    ]


# -- incremental saves ---------------------------------------------------------------------


def same(loaded: dict, expected: dict[str, tuple[dict, dict[str, np.ndarray]]]) -> None:
    """``loaded`` (load_groups) holds exactly ``expected``: headers, names, dtypes, shapes,
    bytes."""
    assert set(loaded) == set(expected)
    for grp, (head, arrays) in expected.items():
        got_head, got = loaded[grp]
        assert got_head == head, grp
        assert set(got) == set(arrays), grp
        for name, a in arrays.items():
            b = got[name]
            assert (b.dtype, b.shape) == (a.dtype, a.shape), (grp, name)
            assert b.tobytes() == np.ascontiguousarray(a).tobytes(), (grp, name)


def slot_major(rows: int, seed: int = 0) -> np.ndarray:
    """A daily profile as the detector keeps it: (96 slots, rows), float32."""
    return np.random.default_rng(seed).random((96, rows), dtype=np.float32)


def wal_after_checkpoint(store: StateStore) -> Path:
    """The WAL file, emptied: what the next transaction writes is its size afterwards."""
    assert store.wait_checkpoint(30)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(f"{store.path}-wal")
    assert wal.stat().st_size == 0
    return wal


def test_a_save_where_one_slot_row_changed_writes_a_small_fraction_of_the_array(tmp_path):
    rows = 20_000
    day = slot_major(rows)  # 7.7 MB
    store = StateStore(tmp_path)
    store.save({}, groups={"slow": ({"keys": rows}, {"baseline.day": day})})
    wal = wal_after_checkpoint(store)
    day[37] += 1.0  # the current slot learns, for every surface
    store.save({}, groups={"slow": ({"keys": rows}, {"baseline.day": day})})
    # What the file took: the row (80 kB), the chunks it straddles, the hashes, the index.
    assert wal.stat().st_size < 0.05 * day.nbytes, wal.stat().st_size
    # The store's own count: the chunks the row straddles.
    assert store.last_save.written_bytes <= rows * 4 + 2 * alarm.state.CHUNK
    assert store.last_save.array_bytes == day.nbytes
    store.close()
    same(StateStore(tmp_path).load_groups(), {"slow": ({"keys": rows}, {"baseline.day": day})})


def test_a_save_where_nothing_changed_writes_no_array_bytes(tmp_path):
    day = slot_major(5000)
    store = StateStore(tmp_path)
    for _ in range(2):
        store.save({"n": 1}, groups={"slow": ({"k": 1}, {"day": day})})
    assert store.last_save.written_bytes == 0 and store.last_save.chunks_written == 0


def test_a_restarted_store_loads_the_last_save_and_saves_incrementally_at_once(tmp_path):
    day = slot_major(20_000)
    counts = np.arange(20_000, dtype=np.uint16)
    first = StateStore(tmp_path)
    for slot in range(3):
        day[slot] = slot
        first.save({"slot": slot}, groups={"slow": ({"k": 1}, {"day": day, "n": counts})})
    first.close()  # a restart (a kill -9 between saves leaves the same file)

    again = StateStore(tmp_path)
    assert again.load() == {"slot": 2}
    same(again.load_groups(), {"slow": ({"k": 1}, {"day": day, "n": counts})})
    day[3] = 3
    again.save({"slot": 3}, groups={"slow": ({"k": 1}, {"day": day, "n": counts})})
    # The hashes saved with the chunks tell a new store what the file holds.
    assert again.last_save.arrays_whole == 0
    assert again.last_save.written_bytes <= 20_000 * 4 + 2 * alarm.state.CHUNK
    again.close()
    same(StateStore(tmp_path).load_groups(), {"slow": ({"k": 1}, {"day": day, "n": counts})})


def test_a_changed_shape_or_dtype_rewrites_the_array_whole_and_a_dropped_one_is_gone(tmp_path):
    store = StateStore(tmp_path)
    day = slot_major(3000)
    week = np.ones((168, 3000), dtype=np.uint16)
    store.save({}, groups={"slow": ({"keys": 3000}, {"day": day, "week": week})})
    # A surface more: every array one row wider (its bytes shift in every chunk).
    day = slot_major(3001, seed=1)
    week = np.ones((168, 3001), dtype=np.uint32)
    store.save({}, groups={"slow": ({"keys": 3001}, {"day": day, "week": week})})
    assert store.last_save.arrays_whole == 2
    assert store.last_save.written_bytes == day.nbytes + week.nbytes
    same(store.load_groups(), {"slow": ({"keys": 3001}, {"day": day, "week": week})})
    # Same bytes, another shape: still rewritten (the shape is the array's, not its chunks').
    flat = day.reshape(-1)
    store.save({}, groups={"slow": ({"keys": 3001}, {"day": flat})})
    assert store.last_save.arrays_whole == 1
    same(store.load_groups(), {"slow": ({"keys": 3001}, {"day": flat})})
    store.close()
    db = sqlite3.connect(tmp_path / "capalarm.db")
    assert db.execute("SELECT DISTINCT name FROM array_meta").fetchall() == [("day",)]
    assert db.execute("SELECT DISTINCT name FROM array_chunks").fetchall() == [("day",)]


def test_a_transposed_array_is_stored_in_its_memory_order_and_loaded_in_c_order(tmp_path):
    # The tails' kept peaks: kept surface by surface, handed over day-major.
    kept = np.random.default_rng(2).random((3, 5000, 14, 6), dtype=np.float32)
    view = kept.transpose(0, 2, 3, 1)
    store = StateStore(tmp_path)
    store.save({}, groups={"slow": ({}, {"kept": view})})
    kept[1, 4321] = 7.0  # one surface's incident ended: one place in memory
    store.save({}, groups={"slow": ({}, {"kept": view})})
    assert store.last_save.written_bytes <= 2 * alarm.state.CHUNK
    loaded = StateStore(tmp_path).load_groups()["slow"][1]["kept"]
    assert loaded.flags.c_contiguous and loaded.shape == view.shape
    assert loaded.tobytes() == np.ascontiguousarray(view).tobytes()


def test_another_writer_of_the_file_is_noticed(tmp_path):
    """What a store remembers of the file is not trusted after another store wrote it."""
    day = slot_major(4000)
    one, two = StateStore(tmp_path), StateStore(tmp_path)
    one.save({}, groups={"slow": ({}, {"day": day})})
    two.save({}, groups={"slow": ({}, {"day": day + 1})})
    one.save({}, groups={"slow": ({}, {"day": day})})  # what one saved last time, changed since
    same(two.load_groups(), {"slow": ({}, {"day": day})})


def test_a_failed_save_leaves_the_last_one_and_the_next_save_is_whole_where_needed(tmp_path):
    day = slot_major(4000)
    store = StateStore(tmp_path)
    store.save({"v": 1}, groups={"slow": ({}, {"day": day})})
    changed = day.copy()
    changed[5] = 0
    calls = [0]

    def interrupt() -> int:
        calls[0] += 1
        return calls[0] > 20  # SQLite stops the statement: the save fails midway

    store.db.set_progress_handler(interrupt, 10)
    with pytest.raises(sqlite3.OperationalError):
        store.save({"v": 2}, groups={"slow": ({}, {"day": changed, "more": day})})
    store.db.set_progress_handler(None, 10)
    assert store.load() == {"v": 1}
    same(store.load_groups(), {"slow": ({}, {"day": day})})
    store.save({"v": 3}, groups={"slow": ({}, {"day": changed})})
    same(StateStore(tmp_path).load_groups(), {"slow": ({}, {"day": changed})})


def test_the_fallback_hash_round_trips_and_a_change_of_hash_rewrites_whole(tmp_path):
    day = slot_major(3000)
    store = StateStore(tmp_path)
    store.hash = "blake2b-64"
    store.save({}, groups={"slow": ({}, {"day": day})})
    day[1] = 9
    store.save({}, groups={"slow": ({}, {"day": day})})
    assert store.last_save.arrays_whole == 0 and store.last_save.chunks_written <= 2
    same(StateStore(tmp_path).load_groups(), {"slow": ({}, {"day": day})})
    store.hash = alarm.state.HASH
    store.save({}, groups={"slow": ({}, {"day": day})})
    assert store.last_save.arrays_whole == (alarm.state.HASH != "blake2b-64")
    same(StateStore(tmp_path).load_groups(), {"slow": ({}, {"day": day})})


def test_a_damaged_chunk_leaves_that_array_out(tmp_path):
    day, week = slot_major(3000), slot_major(168)
    store = StateStore(tmp_path)
    store.save({}, groups={"slow": ({}, {"day": day, "week": week})})
    store.db.execute("UPDATE array_chunks SET data = zeroblob(length(data)) WHERE name = 'day'")
    assert set(store.load_groups()["slow"][1]) == {"week"}
    store.db.execute("DELETE FROM array_chunks WHERE name = 'week' AND idx = 1")
    assert set(store.load_groups()["slow"][1]) == set()


def version_1_file(path: Path, groups: dict[str, tuple[dict, dict[str, np.ndarray]]]) -> None:
    """A state database as schema version 1 wrote it: one BLOB per array."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, saved REAL NOT NULL)")
    db.execute(
        "CREATE TABLE arrays (grp TEXT NOT NULL, name TEXT NOT NULL, dtype TEXT NOT NULL, "
        "shape TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (grp, name))"
    )
    db.execute(
        "CREATE TABLE ledger (source TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, "
        "PRIMARY KEY (source, key)) WITHOUT ROWID"
    )
    db.execute("INSERT INTO kv VALUES ('schema', '1', 0)")
    db.execute("INSERT INTO kv VALUES ('pipeline', '{\"v\":1}', 0)")
    for grp, (head, arrays) in groups.items():
        db.execute("INSERT INTO kv VALUES (?, ?, 0)", (f"arrays:{grp}", json.dumps(head)))
        for name, a in arrays.items():
            db.execute(
                "INSERT INTO arrays VALUES (?, ?, ?, ?, ?)",
                (grp, name, str(a.dtype), json.dumps(a.shape), a.tobytes()),
            )
    db.commit()
    db.close()


def test_a_version_1_file_is_read_and_each_group_converted_at_its_next_save(tmp_path):
    fast = ({"keys": ["a"]}, {"state": np.array([2], dtype=np.int8)})
    slow = ({"keys": ["a"]}, {"day": slot_major(10)})
    version_1_file(tmp_path / "capalarm.db", {"fast": fast, "slow": slow})
    store = StateStore(tmp_path)
    assert store.load() == {"v": 1}
    same(store.load_groups(), {"fast": fast, "slow": slow})
    schema = "SELECT value FROM kv WHERE key = 'schema'"
    assert store.db.execute(schema).fetchone() == ("1",)  # opened, not yet converted
    fast2 = ({"keys": ["a"]}, {"state": np.array([0], dtype=np.int8)})
    store.save({"v": 2}, groups={"fast": fast2})
    assert store.db.execute(schema).fetchone() == (str(SCHEMA_VERSION),)
    assert store.db.execute("SELECT DISTINCT grp FROM arrays").fetchall() == [("slow",)]
    store.close()
    again = StateStore(tmp_path)
    same(again.load_groups(), {"fast": fast2, "slow": slow})
    again.save({"v": 3}, groups={"slow": slow})
    assert again.db.execute("SELECT count(*) FROM arrays").fetchone() == (0,)
    same(again.load_groups(), {"fast": fast2, "slow": slow})


def test_a_kill_in_the_middle_of_a_save_leaves_the_previous_complete_state(tmp_path):
    """kill -9 from inside the save's transaction, after some of its chunks are written."""
    script = textwrap.dedent(
        f"""
        import os, signal, numpy as np
        from alarm.state import StateStore
        store = StateStore({str(tmp_path)!r})
        day = np.zeros((96, 20000), dtype=np.float32)
        store.save({{"v": 1}}, groups={{"slow": ({{"h": 1}}, {{"day": day}})}})
        calls = [0]
        def kill():
            calls[0] += 1
            if calls[0] > 300:
                os.kill(os.getpid(), signal.SIGKILL)
            return 0
        store.db.set_progress_handler(kill, 10)
        day[:] = 1.0
        store.save({{"v": 2}}, groups={{"slow": ({{"h": 2}}, {{"day": day}})}})
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert res.returncode == -signal.SIGKILL, res.stderr
    store = StateStore(tmp_path)
    assert store.load() == {"v": 1}
    day = np.zeros((96, 20000), dtype=np.float32)
    same(store.load_groups(), {"slow": ({"h": 1}, {"day": day})})
    # And the next save, incremental against the file as it is, is exact.
    day[3] = 3
    store.save({"v": 3}, groups={"slow": ({"h": 3}, {"day": day})})
    same(StateStore(tmp_path).load_groups(), {"slow": ({"h": 3}, {"day": day})})


def test_after_a_large_save_then_a_small_one_the_wal_file_is_at_most_wal_limit(
    tmp_path, monkeypatch
):
    """The WAL file kept the size of the largest transaction ever written (780 MB after the
    first save at 100,000 surfaces), beside a database of the same size.  Bound: WAL_LIMIT
    once the checkpoint after a save has run, whichever way it gets there."""
    limit = 1 << 20
    monkeypatch.setattr(alarm.state, "WAL_LIMIT", limit)
    day = slot_major(20_000)  # 7.7 MB, all of it written by the first save
    wal = tmp_path / "capalarm.db-wal"
    store = StateStore(tmp_path)
    store.save({"v": 1}, groups={"slow": ({"h": 1}, {"day": day})})
    assert store.wait_checkpoint(30)
    # Copied into the database and the file truncated, on the checkpoint thread.
    assert wal.stat().st_size <= limit, wal.stat().st_size
    assert (tmp_path / "capalarm.db").stat().st_size > day.nbytes
    day[5] += 1.0
    store.save({"v": 2}, groups={"slow": ({"h": 2}, {"day": day})})
    assert store.wait_checkpoint(30)
    assert 0 < wal.stat().st_size <= limit, wal.stat().st_size
    assert store.checkpoints >= 1 and store.checkpoint_failures == 0

    # Without the checkpoint thread's truncation (it found the write lock taken, say), a WAL
    # started afresh by the next save is cut back by SQLite (journal_size_limit).
    def passive_only(db):
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    monkeypatch.setattr(store, "_checkpoint", passive_only)
    day[:] += 1.0
    store.save({"v": 3}, groups={"slow": ({"h": 3}, {"day": day})})
    assert store.wait_checkpoint(30)
    assert wal.stat().st_size > day.nbytes  # the large one, copied but not cut
    day[6] += 1.0
    store.save({"v": 4}, groups={"slow": ({"h": 4}, {"day": day})})
    assert store.wait_checkpoint(30)
    assert 0 < wal.stat().st_size <= limit, wal.stat().st_size
    store.close()
    again = StateStore(tmp_path)
    assert again.load() == {"v": 4}
    same(again.load_groups(), {"slow": ({"h": 4}, {"day": day})})
    again.close()


def test_a_save_does_not_wait_for_the_checkpoint(tmp_path, monkeypatch):
    """The pipeline thread saves; the checkpoint (~0.1 s of a 0.3 s save at 100,000
    surfaces when SQLite ran it at commit) is another thread's."""
    import threading

    release = threading.Event()
    store = StateStore(tmp_path)
    assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    original = store._checkpoint

    def held(db):
        release.wait(30)
        original(db)

    monkeypatch.setattr(store, "_checkpoint", held)
    day = slot_major(20_000)  # 7.7 MB: past CHECKPOINT_AT
    for v in range(3):
        day[v] += 1.0
        store.save({"v": v}, groups={"slow": ({"h": v}, {"day": day})})
    assert not store.wait_checkpoint(0.05)  # saved three times, the first checkpoint held
    release.set()
    assert store.wait_checkpoint(30)
    store.close()
    same(StateStore(tmp_path).load_groups(), {"slow": ({"h": 2}, {"day": day})})


def saves_in_turn(v: int) -> np.ndarray:
    """The array of save ``v`` of the child below: odd saves change all of it (a large
    transaction, a WAL past the limit, a truncating checkpoint), even ones one row."""
    day = np.zeros((96, 12_000), dtype=np.float32)  # 4.6 MB: past CHECKPOINT_AT
    for i in range(1, v + 1):
        if i % 2:
            day[:] = i
        else:
            day[i % 96] = i + 0.5
    return day


@pytest.mark.parametrize("after", [0.0, 0.04, 0.09, 0.15, 0.22, 0.3, 0.45, 0.6])
def test_a_kill_at_any_point_of_saves_and_checkpoints_leaves_the_last_or_next_state(
    tmp_path, after
):
    """kill -9 while saves of 4.6 MB and of one row follow each other and their checkpoints run
    beside them (copying the WAL into the database, truncating it): the state loaded is the
    last save that returned or the one in flight, whole, and saving goes on from it."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = [{str(Path(__file__).parents[1])!r}, {str(Path(__file__).parent)!r}]
        import alarm.state
        alarm.state.WAL_LIMIT = 256 << 10
        from alarm.state import StateStore
        from test_state_store import saves_in_turn
        store = StateStore({str(tmp_path)!r})
        v = 0
        while True:
            v += 1
            store.save({{"v": v}}, groups={{"slow": ({{"v": v}}, {{"day": saves_in_turn(v)}})}})
            print(v, flush=True)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1", "the child's first save"
        time.sleep(after)
        child.send_signal(signal.SIGKILL)
        lines = child.stdout.read().split()
    finally:
        child.kill()
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    returned = int(lines[-1]) if lines else 1
    store = StateStore(tmp_path)
    v = store.load()["v"]
    assert v in (returned, returned + 1), (v, returned)
    same(store.load_groups(), {"slow": ({"v": v}, {"day": saves_in_turn(v)})})
    store.save({"v": v + 1}, groups={"slow": ({"v": v + 1}, {"day": saves_in_turn(v + 1)})})
    store.close()
    again = StateStore(tmp_path)
    same(again.load_groups(), {"slow": ({"v": v + 1}, {"day": saves_in_turn(v + 1)})})
    again.close()


# One step of the round trip: an array set (some rows changed), reshaped, retyped, dropped, or
# the store restarted.
STEP = st.tuples(
    st.sampled_from(["fast", "slow"]),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["rows", "rows", "rows", "shape", "dtype", "drop", "restart", "transpose"]),
    st.integers(0, 2**32 - 1),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(STEP, min_size=1, max_size=25))
def test_groups_round_trip_across_many_saves_with_partial_changes(monkeypatch, steps):
    # Small chunks: arrays of a few hundred bytes span many of them.
    monkeypatch.setattr(alarm.state, "CHUNK", 64)
    model: dict[str, tuple[dict, dict[str, np.ndarray]]] = {}
    with tempfile.TemporaryDirectory(prefix="capalarm-chunks-") as tmp:
        store = StateStore(tmp)
        for n, (grp, name, what, seed) in enumerate(steps):
            rng = np.random.default_rng(seed)
            if what == "restart":
                store.close()
                store = StateStore(tmp)
                same(store.load_groups(), model)
                continue
            arrays = dict(model.get(grp, ({}, {}))[1])
            a = arrays.get(name)
            if a is None or what == "shape":
                a = rng.random((int(rng.integers(0, 12)), int(rng.integers(1, 40))))
                a = a.astype(np.float32)
            elif what == "rows" and a.ndim == 2 and a.shape[0]:
                a = a.copy()
                a[rng.integers(0, a.shape[0], int(rng.integers(1, 3)))] = rng.random()
            elif what == "dtype":
                a = a.astype(np.float64 if a.dtype == np.float32 else np.float32)
            elif what == "transpose" and a.ndim == 2:
                a = np.ascontiguousarray(a.T).T  # same values, Fortran order in memory
            if what == "drop":
                arrays.pop(name, None)
            else:
                arrays[name] = a
            model[grp] = ({"step": n}, arrays)
            store.save({"step": n}, groups={grp: model[grp]})
            same(store.load_groups(), model)
        store.close()
        same(StateStore(tmp).load_groups(), model)
