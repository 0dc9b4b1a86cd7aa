"""Alertmanager: ``POST /api/v2/alerts`` with a list of one postable alert.

Each alert's labels are its identity in Alertmanager, so they hold only stable values
(alertname, target, kind, rule, severity); the figures go into annotations.  A firing alert's
``endsAt`` is set, at each send, to four repeat intervals ahead (as Prometheus does with its
resend delay), and the router re-sends firing alerts every ``repeat_interval``: a firing alert
never expires while capalarm is up, and resolves by itself if capalarm dies.  A resolved alert
is sent with ``endsAt`` at the moment it resolved.

Every URL of the destination is its own channel with its own queue, so every peer of an HA
cluster gets every alert even while another peer is down (the peers deduplicate
notifications between themselves).

Answers (Alertmanager's OpenAPI spec, api/v2/openapi.yaml): 200 accepted; 400 a bad alert —
not retried; 5xx retried.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from alarm.notify_config import AlertmanagerDestination
from alarm.sanitize import sanitize
from exporters.delivery import Outcome, classify, post
from exporters.outbox import Row
from exporters.payload import (
    LinkSet,
    contributors,
    forged_sample,
    handle_text,
    human_bytes,
    iso,
    lampson,
    summary,
)
from exporters.routing import target_of

EXPIRY_INTERVALS = 4  # endsAt = now + 4 x repeat_interval, like Prometheus' resend logic
# Alertmanager sets no limit on an annotation, but every receiver template copies them into
# each notification: bounded like the payloads of the other destinations' text fields.
ANNOTATION_MAX = 8000


def alertname(rule: str) -> str:
    return "Capalarm" + "".join(part.capitalize() for part in rule.split("_"))


def postable_alert(
    cfg: AlertmanagerDestination, row: Row, links: LinkSet, top: int, now: float
) -> dict[str, Any]:
    change = row.body["change"]
    target_type = next((k for k in ("surface", "source", "service") if k in change), "target")
    labels = {
        "alertname": alertname(str(change.get("rule"))),
        target_type: sanitize(target_of(change), 64),
        "kind": str(change.get("kind")),
        "rule": str(change.get("rule")),
        "severity": str(row.body.get("severity")),
        **cfg.extra_labels,
    }
    link = links.for_change(change)
    annotations = {
        "summary": summary(change, now),
        "description": sanitize(str(change.get("summary", "")), 1000),
        "status_page": str(link["status_page"]),
    }
    if link["runbook"]:
        annotations["runbook_url"] = str(link["runbook"])
    figures = lampson(change)
    if figures:
        annotations["capacity_bits_per_second"] = f"{figures['capacity_bits_per_second']:.0f}"
        annotations["bits_over_budget"] = f"{figures['bits_over_budget']:.0f}"
    top_list = contributors(change, top)
    if top_list:
        annotations["top_contributors"] = ", ".join(
            f"{c['contributor']} ({human_bytes(c['bytes'])})" for c in top_list
        )[:ANNOTATION_MAX]
    # Annotations are strings only (api/v2/openapi.yaml: labelSet), so the receipts go as one
    # line per contributor: what the receiver re-checks without asking capalarm.
    receipts = "\n".join(
        f"{c['contributor']}: {handle_text(c['receipt'])}" for c in top_list if "receipt" in c
    )
    if receipts:
        annotations["receipts"] = receipts[:ANNOTATION_MAX]
    sample = forged_sample(change)
    if sample:
        annotations["forged_sample"] = sample
    at = float(change.get("at", now))
    if change.get("state") == "resolved":
        ends = at
    else:
        ends = max(now, at) + EXPIRY_INTERVALS * cfg.repeat_interval
    return {
        "labels": labels,
        "annotations": annotations,
        "startsAt": iso(float(change.get("started_at") or at)),
        "endsAt": iso(ends),
        "generatorURL": str(link["status_page"]),
    }


class AlertmanagerSender:
    def __init__(self, cfg: AlertmanagerDestination, links: LinkSet, top: int):
        self.cfg = cfg
        self.links = links
        self.top = top

    def targets(self) -> list[tuple[str, str]]:
        urls = [u.rstrip("/") + "/api/v2/alerts" for u in self.cfg.urls]
        if len(urls) == 1:
            return [(self.cfg.name, urls[0])]
        return [(f"{self.cfg.name}#{i}", u) for i, u in enumerate(urls)]

    async def send(
        self, session: aiohttp.ClientSession, target: str, row: Row, now: float
    ) -> Outcome:
        body = json.dumps([postable_alert(self.cfg, row, self.links, self.top, now)]).encode()
        async with post(session, target, body, {"Content-Type": "application/json"}) as resp:
            text = await resp.text(errors="replace")
            return classify(resp.status, resp.headers, text, time.time(), url=target)
