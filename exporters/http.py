"""The read-only HTTP side: /metrics, /healthz, /readyz, /api/v1/surfaces, /api/v1/alerts, and a
small status page at /."""

from __future__ import annotations

import asyncio
import html
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from alarm.detector.alerts import AlertState
from alarm.sanitize import sanitize
from alarm.snapshot import Snapshot
from exporters.prometheus import NotifierView, render

STATE_NAMES = {int(s): s.name.lower() for s in AlertState}


def surfaces_json(snap: Snapshot) -> dict[str, Any]:
    return {
        "taken_at": snap.taken_at,
        "tick_seconds": snap.tick,
        "last_tick_end": snap.last_tick_end,
        "surfaces": [
            {
                "surface": s.name,
                "kind": s.kind,
                "bytes_total": s.bytes_total,
                "events_total": s.events_total,
                "rate_bytes_per_second": s.rate,
                "events_per_second": s.events_rate,
                "baseline_bytes_per_second": s.baseline,
                "threshold_bytes_per_second": s.threshold,
                "baseline_ready": s.baseline_ready,
                "learning": s.learning,
                "budget_misconfigured": s.budget_misconfigured,
                "capacity_bits_per_second": s.capacity_bps,
                "budget": {
                    "allowance_bits_per_second": s.budget_allowance,
                    "tolerance_bits": s.budget_tolerance,
                    "excess_bits": s.budget_excess,
                },
                "alerts": {
                    "spike": STATE_NAMES[s.spike_state],
                    "budget": STATE_NAMES[s.budget_state],
                },
                "top_contributors": [
                    {"contributor": sanitize(c), "bytes": b} for c, b in s.contributors
                ],
                "contributors_error_bytes": s.contributors_error,
            }
            for s in snap.surfaces
        ],
        "sources": [
            {
                "source": v.name,
                "type": v.type,
                "kind": v.kind,
                "mode": v.health.mode,
                "up": v.health.up,
                "caught_up": v.health.caught_up,
                "blind": sanitize(v.health.blind),
                "provenance_verified": v.health.provenance_verified,
                "counters": {c: v.counters.get(c, 0) for c in v.declared},
                "watermark": v.watermark,
                "last_record_timestamp": v.health.last_record_ts,
                "last_success_timestamp": v.health.last_success_at,
                "errors": v.health.errors,
                "last_error": sanitize(v.health.last_error),
                "last_error_timestamp": v.health.last_error_at,
            }
            for v in snap.sources
        ],
        "open_ticks": snap.open_ticks,
    }


SnapshotFn = Callable[[], Awaitable[Snapshot]]


class HttpServer:
    def __init__(
        self,
        snapshot: SnapshotFn,
        notifiers: Callable[[], Sequence[NotifierView]],
        recent_changes: Callable[[], list[dict[str, Any]]],
        ready: Callable[[], tuple[bool, str]],
        notifications: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    ):
        self._notifications = notifications
        self._snapshot = snapshot
        self._notifiers = notifiers
        self._recent = recent_changes
        self._ready = ready
        self.app = web.Application()
        self.app.add_routes(
            [
                web.get("/", self.index),
                web.get("/metrics", self.metrics),
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.readyz),
                web.get("/api/v1/surfaces", self.surfaces),
                web.get("/api/v1/alerts", self.alerts),
                web.get("/api/v1/notifications", self.notifications),
            ]
        )

    async def metrics(self, request: web.Request) -> web.Response:
        snap = await self._snapshot()
        body, ctype = await asyncio.to_thread(
            render, snap, list(self._notifiers()), request.headers.get("Accept")
        )
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = ctype
        return resp

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _: web.Request) -> web.Response:
        ok, why = self._ready()
        return web.Response(text=(why or "ready") + "\n", status=200 if ok else 503)

    async def surfaces(self, _: web.Request) -> web.Response:
        snap = await self._snapshot()
        return web.json_response(surfaces_json(snap))

    async def alerts(self, _: web.Request) -> web.Response:
        return web.json_response({"changes": self._recent()})

    async def notifications(self, _: web.Request) -> web.Response:
        """Delivery state: per channel counters and queue, dead letters, silences, flapping."""
        if self._notifications is None:
            return web.json_response({"channels": [], "dead_letters": []})
        return web.json_response(await self._notifications())

    async def index(self, _: web.Request) -> web.Response:
        snap = await self._snapshot()
        rows = "".join(
            f"<tr><td>{html.escape(s.kind)}</td><td>{html.escape(s.name)}</td>"
            f"<td>{s.rate:,.0f}</td><td>{s.baseline:,.0f}</td><td>{s.threshold:,.0f}</td>"
            f"<td>{s.capacity_bps:,.0f}</td><td>{s.budget_excess:,.0f} / {s.budget_tolerance:,.0f}</td>"
            f"<td class=s{s.spike_state}>{STATE_NAMES[s.spike_state]}</td>"
            f"<td class=s{s.budget_state}>{STATE_NAMES[s.budget_state]}</td></tr>"
            for s in snap.surfaces
        )
        srcs = "".join(
            f"<tr><td>{html.escape(v.name)}</td><td>{'up' if v.health.up else 'DOWN'}</td>"
            f"<td>{v.counters.get('records_read', 0)}</td>"
            f"<td>{v.counters.get('records_lost', 0)}</td>"
            f"<td>{v.counters.get('forged_records', 0)}</td>"
            f"<td>{v.counters.get('parse_errors', 0)}</td></tr>"
            for v in snap.sources
        )
        page = f"""<!doctype html><html><head><meta charset=utf-8><title>capalarm</title>
<meta http-equiv=refresh content=5><style>body{{font-family:sans-serif;margin:2em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
.s1{{background:#fd0}}.s2{{background:#f55;color:#fff}}</style></head><body>
<h1>capalarm</h1><p>{snap.ticks} ticks of {snap.tick:g}s. <a href=/metrics>/metrics</a>
<a href=/api/v1/surfaces>/api/v1/surfaces</a> <a href=/api/v1/alerts>/api/v1/alerts</a></p>
<h2>Surfaces</h2><table><tr><th>kind</th><th>surface</th><th>B/s</th><th>baseline</th>
<th>threshold</th><th>capacity bit/s</th><th>budget excess / tolerance (bits)</th><th>spike</th>
<th>budget</th></tr>{rows}</table><h2>Sources</h2><table><tr><th>source</th><th>state</th>
<th>read</th><th>lost</th><th>forged</th><th>parse errors</th></tr>{srcs}</table></body></html>"""
        return web.Response(text=page, content_type="text/html")
