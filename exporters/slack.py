"""Slack incoming webhook (https://api.slack.com/messaging/webhooks): a readable message.

The JSON body has ``text`` (the fallback Slack shows in notifications) and Block Kit
``blocks``: a header, the summary, the figures as fields, the top contributors, and links to
the status page and the runbook.  Workload-controlled text is sanitised and escaped for
mrkdwn (``&``, ``<``, ``>``), so a hostile hostname cannot forge a link or a mention.

Answers (Slack's incoming-webhook errors and rate limits): 200 ``ok`` delivered; 429 — rate
limited, retried after the ``Retry-After`` seconds Slack sends; 5xx (``rollup_error``)
retried; 400 ``invalid_payload`` / ``no_text``, 403 ``action_prohibited``, 404
``channel_not_found``, 410 ``channel_is_archived`` are not retried (dead letter).

Slack has no idempotency key: a message whose send was in flight when the process died is
posted again after the restart (at-least-once).
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
from pydantic import SecretStr

from alarm.notify_config import SlackDestination
from exporters.delivery import Outcome, classify, post, retry
from exporters.outbox import Row
from exporters.payload import (
    LinkSet,
    alert_document,
    figure,
    handle_text,
    human_bytes,
    shown_threshold,
)

HEADER_MAX = 150  # Block Kit: header text
SECTION_MAX = 3000  # Block Kit: section text
ICONS = {"firing": ":red_circle:", "resolved": ":large_green_circle:"}


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str) -> str:
    """Within a section's 3000 characters, cut at a line so no code span is left open."""
    if len(text) <= SECTION_MAX:
        return text
    head = text[: SECTION_MAX - 2]
    return head[: head.rfind("\n")] + "\n…" if "\n" in head else head[: SECTION_MAX - 1] + "…"


def _bits_per_second(value: float | None) -> str:
    return "not set" if value is None else f"{value:,.0f} bit/s"


def slack_message(row: Row, links: LinkSet, top: int, now: float) -> dict[str, Any]:
    doc = alert_document(row.body, row.idem_key, links, top, now)
    state = str(doc["status"])
    title = f"{ICONS.get(state, '')} {doc['title']}".strip()
    if doc["repeat"]:
        title += " (still firing)"
    elif doc["escalated"]:
        title += " (escalated)"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:HEADER_MAX]}},
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": escape(doc["summary"])[:SECTION_MAX]},
        },
    ]
    fields = [f"*Severity*\n{doc['severity']}", f"*Since*\n{doc['started_at']}"]
    figures = doc["figures"]
    if "rate_bytes_per_second" in figures:
        fields += [
            f"*Write rate*\n{figure(figures, 'rate_bytes_per_second') or 0:,.0f} B/s",
            f"*Baseline / threshold*\n{figure(figures, 'baseline_bytes_per_second') or 0:,.0f}"
            f" / {shown_threshold(doc):,.0f} B/s",
        ]
    if doc["lampson"]:
        lp = doc["lampson"]
        fields += [
            f"*Capacity bound*\n{lp['capacity_bits_per_second']:,.0f} bit/s",
            f"*Over budget*\n{lp['bits_over_budget']:,.0f} bits "
            f"(allowance {_bits_per_second(lp['allowance_bits_per_second'])})",
        ]
    blocks.append(
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields[:10]]}
    )
    if doc["top_contributors"]:
        who = ", ".join(
            f"`{escape(c['contributor'])}` {human_bytes(c['bytes'])}"
            for c in doc["top_contributors"]
        )
        blocks.append(
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": f"Top contributors: {who}"[:SECTION_MAX]}],
            }
        )
    # The receipts (device:inode and sha256, artifact digests) and a forged record's sample,
    # as code spans: an operator re-checks them on the host or registry, not in capalarm.
    receipts = [
        f"`{escape(c['contributor'])}`: `{escape(handle_text(c['receipt']))}`"
        for c in doc["top_contributors"]
        if "receipt" in c
    ]
    if receipts:
        text = "*Receipts*\n" + "\n".join(receipts)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _cut(text)}})
    if doc["forged_sample"]:
        text = f"*Sample forged record*\n`{escape(doc['forged_sample'])}`"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _cut(text)}})
    link = doc["links"]
    parts = [f"<{link['status_page']}|Status page>"]
    if link["runbook"]:
        parts.append(f"<{link['runbook']}|Runbook>")
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": " · ".join(parts)}})
    return {"text": f"{doc['title']}: {doc['summary']}"[:SECTION_MAX], "blocks": blocks}


class SlackSender:
    def __init__(self, cfg: SlackDestination, links: LinkSet, url: SecretStr, top: int):
        self.cfg = cfg
        self.links = links
        self._url = url  # the webhook URL carries Slack's token: a secret
        self.top = top

    def targets(self) -> list[tuple[str, str]]:
        # The target shown in the API and logs says where the secret URL comes from, never it.
        return [(self.cfg.name, f"secret ({self.cfg.url.where()})")]

    async def send(
        self, session: aiohttp.ClientSession, target: str, row: Row, now: float
    ) -> Outcome:
        body = json.dumps(slack_message(row, self.links, self.top, now)).encode()
        try:
            url = self._url.get_secret_value()
            async with post(session, url, body, {"Content-Type": "application/json"}) as resp:
                text = await resp.text(errors="replace")
                return classify(
                    resp.status, resp.headers, text, time.time(), url=url, path_is_secret=True
                )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # aiohttp's messages can quote the URL, and this URL is the secret: name the error
            # class only.
            return retry(f"{type(exc).__name__} posting to the Slack webhook")
