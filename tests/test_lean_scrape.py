"""The lean scrape (issue 29): at most 10 series a surface by default and every figure in
``http.metrics: full``; a body written at a cost proportional to what changed (the scrape
cache writes what render_text writes, byte for byte, scrape after scrape); gzip when the
scraper takes it; the status page's and the API's pages (issue 28)."""

from __future__ import annotations

import gzip
import math
import zlib

import aiohttp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_status_page import crafted_snapshot, view

from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.synthetic import fence_line
from alarm.config import config_from_dict
from exporters import textformat
from exporters.prometheus import accepts_gzip, all_families, budget_figures, render
from exporters.textformat import Columns, ScrapeCache, render_text
from tests.servicekit import RecordsCollector, get, running_service, wait_for

PREFIX = "EGRESS_FENCE tlean"
PATHS = pytest.mark.parametrize("native", [True, False], ids=["native", "python"])


def series_of(body: bytes) -> list[bytes]:
    return [line for line in body.splitlines() if line and not line.startswith(b"#")]


# -- what a scrape holds ---------------------------------------------------------------------
def test_a_surface_costs_at_most_ten_series_and_full_restores_every_family():
    snap = crafted_snapshot()
    n = len(snap.surfaces)
    lean = render_text(all_families(snap, []))
    full = render_text(all_families(snap, [], full=True))
    per_surface = [s for s in series_of(lean) if b"surface=" in s or b"target_type=" in s]
    firing = [s for s in per_surface if s.startswith(b"capalarm_alert_state{")]
    assert len(per_surface) - len(firing) <= 9 * n
    assert len(per_surface) <= 10 * n
    # Alert states only where a rule is away from rest (paste-board's spike and budget fire,
    # the long-named surface's budget is pending): no 0 is written for a surface.
    assert all(not s.endswith(b" 0.0") for s in firing if b'target_type="surface"' in s)
    states = sum(len(v.rule_states()) for v in snap.surfaces)
    active = sum(1 for v in snap.surfaces for st in v.rule_states().values() if st)
    assert len([s for s in firing if b'target_type="surface"' in s]) == active < states
    # Full: every horizon, the per-rule gauges, every state with its 0.
    full_names = {s.split(b"{")[0] for s in series_of(full)}
    for name in (
        b"capalarm_surface_budget_horizon_excess_bytes",
        b"capalarm_surface_budget_horizon_allowance_bytes_per_second",
        b"capalarm_surface_seasonal_budget_ratio",
        b"capalarm_surface_baseline_ready",
        b"capalarm_surface_write_events_per_second",
    ):
        assert name in full_names and name not in {s.split(b"{")[0] for s in series_of(lean)}
    full_states = [s for s in series_of(full) if b'target_type="surface"' in s]
    assert len(full_states) == states
    # Both modes have what the rules and dashboards read.
    for body in (lean, full):
        assert (
            b'capalarm_surface_info{baseline_ready="1",budget_misconfigured="0",kind="egress"'
            in body
        )
        assert b"capalarm_surface_budget_ratio{" in body
        assert b"capalarm_kind_budget_horizon_allowance_bytes_per_second{" in body


def test_the_budget_ratio_is_the_horizon_nearest_to_firing_and_the_hour_the_least_bucket():
    v = view("x")
    v.budget_horizons = [
        ("1m", 800.0, 8000.0, 4000.0),
        ("1h", 80.0, 8e6, 6e6),
        ("1d", 8.0, math.inf, 1e9),
    ]
    v.seasonal_ratio, v.seasonal_judged = 0.9, False  # not judging: not counted
    ratio, hour = budget_figures(v)
    assert ratio == 0.75
    assert hour == min(800 + 8000 / 3600, 80 + 8e6 / 3600, math.inf) / 8
    v.seasonal_judged = True
    assert budget_figures(v)[0] == 0.9


@pytest.mark.parametrize(
    ("header", "takes"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("deflate, GZIP;q=0.5", True),
        ("gzip;q=0", False),
        ("identity", False),
        ("", False),
        (None, False),
        ("gzip;q=garbage", False),
    ],
)
def test_gzip_is_taken_as_the_header_says(header, takes):
    assert accepts_gzip(header) is takes


# -- the scrape cache writes what render_text writes ------------------------------------------
VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, math.inf, -math.inf, math.nan, 1e21, 1234567.0]),
    st.floats(allow_nan=True, allow_infinity=True),
)
NAMES = st.sampled_from(["a", "b", 'q"uote', "back\\slash", "new\nline", "ü"])


@st.composite
def scrapes(draw: st.DrawFn) -> list[list[Columns]]:
    """A few scrapes of the same families: values that change or not, rows relabelled,
    surfaces added and removed, a family that comes and goes."""
    n = draw(st.integers(0, 40))
    rows = [(f"s{i}", draw(NAMES)) for i in range(n)]
    values = [[draw(VALUES) for _ in range(n)] for _ in range(3)]
    out = []
    for k in range(draw(st.integers(2, 5))):
        what = draw(st.sampled_from(["same", "some", "all", "relabel", "resize"]))
        if what == "some" and rows:
            for i in draw(st.lists(st.integers(0, len(rows) - 1), max_size=5)):
                for col in values:
                    col[i] = draw(VALUES)
        elif what == "all":
            values = [[draw(VALUES) for _ in rows] for _ in range(3)]
        elif what == "relabel" and rows:
            i = draw(st.integers(0, len(rows) - 1))
            rows = list(rows)
            rows[i] = (rows[i][0], draw(NAMES))
        elif what == "resize":
            m = draw(st.integers(0, 40))
            rows = [(f"s{i}", "k") for i in range(m)]
            values = [[draw(VALUES) for _ in range(m)] for _ in range(3)]
        shared = list(rows)
        fams = [
            Columns("capalarm_a", "A counter.", "counter", ["surface", "kind"], shared, values[0]),
            Columns("capalarm_b", "A gauge.", "gauge", ["surface", "kind"], shared, values[1]),
            Columns(
                "capalarm_c", "Info.", "info", ["kind", "surface"], list(rows), [1.0] * len(rows)
            ),
        ]
        if k % 2:
            fams.append(
                Columns(
                    "capalarm_d",
                    "Now and then.",
                    "gauge",
                    [],
                    [()],
                    [values[2][0] if rows else 0.0],
                )
            )
        out.append(fams)
    return out


@PATHS
@settings(max_examples=150, deadline=None)
@given(seq=scrapes(), gz=st.booleans())
def test_the_cache_writes_what_render_text_writes_scrape_after_scrape(native, seq, gz):
    cache = ScrapeCache(native=native, block_rows=7)  # small blocks: splices across blocks
    for fams in seq:
        body = cache.render(fams, gzip=gz)
        want = render_text(fams, native=False)
        assert (gzip.decompress(body) if gz else body) == want


def test_a_scrape_after_a_few_changes_writes_only_those_lines_and_their_blocks():
    n = 20_000
    rows = [(f"s{i}", "egress") for i in range(n)]
    rng = np.random.default_rng(3)
    values = rng.lognormal(6, 1.5, n).tolist()
    cache = ScrapeCache(block_rows=1000)
    fams = [Columns("capalarm_r", "R.", "gauge", ["surface", "kind"], rows, values)]
    first = cache.render(fams, gzip=True)
    assert cache.stats.lines_written == n and cache.stats.blocks_deflated == 21  # + its header
    values = list(values)
    for i in (5, 6, 15_001):
        values[i] += 1.0
    fams = [Columns("capalarm_r", "R.", "gauge", ["surface", "kind"], list(rows), values)]
    second = cache.render(fams, gzip=True)
    assert cache.stats.lines_written == 3
    assert cache.stats.blocks_written == 2 and cache.stats.blocks_deflated == 2
    assert gzip.decompress(second) == render_text(fams)
    assert zlib.decompress(first, 31) != zlib.decompress(second, 31)
    # Nothing changed: nothing written, nothing compressed again.
    cache.render(fams, gzip=True)
    assert cache.stats.lines_written == 0 and cache.stats.blocks_deflated == 0


def test_the_native_block_writer_is_used_where_it_agrees():
    if textformat.native_module is None:
        pytest.skip("exporters._textformat not built here: no C compiler at install time")
    assert ScrapeCache()._native is textformat.native_module


# -- over HTTP -------------------------------------------------------------------------------
def records(n: int) -> list[KernelRecord]:
    line = fence_line(PREFIX, "10.40.0.9", 443, "TCP", 700, 40000)
    return [KernelRecord(ts=0, message=line, facility=0, trusted=True) for _ in range(n)]


def service_config(tmp_path, metrics: str | None = None) -> dict:
    cfg = {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        "sources": [{"name": "kernel", "prefixes": [PREFIX]}],
        "surfaces": [
            {"name": f"s{i:03d}", "match": {"dst": [f"10.40.{i}.0/24"]}} for i in range(120)
        ],
    }
    if metrics:
        cfg["http"] = {"listen": "127.0.0.1:0", "metrics": metrics}
    return cfg


async def fetch(port: int, path: str, **headers: str) -> tuple[int, dict, bytes]:
    """The raw answer: aiohttp's client neither asks for gzip nor decompresses."""
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


@pytest.mark.parametrize("mode", ["lean", "full"])
async def test_metrics_are_gzipped_when_asked_and_the_mode_is_the_configs(tmp_path, mode):
    collector = RecordsCollector("kernel", records(30), (PREFIX,), 0.5)
    cfg = service_config(tmp_path, None if mode == "lean" else mode)
    async with running_service(cfg, collectors={"kernel": collector}) as service:
        port = service.http_port

        async def counted() -> bool:
            _, _, body = await fetch(port, "/metrics", **{"Accept-Encoding": "identity"})
            return (
                b'capalarm_surface_written_bytes_total{kind="egress",surface="s000"} 21000.0'
                in body
            )

        await wait_for(counted, timeout=20)
        status, headers, zipped = await fetch(port, "/metrics", **{"Accept-Encoding": "gzip"})
        _, plain_headers, plain = await fetch(port, "/metrics", **{"Accept-Encoding": "identity"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert "Content-Encoding" not in plain_headers and "Accept-Encoding" in headers["Vary"]
    body = gzip.decompress(zipped)
    assert len(zipped) * 5 < len(body)
    surfaces = 120 + 2  # and the unclassified one, and the kind's aggregate
    per_surface = [s for s in series_of(body) if b"surface=" in s or b'target_type="surface"' in s]
    plain_series = [
        s for s in series_of(plain) if b"surface=" in s or b'target_type="surface"' in s
    ]
    # The same series both ways (values may have moved on between the two scrapes).
    assert [s.rsplit(b" ", 1)[0] for s in per_surface] == [
        s.rsplit(b" ", 1)[0] for s in plain_series
    ]
    if mode == "lean":
        assert len(per_surface) <= 10 * surfaces
        assert b"capalarm_surface_budget_horizon_excess_bytes" not in body
    else:
        assert len(per_surface) > 20 * surfaces
        assert (
            b'capalarm_surface_budget_horizon_excess_bytes{horizon="1m",kind="egress",surface="s000"}'
            in body
        )


def test_an_unknown_metrics_mode_is_a_config_error():
    with pytest.raises(Exception, match="metrics"):
        config_from_dict({"http": {"metrics": "tiny"}})


async def test_the_status_page_goes_page_by_page_and_refuses_a_page_out_of_range(tmp_path):
    collector = RecordsCollector("kernel", records(5), (PREFIX,), 0.5)
    async with running_service(
        service_config(tmp_path), collectors={"kernel": collector}
    ) as service:
        _, _, first = await get(service, "/")
        _, _, second = await get(service, "/?page=2")
        bad = [(await get(service, f"/?page={p}"))[0] for p in ("0", "11", "x")]
    assert "Showing 1&ndash;100 of 122 surfaces" in first and 'href="/?page=2"' in first
    assert "Showing 101&ndash;122 of 122 surfaces" in second
    assert second.count('class="card surface') == 22
    assert bad == [400, 400, 400]


def test_render_without_a_cache_gzips_too():
    snap = crafted_snapshot()
    zipped, _ = render(snap, [], None, gzip=True)
    plain, _ = render(snap, [], None)

    def ours(body: bytes) -> list[bytes]:  # the process' own figures move between the two
        return [line for line in body.splitlines() if b"process_" not in line]

    assert ours(gzip.decompress(zipped)) == ours(plain)
