"""The read-only HTTP side: /metrics, /healthz, /readyz, /api/v1/surfaces, /api/v1/alerts,
/api/v1/notifications and the status page at /.  Only GET (and HEAD) are routed: nothing here
changes anything.

With a web config (exporters/webconfig.py, ``--web.config.file``) every request passes its
rate limit and basic auth (the probes, /healthz and /readyz, the rate limit only: kubelets
probe without credentials), responses carry its headers, and the listener speaks TLS with its
certificate.  A new TLS setting applies from the next connection on the same listening
socket (exporters/listener.py): no connection is refused or dropped in between, and open
connections finish with the setting they started with.

Nothing a request does runs on the default executor, which the sources read with (the file
tailer, kmsg and journald readers, the fs engine): rendering, compressing and re-reading the
web config run on the server's own HTTP_THREADS threads, password checks on the auth gate's
(exporters/webconfig.py), so no number of requests can hold a source back.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import logging
import math
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from alarm.history import HistoryRequest
from alarm.sanitize import sanitize
from alarm.snapshot import CanaryView, HistoryWindow, Snapshot, SnapshotRequest
from exporters.listener import Listener
from exporters.prometheus import METRICS_MODES, NotifierView, accepts_gzip, render
from exporters.statuspage import PAGE_MAX, PAGE_SURFACES, STATE_NAMES, render_page
from exporters.textformat import ScrapeCache
from exporters.webconfig import WebConfig, WebConfigWatcher

log = logging.getLogger("capalarm.http")

# Liveness and readiness: answered without basic auth or a client certificate (kubelets
# probe without them), still under the rate limit.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
# Surfaces /api/v1/surfaces?history=1 carries the history of at most (each ~4 KB of JSON).
API_HISTORY_LIMIT = 1000
# Surfaces on a page of /api/v1/surfaces: without ?limit=, and at most.  A fleet of up to
# API_PAGE_DEFAULT surfaces gets all of them in one answer, as before pages existed.
API_PAGE_DEFAULT = 1000
API_PAGE_MAX = 10000
# Threads of the HTTP side's own (rendering, compression, web config reads).
HTTP_THREADS = 2


def _floats(values: Any) -> list[float | None]:
    return [round(v, 6) if math.isfinite(v) else None for v in values.tolist()]


def _history_json(window: HistoryWindow, j: int) -> dict[str, Any]:
    return {
        "rate_bytes_per_second": _floats(window.rate[j]),
        "threshold_bytes_per_second": _floats(window.threshold[j]),
        "budget_excess_ratio": _floats(window.budget_ratio[j]),
    }


def canary_json(c: CanaryView | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "address": c.address,
        "port": c.port,
        "netns": c.netns,
        "interval_seconds": c.interval,
        "deadline_seconds": c.deadline,
        "sent": c.sent,
        "send_errors": c.send_errors,
        "last_sent_timestamp": c.last_sent,
        "last_error": sanitize(c.last_error),
        "sources": [
            {
                "source": s.source,
                "seen": s.seen,
                "missed": s.missed,
                "last_seen_timestamp": s.last_seen,
                "last_latency_seconds": s.last_latency,
                "blind": sanitize(s.blind),
            }
            for s in c.sources
        ],
    }


class BadQuery(ValueError):
    """A query parameter out of its range: answered 400 with this one line."""


def _int_param(query: Any, name: str, default: int, low: int, high: int) -> int:
    text = query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadQuery(f"{name}: not an integer: {sanitize(text)[:40]!r}") from None
    if not low <= value <= high:
        raise BadQuery(f"{name}: {value} is not between {low} and {high}")
    return value


def surface_cursor(kind: str, name: str) -> str:
    """What ``after=`` takes: a surface's kind and name (a kind has no '/')."""
    return f"{kind}/{name}"


def page_rows(snap: Snapshot, limit: int, after: str | None, order: str) -> tuple[list[int], bool]:
    """The rows of ``snap.surfaces`` on one page of /api/v1/surfaces, and whether more follow.
    ``order`` "config": the declared order, resumed after the surface ``after`` names;
    "attention": what needs a look first (firing, pending, nearest to a threshold), from the
    top (it changes every tick, so it has no ``after``).  The page the snapshot was asked for
    (``SnapshotRequest``) where it has one, else worked out on its columns."""
    if order == "attention" and after is not None:
        raise BadQuery("after: not with order=attention (the order changes every tick)")
    if snap.page_error or (snap.page is None and after is not None and not _known(snap, after)):
        raise BadQuery(
            f"after: no surface {sanitize(after or '')[:80]!r} (removed by a reload? start again)"
        )
    if snap.page is not None:
        return snap.page, snap.more
    return snap.columns.page(limit, after, order)


def _known(snap: Snapshot, after: str) -> bool:
    kind, sep, name = after.partition("/")
    return bool(sep) and snap.columns.layout.row_of(kind, name) is not None


def surfaces_json(
    snap: Snapshot, rows: list[int] | None = None, more: str | None = None
) -> dict[str, Any]:
    """``rows``: the surfaces of one page (every one when None); ``more``: the link to the
    next page (None on the last)."""
    history = snap.history
    where = {} if history is None else {row: j for j, row in enumerate(history.rows)}
    surfaces = []
    for i in range(len(snap.surfaces)) if rows is None else rows:
        s = snap.surfaces[i]
        entry: dict[str, Any] = {
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
            # The first horizon's figures stay where clients read them; "horizons" has every
            # one, since the one that fires is often not the first (1h, 1d, or a custom name).
            "budget": {
                "allowance_bits_per_second": s.budget_allowance,
                "tolerance_bits": s.budget_tolerance,
                "excess_bits": s.budget_excess,
                "horizons": [
                    {
                        "horizon": name,
                        "allowance_bits_per_second": allowance,
                        "tolerance_bits": tolerance,
                        "excess_bits": excess,
                    }
                    for name, allowance, tolerance, excess in s.budget_horizons
                ],
            },
            # Every rule on the surface, as /metrics' capalarm_alert_state and the page show it:
            # read from rule_states(), so a rule added later is reported without a change here.
            "alerts": {rule: STATE_NAMES[state] for rule, state in s.rule_states().items()},
            "top_contributors": [
                {"contributor": sanitize(c), "bytes": b} for c, b in s.contributors
            ],
            "contributors_error_bytes": s.contributors_error,
        }
        if history is not None and i in where:
            entry["history"] = _history_json(history, where[i])
        surfaces.append(entry)
    out: dict[str, Any] = {
        "taken_at": snap.taken_at,
        "tick_seconds": snap.tick,
        "last_tick_end": snap.last_tick_end,
        "surfaces": surfaces,
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
        "egress_canary": canary_json(snap.egress_canary),
        "open_ticks": snap.open_ticks,
        "total_surfaces": len(snap.surfaces),
        "next": more,
    }
    if history is not None:
        # Slot j of every surface's history starts at slot_starts[j] and lasts slot_seconds.
        out["history"] = {
            "slot_seconds": history.slot_seconds,
            "slot_starts": history.starts.tolist(),
            "surfaces_with_history": len(history.rows),
        }
    return out


SnapshotFn = Callable[[SnapshotRequest | HistoryRequest | None], Awaitable[Snapshot]]


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    """RFC 7617: ``Basic base64(user ":" password)``; None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


class HttpServer:
    def __init__(
        self,
        snapshot: SnapshotFn,
        notifiers: Callable[[], Sequence[NotifierView]],
        recent_changes: Callable[[], list[dict[str, Any]]],
        ready: Callable[[], tuple[bool, str]],
        notifications: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        web_config: WebConfig | None = None,
        metrics: str = "lean",
    ):
        if metrics not in METRICS_MODES:
            raise ValueError(f"metrics: {metrics!r} is not one of {', '.join(METRICS_MODES)}")
        self._full_metrics = metrics == "full"
        # The last scrape's lines, so that the next rewrites only what changed.
        self.scrape_cache = ScrapeCache()
        self._notifications = notifications
        self._snapshot = snapshot
        self._notifiers = notifiers
        self._recent = recent_changes
        self._ready = ready
        self._executor = ThreadPoolExecutor(HTTP_THREADS, thread_name_prefix="capalarm-http")
        self.web = WebConfigWatcher(web_config, self._executor) if web_config is not None else None
        self._tls_key = web_config.tls_key if web_config is not None else None
        self.app = web.Application(middlewares=[self._guard])
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
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._watch: asyncio.Task[None] | None = None
        self.port: int | None = None

    # -- listening -------------------------------------------------------------------
    @property
    def scheme(self) -> str:
        tls = self.web is not None and self.web.config.ssl_context is not None
        return "https" if tls else "http"

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port.  OSError when the
        address cannot be bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=128)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        assert self._runner.server is not None
        ctx = self.web.config.ssl_context if self.web is not None else None
        self._listener = Listener(self._runner.server, ctx)
        await self._listener.start(sock)
        if self.web is not None:
            self._watch = asyncio.create_task(self.web.run(self._apply))
        return self.port

    async def _apply(self, new: WebConfig) -> None:
        """A reloaded web config: a new TLS setting applies from the next connection (users,
        headers and the rate limit are read per request)."""
        if self._listener is None or new.tls_key == self._tls_key:
            return
        self._listener.context = new.ssl_context
        self._tls_key = new.tls_key
        log.info("listener now serves %s", self.scheme)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.web is not None:
            self.web.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """CPU work of a request, on the HTTP side's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- every request -----------------------------------------------------------------
    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """The web config's checks, in the toolkit's order: rate limit, headers, basic
        auth; then client certificate SANs where configured."""
        w = self.web
        if w is None:
            return await handler(request)
        cfg = w.config
        if w.limiter is not None and not w.limiter.allow():
            return web.Response(status=429, text="Too Many Requests\n", headers=cfg.headers)
        if request.path in PROBE_PATHS:
            # A kubelet's httpGet probe sends no credentials and no client certificate: behind
            # basic auth the probes got 401 and the pod was restarted for ever.  They say only
            # that the process answers and whether its sources read, so they stay open (rate
            # limited all the same); everything else needs what the web config asks.
            resp = await handler(request)
            resp.headers.update(cfg.headers)
            return resp
        if cfg.allowed_sans is not None and not self._san_allowed(request, cfg.allowed_sans):
            return web.Response(status=403, text="Forbidden\n", headers=cfg.headers)
        if cfg.users:
            creds = _basic_credentials(request.headers.get("Authorization"))
            ok = False if creds is None else await w.auth.verdict(*creds, request.remote or "")
            if ok is None:  # too many password checks waiting: not checked, try again
                return web.Response(
                    status=429,
                    text="Too Many Requests\n",
                    headers={**cfg.headers, "Retry-After": "1"},
                )
            if not ok:
                return web.Response(
                    status=401,
                    text="Unauthorized\n",
                    headers={**cfg.headers, "WWW-Authenticate": "Basic"},
                )
        resp = await handler(request)
        resp.headers.update(cfg.headers)
        return resp

    @staticmethod
    def _san_allowed(request: web.Request, allowed: frozenset[str]) -> bool:
        """The client certificate names one of ``allowed`` as a DNS, IP, e-mail or URI
        subject alternative name (the toolkit's client_allowed_sans)."""
        cert = request.transport.get_extra_info("peercert") if request.transport else None
        if not cert:
            return False
        return any(value in allowed for _, value in cert.get("subjectAltName", ()))

    # -- endpoints -------------------------------------------------------------------
    async def metrics(self, request: web.Request) -> web.Response:
        """Gzip-compressed when the scraper takes it (Prometheus always asks)."""
        snap = await self._snapshot(SnapshotRequest())  # columns only: no view, no history
        gz = accepts_gzip(request.headers.get("Accept-Encoding"))
        body, ctype = await self._off_loop(
            functools.partial(
                render,
                snap,
                list(self._notifiers()),
                request.headers.get("Accept"),
                full=self._full_metrics,
                gzip=gz,
                cache=self.scrape_cache,
            )
        )
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = ctype
        resp.headers["Vary"] = "Accept-Encoding"
        if gz:
            resp.headers["Content-Encoding"] = "gzip"
        return resp

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _: web.Request) -> web.Response:
        ok, why = self._ready()
        return web.Response(text=(why or "ready") + "\n", status=200 if ok else 503)

    async def surfaces(self, request: web.Request) -> web.Response:
        """A page of the surfaces: ``?limit=`` of them (API_PAGE_DEFAULT, at most
        API_PAGE_MAX) ``&after=KIND/NAME`` (the last of the previous page; ``next`` in the
        answer is the link on, null on the last page), in the declared order or with
        ``&order=attention`` what needs a look first.  ``?history=1``: with the last hour of
        each surface (of at most API_HISTORY_LIMIT, those that need a look first);
        ``&surface=NAME`` (repeatable): of these only."""
        q = request.query
        try:
            limit = _int_param(q, "limit", API_PAGE_DEFAULT, 1, API_PAGE_MAX)
            order = q.get("order", "config")
            if order not in ("config", "attention"):
                raise BadQuery(f"order: {sanitize(order)[:40]!r} is not config or attention")
        except BadQuery as exc:
            return web.Response(status=400, text=f"{exc}\n")
        after = q.get("after")
        if order == "attention" and after is not None:
            return web.Response(
                status=400, text="after: not with order=attention (the order changes every tick)\n"
            )
        want = q.get("history", "") not in ("", "0", "false")
        names = frozenset(q.getall("surface", [])) or None
        # The page is found on the pipeline thread, and only its surfaces' views are made.
        request = SnapshotRequest(
            limit, order, after, API_HISTORY_LIMIT if want else 0, names if want else None
        )
        snap = await self._snapshot(request)

        def page() -> dict[str, Any]:
            rows, more = page_rows(snap, limit, after, order)
            link = None
            if more and rows:
                last = snap.surfaces[rows[-1]]
                params = [(k, v) for k, v in q.items() if k != "after"]
                params.append(("after", surface_cursor(last.kind, last.name)))
                link = "/api/v1/surfaces?" + urllib.parse.urlencode(params)
            if order == "attention":
                link = None  # the next page of an order that moves is not a page
            return surfaces_json(snap, rows, link)

        try:
            body = await self._off_loop(page)
        except BadQuery as exc:
            return web.Response(status=400, text=f"{exc}\n")
        return web.json_response(body)

    async def alerts(self, _: web.Request) -> web.Response:
        return web.json_response({"changes": self._recent()})

    async def notifications(self, _: web.Request) -> web.Response:
        """Delivery state: per channel counters and queue, dead letters, silences, flapping."""
        if self._notifications is None:
            return web.json_response({"channels": [], "dead_letters": []})
        return web.json_response(await self._notifications())

    async def index(self, request: web.Request) -> web.Response:
        """``?page=N``: the next PAGE_SURFACES surfaces in attention order (up to PAGE_MAX)."""
        try:
            number = _int_param(request.query, "page", 1, 1, PAGE_MAX)
        except BadQuery as exc:
            return web.Response(status=400, text=f"{exc}\n")
        snap = await self._snapshot(HistoryRequest(PAGE_SURFACES * number))
        page = await self._off_loop(render_page, snap, self._recent(), len(snap.surfaces), number)
        # aiohttp compresses a large body on an executor: this one's, not the default.
        resp = web.Response(text=page, content_type="text/html", zlib_executor=self._executor)
        resp.enable_compression()
        return resp
