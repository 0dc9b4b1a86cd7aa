"""PagerDuty Events API v2 (https://developer.pagerduty.com/docs/events-api-v2/overview/).

``POST /v2/enqueue`` with ``event_action`` ``trigger`` or ``resolve`` and a ``dedup_key`` that is
stable per alert (``capalarm/<fingerprint>``): a repeat or a re-delivery of a trigger lands on
the same open PagerDuty alert instead of opening a second one, and the resolve closes it.

Trigger events carry the PD-CEF payload: ``summary`` (at most 1024 characters), ``source``,
``severity`` (capalarm's severities are PagerDuty's: critical, error, warning, info),
``timestamp``, ``component`` (the surface or source), ``group`` (its kind), ``class`` (the rule)
and the evidence in ``custom_details``; plus ``client``, ``client_url`` and ``links``.

Answers, per the Events API v2 overview ("Response Codes & Retry Logic"): 202 accepted;
400 invalid event — not retried (dead letter); 429 and 5xx — retried later (PagerDuty asks for
a backoff on 429; Retry-After is honoured if sent); network errors — retried.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from pydantic import SecretStr

from alarm.notify_config import PagerDutyDestination
from exporters.delivery import (
    DELIVERED,
    Outcome,
    post,
    redirected,
    reject,
    retry,
    retry_after,
)
from exporters.outbox import Row
from exporters.payload import LinkSet, alert_document, iso, summary
from exporters.routing import target_of

SUMMARY_MAX = 1024
DEDUP_MAX = 255
# Events API v2: "the maximum size of a payload is 512 KB" (the whole event as sent).
PAYLOAD_MAX = 512 * 1024


def dedup_key(fingerprint: str) -> str:
    return f"capalarm/{fingerprint}"[:DEDUP_MAX]


def pagerduty_event(
    cfg: PagerDutyDestination,
    routing_key: str,
    row: Row,
    links: LinkSet,
    top: int,
    now: float,
) -> dict[str, Any]:
    change = row.body["change"]
    key = dedup_key(str(change.get("fingerprint")))
    if change.get("state") == "resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": key}
    doc = alert_document(row.body, row.idem_key, links, top, now)
    link = doc["links"]
    event_links = [{"href": link["status_page"], "text": "capalarm status page"}]
    if link["runbook"]:
        event_links.append({"href": link["runbook"], "text": "Runbook"})
    details = {
        "summary": doc["summary"],
        "lampson": doc["lampson"],
        "figures": doc["figures"],
        "top_contributors": doc["top_contributors"],
        "forged_sample": doc["forged_sample"],
        "started_at": doc["started_at"],
        "value": doc["value"],
        "threshold": doc["threshold"],
        "repeat": doc["repeat"],
        "escalated": doc["escalated"],
        "notification_id": row.idem_key,
    }
    event = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": key,
        "payload": {
            "summary": summary(change, now)[:SUMMARY_MAX],
            "source": cfg.source,
            "severity": row.body.get("severity") or "warning",
            "timestamp": iso(float(change.get("at", now))),
            "component": doc["target"] or target_of(change),
            "group": str(change.get("kind")),
            "class": str(change.get("rule")),
            "custom_details": details,
        },
        "client": "capalarm",
        "client_url": link["status_page"],
        "links": event_links,
    }
    # PagerDuty refuses an event over 512 KB: with many contributors (http.top_contributors
    # up to 1000) and their receipts, drop the smallest contributors until it fits.
    shown = details["top_contributors"]
    while shown and len(json.dumps(event).encode()) > PAYLOAD_MAX:
        shown.pop()
        details["top_contributors_cut"] = True
    return event


class PagerDutySender:
    def __init__(self, cfg: PagerDutyDestination, links: LinkSet, routing_key: SecretStr, top: int):
        self.cfg = cfg
        self.links = links
        self._routing_key = routing_key
        self.top = top

    def targets(self) -> list[tuple[str, str]]:
        return [(self.cfg.name, self.cfg.url)]

    async def send(
        self, session: aiohttp.ClientSession, target: str, row: Row, now: float
    ) -> Outcome:
        event = pagerduty_event(
            self.cfg, self._routing_key.get_secret_value(), row, self.links, self.top, now
        )
        body = json.dumps(event).encode()
        async with post(session, target, body, {"Content-Type": "application/json"}) as resp:
            text = await resp.text(errors="replace")
            status = resp.status
            if status == 202 or 200 <= status < 300:
                return DELIVERED
            if 300 <= status < 400:
                return redirected(
                    status, resp.headers.get("Location"), target, path_is_secret=False
                )
            if status == 429 or status >= 500:
                return retry(
                    f"HTTP {status} {text[:200]}", retry_after(resp.headers.get("Retry-After"), now)
                )
            # 400 "invalid event" and anything else: sending it again would not change it.
            return reject(f"HTTP {status} {text[:300]}")
