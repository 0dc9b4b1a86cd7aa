"""Slack incoming webhook against a local fake that follows Slack's documented formats
(tests/fakes/slack.py cites them): a readable message that Block Kit accepts, Retry-After
honoured on 429, 5xx retried, other errors not retried, and the secret URL never shown."""

from __future__ import annotations

import json
import logging

from tests.fakes.kit import change, learning_change, record, running_notifications, wait_for
from tests.fakes.server import serve
from tests.fakes.slack import FakeSlack


def slack_config(base: str, fake: FakeSlack) -> dict:
    return {
        "destinations": [{"type": "slack", "name": "chat", "url": {"env": "CAPALARM_SLACK_URL"}}],
        "outbox": {"base_backoff": "20ms", "max_backoff": "100ms"},
        "links": {
            "external_url": "https://capalarm.example/",
            "runbook": "https://rb.example/{rule}",
        },
    }


async def test_a_readable_message_with_figures_links_and_escaped_contributors(
    tmp_path, monkeypatch
):
    fake = FakeSlack()
    async with serve(fake.app()) as srv:
        monkeypatch.setenv("CAPALARM_SLACK_URL", srv.base + fake.path)
        hostile = "<https://evil.example|click me> & <!channel>\x07"
        async with running_notifications(tmp_path, slack_config(srv.base, fake)) as n:
            await record(n, change(contributors=[(hostile, 9000), ("10.20.1.10:443/tcp", 800)]))
            await wait_for(lambda: fake.messages, timeout=10)
    msg = fake.messages[0]
    assert msg["text"].startswith("FIRING spike: egress surface registry-proxy")
    header, summary, fields, context, links = msg["blocks"]
    assert header["type"] == "header" and "FIRING spike" in header["text"]["text"]
    assert "rose to 24,000 B/s, x20.0 its baseline of 1,200 B/s" in summary["text"]["text"]
    field_text = " ".join(f["text"] for f in fields["fields"])
    assert "*Capacity bound*\n194,560 bit/s" in field_text and "*Severity*\nwarning" in field_text
    ctx = context["elements"][0]["text"]
    assert "&lt;https://evil.example|click me&gt; &amp; &lt;!channel&gt;?" in ctx
    assert "<https://evil" not in json.dumps(msg) and "<!channel>" not in json.dumps(msg)
    assert links["text"]["text"] == (
        "<https://capalarm.example/|Status page> · <https://rb.example/spike|Runbook>"
    )


async def test_retry_after_is_honoured_on_429_and_5xx_is_retried(tmp_path, monkeypatch):
    fake = FakeSlack(retry_after=2)
    fake.fail_next([429, 500])
    async with serve(fake.app()) as srv:
        monkeypatch.setenv("CAPALARM_SLACK_URL", srv.base + fake.path)
        async with running_notifications(tmp_path, slack_config(srv.base, fake)) as n:
            await record(n, change())
            await wait_for(lambda: fake.messages, timeout=15)
            (ch,) = n.views
    assert fake.answers == [429, 500, 200]
    # Backoff alone would retry after ~20 ms; Slack asked for 2 s.
    assert fake.arrivals[1] - fake.arrivals[0] >= 1.95
    assert ch.retried == 2 and ch.sent == 1


async def test_rate_limit_paces_a_burst_and_nothing_is_lost(tmp_path, monkeypatch):
    fake = FakeSlack(rate_limit_seconds=1.0, retry_after=1)
    async with serve(fake.app()) as srv:
        monkeypatch.setenv("CAPALARM_SLACK_URL", srv.base + fake.path)
        async with running_notifications(tmp_path, slack_config(srv.base, fake)) as n:
            await record(n, *[change(f"surface-{i}") for i in range(3)])
            await wait_for(lambda: len(fake.messages) == 3, timeout=15)
    assert 429 in fake.answers and fake.answers.count(200) == 3


async def test_channel_errors_are_not_retried_and_the_url_is_never_shown(
    tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    fake = FakeSlack()
    fake.fail_next([404, 410])
    async with serve(fake.app()) as srv:
        url = srv.base + fake.path
        monkeypatch.setenv("CAPALARM_SLACK_URL", url)
        async with running_notifications(tmp_path, slack_config(srv.base, fake)) as n:
            await record(n, change("a"), change("b"))
            (ch,) = n.views
            await wait_for(lambda: ch.dead_letters == 2, timeout=10)
            api = json.dumps(await n.api())
    assert len(fake.arrivals) == 2 and ch.retried == 0
    reasons = sorted(d["reason"] for d in json.loads(api)["dead_letters"])
    assert reasons == [
        "rejected: HTTP 404 channel_not_found",
        "rejected: HTTP 410 channel_is_archived",
    ]
    assert fake.path not in api and fake.path not in caplog.text
    assert json.loads(api)["channels"][0]["target"] == "secret (env CAPALARM_SLACK_URL)"


async def test_a_learning_alert_with_null_figures_is_a_readable_message(tmp_path, monkeypatch):
    fake = FakeSlack()
    async with serve(fake.app()) as srv:
        monkeypatch.setenv("CAPALARM_SLACK_URL", srv.base + fake.path)
        c = learning_change()
        c.figures["budget_allowance_bits_per_second"] = float("inf")
        async with running_notifications(tmp_path, slack_config(srv.base, fake)) as n:
            await record(n, c)
            await wait_for(lambda: fake.messages or 400 in fake.answers, timeout=10)
    assert fake.answers == [200]
    fields = " ".join(f["text"] for f in fake.messages[0]["blocks"][2]["fields"])
    # The threshold the rate passed (the absolute floor), not the uncalibrated 0.
    assert "*Baseline / threshold*\n1,200 / 60,000 B/s" in fields
    assert "(allowance not set)" in fields
