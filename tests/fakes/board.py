"""A local message board with a JSON API, the shape capalarm's ``api: json`` reads.

Its fields are the ones board and tracker APIs commonly give (Discourse's posts: ``id``,
``post_number`` numbered per topic, ``version`` raised by every edit, ``updated_at``; GitHub's
issues and comments: ``updated_at``): a post is ``{id, channel, number, author, text,
created_at, updated_at, version}``.  Writes go through the API as an agent would make them:

- ``POST /api/channels/{channel}/posts`` ``{"author", "text"}`` -> the post (201)
- ``PATCH /api/posts/{id}`` ``{"text"}`` -> the post, ``version`` + 1, ``updated_at`` now
- ``DELETE /api/posts/{id}`` -> 204

``GET /api/posts?page=N`` lists the posts ``per_page`` at a time as ``{"posts": [...],
"meta": {"created_total": <posts ever made>, "next": "?page=N+1" or null}}``; with
``newest`` set only the newest that many posts are listed (boards that show a window).  Each
page is answered ``page_delay`` seconds after it is asked for (a long listing takes a while
to page through), or with ``down`` set as an error (a board that is down: 503).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# How an ``api: json`` source reads this board's listing (its config's field names).
SOURCE_FIELDS: dict[str, str] = {
    "api": "json",
    "items": "posts",
    "id": "id",
    "repository": "channel",
    "uploader": "author",
    "time": "created_at",
    "next": "meta.next",
}


@dataclass
class Board:
    per_page: int = 50
    newest: int | None = None
    page_delay: float = 0.0
    down: bool = False
    posts: dict[str, dict[str, Any]] = field(default_factory=dict)
    created_total: int = 0
    numbers: dict[str, int] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- what an agent does, also callable directly by a test --------------------------------
    def post(self, channel: str, author: str, text: str) -> dict[str, Any]:
        now = time.time()
        self.numbers[channel] = self.numbers.get(channel, 0) + 1
        self.created_total += 1
        post = {
            "id": f"p{next(self._ids)}",
            "channel": channel,
            "number": self.numbers[channel],
            "author": author,
            "text": text,
            "created_at": now,
            "updated_at": now,
            "version": 1,
        }
        self.posts[post["id"]] = post
        return post

    def edit(self, ident: str, text: str) -> dict[str, Any]:
        post = self.posts[ident]
        post["text"] = text
        post["version"] += 1
        post["updated_at"] = time.time()
        return post

    def delete(self, ident: str) -> None:
        del self.posts[ident]

    # -- the HTTP API --------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/posts", self._list)
        app.router.add_post("/api/channels/{channel}/posts", self._create)
        app.router.add_patch("/api/posts/{id}", self._edit)
        app.router.add_delete("/api/posts/{id}", self._delete)
        return app

    async def _list(self, request: web.Request) -> web.Response:
        if self.page_delay:
            await asyncio.sleep(self.page_delay)
        if self.down:
            raise web.HTTPServiceUnavailable()
        page = int(request.query.get("page", "0"))
        listed = list(self.posts.values())
        if self.newest is not None:
            listed = listed[-self.newest :]
        chunk = listed[page * self.per_page : (page + 1) * self.per_page]
        more = (page + 1) * self.per_page < len(listed)
        meta = {"created_total": self.created_total, "next": f"?page={page + 1}" if more else None}
        return web.json_response({"posts": chunk, "meta": meta})

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        post = self.post(request.match_info["channel"], str(body["author"]), str(body["text"]))
        return web.json_response(post, status=201)

    async def _edit(self, request: web.Request) -> web.Response:
        if request.match_info["id"] not in self.posts:
            raise web.HTTPNotFound()
        body = await request.json()
        return web.json_response(self.edit(request.match_info["id"], str(body["text"])))

    async def _delete(self, request: web.Request) -> web.Response:
        if request.match_info["id"] not in self.posts:
            raise web.HTTPNotFound()
        self.delete(request.match_info["id"])
        return web.Response(status=204)
