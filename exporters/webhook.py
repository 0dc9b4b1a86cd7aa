"""Webhook v1: POST each alert state change as JSON, in order, with retries.

In-memory and bounded: a full queue drops the oldest notification and counts it.  Durable
delivery (outbox in SQLite, signatures) replaces this in its own change; the seam is
``Notifier.submit`` and ``Notifier.run``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import deque
from typing import Any

import aiohttp

from alarm import __version__
from alarm.config import WebhookConfig

log = logging.getLogger("capalarm.webhook")


class WebhookNotifier:
    def __init__(
        self, cfg: WebhookConfig, index: int, base_backoff: float = 0.5, max_backoff: float = 30.0
    ):
        self.cfg = cfg
        self.name = cfg.name or f"webhook{index}"
        self._queue: deque[tuple[float, dict[str, Any]]] = deque()
        self._wake = asyncio.Event()
        self._base_backoff = base_backoff
        self._max_backoff = max_backoff
        self.sent = 0
        self.failed = 0
        self.retried = 0
        self.dropped = 0

    # -- the view exporters/prometheus.py reads ---------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def oldest_queued_age(self) -> float:
        return time.time() - self._queue[0][0] if self._queue else 0.0

    def submit(self, payload: dict[str, Any]) -> None:
        if len(self._queue) >= self.cfg.queue_size:
            self._queue.popleft()
            self.dropped += 1
            log.error(
                "%s: queue full (%d), dropped the oldest notification",
                self.name,
                self.cfg.queue_size,
            )
        self._queue.append((time.time(), payload))
        self._wake.set()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.cfg.timeout)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"capalarm/{__version__}",
            **self.cfg.headers,
        }
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            while True:
                if not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                _, payload = self._queue[0]
                delivered = await self._deliver(session, payload)
                # Keep order: the head leaves the queue only once it is delivered or given up.
                if self._queue and self._queue[0][1] is payload:
                    self._queue.popleft()
                if delivered:
                    self.sent += 1
                else:
                    self.failed += 1

    async def _deliver(self, session: aiohttp.ClientSession, payload: dict[str, Any]) -> bool:
        body = json.dumps(payload, separators=(",", ":"), default=str).encode()
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                self.retried += 1
                delay = min(self._max_backoff, self._base_backoff * 2 ** (attempt - 1))
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
            try:
                async with session.post(self.cfg.url, data=body) as resp:
                    await resp.read()
                    if 200 <= resp.status < 300:
                        return True
                    if 400 <= resp.status < 500 and resp.status not in (408, 429):
                        log.error(
                            "%s: receiver rejected the notification: HTTP %d",
                            self.name,
                            resp.status,
                        )
                        return False
                    log.warning("%s: HTTP %d, will retry", self.name, resp.status)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.warning("%s: delivery failed (%s), will retry", self.name, type(exc).__name__)
        log.error(
            "%s: gave up on a notification after %d attempts", self.name, self.cfg.max_retries + 1
        )
        return False
