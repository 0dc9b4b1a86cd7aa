"""The status page at / and the history behind it (alarm/history.py, exporters/statuspage.py).

The layout is checked the way a person would see it: headless Chromium (Debian ``chromium``,
tests/chromium.py) loads the page from the real HTTP server at 1280 px and at 390 px (a phone,
with the page's viewport meta in force), takes screenshots, and reads the element boxes: every
surface is there with its figures and its chart, and nothing is wider than the screen."""

from __future__ import annotations

import html
import json
import math
import re
import zlib
from pathlib import Path

import numpy as np

from alarm.collectors.kernel.synthetic import Flow, SyntheticCollector
from alarm.config import config_from_dict
from alarm.events import SourceHealth
from alarm.history import MAX_SLOTS, History, HistoryRequest, attention_order, slot_layout
from alarm.pipeline import Pipeline
from alarm.snapshot import CanarySourceView, CanaryView, Snapshot, SourceView, SurfaceView
from exporters.http import HttpServer
from exporters.statuspage import PAGE_SURFACES, human, nice_top, render_page
from tests.chromium import chromium, png_size
from tests.servicekit import get, running_service, wait_for

NOW = 1_790_000_000.0
LONG_NAME = "a-surface-name-that-is-as-long-as-the-config-allows-0123456789"  # 63 chars
HOSTILE = "<script>alert(1)</script>\x1b[31m" + "x" * 5000


# -- history ----------------------------------------------------------------------------
def test_slots_are_bounded_whatever_the_tick():
    for tick in (0.05, 0.5, 1.0, 3.0, 7.0, 10.0, 60.0, 600.0, 3600.0):
        slot, slots = slot_layout(tick)
        assert slots <= MAX_SLOTS
        assert slot >= 10.0 and math.isclose(slot / tick, round(slot / tick))  # whole ticks
        assert slot * slots >= 3600.0 - 1e-6 or slots == MAX_SLOTS
    assert slot_layout(10.0) == (10.0, 360)
    assert slot_layout(60.0) == (60.0, 60)


def test_short_ticks_are_downsampled_keeping_each_slots_peak():
    h = History(rows=2, tick=1.0)
    assert (h.slot_seconds, h.slots) == (10.0, 360)
    rng = np.random.default_rng(3)
    rates = rng.uniform(0, 100, size=(2 * 3600, 2))
    rates[7000, 0] = 5000.0  # a one-tick spike
    for t in range(2 * 3600):
        thr = np.array([np.nan if t < 3000 else 200.0, 150.0])
        h.record(NOW + t + 1, rates[t], thr, np.array([t / 7200, 0.0]))
    w = h.window([0, 1])
    assert w.rate.shape == (2, 360) and w.starts.shape == (360,)
    assert w.rate.dtype == np.float32
    # Only the last hour is kept, oldest slot first, each slot the largest of its ten ticks.
    assert w.starts[-1] + 10.0 > NOW + 7200 - 10 and np.all(np.diff(w.starts) == 10.0)
    ends = NOW + np.arange(1, 7201)
    for j in (0, 100, 359):
        in_slot = (ends - 0.5 >= w.starts[j]) & (ends - 0.5 < w.starts[j] + 10.0)
        assert np.isclose(w.rate[0, j], rates[in_slot, 0].max(), rtol=1e-6)
    assert w.rate[0].max() == 5000.0
    # A threshold is NaN while not judged; judged all of the last hour here.
    assert np.all(np.isfinite(w.threshold[0])) and np.all(w.threshold[1] == 150.0)


def test_memory_at_100k_surfaces_is_what_docs_scaling_says():
    h = History(rows=100_000, tick=10.0)
    assert h.nbytes() == 360 * 100_000 * 3 * 4  # 432 MB, in docs/scaling.md
    assert "432 MB" in (Path(__file__).parent.parent / "docs" / "scaling.md").read_text()


def pipeline(surfaces: int = 2) -> Pipeline:
    return Pipeline(
        config_from_dict(
            {
                "tick": "1s",
                "surfaces": [
                    {"name": f"s{i}", "match": {"dport": [i + 1]}} for i in range(surfaces)
                ],
            }
        )
    )


def run_ticks(p: Pipeline, ticks: int, start: float = NOW) -> None:
    n = len(p.table)
    for t in range(ticks):
        nbytes = np.full(n, 100.0 * (t + 1))
        p._evaluate(start + t + 1, nbytes, np.ones(n), nbytes, {}, False, True)


def test_a_learning_surface_has_no_threshold_in_its_history():
    p = pipeline()
    run_ticks(p, 30)
    snap = p.snapshot(NOW + 30, 10, {}, {}, HistoryRequest(10))
    assert snap.history is not None
    assert all(not s.baseline_ready for s in snap.surfaces)
    assert np.all(np.isnan(snap.history.threshold))  # learning: NaN, never 0
    filled = np.isfinite(snap.history.rate[0])
    assert filled.sum() == 3  # 30 one-second ticks in three 10-s slots
    # The budget column is excess / tolerance: 0 while the surface is under its allowance.
    assert np.all(snap.history.budget_ratio[np.isfinite(snap.history.budget_ratio)] >= 0)


def test_the_metrics_snapshot_carries_no_history_and_a_request_picks_surfaces():
    p = pipeline(5)
    run_ticks(p, 12)
    assert p.snapshot(NOW, 10, {}, {}).history is None
    w = p.snapshot(NOW, 10, {}, {}, HistoryRequest(2)).history
    assert w is not None and len(w.rows) == 2
    named = p.snapshot(NOW, 10, {}, {}, HistoryRequest(10, frozenset({"s3"}))).history
    assert named is not None and [p.detector.keys[r][1] for r in named.rows] == ["s3"]


def test_a_reload_keeps_the_charts_of_the_surfaces_it_keeps():
    old = pipeline(2)
    run_ticks(old, 20)
    new = pipeline(3)  # s2 is new
    new.adopt_history(old)
    keys = new.detector.keys
    w = new.history.window(range(len(keys)))
    by_name = {keys[r][1]: j for j, r in enumerate(w.rows)}
    assert np.isfinite(w.rate[by_name["s0"]]).sum() == 2
    assert np.isfinite(w.rate[by_name["s2"]]).sum() == 0


# -- the page, rendered ---------------------------------------------------------------
def view(name: str, kind: str = "egress", **kw) -> SurfaceView:
    base = dict(
        kind=kind,
        name=name,
        bytes_total=123_456,
        events_total=789,
        rate=1234.5,
        events_rate=3.0,
        baseline=85.0,
        threshold=0.0,
        baseline_ready=False,
        capacity_bps=9876.0,
        budget_excess=1000.0,
        budget_allowance=100.0,
        budget_tolerance=65536.0,
        spike_state=0,
        budget_state=0,
        contributors=[("10.0.0.5:443/TCP", 120_000)],
        contributors_error=0,
        budget_horizons=[("1m", 100.0, 65536.0, 1000.0), ("1h", 2.0, 24576.0, 12000.0)],
        learning=True,
    )
    base.update(kw)
    return SurfaceView(**base)


def crafted_snapshot() -> Snapshot:
    """Every state a surface can show, a name as long as the config allows, hostile text in
    evidence and errors, and an hour of history for each."""
    surfaces = [
        view("proxy", baseline=5000.0, threshold=40_000.0, baseline_ready=True, learning=False),
        view("learner", baseline=85.0, threshold=0.0),  # the old "baseline 85, threshold 0" row
        view(
            "paste-board",
            rate=64_000.0,
            spike_state=2,
            budget_state=2,
            contributors=[(HOSTILE, 64_000), ("10.30.0.7:80/TCP", 900)],
            rule_alert_states={"beacon": 0},
        ),
        view(LONG_NAME, kind="fs", rate=9.9e9, budget_state=1, rule_alert_states={"drop": 0}),
        view("unclassified", kind="registry", rate=0.0, bytes_total=0, contributors=[]),
    ]
    n = len(surfaces)
    h = History(n, 10.0)
    rng = np.random.default_rng(1)
    for t in range(360):
        rate = rng.uniform(100, 2000, n)
        rate[2] = 60_000.0 if t > 330 else 500.0
        if 100 <= t < 130:
            rate[4] = np.nan  # an outage: a gap in the line
        thr = np.array([40_000.0, np.nan, np.nan, np.nan, np.nan])  # only proxy is judged
        ratio = np.array([0.01, 0.2, min(1.4, t / 250), 0.9, 0.0])
        h.record(NOW - 3600 + (t + 1) * 10, rate, thr, ratio)
    window = h.window(list(range(n)))
    sources = [
        SourceView(
            "kernel",
            "kmsg",
            "egress",
            SourceHealth(up=True, caught_up=True, provenance_verified=True, last_record_ts=NOW - 2),
            {"records_read": 123_456, "records_lost": 0, "forged_records": 2},
            {"records_read": "Records read."},
        ),
        SourceView(
            "scratch-watch",
            "fs",
            "fs",
            SourceHealth(up=True, blind="watched tree /srv/scratch is gone " + HOSTILE),
            {"records_read": 10},
            {"records_read": "Records read."},
        ),
        SourceView(
            "internal-pypi",
            "registry",
            "registry",
            SourceHealth(up=False, errors=4, last_error=HOSTILE, last_error_at=NOW - 30),
            {},
            {},
        ),
    ]
    canary = CanaryView(
        "10.255.255.1",
        9,
        "sandbox",
        60.0,
        30.0,
        sent=42,
        send_errors=0,
        last_sent=NOW - 10,
        last_error="",
        sources=[CanarySourceView("kernel", 41, 1, NOW - 9.9, 0.004, "")],
    )
    return Snapshot(
        taken_at=NOW,
        tick=10.0,
        ticks=360,
        last_tick_end=NOW,
        last_tick_seconds=0.001,
        surfaces=surfaces,
        sources=sources,
        source_alerts=[],
        unknown_surface_events=0,
        history=window,
        egress_canary=canary,
    )


RECENT = [
    {
        "fingerprint": "f1",
        "surface": "paste-board",
        "kind": "egress",
        "rule": "budget",
        "state": "firing",
        "previous": "pending",
        "at": NOW - 60,
        "started_at": NOW - 70,
        "summary": "paste-board carried 81 kbit over its budget " + HOSTILE,
        "contributors": [
            {"contributor": HOSTILE, "bytes": 64000, "receipt": {"package": HOSTILE}},
            {"contributor": "10.30.0.7:80/TCP", "bytes": 900},
        ],
    },
    {
        "fingerprint": "f3",
        "surface": "paste-board",
        "kind": "egress",
        "rule": "budget",
        "state": "firing",
        "previous": "pending",
        "at": NOW - 50,
        "started_at": NOW - 70,
        # The detector's own figures: the horizon it fired on, not the one closest now.
        "figures": {
            "budget_horizon": "1d",
            "budget_excess_bits": 60000.0,
            "budget_allowance_bits_per_second": 0.5,
            "budget_tolerance_bits": 65536.0,
        },
        "summary": "egress surface paste-board carried 60,000 bits above its 1d allowance of 0 "
        "bit/s (tolerance 65,536 bits; on course to pass it next tick)",
        "contributors": [],
    },
    {
        "fingerprint": "f4",
        "surface": "proxy",
        "kind": "egress",
        "rule": "budget",
        "state": "resolved",
        "previous": "firing",
        "at": NOW - 40,
        "started_at": NOW - 640,
        "figures": {
            "budget_horizon": "1h",
            "budget_excess_bits": 1200.0,
            "budget_allowance_bits_per_second": 2.0,
            "budget_tolerance_bits": 24576.0,
        },
        "summary": "egress surface proxy carried 1,200 bits above its 1h allowance of 2 bit/s "
        "(tolerance 24,576 bits; on course to pass it next tick) — resolved",
        "contributors": [],
    },
    {
        "fingerprint": "f5",
        "surface": "proxy",
        "kind": "egress",
        "rule": "spike",
        "state": "resolved",
        "previous": "firing",
        "at": NOW - 35,
        "started_at": NOW - 95,
        "figures": {"rate_bytes_per_second": 90.0},
        "summary": "egress surface proxy wrote 90 B/s against a baseline of 85 B/s — resolved",
        "contributors": [],
    },
    {
        "fingerprint": "f2",
        "source": "kernel",
        "kind": "source",
        "rule": "surface_blind",
        "state": "resolved",
        "previous": "firing",
        "at": NOW - 30,
        "started_at": NOW - 300,
        "summary": "kernel sees again",
        "contributors": [],
    },
]


def test_a_learning_surface_shows_learning_where_its_threshold_would_be():
    page = render_page(crafted_snapshot(), RECENT, 5)
    card = re.search(
        r'<article class="card surface learning" data-surface="learner".*?</article>', page
    )
    assert card, "the learning surface has its card"
    threshold = re.search(r'data-fig="threshold"><dt>threshold</dt><dd[^>]*>([^<]*)<', card[0])
    assert threshold and threshold[1] == "learning"
    judged = re.search(
        r'data-surface="proxy".*?data-fig="threshold"><dt>threshold</dt><dd[^>]*>([^<]*)<', page
    )
    assert judged and judged[1] == human(40_000.0, "B/s") == "40 kB/s"


def alert_html(page: str, fingerprint: str) -> str:
    found = re.search(rf'<div class="alert" data-alert="{fingerprint}">(.*?)</div>', page)
    assert found, fingerprint
    return html.unescape(re.sub(r"<[^>]+>", "", found[1]))


def test_a_resolved_budget_says_it_resolved_and_its_figures_not_the_firing_text():
    page = render_page(crafted_snapshot(), RECENT, 5)
    budget = alert_html(page, "f4")
    assert "on course to pass it next tick" not in budget
    assert (
        "egress surface proxy: budget resolved. When it resolved it carried 1,200 bits above "
        "its 1h allowance of 2 bit/s, under its tolerance of 24,576 bits"
    ) in budget
    assert "after 10 min" in budget
    spike = alert_html(page, "f5")
    assert "Resolved. When it resolved: egress surface proxy wrote 90 B/s" in spike
    assert "— resolved" not in spike
    assert "kernel sees again" in alert_html(page, "f2")  # a source's own words stay


def test_judged_and_learning_are_explained():
    page = render_page(crafted_snapshot(), RECENT, 5)
    states = re.search(r"<p class=meta id=states>(.*?)</p>", page, re.S)
    assert states and "judged</b>: quiet, and the spike rule has learned" in states[1]
    assert "learning</b>: quiet, its spike threshold not known" in states[1]


def test_a_firing_budget_names_the_horizon_it_fired_on():
    page = render_page(crafted_snapshot(), RECENT, 5)
    board = re.search(r'data-surface="paste-board".*?data-fig="budget">(.*?)</div>', page)
    assert board
    # Closest to its tolerance now: the 1h horizon; fired (a tick ahead) on the 1d one.
    assert "49% of 24.6 kbit (1h)" in board[1]
    assert '<span class="badge firing" data-fired="1d">firing on 1d</span>' in board[1]
    # Pending with no change on the page: the horizon closest to its tolerance.
    pending = re.search(rf'data-surface="{LONG_NAME}".*?data-fig="budget">(.*?)</div>', page)
    assert pending and 'data-fired="1h">pending on 1h</span>' in pending[1]
    quiet = re.search(r'data-surface="proxy".*?data-fig="budget">(.*?)</div>', page)
    assert quiet and "data-fired" not in quiet[1]


def test_charts_have_a_rate_scale_and_a_time_axis():
    page = render_page(crafted_snapshot(), RECENT, 5)
    card = re.search(r'data-surface="proxy".*?</article>', page)
    assert card
    labels = dict(
        re.findall(r'data-axis="(rate-top|rate-mid|budget-alarm)"[^>]*>([^<]*)<', card[0])
    )
    # Its threshold, 40 kB/s, is the largest figure: the scale's top is the next round one.
    assert labels == {"rate-top": "50 kB/s", "rate-mid": "25 kB/s", "budget-alarm": "100 %"}
    times = re.findall(r'data-axis="time"[^>]*>([^<]*)<', card[0])
    assert times == ["-60 min", "-45 min", "-30 min", "-15 min", "now"]
    assert [nice_top(v) for v in (0.0, 1.0, 1.5, 44_000.0, 50_001.0)] == [1, 1, 2, 50_000, 100_000]


def test_workload_text_is_escaped_and_bounded():
    page = render_page(crafted_snapshot(), RECENT, 5)
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\x1b" not in page
    assert "x" * 300 not in page  # sanitize() bounds each text at 200 characters
    assert page.count("<script>") == 1  # only the page's own reload


def test_the_page_shows_at_most_its_limit_those_needing_a_look_first():
    views = [view(f"s{i:03d}") for i in range(250)]
    views[200] = view("s200", spike_state=2)
    views[201] = view("s201", budget_state=1)
    n = len(views)
    h = History(n, 10.0)
    snap = Snapshot(NOW, 10.0, 1, NOW, 0.0, views, [], [], 0)
    snap.history = h.window(attention_order(views)[:PAGE_SURFACES])
    page = render_page(snap, [], n)
    names = re.findall(r'data-surface="([^"]+)"', page)
    assert len(names) == PAGE_SURFACES
    assert names[:2] == ["s200", "s201"]
    assert f"Showing 1&ndash;{PAGE_SURFACES:,} of {n:,} surfaces" in page
    assert 'href="/?page=2"' in page and 'href="/?page=0"' not in page


def test_the_next_page_shows_the_next_surfaces_in_the_same_order():
    """/?page=2: the surfaces after the first page's, in attention order, and links both
    ways; the last page links back only."""
    views = [view(f"s{i:03d}") for i in range(250)]
    views[240] = view("s240", spike_state=2)
    order = attention_order(views)
    pages = []
    for number in (1, 2, 3):
        snap = Snapshot(NOW, 10.0, 1, NOW, 0.0, views, [], [], 0)
        snap.history = History(len(views), 10.0).window(order[: PAGE_SURFACES * number])
        pages.append(render_page(snap, [], len(views), number))
    shown = [re.findall(r'data-surface="([^"]+)"', p) for p in pages]
    assert shown[0][0] == "s240"
    assert [views[i].name for i in order] == shown[0] + shown[1] + shown[2]
    assert len(shown[2]) == 50 and "Showing 201&ndash;250 of 250" in pages[2]
    assert 'href="/?page=1"' in pages[1] and 'href="/?page=3"' in pages[1]
    assert 'href="/?page=4"' not in pages[2] and 'href="/?page=2"' in pages[2]


# -- the page in a browser ---------------------------------------------------------------
LAYOUT_JS = """
(() => {
  const vw = document.documentElement.clientWidth;
  const box = (el) => { const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, width: r.width, height: r.height}; };
  const out = {vw, innerWidth: window.innerWidth,
               scrollWidth: document.documentElement.scrollWidth, surfaces: [], sources: [],
               alerts: document.querySelectorAll('#alerts .alert').length, wide: []};
  for (const card of document.querySelectorAll('article.surface')) {
    const figs = {};
    for (const f of card.querySelectorAll('[data-fig]')) {
      const dd = f.querySelector('dd');
      figs[f.dataset.fig] = Object.assign({text: dd.textContent}, box(dd));
    }
    const svg = card.querySelector('svg.chart');
    const axes = [...card.querySelectorAll('[data-axis]')].map(
      (el) => Object.assign({axis: el.dataset.axis, text: el.textContent}, box(el)));
    out.surfaces.push({name: card.dataset.surface, state: card.dataset.state,
      card: box(card), title: box(card.querySelector('h3')), figs, axes,
      chart: svg ? Object.assign({points: +svg.dataset.points,
                                  lines: svg.querySelectorAll('polyline').length}, box(svg))
                 : null});
  }
  for (const card of document.querySelectorAll('article.source, article.canary'))
    out.sources.push(Object.assign({name: card.dataset.source || card.dataset.canary}, box(card)));
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && (r.right > vw + 0.5 || r.left < -0.5))
      out.wide.push(el.tagName + '.' + el.className + ' ' + r.left + '..' + r.right);
  }
  return JSON.stringify(out);
})()
"""


def check_layout(layout: dict, expected: list[SurfaceView], width: int) -> None:
    vw = layout["vw"]
    assert vw == width, f"the viewport is {vw} px, not {width} (viewport meta missing?)"
    assert layout["scrollWidth"] <= vw, "the page scrolls sideways"
    assert layout["wide"] == [], f"elements past the screen edge: {layout['wide'][:5]}"
    got = {s["name"]: s for s in layout["surfaces"]}
    assert set(got) == {s.name for s in expected}
    for s in expected:
        card = got[s.name]
        c = card["card"]
        assert c["left"] >= 0 and c["right"] <= vw, s.name
        assert card["title"]["right"] <= c["right"] + 0.5, f"{s.name}: title cut off"
        for fig in ("rate", "threshold", "baseline", "capacity", "spike", "budget"):
            f = card["figs"][fig]
            assert f["width"] > 0 and f["height"] > 0, f"{s.name}: {fig} not shown"
            assert c["left"] <= f["left"] and f["right"] <= c["right"] + 0.5, (
                f"{s.name}: {fig} outside its card"
            )
        assert card["figs"]["rate"]["text"] == human(s.rate, "B/s")
        chart = card["chart"]
        assert chart is not None, f"{s.name}: no chart"
        assert chart["width"] >= min(280, vw - 60) and chart["height"] >= 80
        assert chart["right"] <= c["right"] and chart["lines"] >= 1 and chart["points"] > 0
        # The scale: labels shown, inside the card, bytes/s over the rate panel, the time
        # below the chart from left to right.
        axes = card["axes"]
        assert [a["axis"] for a in axes].count("time") == 5, s.name
        for a in axes:
            assert a["width"] > 0 and a["height"] > 0, f"{s.name}: {a['axis']} not shown"
            assert c["left"] - 0.5 <= a["left"] and a["right"] <= c["right"] + 0.5, (
                f"{s.name}: {a['axis']} label {a['text']!r} outside its card"
            )
        top = next(a for a in axes if a["axis"] == "rate-top")
        assert top["text"].endswith("B/s")
        chart_bottom = chart["top"] + chart["height"]
        assert chart["top"] - 0.5 <= top["top"] < chart["top"] + chart["height"] * 0.3
        times = [a for a in axes if a["axis"] == "time"]
        assert all(t["top"] >= chart_bottom - 0.5 for t in times), f"{s.name}: time axis"
        assert [t["left"] for t in times] == sorted(t["left"] for t in times)
        assert times[-1]["text"] == "now"


def check_png(data: bytes, blank: bytes, width: int) -> None:
    w, h = png_size(data)
    assert w == width and h >= 600, (w, h)
    # Non-trivial: far more than a blank page of the same width compresses to, and the image
    # data has the variety of text and lines (a blank page's filtered rows are nearly all 0).
    assert len(data) > 4 * len(blank) and len(data) > 20_000, (len(data), len(blank))
    chunks, i = [], 8
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "big")
        if data[i + 4 : i + 8] == b"IDAT":
            chunks.append(data[i + 8 : i + 8 + n])
        i += 12 + n
    raw = zlib.decompress(b"".join(chunks))
    assert len(set(raw)) > 100


async def serve(snap: Snapshot, recent: list[dict]) -> HttpServer:
    async def snapshot(_history):
        return snap

    server = HttpServer(snapshot, lambda: [], lambda: list(recent), lambda: (True, ""))
    await server.start("127.0.0.1", 0)
    return server


async def test_the_page_in_chromium_at_1280_and_390_px(tmp_path):
    snap = crafted_snapshot()
    server = await serve(snap, RECENT)
    url = f"http://127.0.0.1:{server.port}/"
    try:
        async with chromium(tmp_path) as browser:
            blank_page = await browser.page(390, 844, mobile=True)
            await blank_page.goto("about:blank")
            for width, height, mobile in ((1280, 800, False), (390, 844, True)):
                page = await browser.page(width, height, mobile=mobile)
                await page.goto(url)
                layout = json.loads(await page.evaluate(LAYOUT_JS))
                check_layout(layout, snap.surfaces, width)
                assert layout["alerts"] == len(RECENT)
                assert {s["name"] for s in layout["sources"]} >= {"kernel", "internal-pypi"}
                for s in layout["sources"]:
                    assert s["left"] >= 0 and s["right"] <= width
                lefts = {round(s["card"]["left"]) for s in layout["surfaces"]}
                # A laptop gets a grid of several columns, a phone one column.
                assert (len(lefts) >= 3) if width == 1280 else (len(lefts) == 1)
                shot = await page.screenshot()
                (tmp_path / f"status-{width}.png").write_bytes(shot)
                blank = await blank_page.screenshot(full_page=False)
                check_png(shot, blank, width)
    finally:
        await server.stop()


async def test_a_running_service_page_shows_every_surface_with_its_last_minutes(tmp_path):
    flows = [
        Flow("10.20.1.10", 443, "TCP", 20, 600),
        Flow("10.30.0.7", 80, "TCP", 8, 200),  # over paste-board's small budget: fires
    ]
    collector = SyntheticCollector("demo", flows, tick=0.5, interval=0.1)
    cfg = {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "demo"}],
        "surfaces": [
            {"name": "registry-proxy", "match": {"dst": ["10.20.0.0/16"], "dport": [443]}},
            {
                "name": "paste-board",
                "match": {"dst": ["10.30.0.7/32"], "dport": [80]},
                "budget": {"allowance_bits_per_second": 800, "tolerance_bits": 16000},
            },
        ],
    }
    async with running_service(cfg, collectors={"demo": collector}) as service:

        async def firing_with_history():
            snap = await service.snapshot(HistoryRequest(10))
            w = snap.history
            states = {s.name: s.budget_state for s in snap.surfaces}
            return (
                states.get("paste-board") == 2
                and w is not None
                and np.isfinite(w.rate).sum(axis=1).min() >= 2
            )

        await wait_for(firing_with_history, timeout=40)

        status, _, body = await get(service, "/api/v1/surfaces?history=1")
        assert status == 200
        doc = json.loads(body)
        slots = len(doc["history"]["slot_starts"])
        assert doc["history"]["slot_seconds"] == 10.0 and slots == 360
        for s in doc["surfaces"]:
            hist = s["history"]
            assert len(hist["rate_bytes_per_second"]) == slots
            assert hist["rate_bytes_per_second"][0] is None  # before the service started
            assert all(v is None for v in hist["threshold_bytes_per_second"])  # learning
        _, _, plain = await get(service, "/api/v1/surfaces")
        assert "history" not in json.loads(plain)["surfaces"][0]
        _, _, one = await get(service, "/api/v1/surfaces?history=1&surface=paste-board")
        with_history = [s["surface"] for s in json.loads(one)["surfaces"] if "history" in s]
        assert with_history == ["paste-board"]

        snap = await service.snapshot(HistoryRequest(10))
        async with chromium(tmp_path) as browser:
            page = await browser.page(390, 844, mobile=True)
            await page.goto(f"http://127.0.0.1:{service.http_port}/")
            layout = json.loads(await page.evaluate(LAYOUT_JS))
            assert layout["vw"] == 390 and layout["scrollWidth"] <= 390
            got = {s["name"]: s for s in layout["surfaces"]}
            assert set(got) == {s.name for s in snap.surfaces}
            assert got["paste-board"]["state"] == "firing"
            assert got["registry-proxy"]["figs"]["threshold"]["text"] == "learning"
            assert all(s["chart"]["points"] >= 2 for s in got.values())
            assert layout["alerts"] >= 1  # the budget alert, with its time and evidence
            shot = await page.screenshot()
            (tmp_path / "service-390.png").write_bytes(shot)
            assert png_size(shot)[0] == 390
