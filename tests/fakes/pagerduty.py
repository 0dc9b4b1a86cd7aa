"""A local PagerDuty Events API v2 endpoint (``POST /v2/enqueue``) for tests.

Follows, field for field:

- "Send an Alert Event" — https://developer.pagerduty.com/docs/events-api-v2/trigger-events/
  (PagerDuty/developer-docs, docs/events-API-v2/02-Trigger-Events.md): ``routing_key``
  (required, the 32-character integration key), ``event_action`` (required: trigger,
  acknowledge, resolve), ``dedup_key`` (at most 255 characters; required unless trigger),
  ``payload.summary`` (required, at most 1024 characters), ``payload.source`` (required),
  ``payload.severity`` (required: critical, error, warning, info), optional
  ``payload.timestamp`` / ``component`` / ``group`` / ``class`` / ``custom_details`` (object),
  ``images`` (``src`` required), ``links`` (``href`` required), ``client``, ``client_url``.
  De-duplication: a trigger with an open alert's dedup_key is added to that alert; after a
  resolve, a trigger opens a new alert; acknowledge/resolve of an unknown or resolved key is
  dropped.
- The Events API v2 OpenAPI document (PagerDuty/api-schema, reference/events-v2/openapiv3.json):
  202 ``{"status": "success", "message": "Event processed", "dedup_key": ...}``; 400 invalid
  event with ``{"status", "message", "errors": [...]}``; 429 "Too many API calls at a time";
  5xx with the Error schema.
- "Events API v2 Overview", Response Codes & Retry Logic and Size Limits (512 KB payloads);
  "Events API Rate Limits" (429 when over the limit; the event is not ingested).

Faults are scripted: ``fail_next([429, 500, ...])`` answers the next requests with those
codes, without ingesting the events.  Unknown top-level fields are refused, so a misspelled
field fails a test instead of being ignored.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from tests.fakes.server import strict_json

SIZE_LIMIT = 512 * 1024
TOP_LEVEL = {
    "routing_key",
    "event_action",
    "dedup_key",
    "payload",
    "images",
    "links",
    "client",
    "client_url",
}
PAYLOAD_FIELDS = {
    "summary",
    "source",
    "severity",
    "timestamp",
    "component",
    "group",
    "class",
    "custom_details",
}
SEVERITIES = {"critical", "error", "warning", "info"}
ACTIONS = {"trigger", "acknowledge", "resolve"}
ROUTING_KEY = re.compile(r"^[A-Za-z0-9]{32}$")


@dataclass
class PdAlert:
    dedup_key: str
    status: str  # triggered | acknowledged | resolved
    summary: str
    severity: str
    triggers: int = 1
    custom_details: dict[str, Any] = field(default_factory=dict)


@dataclass
class FakePagerDuty:
    routing_key: str
    events: list[dict[str, Any]] = field(default_factory=list)  # accepted, in order
    requests: int = 0
    alerts: list[PdAlert] = field(default_factory=list)  # every alert ever opened
    _script: list[int] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=SIZE_LIMIT * 2)
        app.add_routes([web.post("/v2/enqueue", self.enqueue)])
        return app

    def fail_next(self, statuses: list[int]) -> None:
        self._script.extend(statuses)

    def open_alert(self, dedup_key: str) -> PdAlert | None:
        for a in reversed(self.alerts):
            if a.dedup_key == dedup_key and a.status != "resolved":
                return a
        return None

    @staticmethod
    def _invalid(errors: list[str]) -> web.Response:
        return web.json_response(
            {"status": "invalid event", "message": "Event object is invalid", "errors": errors},
            status=400,
        )

    async def enqueue(self, request: web.Request) -> web.Response:
        self.requests += 1
        raw = await request.read()
        if self._script:
            status = self._script.pop(0)
            if status == 429:
                return web.Response(status=429, text="Too many API calls at a time.")
            return web.json_response(
                {"status": "Internal Server Error", "message": "The server experienced an error"},
                status=status,
            )
        if len(raw) > SIZE_LIMIT:
            return self._invalid(["Event payload is larger than 512 KB"])
        try:
            event = strict_json(raw)
        except ValueError:
            return web.json_response(
                {
                    "status": "Unrecognized object",
                    "message": "Event object format is unrecognized",
                    "errors": ["JSON parse error"],
                },
                status=400,
            )
        if not isinstance(event, dict):
            return self._invalid(["Event object must be a JSON object"])
        errors = self.validate(event)
        if errors:
            return self._invalid(errors)
        action = event["event_action"]
        key = event.get("dedup_key") or uuid.uuid4().hex
        if action == "trigger":
            p = event["payload"]
            alert = self.open_alert(key)
            if alert is None:
                self.alerts.append(
                    PdAlert(
                        key,
                        "triggered",
                        p["summary"],
                        p["severity"],
                        1,
                        p.get("custom_details", {}),
                    )
                )
            else:
                alert.triggers += 1
                alert.summary, alert.severity = p["summary"], p["severity"]
        else:
            alert = self.open_alert(key)
            if alert is not None:  # otherwise dropped, as PagerDuty does
                alert.status = "acknowledged" if action == "acknowledge" else "resolved"
        self.events.append(event)
        return web.json_response(
            {"status": "success", "message": "Event processed", "dedup_key": key}, status=202
        )

    def validate(self, event: dict[str, Any]) -> list[str]:
        errors = []
        unknown = set(event) - TOP_LEVEL
        if unknown:
            errors.append(f"Unknown fields: {sorted(unknown)}")
        rk = event.get("routing_key")
        if not isinstance(rk, str) or not ROUTING_KEY.match(rk):
            errors.append("Length of 'routing_key' is incorrect (should be 32 characters)")
        elif rk != self.routing_key:
            errors.append("Invalid routing key")
        action = event.get("event_action")
        if action not in ACTIONS:
            errors.append("'event_action' is missing or invalid")
        key = event.get("dedup_key")
        if key is not None and (not isinstance(key, str) or len(key) > 255):
            errors.append("'dedup_key' must be a string of at most 255 characters")
        if action in ("acknowledge", "resolve") and not key:
            errors.append("'dedup_key' is required for acknowledge and resolve")
        if action == "trigger":
            p = event.get("payload")
            if not isinstance(p, dict):
                return [*errors, "'payload' is missing or invalid"]
            unknown = set(p) - PAYLOAD_FIELDS
            if unknown:
                errors.append(f"Unknown payload fields: {sorted(unknown)}")
            s = p.get("summary")
            if not isinstance(s, str) or not s:
                errors.append("'payload.summary' is missing")
            elif len(s) > 1024:
                errors.append("'payload.summary' is longer than 1024 characters")
            if not isinstance(p.get("source"), str) or not p.get("source"):
                errors.append("'payload.source' is missing")
            if p.get("severity") not in SEVERITIES:
                errors.append("'payload.severity' is missing or invalid")
            ts = p.get("timestamp")
            if ts is not None:
                try:
                    datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
                except ValueError:
                    errors.append("'payload.timestamp' is not ISO 8601")
            if "custom_details" in p and not isinstance(p["custom_details"], dict):
                errors.append("'payload.custom_details' must be an object")
            for name in ("component", "group", "class"):
                if name in p and not isinstance(p[name], str):
                    errors.append(f"'payload.{name}' must be a string")
        for link in event.get("links", []) or []:
            if not isinstance(link, dict) or not link.get("href"):
                errors.append("each link needs 'href'")
        for image in event.get("images", []) or []:
            if not isinstance(image, dict) or not image.get("src"):
                errors.append("each image needs 'src'")
        return errors
