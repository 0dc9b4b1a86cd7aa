"""Who wrote it, on egress (issue 27): where the fence logs the socket's owner (nftables
``log flags skuid``: ``UID=1000 GID=1000``), the UIDs that wrote to a destination are that
contributor's evidence, in the alert and its payload, and never a metric label; so is the log
prefix of a workload's own fence rule (``socket cgroupv2 ... log prefix "EGRESS_FENCE a17 "``)."""

from __future__ import annotations

import io
import json

import pytest

from alarm.backtest import run_backtest
from alarm.collectors.kernel import fence as fence_module
from alarm.collectors.kernel.fastscan import FlowScan
from alarm.collectors.kernel.fence import FenceReader, FlowContributors
from alarm.collectors.kernel.records import KernelRecord
from alarm.config import config_from_dict
from alarm.events import Batch
from alarm.pipeline import Pipeline
from exporters.payload import LinkSet, alert_document
from exporters.prometheus import render

LINE = (
    "{prefix} IN= OUT=eth0 SRC=10.0.0.2 DST={dst} LEN={n} TOS=0x00 PREC=0x00 TTL=64 ID=1 "
    "DF PROTO=TCP SPT=40000 DPT=443 WINDOW=64 RES=0x00 ACK PSH URGP=0 {owner}"
)
CONFIG = {"tick": "10s", "surfaces": [{"name": "proxy", "match": {"dport": [443]}}]}


def line(dst: str, n: int, uid: int | None, prefix: str = "EGRESS_FENCE") -> str:
    owner = "" if uid is None else f"UID={uid} GID={uid} "
    return LINE.format(prefix=prefix, dst=dst, n=n, owner=owner)


@pytest.mark.parametrize("batch", [1, 10**9], ids=["native", "per-record"])
def test_the_uids_the_fence_logged_are_each_destinations_evidence(batch) -> None:
    msgs = [line("10.1.2.3", 1000, 1000 + i % 2) for i in range(40)]  # two sandboxes
    msgs += [line("10.1.2.4", 500, 2000 + i) for i in range(6)]  # six, one each
    msgs += [line("10.1.2.5", 300, None) for _ in range(3)]  # logged without skuid
    msgs += [line("10.1.2.6", 300, None, "EGRESS_FENCE agent-17") for _ in range(3)]
    recs = [KernelRecord(0.0, m, 0, trusted=True) for m in msgs]
    fence_module.NATIVE_BATCH, saved = batch, fence_module.NATIVE_BATCH
    try:
        read = FenceReader(("EGRESS_FENCE",), require_trusted=True, tick=10.0).read(recs)
    finally:
        fence_module.NATIVE_BATCH = saved
    pipe = Pipeline(config_from_dict(CONFIG))
    assert pipe.close_until(0.0) == []  # the clock starts at tick 0
    pipe.apply("kernel", Batch(read.events, watermark=10.0), None)
    pipe.close_until(10.0)  # the tick's writers are credited when it is evaluated
    receipts = {c: r for c, _, r in pipe.table.evidence(pipe.table.index[("egress", "proxy")], 9)}
    # Evidence, not labels: /metrics has one series per surface, no UID anywhere.
    text = render(pipe.snapshot(20.0, 10, {}, {}), [], None)[0]
    text = text if isinstance(text, str) else text.decode()
    assert 'uid="' not in text and "1001" not in text
    assert receipts["10.1.2.3:443/TCP"] == {"uid": "1000,1001"}
    assert receipts["10.1.2.4:443/TCP"] == {"uid": "2000,2001,2002,2003,+2"}
    assert receipts["10.1.2.5:443/TCP"] is None
    assert receipts["10.1.2.6:443/TCP"] == {"prefix": "EGRESS_FENCE agent-17"}


def test_a_backtest_alert_names_the_uid_in_its_payload_and_never_in_metrics(tmp_path) -> None:
    dump = tmp_path / "kmsg.txt"
    rows = []
    for i in range(200):  # 20 s of quiet, then one sandbox writes 1.2 MB in a tick
        n = 100 if i < 100 else 12_000
        rows.append(f"4,{i},{i * 200_000},-;{line('10.1.2.3', n, 1000 if i < 100 else 4242)}")
    dump.write_text("\n".join(rows) + "\n")
    config = config_from_dict(
        {
            "tick": "10s",
            "surfaces": [
                {
                    "name": "proxy",
                    "match": {"dport": [443]},
                    "spike": {"absolute_bytes_per_second": 10_000},
                }
            ],
        }
    )
    out = io.StringIO()
    assert run_backtest(config, [str(dump)], out, workers=1).records == 200
    changes = [json.loads(x) for x in out.getvalue().splitlines()]
    (fired,) = [c for c in changes if c["rule"] == "spike" and c["state"] == "firing"]
    top = fired["contributors"][0]
    assert top["contributor"] == "10.1.2.3:443/TCP"
    # The UIDs that wrote to the destination in what was read with the tick that fired (a
    # backtest reads a whole chunk at once: the quiet sandbox's too).
    assert "4242" in top["receipt"]["uid"].split(",")
    doc = alert_document({"change": fired}, "k", LinkSet("http://capalarm/", None), 5)
    assert doc["top_contributors"][0]["receipt"] == top["receipt"]


def test_every_contributors_owners_are_found_at_once() -> None:
    """FlowOwners reads the receipts of all of a batch's contributors in one pass: one (UID,
    prefix) pair over all of a contributor's flows gives that pair's receipt, several are
    read from its flows; a contributor whose flows name no owner, or an index the table
    does not hold (``find`` gives -1 for a name it cannot read), has none."""
    scan = FlowScan()
    agent = "EGRESS_FENCE agent-17"
    rows = [
        (1.0, agent, "eth0", "10.0.0.1", 100, "TCP", 443, 1000, True),
        (2.0, agent, "eth1", "10.0.0.1", 100, "TCP", 443, 1000, True),  # the same pair
        (1.0, "EGRESS_FENCE", "eth0", "10.0.0.2", 100, "TCP", 443, 1000, True),
        (1.0, "EGRESS_FENCE", "eth0", "10.0.0.2", 100, "TCP", 443, None, True),
        (1.0, "EGRESS_FENCE", "eth0", "10.0.0.3", 100, "TCP", 443, 1001, True),
        (1.0, agent, "eth0", "10.0.0.3", 100, "TCP", 443, 1000, True),
        (1.0, "EGRESS_FENCE", "eth0", "10.0.0.4", 100, "TCP", 443, None, True),
    ]
    scan.add_rows(rows, 10.0)
    table = FlowContributors(scan)
    index = {name: i for i, name in enumerate(table.names(range(table.count)))}
    owners = table.evidence
    assert owners is not None
    assert owners.get(index["10.0.0.1:443/TCP"]) == {"uid": "1000", "prefix": agent}
    assert owners.get(index["10.0.0.2:443/TCP"]) == {"uid": "1000"}
    assert owners.get(index["10.0.0.3:443/TCP"]) == {"uid": "1000,1001", "prefix": agent}
    assert owners.get(index["10.0.0.4:443/TCP"]) is None
    assert owners.get(-1) is None and owners.get(table.count) is None
