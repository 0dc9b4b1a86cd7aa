"""A caching reverse proxy in front of a real registry, which can stop refreshing.

While ``frozen`` it answers every GET and HEAD from what it last fetched for that path and
query (a path it never fetched: 404), as a CDN, a pull-through cache or a read replica that
lost its upstream does: the polls through it keep succeeding and keep showing the past.
Uploads (any other method) are forwarded, or refused with 403 while ``refuse_uploads`` is
set (a revoked canary credential, a repository made read-only); ``answer_delay`` holds the
registry's answer to a forwarded upload back that long (a slow or lost answer to an upload
the registry has already stored).  This is what the registry
canary is for: nothing else a poll sees tells the two apart from a quiet registry.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

# Headers passed through in each direction (hop-by-hop and length headers are aiohttp's).
REQUEST_HEADERS = ("Accept", "Authorization", "Content-Type", "If-None-Match", "If-Modified-Since")
REPLY_HEADERS = ("Content-Type", "ETag", "Last-Modified", "Location", "WWW-Authenticate")


@dataclass
class StaleProxy:
    upstream: str  # scheme://host:port, no path
    frozen: bool = False
    refuse_uploads: bool = False
    cache: dict[tuple[str, str], tuple[int, dict[str, str], bytes]] = field(default_factory=dict)
    answer_delay: float = 0.0
    uploads: int = 0
    refused: int = 0
    stored: int = 0  # uploads forwarded and answered by the registry

    async def handle(self, request: web.Request) -> web.Response:
        key = (request.method, request.path_qs)
        if request.method in ("GET", "HEAD"):
            if self.frozen:
                hit = self.cache.get(key)
                if hit is None:
                    return web.Response(status=404)
                status, headers, body = hit
            else:
                status, headers, body = await self._forward(request)
                self.cache[key] = (status, headers, body)
        else:
            self.uploads += 1
            if self.refuse_uploads:
                self.refused += 1
                return web.Response(status=403, text="uploads refused\n")
            status, headers, body = await self._forward(request)
            self.stored += 1
            await asyncio.sleep(self.answer_delay)
        if request.method == "HEAD":
            return web.Response(status=status, headers=headers)
        return web.Response(status=status, headers=headers, body=body)

    async def _forward(self, request: web.Request) -> tuple[int, dict[str, str], bytes]:
        sent = {k: request.headers[k] for k in REQUEST_HEADERS if k in request.headers}
        data = await request.read()
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                headers=sent,
                data=data or None,
                allow_redirects=False,
            ) as resp,
        ):
            body = await resp.read()
            headers = {k: resp.headers[k] for k in REPLY_HEADERS if k in resp.headers}
            if request.method == "HEAD" and "Content-Length" in resp.headers:
                headers["Content-Length"] = resp.headers["Content-Length"]
            return resp.status, headers, body

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app
