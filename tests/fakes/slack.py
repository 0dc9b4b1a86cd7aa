"""A local Slack incoming webhook (``POST /services/T.../B.../...``) for tests.

Follows, field for field:

- "Sending messages using incoming webhooks" — https://api.slack.com/messaging/webhooks: a
  JSON body with ``text`` and/or Block Kit ``blocks``; success is HTTP 200 with the body ``ok``;
  when ``blocks`` are used, ``text`` is the fallback shown in notifications.
- "Improving error conditions for Incoming Webhooks" —
  https://api.slack.com/changelog/2016-05-17-changes-to-errors-for-incoming-webhooks: 400
  ``invalid_payload`` (the body cannot be understood) and ``user_not_found``; 403
  ``action_prohibited``; 404 ``channel_not_found``; 410 ``channel_is_archived``; 500
  ``rollup_error``.  Also 400 ``no_text`` when there is nothing to post.
- "Rate limits" — https://api.slack.com/docs/rate-limits: about one message per second, short
  bursts allowed; over the limit, HTTP 429 Too Many Requests with a ``Retry-After`` header in
  seconds.
- Block Kit reference (https://api.slack.com/reference/block-kit/blocks): at most 50 blocks;
  ``header`` takes ``plain_text`` up to 150 characters; ``section`` takes a text object up to
  3000 characters and/or up to 10 ``fields`` of up to 2000; ``context`` up to 10 elements;
  text objects are ``plain_text`` or ``mrkdwn``.  A bad block is ``invalid_blocks`` (400).

``rate_limit_seconds`` turns on the per-second limit (429 + Retry-After); ``fail_next`` scripts
error answers by status code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.server import strict_json

ERRORS = {
    400: "invalid_payload",
    403: "action_prohibited",
    404: "channel_not_found",
    410: "channel_is_archived",
    500: "rollup_error",
}
BLOCK_TYPES = {"section", "header", "context", "divider", "actions", "image", "rich_text"}
TEXT_TYPES = {"plain_text", "mrkdwn"}


@dataclass
class FakeSlack:
    path: str = "/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
    rate_limit_seconds: float = 0.0
    retry_after: int = 1
    messages: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # every request, accepted or not
    answers: list[int] = field(default_factory=list)
    _script: list[int] = field(default_factory=list)
    _last_accepted: float = 0.0

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.post(self.path, self.post)])
        return app

    def fail_next(self, statuses: list[int]) -> None:
        self._script.extend(statuses)

    def _answer(self, status: int, text: str, **headers: str) -> web.Response:
        self.answers.append(status)
        return web.Response(status=status, text=text, headers=headers)

    async def post(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        self.arrivals.append(now)
        raw = await request.read()
        if self._script:
            status = self._script.pop(0)
            if status == 429:
                return self._answer(429, "rate_limited", **{"Retry-After": str(self.retry_after)})
            return self._answer(status, ERRORS.get(status, "rollup_error"))
        if self.rate_limit_seconds and now - self._last_accepted < self.rate_limit_seconds:
            return self._answer(429, "rate_limited", **{"Retry-After": str(self.retry_after)})
        if not request.content_type.startswith("application/json"):
            return self._answer(400, "invalid_payload")
        try:
            body = strict_json(raw)
        except ValueError:
            return self._answer(400, "invalid_payload")
        if not isinstance(body, dict):
            return self._answer(400, "invalid_payload")
        if not body.get("text") and not body.get("blocks"):
            return self._answer(400, "no_text")
        if "blocks" in body and not self.valid_blocks(body["blocks"]):
            return self._answer(400, "invalid_blocks")
        self._last_accepted = now
        self.messages.append(body)
        return self._answer(200, "ok")

    @staticmethod
    def _text(obj: Any, limit: int, types: set[str] = TEXT_TYPES) -> bool:
        return (
            isinstance(obj, dict)
            and obj.get("type") in types
            and isinstance(obj.get("text"), str)
            and 0 < len(obj["text"]) <= limit
        )

    def valid_blocks(self, blocks: Any) -> bool:
        if not isinstance(blocks, list) or not 0 < len(blocks) <= 50:
            return False
        for b in blocks:
            if not isinstance(b, dict) or b.get("type") not in BLOCK_TYPES:
                return False
            t = b["type"]
            if t == "header" and not self._text(b.get("text"), 150, {"plain_text"}):
                return False
            if t == "section":
                has_text = "text" in b
                fields = b.get("fields")
                if not has_text and not fields:
                    return False
                if has_text and not self._text(b["text"], 3000):
                    return False
                if fields is not None and (
                    not isinstance(fields, list)
                    or not 0 < len(fields) <= 10
                    or not all(self._text(f, 2000) for f in fields)
                ):
                    return False
            if t == "context":
                els = b.get("elements")
                if not isinstance(els, list) or not 0 < len(els) <= 10:
                    return False
                if not all(self._text(e, 3000) for e in els):
                    return False
        return True
