"""``api: npm``: an npm registry (verdaccio, a CouchDB-backed registry, npm proxies).

Which packages changed:
- a CouchDB ``_changes`` feed where the server has one (CouchDB API reference, "/{db}/_changes":
  ``?since=<seq>&limit=<n>`` answers ``{results: [{seq, id, changes, deleted}], last_seq}``);
  the saved ``last_seq`` is the cursor;
- else the listing ``/-/all`` (``{_updated, <name>: {time: {modified}}, ...}``, which verdaccio
  serves) with each package's ``time.modified`` as its validator, so only packages modified
  since the last look are read;
- else the search API ``/-/v1/search?text=&size=250&from=<n>`` (npm registry API,
  "registry/docs/REGISTRY-API.md#get-v1search"), paged.

What changed in a package is read from its packument (``GET /<name>``, scoped names with the
``/`` escaped): ``versions[v].dist`` (``tarball``, ``shasum``, ``integrity``, ``unpackedSize``),
``time[v]`` (publish time), ``_npmUser`` (publisher, where the registry records one).  A
version's identity is its number and integrity, so a version republished with other content
is new.  Its bytes are the tarball's ``Content-Length`` (HEAD: what was uploaded), else
``dist.unpackedSize`` (larger than the upload: an upper bound, which a capacity bound may be).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from alarm.collectors.registry.http import GarbageResponse, PollError
from alarm.collectors.registry.listing import hashes_of
from alarm.collectors.registry.names import packument_url
from alarm.collectors.registry.poller import Cycle, parse_time

PACKAGES_AT_ONCE = 64
CHANGES_LIMIT = 1000
SEARCH_PAGE = 250


class NpmAdapter:
    def __init__(self, cfg: Any):
        self.base = cfg.url if cfg.url.endswith("/") else cfg.url + "/"
        self.use_changes = cfg.changes == "auto"

    async def poll(self, cycle: Cycle) -> None:
        feed = cycle.state.get("feed")
        if feed is None or cycle.learning:
            feed = await self._choose_feed(cycle)
        if feed == "changes":
            await self._poll_changes(cycle)
        else:
            modified = await (self._list_all(cycle) if feed == "all" else self._search(cycle))
            names = [n for n in modified if cycle.wanted(n)]
            stale = [n for n in names if cycle.index.validator(n) != {"modified": modified[n]}]
            await self._read_packages(cycle, stale, modified)
            forgotten, suspicious = cycle.index.forget_missing(set(names))
            cycle.counts["groups_forgotten"] += forgotten
            cycle.counts["listing_shrinks"] += suspicious
        cycle.state["feed"] = feed

    async def _choose_feed(self, cycle: Cycle) -> str:
        if self.use_changes:
            reply = await cycle.client.get(
                self.base + "_changes?descending=true&limit=1", ok=frozenset({200, 400, 404, 405})
            )
            if reply.status == 200 and isinstance(_doc(reply), dict) and "last_seq" in _doc(reply):
                return "changes"
        reply = await cycle.client.get(self.base + "-/all", ok=frozenset({200, 404, 405}))
        return "all" if reply.status == 200 else "search"

    async def _poll_changes(self, cycle: Cycle) -> None:
        client = cycle.client
        if cycle.learning or "seq" not in cycle.state:
            _, doc = await client.get_json(self.base + "_changes?descending=true&limit=1")
            cycle.state["seq"] = _seq(doc)
            # The starting state: every package's versions, learned without counting.
            modified = await self._list_all(cycle)
            await self._read_packages(cycle, [n for n in modified if cycle.wanted(n)], modified)
            return
        trail = cycle.pages("_changes")
        while True:
            since = cycle.state["seq"]
            trail.visit(str(since))
            _, doc = await client.get_json(
                f"{self.base}_changes?since={quote(str(since))}&limit={CHANGES_LIMIT}"
            )
            results = doc.get("results") if isinstance(doc, dict) else None
            if not isinstance(results, list):
                raise GarbageResponse("_changes: no 'results' list")
            last = _seq(doc)
            now_at, was_at = _seq_number(last), _seq_number(since)
            if now_at is not None and was_at is not None and now_at < was_at:
                cycle.counts["cursor_regressions"] += 1
            cycle.counts["records_read"] += len(results)
            ids = sorted({str(r["id"]) for r in results if isinstance(r, dict) and "id" in r})
            names = [i for i in ids if not i.startswith("_design/") and cycle.wanted(i)]
            await self._read_packages(cycle, names, {})
            cycle.state["seq"] = last
            await cycle.checkpoint()
            if len(results) < CHANGES_LIMIT or last == since:
                return

    async def _list_all(self, cycle: Cycle) -> dict[str, str]:
        _, doc = await cycle.client.get_json(self.base + "-/all")
        if not isinstance(doc, dict):
            raise GarbageResponse("-/all: not an object")
        if len(doc) > cycle.settings.max_items:
            cycle.counts["listing_truncated"] += 1
            raise PollError(f"-/all lists {len(doc)} packages, over max_items")
        out = {}
        for name, entry in doc.items():
            if name.startswith("_") or not isinstance(entry, dict):
                continue
            time = entry.get("time") if isinstance(entry.get("time"), dict) else {}
            out[name] = str(time.get("modified", ""))
        return out

    async def _search(self, cycle: Cycle) -> dict[str, str]:
        out: dict[str, str] = {}
        offset = 0
        trail = cycle.pages("-/v1/search")
        while True:
            trail.visit(str(offset))
            _, doc = await cycle.client.get_json(
                f"{self.base}-/v1/search?text=&size={SEARCH_PAGE}&from={offset}"
            )
            objects = doc.get("objects") if isinstance(doc, dict) else None
            if not isinstance(objects, list):
                raise GarbageResponse("-/v1/search: no 'objects' list")
            for obj in objects:
                pkg = obj.get("package") if isinstance(obj, dict) else None
                if isinstance(pkg, dict) and isinstance(pkg.get("name"), str):
                    out[pkg["name"]] = str(pkg.get("date") or pkg.get("version") or "")
            if len(out) > cycle.settings.max_items:
                cycle.counts["listing_truncated"] += 1
                raise PollError("search lists more packages than max_items")
            offset += len(objects)
            if len(objects) < SEARCH_PAGE or offset >= int(doc.get("total", 0) or 0):
                return out

    async def _read_packages(
        self, cycle: Cycle, names: list[str], modified: dict[str, str]
    ) -> None:
        for start in range(0, len(names), PACKAGES_AT_ONCE):
            async with asyncio.TaskGroup() as tg:
                for name in names[start : start + PACKAGES_AT_ONCE]:
                    tg.create_task(self._package(cycle, name, modified.get(name)))
            await cycle.checkpoint()

    async def _package(self, cycle: Cycle, name: str, modified: str | None) -> None:
        reply, doc = await cycle.client.get_json(
            packument_url(self.base, name), ok=frozenset({200, 404})
        )
        if reply.status == 404:
            return
        if not isinstance(doc, dict) or not isinstance(doc.get("versions", {}), dict):
            raise GarbageResponse(f"packument of {name!r}: no 'versions' object")
        versions: dict[str, Any] = doc.get("versions") or {}
        times = doc.get("time") if isinstance(doc.get("time"), dict) else {}
        listed = []
        for version, meta in versions.items():
            dist = meta.get("dist") if isinstance(meta, dict) else None
            dist = dist if isinstance(dist, dict) else {}
            listed.append((version, meta if isinstance(meta, dict) else {}, dist))
        cycle.counts["records_read"] += len(listed)
        identities = (f"{v}#{d.get('integrity') or d.get('shasum') or ''}" for v, _, d in listed)
        validator = {"modified": modified} if modified is not None else None
        diff = await cycle.index.diff_off_loop(name, hashes_of(identities), validator)
        cycle.counts["duplicate_items"] += diff.duplicates
        cycle.counts["listing_shrinks"] += diff.shrink_kept
        new = [listed[i] for i in diff.new]
        sizes: list[int | None] = []
        if not cycle.learning:
            for _, _, dist in new:
                size = None
                if isinstance(dist.get("tarball"), str):
                    size, _ = await cycle.client.probe(dist["tarball"])
                if size is None and isinstance(dist.get("unpackedSize"), int):
                    size = dist["unpackedSize"]
                sizes.append(size)
        cycle.index.commit(diff)
        for (version, meta, dist), size in zip(new, sizes or [None] * len(new), strict=True):
            user = meta.get("_npmUser")
            uploader = user.get("name") if isinstance(user, dict) else None
            tarball = str(dist.get("tarball") or "")
            filename = tarball.rsplit("/", 1)[-1] if tarball else f"{version}.tgz"
            cycle.found(
                name,
                version,
                size,
                label=f"{name} {version} {filename}",
                uploaded_at=parse_time(times.get(version)),
                uploader=str(uploader) if uploader else None,
                receipt={
                    "name": name,
                    "version": version,
                    "file": filename,
                    "digest": dist.get("integrity")
                    or (f"sha1:{dist['shasum']}" if dist.get("shasum") else None),
                    "url": tarball or None,
                },
            )


def _doc(reply: Any) -> Any:
    try:
        return reply.json()
    except GarbageResponse:
        return None


def _seq(doc: Any) -> Any:
    if not isinstance(doc, dict) or "last_seq" not in doc:
        raise GarbageResponse("_changes: no 'last_seq'")
    seq = doc["last_seq"]
    if not isinstance(seq, int | str) or isinstance(seq, bool):
        raise GarbageResponse("_changes: 'last_seq' is not a number or string")
    return seq


def _seq_number(seq: Any) -> int | None:
    """CouchDB 1.x sequences are integers; 2.x+ are opaque strings whose prefix before ``-``
    is a number (comparable only roughly)."""
    if isinstance(seq, int):
        return seq
    head = str(seq).split("-", 1)[0]
    return int(head) if head.isdigit() else None
