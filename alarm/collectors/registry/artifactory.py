"""``api: artifactory``: JFrog Artifactory, read through AQL.

Follows JFrog's "Artifactory Query Language" page and the REST API's "Artifactory Query
Language (AQL)" entry: ``POST <base>/api/search/aql`` with a ``text/plain`` query such as
``items.find({...}).include(...).sort({"$asc": [...]}).limit(n)``, answered by
``{"results": [{repo, path, name, type, size, created, created_by, modified, modified_by,
sha256, actual_sha1, ...}], "range": {start_pos, end_pos, total, limit}}``.

A cursor feed: files with ``modified`` at or after the saved cursor, oldest first; the files
seen at exactly the cursor's timestamp are kept (``boundary``) so they are not counted twice.
A file modified again (overwritten) is a new write.  The first poll reads only the newest
timestamp (``sort $desc, limit 1``): the starting state costs one query, however big the
instance.  A feed that goes quiet is checked against that newest timestamp: a newest file older
than the cursor means the instance was restored or reset (``cursor_regressions``), and the
cursor moves back to it without counting anything.
"""

from __future__ import annotations

import json
from typing import Any

from alarm.collectors.registry.http import GarbageResponse
from alarm.collectors.registry.poller import Cycle, parse_time

INCLUDE = (
    "repo",
    "path",
    "name",
    "size",
    "created",
    "created_by",
    "modified",
    "modified_by",
    "sha256",
    "actual_sha1",
)
EPOCH = "1970-01-01T00:00:00.000Z"
BOUNDARY_LIMIT = 10000


def repository_of(item: dict[str, Any]) -> str:
    path = str(item.get("path") or ".")
    repo = str(item.get("repo") or "")
    return repo if path in (".", "") else f"{repo}/{path}"


def item_key(item: dict[str, Any]) -> str:
    return f"{repository_of(item)}/{item.get('name', '')}"


class ArtifactoryAdapter:
    def __init__(self, cfg: Any):
        base = cfg.url if cfg.url.endswith("/") else cfg.url + "/"
        self.aql_url = base + "api/search/aql"
        self.base = base
        self.repositories = list(cfg.repositories)
        self.page_size = cfg.page_size

    def criteria(self, since: str | None) -> dict[str, Any]:
        crit: dict[str, Any] = {"type": "file"}
        if since is not None:
            crit["modified"] = {"$gte": since}
        if self.repositories:
            crit["$or"] = [{"repo": r} for r in self.repositories]
        return crit

    def query(self, since: str | None, *, newest: bool = False, offset: int = 0) -> str:
        find = json.dumps(self.criteria(since), separators=(",", ":"))
        include = ",".join(json.dumps(f) for f in INCLUDE)
        if newest:
            return f'items.find({find}).include({include}).sort({{"$desc":["modified"]}}).limit(1)'
        order = '{"$asc":["modified","repo","path","name"]}'
        tail = f".offset({offset})" if offset else ""
        return f"items.find({find}).include({include}).sort({order}){tail}.limit({self.page_size})"

    async def _results(self, cycle: Cycle, aql: str) -> list[dict[str, Any]]:
        _, doc = await cycle.client.get_json(
            self.aql_url,
            method="POST",
            data=aql.encode(),
            headers={"Content-Type": "text/plain", "Accept": "application/json"},
        )
        results = doc.get("results") if isinstance(doc, dict) else None
        if not isinstance(results, list):
            raise GarbageResponse("AQL: no 'results' list")
        return [r for r in results if isinstance(r, dict)]

    async def _newest(self, cycle: Cycle) -> tuple[str, float]:
        top = await self._results(cycle, self.query(None, newest=True))
        if not top:
            return EPOCH, 0.0
        stamp = str(top[0].get("modified") or EPOCH)
        return stamp, parse_time(stamp) or 0.0

    async def poll(self, cycle: Cycle) -> None:
        state = cycle.state
        if cycle.learning or "cursor" not in state:
            cycle.counts["baseline_artifacts"] += await self._learn(
                cycle, *await self._newest(cycle)
            )
            return
        offset = reported = 0
        trail = cycle.pages("items.find")
        while True:
            cursor = state["cursor"]
            trail.visit(f"{cursor} {offset}")
            cursor_ts = parse_time(cursor) or 0.0
            boundary = set(state.get("boundary") or [])
            page = await self._results(cycle, self.query(cursor, offset=offset))
            cycle.counts["records_read"] += len(page)
            progressed = False
            for item in page:
                stamp = str(item.get("modified") or item.get("created") or "")
                ts = parse_time(stamp)
                if ts is None:
                    cycle.counts["parse_errors"] += 1
                    continue
                key = item_key(item)
                if ts < cursor_ts:
                    cycle.counts["stale_items"] += 1  # the server ignored the filter
                    continue
                if ts == cursor_ts and key in boundary:
                    continue  # read at the end of the last poll
                self._report(cycle, item, ts)
                reported += 1
                if ts > cursor_ts:
                    cursor, cursor_ts, boundary = stamp, ts, {key}
                    progressed = True
                elif len(boundary) < BOUNDARY_LIMIT:
                    boundary.add(key)
            state["cursor"] = cursor
            state["boundary"] = sorted(boundary)
            await cycle.checkpoint()
            if len(page) < self.page_size:
                break
            # A full page all at one timestamp: step past what was read of it.
            offset = 0 if progressed else offset + len(page)
        if not reported:
            stamp, newest = await self._newest(cycle)
            if stamp != EPOCH and newest < (parse_time(state["cursor"]) or 0.0):
                cycle.counts["cursor_regressions"] += 1
                await self._learn(cycle, stamp, newest)

    async def _learn(self, cycle: Cycle, stamp: str, newest: float) -> int:
        """Start the cursor at the newest timestamp, every file at it already read."""
        at_cursor = await self._results(cycle, self.query(stamp))
        keys = [item_key(i) for i in at_cursor if parse_time(i.get("modified")) == newest]
        cycle.state["cursor"], cycle.state["boundary"] = stamp, sorted(keys)
        return len(keys)

    def _report(self, cycle: Cycle, item: dict[str, Any], ts: float) -> None:
        repository = repository_of(item)
        if not cycle.wanted(repository):
            return
        name = str(item.get("name") or "")
        size = item.get("size")
        sha256 = item.get("sha256")
        uploader = item.get("modified_by") or item.get("created_by")
        cycle.found(
            repository,
            name,
            size if isinstance(size, int) and not isinstance(size, bool) else None,
            label=f"{repository}/{name}",
            uploaded_at=ts,
            uploader=str(uploader) if uploader else None,
            receipt={
                "name": repository,
                "file": name,
                "digest": f"sha256:{sha256}" if sha256 else None,
                "url": f"{self.base}{repository}/{name}",
            },
        )
