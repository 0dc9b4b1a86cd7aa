"""PagerDuty Events API v2 against a local fake that follows the documented request and
response formats (tests/fakes/pagerduty.py cites them): trigger and resolve with a stable
dedup_key, severity mapping, evidence in custom_details; 202 accepted, 400 not retried, 429
and 5xx retried."""

from __future__ import annotations

import time

from tests.fakes.kit import change, record, running_notifications, wait_for
from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.server import serve

KEY = "R0123456789abcdef0123456789ABCDE"  # 32 characters, like an integration key
OTHER_KEY = "Z" * 32


def pd_config(url: str, env: str = "CAPALARM_PD_KEY", **kw) -> dict:
    return {
        "destinations": [
            {
                "type": "pagerduty",
                "name": "pd",
                "url": f"{url}/v2/enqueue",
                "routing_key": {"env": env},
                **kw,
            }
        ],
        "outbox": {"base_backoff": "20ms", "max_backoff": "100ms"},
        "links": {
            "external_url": "https://capalarm.example/",
            "runbook": "https://runbooks.example/capalarm#{rule}",
        },
        "severities": {"source_down": "critical"},
    }


async def test_trigger_then_resolve_with_a_stable_dedup_key_and_the_evidence(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPALARM_PD_KEY", KEY)
    pd = FakePagerDuty(routing_key=KEY)
    async with serve(pd.app()) as srv, running_notifications(tmp_path, pd_config(srv.base)) as n:
        t0 = time.time()
        budget = change("paste-board", "budget", at=t0, contributors=[("10.30.0.7:80/tcp", 4096)])
        await record(n, budget, change("registry-proxy", "spike", at=t0))
        await record(n, change("kernel", "source_down", kind="source", target_type="source", at=t0))
        await wait_for(lambda: len(pd.events) == 3, timeout=10)
        await record(n, change("paste-board", "budget", state="resolved", at=t0 + 30))
        await wait_for(lambda: len(pd.events) == 4, timeout=10)
        # The same alert fires again later: a new PagerDuty alert under the same key.
        await record(n, change("paste-board", "budget", at=t0 + 60, started_at=t0 + 55))
        await wait_for(lambda: len(pd.events) == 5, timeout=10)

    trigger = pd.events[0] if pd.events[0]["payload"]["class"] == "budget" else pd.events[1]
    assert trigger["event_action"] == "trigger" and trigger["routing_key"] == KEY
    assert trigger["dedup_key"] == f"capalarm/{budget.fingerprint}"
    p = trigger["payload"]
    assert p["severity"] == "critical" and p["source"] == "capalarm"
    assert (p["component"], p["group"], p["class"]) == ("paste-board", "egress", "budget")
    assert "81,920 bits over its capacity budget of 800 bit/s" in p["summary"]
    assert "since" in p["summary"]
    details = p["custom_details"]
    assert details["lampson"]["bits_over_budget"] == 81920.0
    assert details["top_contributors"] == [{"contributor": "10.30.0.7:80/tcp", "bytes": 4096}]
    assert trigger["client_url"] == "https://capalarm.example/"
    assert {link["href"] for link in trigger["links"]} == {
        "https://capalarm.example/",
        "https://runbooks.example/capalarm#budget",
    }
    severities = {e["payload"]["class"]: e["payload"]["severity"] for e in pd.events[:3]}
    assert severities == {"budget": "critical", "spike": "warning", "source_down": "critical"}
    resolve = pd.events[3]
    assert resolve == {
        "routing_key": KEY,
        "event_action": "resolve",
        "dedup_key": f"capalarm/{budget.fingerprint}",
    }
    budget_alerts = [a for a in pd.alerts if a.dedup_key == resolve["dedup_key"]]
    assert [a.status for a in budget_alerts] == ["resolved", "triggered"]


async def test_400_is_not_retried_and_ends_as_a_dead_letter(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPALARM_PD_KEY", OTHER_KEY)  # not this integration's key
    pd = FakePagerDuty(routing_key=KEY)
    async with serve(pd.app()) as srv, running_notifications(tmp_path, pd_config(srv.base)) as n:
        await record(n, change())
        (ch,) = n.views
        await wait_for(lambda: ch.dead_letters == 1, timeout=10)
        (dead,) = n.outbox.dead_letters("pd", 10)
    assert pd.requests == 1 and ch.retried == 0 and ch.failed == 1
    assert dead["reason"].startswith("rejected: HTTP 400") and "invalid event" in dead["reason"]
    assert OTHER_KEY not in dead["reason"]


async def test_429_and_5xx_are_retried_until_accepted_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPALARM_PD_KEY", KEY)
    pd = FakePagerDuty(routing_key=KEY)
    pd.fail_next([429, 500, 502, 503])
    async with serve(pd.app()) as srv, running_notifications(tmp_path, pd_config(srv.base)) as n:
        await record(n, change())
        (ch,) = n.views
        await wait_for(lambda: ch.sent == 1, timeout=10)
    assert pd.requests == 5 and ch.retried == 4 and len(pd.events) == 1
    assert len(pd.alerts) == 1 and pd.alerts[0].triggers == 1


async def test_repeats_land_on_the_same_open_alert(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPALARM_PD_KEY", KEY)
    pd = FakePagerDuty(routing_key=KEY)
    async with (
        serve(pd.app()) as srv,
        running_notifications(tmp_path, pd_config(srv.base, repeat_interval="1s")) as n,
    ):
        await record(n, change())
        await wait_for(lambda: len(pd.events) >= 3, timeout=10)
    assert len(pd.alerts) == 1 and pd.alerts[0].triggers >= 3
    assert {e["payload"]["custom_details"]["repeat"] for e in pd.events} == {False, True}
