"""/metrics is written by exporters/textformat.py, not by prometheus_client's generate_latest
(thirty times slower at 100,000 surfaces): for the same families the two must agree byte for
byte, hostile names and every kind of value included."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from test_status_page import crafted_snapshot

from exporters import textformat
from exporters.prometheus import (
    alert_families,
    budget_families,
    render,
    source_families,
    spike_families,
    surface_families,
)
from exporters.textformat import Columns, render_text


class _Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def reference(families) -> bytes:
    """What prometheus_client writes for the same families."""
    registry = CollectorRegistry(auto_describe=False)
    metrics = [f.metric() if isinstance(f, Columns) else f for f in families]
    registry.register(_Fixed(metrics))
    return exposition.generate_latest(registry)


VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, math.inf, -math.inf, math.nan, 1e21, 1234567.0, 5e-324]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
)
LABEL_TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from('\\"\n{}=,'),
    max_size=12,
)


@st.composite
def families(draw: st.DrawFn) -> list:
    out = []
    for i in range(draw(st.integers(1, 5))):
        typ = draw(st.sampled_from(["counter", "gauge", "unknown"]))
        names = draw(st.sampled_from([(), ("surface", "kind"), ("kind", "surface", "horizon")]))
        size = draw(st.integers(0, 6))
        rows = [tuple(draw(LABEL_TEXT) for _ in names) for _ in range(size)]
        values = [draw(VALUES) for _ in range(size)]
        doc = draw(st.sampled_from(["Plain.", "Back\\slash and\nnewline.", "Ünïcode ✓"]))
        if not names:
            rows, values = rows[:1], values[:1]
        out.append(Columns(f"capalarm_f{i}", doc, typ, names, rows, values))
    # prometheus_client's own families too, as the process collector and the source and
    # service families are.
    g = GaugeMetricFamily("capalarm_g", "A gauge.", labels=["source"])
    g.add_metric([draw(LABEL_TEXT)], draw(VALUES))
    c = CounterMetricFamily("capalarm_c", "A counter.", value=draw(VALUES))
    info = InfoMetricFamily("capalarm_build", "Build.", value={"version": draw(LABEL_TEXT)})
    return [*out, g, c, info]


def test_the_native_series_writer_is_built_in_ci():
    # In CI the extension must be built and agree with prometheus_client: a missing
    # compiler or a formatting change there fails, it never falls back silently.
    if os.environ.get("CI") or textformat.native_module is not None:
        assert textformat.native_series() is not None, textformat.code_path()
    else:
        pytest.skip("exporters._textformat not built here: no C compiler at install time")


PATHS = pytest.mark.parametrize("native", [True, False], ids=["native", "python"])


@PATHS
@settings(max_examples=300, deadline=None)
@given(fams=families())
def test_the_fast_writer_agrees_with_prometheus_client_byte_for_byte(native, fams):
    assert render_text(fams, native=native) == reference(fams)


@PATHS
def test_a_snapshot_with_hostile_names_renders_as_prometheus_client_renders_it(native):
    snap = crafted_snapshot()
    fams = [
        *surface_families(snap),
        *spike_families(snap),
        *budget_families(snap),
        *alert_families(snap),
        *source_families(snap),
    ]
    body = render_text(fams, native=native)
    assert body == reference(fams)
    assert b'surface="paste-board"' in body and b"capalarm_surface_written_bytes_total{" in body


def test_openmetrics_is_still_written_when_asked_for():
    body, content_type = render(crafted_snapshot(), [], "application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    assert (
        body.endswith(b"# EOF\n") and b'capalarm_surface_written_bytes_total{kind="egress"' in body
    )


def test_the_native_writer_steps_aside_when_prometheus_client_formats_otherwise(monkeypatch):
    # prometheus_client has changed how it writes large values (Go's exponent form) before:
    # where the installed one disagrees with the native formatting, Python writes the lines.
    if textformat.native_module is None:
        pytest.skip("exporters._textformat not built here: no C compiler at install time")

    def older(d: float) -> str:  # prometheus_client < 0.20 wrote 1234567.0 as 1.234567e+06
        s = repr(float(d))
        return "1.234567e+06" if d == 1234567.0 else s

    monkeypatch.setattr(textformat, "floatToGoString", older)
    assert textformat.native_series() is None
    assert "python" in textformat.code_path()
