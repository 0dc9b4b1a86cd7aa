"""A local Sonatype Nexus Repository 3, as far as capalarm reads it: the Assets REST API.

Mirrors Sonatype's "Assets API" page (``GET /service/rest/v1/assets?repository=<name>``, with
``continuationToken`` from "Pagination": a page of ``items`` and the token of the next page,
``null`` on the last; 404 for an unknown repository; 422 without ``repository``) and its item
fields: ``downloadUrl, path, id, repository, format, checksum {sha1, sha256, md5, sha512},
contentType, lastModified, lastDownloaded, uploader, uploaderIp, fileSize, blobCreated``.
Nexus pages by 10 items.  Authentication: HTTP Basic, 401 otherwise.
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

PAGE = 10


def stamp(ts: float) -> str:
    return (
        datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{int(ts * 1000) % 1000:03d}+00:00"
    )


@dataclass
class Nexus:
    user: str = "admin"
    password: str = "nexus-pass"
    repositories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    requests: int = 0
    base: str = ""
    # Fault: every page names this token as the next one (a server paging in a loop).
    stuck_token: str | None = None

    def upload(
        self, repository: str, path: str, content: bytes, uploader: str, at: float | None = None
    ) -> dict[str, Any]:
        """An asset written at ``path`` (overwriting keeps its id, changes its checksum)."""
        at = time.time() if at is None else at
        assets = self.repositories.setdefault(repository, [])
        old = next((a for a in assets if a["path"] == path), None)
        asset_id = (
            old["id"] if old else base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        )
        asset = {
            "downloadUrl": f"{self.base}/repository/{repository}/{path}",
            "path": path, "id": asset_id, "repository": repository, "format": "pypi",
            "checksum": {"sha1": hashlib.sha1(content).hexdigest(), "sha256": hashlib.sha256(content).hexdigest(), "md5": hashlib.md5(content).hexdigest()},
            "contentType": "application/octet-stream", "lastModified": stamp(at),
            "lastDownloaded": None, "uploader": uploader, "uploaderIp": "10.0.0.7",
            "fileSize": len(content), "blobCreated": stamp(at),
        }  # fmt: skip
        if old:
            assets[assets.index(old)] = asset
        else:
            assets.append(asset)
        return asset

    async def assets(self, request: web.Request) -> web.Response:
        self.requests += 1
        expected = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.Response(status=401)
        name = request.query.get("repository")
        if not name:
            return web.json_response(
                [{"id": "PARAMETER repository", "message": "must not be null"}], status=422
            )
        if name not in self.repositories:
            return web.Response(status=404, text="Repository not found")
        assets = self.repositories[name]
        token = request.query.get("continuationToken")
        start = int(token, 16) if token else 0
        page = assets[start : start + PAGE]
        more = start + PAGE < len(assets)
        following = f"{start + PAGE:x}" if more else None
        return web.json_response(
            {"items": page, "continuationToken": self.stuck_token or following}
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/service/rest/v1/assets", self.assets)
        return app
