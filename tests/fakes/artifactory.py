"""A local JFrog Artifactory, as far as capalarm reads it: AQL search.

Mirrors JFrog's documentation pages "Artifactory Query Language" (the ``items`` domain, the
criteria ``{"field": {"$gt"|"$gte"|"$eq": value}}``, ``$or``, ``.include()``, ``.sort({"$asc"|
"$desc": [fields]})``, ``.offset(n)``, ``.limit(n)``) and the REST API entry "Artifactory Query
Language (AQL)" (``POST /artifactory/api/search/aql``, ``Content-Type: text/plain``; the answer
``{"results": [...], "range": {"start_pos", "end_pos", "total", "limit"}}``; item fields
``repo, path, name, type, size, created, created_by, modified, modified_by, updated``, and
``sha256``/``actual_sha1`` when included).  Times are ISO 8601 with milliseconds and ``Z``.
Authentication: an API key in ``X-JFrog-Art-Api`` or HTTP Basic, 401 otherwise (REST API,
"Authentication").  Only the subset of AQL that the collector sends is parsed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

_CALL = re.compile(r"\.(include|sort|offset|limit)\(")


def stamp(ts: float) -> str:
    return (
        datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{int(ts * 1000) % 1000:03d}Z"
    )


def _calls(query: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``items.find(<json>)`` and its modifiers -> (criteria, {modifier: argument})."""
    if not query.startswith("items.find("):
        raise ValueError("only the items domain is served")
    decoder = json.JSONDecoder()
    criteria, end = decoder.raw_decode(query, len("items.find("))
    rest = query[end:]
    if not rest.startswith(")"):
        raise ValueError("find( not closed")
    rest = rest[1:]
    mods: dict[str, Any] = {}
    while rest:
        m = _CALL.match(rest)
        if m is None:
            raise ValueError(f"cannot parse {rest[:40]!r}")
        name, rest = m.group(1), rest[m.end() :]
        close = rest.index(")") if name != "sort" else decoder.raw_decode(rest)[1]
        arg = rest[:close]
        mods[name] = (
            json.loads(f"[{arg}]")
            if name == "include"
            else json.loads(arg)
            if name == "sort"
            else int(arg)
        )
        rest = rest[close + 1 :]
    return criteria, mods


def _matches(item: dict[str, Any], crit: dict[str, Any]) -> bool:
    for key, want in crit.items():
        if key == "$or":
            if not any(_matches(item, c) for c in want):
                return False
            continue
        have = item.get(key)
        if isinstance(want, dict):
            for op, value in want.items():
                if op == "$gt" and not (have is not None and have > value):
                    return False
                if op == "$gte" and not (have is not None and have >= value):
                    return False
                if op == "$eq" and have != value:
                    return False
        elif have != want:
            return False
    return True


@dataclass
class Artifactory:
    api_key: str = "ak-test-key"
    items: list[dict[str, Any]] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)

    def deploy(
        self, repo: str, path: str, name: str, size: int, user: str, at: float | None = None
    ) -> dict[str, Any]:
        """A file deployed (or redeployed) at ``repo/path/name``."""
        at = time.time() if at is None else at
        self.items = [
            i for i in self.items if (i["repo"], i["path"], i["name"]) != (repo, path, name)
        ]
        digest = hashlib.sha256(f"{repo}/{path}/{name}/{at}".encode()).hexdigest()
        item = {
            "repo": repo, "path": path, "name": name, "type": "file", "size": size,
            "created": stamp(at), "created_by": user, "modified": stamp(at), "modified_by": user,
            "updated": stamp(at), "sha256": digest, "actual_sha1": digest[:40],
        }  # fmt: skip
        self.items.append(item)
        return item

    def authorised(self, request: web.Request) -> bool:
        if request.headers.get("X-JFrog-Art-Api") == self.api_key:
            return True
        auth = request.headers.get("Authorization", "")
        return auth == "Basic " + base64.b64encode(f"admin:{self.api_key}".encode()).decode()

    async def aql(self, request: web.Request) -> web.Response:
        if not self.authorised(request):
            return web.json_response(
                {"errors": [{"status": 401, "message": "Bad credentials"}]}, status=401
            )
        query = (await request.text()).strip()
        self.queries.append(query)
        try:
            criteria, mods = _calls(query)
        except (ValueError, json.JSONDecodeError) as exc:
            return web.Response(status=400, text=f"Failed to parse query: {exc}")
        found = [i for i in self.items if _matches(i, criteria)]
        if "sort" in mods:
            ((direction, fields),) = mods["sort"].items()
            found.sort(key=lambda i: [i.get(f) for f in fields], reverse=direction == "$desc")
        offset = mods.get("offset", 0)
        limit = mods.get("limit", len(found))
        page = found[offset : offset + limit]
        include = mods.get("include")
        if include:
            page = [
                {k: v for k, v in i.items() if k in include or k in ("repo", "path", "name")}
                for i in page
            ]
        return web.json_response(
            {
                "results": page,
                "range": {
                    "start_pos": offset,
                    "end_pos": offset + len(page),
                    "total": len(page),
                    "limit": limit,
                },
            }
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/artifactory/api/search/aql", self.aql)
        return app
