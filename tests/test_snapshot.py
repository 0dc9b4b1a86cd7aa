"""The pipeline's snapshot as columns (alarm/snapshot.py): every figure a surface's view shows is
the detector's own (figures_of, the alert banks, the rules), /metrics and the attention order
are the same whether written from the columns or from a view per surface, and a snapshot
copies the contributors of only the surfaces a request shows (issues 28 and 29: at 100,000
surfaces a view per surface per request was seconds)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from alarm.config import Config, config_from_dict
from alarm.events import NAMED, Batch, Event, WriteEvents
from alarm.history import HistoryRequest, attention_order
from alarm.pipeline import Pipeline
from alarm.snapshot import Snapshot, SnapshotRequest, SurfaceView
from alarm.surfaces import HeavyHitters
from exporters.http import page_rows, surfaces_json
from exporters.prometheus import render

TICK = 10.0
T0 = 1_780_000_000.0


def fleet_config() -> Config:
    surfaces = []
    for i in range(12):
        s: dict = {"name": f"e{i}", "match": {"dport": [1000 + i]}}
        if i % 3 == 0:
            s["spike"] = {"drop_ratio": 3.0}
        if i % 4 == 1:
            s["budget"] = {
                "allowance_bits_per_second": 200,
                "tolerance_bits": 20_000,
                "horizons": [
                    {"horizon": "1d", "allowance_bits_per_second": 20, "tolerance_bits": 40_000}
                ],
            }
        surfaces.append(s)
    for i in range(6):
        surfaces.append(
            {
                "name": f"r{i}",
                "kind": "registry",
                "match": {"repository": [f"r{i}"]},
                "budget": {"allowance_bits_per_second": 100, "tolerance_bits": 10_000},
            }
        )
    return config_from_dict({"tick": "10s", "surfaces": surfaces})


def running_pipeline(ticks: int = 40) -> Pipeline:
    """A pipeline after ``ticks`` of lognormal traffic from a few contributors each, with a
    burst on some surfaces near the end (alerts pending and firing)."""
    p = Pipeline(fleet_config(), {"b": ("external", "egress"), "r": ("external", "registry")})
    rng = np.random.default_rng(5)
    egress = [("egress", f"e{i}") for i in range(12)]
    registry = [("registry", f"r{i}") for i in range(6)]
    for t in range(ticks):
        ts = T0 + t * TICK + 1
        for source, keys in (("b", egress), ("r", registry)):
            events = []
            for j, key in enumerate(keys):
                if rng.random() < 0.3:
                    continue
                size = int(rng.lognormal(5, 1))
                if t > ticks - 6 and j % 5 == 0:
                    size *= 1000
                events += [Event(ts, key, size, f"c{j}-{k}") for k in range(3)]
            if events:
                p.apply(source, Batch(WriteEvents.of(NAMED, events)), None)
        p.close_until(T0 + (t + 1) * TICK)
    return p


def reference_view(p: Pipeline, row: int, top: int) -> SurfaceView:
    """The view of one row as every snapshot made it before columns: from the detector's
    per-row readers."""
    det, table = p.detector, p.table
    kind, name = det.keys[row]
    if row < len(table):
        bytes_total, events_total = int(table.bytes_total[row]), int(table.events_total[row])
        contributors, error = table.hitters[row].top(top), table.hitters[row].error
    else:
        members = [table.index[m] for m in det.aggregates[det.keys[row]]]
        bytes_total = int(table.bytes_total[members].sum())
        events_total = int(table.events_total[members].sum())
        contributors, error = [], 0
    f = det.figures_of(row)

    return SurfaceView(
        kind=kind,
        name=name,
        bytes_total=bytes_total,
        events_total=events_total,
        rate=f.rate,
        events_rate=f.events_rate,
        baseline=f.baseline,
        threshold=f.threshold,
        baseline_ready=f.baseline_ready,
        capacity_bps=f.capacity_bps,
        budget_excess=f.budget_excess,
        budget_allowance=f.budget_allowance,
        budget_tolerance=f.budget_tolerance,
        spike_state=int(det.spike_alerts.state[row]),
        budget_state=int(det.budget_alerts.state[row]),
        contributors=contributors,
        contributors_error=error,
        budget_horizons=f.horizons,
        seasonal_ratio=f.seasonal_ratio,
        seasonal_judged=f.seasonal_judged,
        learning=bool(det.spike.learning[row]),
        budget_misconfigured=bool(det.budget.misconfigured[row]),
        rule_alert_states={
            n: int(det.alert_banks[n].state[row])
            for n, rule in det.rules.items()
            if rule.enabled[row]
        },
        **det.members_shift_of(row),
    )


def fields(v: SurfaceView) -> dict[str, object]:
    """A view's figures and its rules' states (which rules a rule module registers moves
    between rule_alert_states and the optional fields; rule_states() is what is shown)."""
    out = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
    out.pop("rule_alert_states")
    out["rules"] = v.rule_states()
    return out


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return running_pipeline()


def test_each_view_holds_what_the_detector_says_of_its_row(pipeline):
    p = pipeline
    snap = p.snapshot(T0, 5, {}, {})
    assert len(snap.surfaces) == len(p.detector.keys)
    states = [max(v.rule_states().values()) for v in snap.surfaces]
    assert 2 in states, "the traffic was to fire some alert"
    assert any(v.members_shift is not None for v in snap.surfaces), "an aggregate row"
    assert any("drop" in v.rule_alert_states for v in snap.surfaces)
    assert any(len(v.budget_horizons) > 1 for v in snap.surfaces)
    for row, view in enumerate(snap.surfaces):
        assert fields(view) == fields(reference_view(p, row, 5)), p.detector.keys[row]


def test_metrics_and_the_attention_order_from_columns_are_those_of_the_views(pipeline):
    p = pipeline
    snap = p.snapshot(T0, 5, {}, {}, SnapshotRequest())
    views = [reference_view(p, row, 5) for row in range(len(p.detector.keys))]
    crafted = Snapshot(
        taken_at=T0,
        tick=snap.tick,
        ticks=snap.ticks,
        last_tick_end=snap.last_tick_end,
        last_tick_seconds=snap.last_tick_seconds,
        surfaces=views,
        sources=snap.sources,
        source_alerts=snap.source_alerts,
        unknown_surface_events=snap.unknown_surface_events,
        open_ticks=snap.open_ticks,
        backlog_skipped=snap.backlog_skipped,
        pages_folded=snap.pages_folded,
    )
    for full in (False, True):
        for accept in (None, "application/openmetrics-text"):
            got, _ = render(snap, [], accept, full=full)
            want, _ = render(crafted, [], accept, full=full)
            lines = [
                (g, w)
                for g, w in zip(got.splitlines(), want.splitlines(), strict=True)
                if b"process_" not in g
            ]
            assert all(g == w for g, w in lines), (full, accept)
    assert snap.columns.attention_order().tolist() == attention_order(views)
    for order in ("config", "attention"):
        for limit in (1, 7, 100):
            assert page_rows(snap, limit, None, order) == page_rows(crafted, limit, None, order)


def test_a_scrape_copies_no_contributor_and_a_page_only_its_own(pipeline, monkeypatch):
    p = pipeline
    read: list[int] = []
    hitters = {id(h): row for row, h in enumerate(p.table.hitters)}
    top = HeavyHitters.top

    def counting(self: HeavyHitters, n: int) -> list[tuple[str, int]]:
        read.append(hitters[id(self)])
        return top(self, n)

    monkeypatch.setattr(HeavyHitters, "top", counting)
    p.snapshot(T0, 5, {}, {}, SnapshotRequest())
    assert read == []
    snap = p.snapshot(T0, 5, {}, {}, SnapshotRequest(limit=4, after="egress/e2"))
    assert sorted(read) == [3, 4, 5, 6] and snap.page == [3, 4, 5, 6] and snap.more
    body = surfaces_json(snap, snap.page)
    assert [s["surface"] for s in body["surfaces"]] == ["e3", "e4", "e5", "e6"]
    assert all(s["top_contributors"] for s in body["surfaces"])
    read.clear()
    snap = p.snapshot(T0, 5, {}, {}, HistoryRequest(3))
    assert snap.history is not None and sorted(read) == sorted(snap.history.rows)
    # A cursor naming no surface is the page's error, not an exception on the pipeline thread.
    snap = p.snapshot(T0, 5, {}, {}, SnapshotRequest(limit=4, after="egress/gone"))
    assert snap.page is None and snap.page_error
