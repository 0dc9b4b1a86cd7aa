"""The fence reader turns a large batch of records into the same write events through the
native scanner as it does record by record through parse_fence, and the pipeline counts them
on the surfaces their flows classify to."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fastscan import _TRICKY
from test_netfilter import fence_lines

from alarm.collectors.kernel import fence as fence_module
from alarm.collectors.kernel.fastscan import native_available
from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.records import KernelRecord
from alarm.config import config_from_dict
from alarm.events import Batch
from alarm.pipeline import Pipeline

PFX = ("EGRESS_FENCE",)
CONFIG = {
    "surfaces": [
        {"name": "proxy", "match": {"dst": ["10.0.0.0/8", "2001:db8::/32"], "proto": ["tcp"]}},
        {"name": "dns", "match": {"dport": [53], "proto": ["udp"]}},
        {"name": "owned", "match": {"uid": [0, 1000], "out": ["eth+"]}},
    ]
}

pytestmark = pytest.mark.skipif(
    not native_available() and not os.environ.get("CI"),
    reason="alarm._fastscan not built here (no C compiler at install time)",
)


@st.composite
def records(draw: st.DrawFn) -> list[KernelRecord]:
    out = []
    for _ in range(draw(st.integers(0, 80))):
        kind = draw(st.sampled_from(["fence", "fence", "fence", "tricky", "other", "newline"]))
        msg = draw(fence_lines())[0]
        if kind == "tricky":
            pos = draw(st.integers(0, len(msg)))
            msg = msg[:pos] + draw(st.sampled_from(_TRICKY)) + msg[pos:]
        elif kind == "other":
            msg = draw(st.sampled_from(["usb 1-1: hi", "EGRESS_FENC x", "x EGRESS_FENCE IN="]))
        elif kind == "newline":
            msg = msg[:20] + "\n" + msg[20:]
        if draw(st.booleans()):
            msg = msg.rstrip(" ")
        out.append(KernelRecord(ts=0.0, message=msg, facility=0, trusted=draw(st.booleans())))
    return out


def counted(recs: list[KernelRecord], require_trusted: bool, batch: int) -> tuple:
    pipe = Pipeline(config_from_dict(CONFIG))
    fence_module.NATIVE_BATCH, saved = batch, fence_module.NATIVE_BATCH
    try:
        read = FenceReader(PFX, require_trusted, tick=1.0).read(recs)
    finally:
        fence_module.NATIVE_BATCH = saved
    pipe.apply("kernel", Batch(read.events), None)
    table = pipe.table
    surfaces = {
        key: (
            int(table.bytes_total[i]),
            int(table.events_total[i]),
            sorted(table.hitters[i].top(1000)),
        )
        for i, key in enumerate(table.keys)
    }
    return surfaces, read.parse_errors, read.forged


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records(), require_trusted=st.booleans())
def test_native_batch_counts_as_record_by_record(recs, require_trusted) -> None:
    assert counted(recs, require_trusted, 1) == counted(recs, require_trusted, 10**9)


def test_native_batch_is_used_and_counts_every_byte() -> None:
    line = "EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.2 DST=10.1.2.3 LEN={} PROTO=TCP SPT=1 DPT=443 "
    recs = [KernelRecord(0.0, line.format(n), 0, trusted=True) for n in range(100, 200)]
    recs.append(KernelRecord(0.0, line.format(7), 8, trusted=False))  # user space wrote it
    surfaces, errors, forged = counted(recs, True, 1)
    assert surfaces[("egress", "proxy")][:2] == (sum(range(100, 200)), 100)
    assert surfaces[("egress", "proxy")][2] == [("10.1.2.3:443/TCP", sum(range(100, 200)))]
    assert (errors, forged) == (0, 1)
