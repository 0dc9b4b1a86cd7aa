"""Generic webhook: the alert document as JSON, signed per Standard Webhooks.

Body, following the Standard Webhooks payload convention::

    {"type": "alert.firing" | "alert.resolved",
     "timestamp": "<ISO 8601 of this state change>",
     "data": {...the alert document, see exporters/payload.py...}}

``webhook-id`` is the notification's idempotency key (``msg_`` + 32 hex digits), the same on
every attempt and after a restart; ``webhook-timestamp`` and ``webhook-signature`` are computed
per attempt, so a notification queued through an outage still verifies against a receiver's
five-minute tolerance.  A repeat of a firing alert is a new message (new id) with
``data.repeat: true``.  With ``body: change`` (what the ``webhooks:`` shorthand uses) the body
is the detector's change record as-is, the format those receivers already parse.

Answers: 2xx delivered; 408, 429 and 5xx retried (Retry-After honoured); other 4xx is a
rejection and goes to the dead-letter table.
"""

from __future__ import annotations

import json
import time

import aiohttp

from alarm.notify_config import WebhookDestination
from exporters.delivery import Outcome, classify, post
from exporters.outbox import Row
from exporters.payload import LinkSet, alert_document, iso
from exporters.signing import sign_headers


def webhook_body(row: Row, links: LinkSet, top: int, now: float, form: str = "standard") -> bytes:
    change = row.body["change"]
    if form == "change":
        return json.dumps(change, separators=(",", ":"), default=str).encode()
    doc = {
        "type": f"alert.{change.get('state')}",
        "timestamp": iso(float(change.get("at", now))),
        "data": alert_document(row.body, row.idem_key, links, top, now),
    }
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


class WebhookSender:
    def __init__(self, cfg: WebhookDestination, links: LinkSet, keys: list[bytes], top: int):
        self.cfg = cfg
        self.links = links
        self._keys = keys  # decoded signing keys; never logged
        self.top = top

    def targets(self) -> list[tuple[str, str]]:
        return [(self.cfg.name, self.cfg.url)]

    async def send(
        self, session: aiohttp.ClientSession, target: str, row: Row, now: float
    ) -> Outcome:
        body = webhook_body(row, self.links, self.top, now, self.cfg.body)
        headers = {
            "Content-Type": "application/json",
            **self.cfg.headers,
            **sign_headers(self._keys, f"msg_{row.idem_key}", int(time.time()), body),
        }
        async with post(session, target, body, headers) as resp:
            text = await resp.text(errors="replace")
            return classify(resp.status, resp.headers, text, time.time(), url=target)
