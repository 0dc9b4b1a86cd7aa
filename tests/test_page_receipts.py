"""Every destination's page carries the receipts an operator re-checks without trusting
capalarm (issue 27): a file's device:inode and the sha256 of its first bytes, an artifact's
digest, a forged record's sample line; and the contributor names whole, as the surface table
keeps them (they were cut at 120 characters, so a long path could not be found on disk)."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from alarm.detector.alerts import AlertChange
from alarm.notify_config import PagerDutyDestination
from exporters.outbox import Row
from exporters.pagerduty import PAYLOAD_MAX, pagerduty_event
from exporters.payload import LinkSet
from tests.fakes.kit import change, record, running_notifications, wait_for
from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve
from tests.fakes.slack import FakeSlack
from tests.test_alertmanager import alertmanager, am_alerts

# A path as the surface table keeps it: cut at 200 characters and marked as cut.
LONG = "/srv/cache/" + "/".join(f"dir{i:03d}" for i in range(40)) + "/blob.bin"
KEPT = LONG[:200] + "…"
SHA = "9f" * 32
FS_RECEIPT = {
    "dev_ino": "2049:131077",
    "size": 5000,
    "mtime": 1.0,
    "sha256": SHA,
    "sha256_bytes": 4096,
}
DIGEST = "sha256:" + "ab" * 32
REGISTRY_RECEIPT = {"package": "evil", "version": "1.0", "digest": DIGEST, "uploader": "x"}
SAMPLE = "EGRESS_FENCE IN= OUT=eth0 SRC=10.0.0.5 DST=203.0.113.9 LEN=1400 PROTO=TCP DPT=443"
LINKS = {"external_url": "https://capalarm.example/", "runbook": "https://rb.example/{rule}"}
FAST = {"base_backoff": "20ms", "max_backoff": "100ms"}


def with_receipts(at: float) -> AlertChange:
    ch = change(
        "scratch", "budget", at=at, kind="fs", contributors=[(KEPT, 9000), ("evil==1.0", 800)]
    )
    ch.receipts = {KEPT: FS_RECEIPT, "evil==1.0": REGISTRY_RECEIPT}
    return ch


def forged(at: float) -> AlertChange:
    ch = change("kernel", "forged_records", at=at, kind="source", target_type="source")
    ch.figures = {"forged_records_total": 3, "forged_sample": SAMPLE}
    return ch


def handles_of(contributors: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["contributor"]: c.get("receipt", {}) for c in contributors}


def assert_handles(by_name: dict[str, dict[str, Any]]) -> None:
    fs, reg = by_name[KEPT], by_name["evil==1.0"]
    assert fs["dev_ino"] == "2049:131077" and fs["sha256"] == SHA and fs["sha256_bytes"] == 4096
    assert reg["digest"] == DIGEST


async def test_webhook_default_body_carries_receipts_and_the_forged_sample(tmp_path):
    rx = Receiver()
    async with serve(rx.app()) as srv:
        cfg = {
            "destinations": [{"type": "webhook", "name": "soc", "url": f"{srv.base}/hook"}],
            "outbox": FAST,
            "links": LINKS,
        }
        async with running_notifications(tmp_path, cfg) as n:
            t0 = time.time()
            await record(n, with_receipts(t0), forged(t0))
            await wait_for(lambda: len(rx.received) == 2, timeout=10)
    docs = {r.payload["data"]["rule"]: r.payload["data"] for r in rx.received}
    assert_handles(handles_of(docs["budget"]["top_contributors"]))
    assert docs["forged_records"]["forged_sample"] == SAMPLE


async def test_alertmanager_annotations_carry_receipts_and_the_forged_sample(tmp_path):
    app = web.Application()
    async with (
        serve(app) as hook,
        alertmanager(tmp_path / "am", f"{hook.base}/am") as am,
    ):
        cfg = {
            "destinations": [{"type": "alertmanager", "name": "am", "urls": [am]}],
            "links": LINKS,
        }
        async with running_notifications(tmp_path / "state", cfg) as n:
            t0 = time.time()
            await record(n, with_receipts(t0), forged(t0))

            async def both() -> list[dict[str, Any]] | None:
                alerts = await am_alerts(am)
                return alerts if len(alerts) == 2 else None

            alerts = await wait_for(both, timeout=10)
    by_rule = {a["labels"]["rule"]: a["annotations"] for a in alerts}
    receipts = by_rule["budget"]["receipts"]
    assert f"{KEPT}: dev:ino 2049:131077, sha256 {SHA} of the first 4096 B" in receipts
    assert f"evil==1.0: digest {DIGEST}" in receipts
    assert KEPT in by_rule["budget"]["top_contributors"]
    assert by_rule["forged_records"]["forged_sample"] == SAMPLE


async def test_pagerduty_custom_details_carry_receipts_within_the_512_kb_limit(
    tmp_path, monkeypatch
):
    key = "R" * 32
    monkeypatch.setenv("CAPALARM_PD_KEY", key)
    pd = FakePagerDuty(routing_key=key)

    def name(i: int) -> str:  # as long as the table keeps a name
        return f"/{i:04d}".ljust(200, "x")

    # As many contributors as http.top_contributors allows, each with a large receipt: the
    # event must still be one PagerDuty accepts, the largest contributors kept.
    many = change(
        "cache", "budget", kind="fs", contributors=[(name(i), 10**6 - i) for i in range(1000)]
    )
    many.receipts = {name(i): FS_RECEIPT for i in range(1000)}
    async with serve(pd.app()) as srv:
        cfg = {
            "destinations": [
                {
                    "type": "pagerduty",
                    "name": "pd",
                    "url": f"{srv.base}/v2/enqueue",
                    "routing_key": {"env": "CAPALARM_PD_KEY"},
                }
            ],
            "outbox": FAST,
            "links": LINKS,
        }
        async with running_notifications(tmp_path, cfg | {"top_contributors": 50}) as n:
            t0 = time.time()
            await record(n, with_receipts(t0), forged(t0))
            await wait_for(lambda: len(pd.events) == 2, timeout=10)
            await record(n, many)
            await wait_for(lambda: len(pd.events) == 3, timeout=10)
    details = {e["payload"]["class"]: e["payload"]["custom_details"] for e in pd.events[:2]}
    assert_handles(handles_of(details["budget"]["top_contributors"][:2]))
    assert details["forged_records"]["forged_sample"] == SAMPLE
    big = pd.events[2]
    assert len(json.dumps(big).encode()) <= PAYLOAD_MAX
    shown = big["payload"]["custom_details"]["top_contributors"]
    assert shown[0]["contributor"] == name(0) and shown[0]["receipt"]["sha256"] == SHA
    assert len(shown) == 50 and all(c["receipt"]["dev_ino"] == "2049:131077" for c in shown)
    # Past what the settings allow (50 contributors, a few bounded handles each) the event
    # could pass PagerDuty's limit: the smallest contributors are left out, never the event.
    many.receipts = {name(i): FS_RECEIPT | {"digest": "d" * 300} for i in range(1000)}
    body = {"change": many.to_dict(), "severity": "warning"}
    row = Row(1, "pd", "o", "k" * 32, "firing", time.time(), 0, body)
    cfg = PagerDutyDestination(
        name="pd", url="https://events.example/v2/enqueue", routing_key={"env": "X"}
    )
    event = pagerduty_event(
        cfg, key, row, LinkSet("https://capalarm.example/", None), 1000, time.time()
    )
    assert len(json.dumps(event).encode()) <= PAYLOAD_MAX
    cut = event["payload"]["custom_details"]
    assert cut["top_contributors_cut"] and 100 < len(cut["top_contributors"]) < 1000
    assert cut["top_contributors"][0]["contributor"] == name(0)


async def test_slack_blocks_carry_receipts_and_the_forged_sample(tmp_path, monkeypatch):
    fake = FakeSlack()
    async with serve(fake.app()) as srv:
        monkeypatch.setenv("CAPALARM_SLACK_URL", srv.base + fake.path)
        cfg = {
            "destinations": [
                {"type": "slack", "name": "chat", "url": {"env": "CAPALARM_SLACK_URL"}}
            ],
            "outbox": FAST,
            "links": LINKS,
        }
        async with running_notifications(tmp_path, cfg) as n:
            t0 = time.time()
            await record(n, with_receipts(t0), forged(t0))
            await wait_for(lambda: len(fake.messages) == 2, timeout=10)
    texts = {
        m["text"].split(":")[0]: "\n".join(
            b["text"]["text"] for b in m["blocks"] if b["type"] == "section" and "text" in b
        )
        for m in fake.messages
    }
    budget = texts["FIRING budget"]
    assert f"`{KEPT}`: `dev:ino 2049:131077, sha256 {SHA} of the first 4096 B`" in budget
    assert f"`evil==1.0`: `digest {DIGEST}`" in budget
    sample = SAMPLE.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert f"*Sample forged record*\n`{sample}`" in texts["FIRING forged_records"]
