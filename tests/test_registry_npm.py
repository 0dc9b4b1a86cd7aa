"""``api: npm`` against a real verdaccio on loopback (no ``_changes``: the ``-/all`` listing and
packument ``time`` maps), packages published with ``npm publish``; and the CouchDB ``_changes``
feed against a local stand-in that follows CouchDB's "/{db}/_changes" reference."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.fakes.server import serve
from tests.registries import servers
from tests.registries.clients import npm_publish
from tests.registries.harness import Recorder, collector, poll

pytestmark = pytest.mark.slow


async def test_scoped_packages_counted_by_tarball_size_first_poll_silent(
    verdaccio: servers.Server, tmp_path: Path
) -> None:
    npm_publish(verdaccio, tmp_path, "@sandbox/old", "1.0.0", 1000)
    npm_publish(verdaccio, tmp_path, "outside-scope", "1.0.0", 1000)
    rec = Recorder()
    source = collector(rec, api="npm", url=verdaccio.url, packages=["@sandbox/*"])
    assert await poll(source, rec)
    assert rec.rows() == []
    assert rec.counts()["baseline_artifacts"] == 1, "only the scope is watched"
    assert source.health.up

    started = time.time()
    published = [
        npm_publish(verdaccio, tmp_path, "@sandbox/tool", "1.0.0", 4000),
        npm_publish(verdaccio, tmp_path, "@sandbox/tool", "1.0.1", 9000),
        npm_publish(verdaccio, tmp_path, "@sandbox/old", "1.1.0", 2000),
    ]
    npm_publish(verdaccio, tmp_path, "outside-scope", "1.0.1", 1000)
    rec.clear()
    assert await poll(source, rec)
    rows = rec.rows()
    assert sorted((r.repository, r.artifact) for r in rows) == [
        ("@sandbox/old", "1.1.0"),
        ("@sandbox/tool", "1.0.0"),
        ("@sandbox/tool", "1.0.1"),
    ]
    assert sum(r.nbytes for r in rows) == sum(p.stat().st_size for p in published)
    tool = next(r for r in rows if r.artifact == "1.0.1")
    assert tool.evidence and tool.evidence["file"] == "tool-1.0.1.tgz"
    assert str(tool.evidence["digest"]).startswith("sha512-")
    assert tool.evidence["url"].endswith("/@sandbox/tool/-/tool-1.0.1.tgz")
    assert started - 1 <= tool.ts <= time.time(), "counted at its publish time"

    rec.clear()
    assert await poll(source, rec)
    assert rec.rows() == []
    assert rec.counts()["records_read"] == 0, "unmodified packuments are not read again"


def couchdb_changes_app(state: dict[str, Any]) -> web.Application:
    """CouchDB API reference, "/{db}/_changes" (``since``, ``limit``, ``descending``;
    ``{results: [{seq, id, changes: [{rev}]}], last_seq}``) and "/{db}/{docid}" for packuments;
    ``-/all`` as npm's legacy listing.  Sequences are integers (CouchDB 1.x)."""

    async def changes(request: web.Request) -> web.Response:
        log = state["log"]
        if request.query.get("descending") == "true":
            return web.json_response({"results": log[-1:], "last_seq": len(log)})
        since = int(request.query.get("since", "0"))
        limit = int(request.query.get("limit", "1000"))
        results = log[since : since + limit]
        return web.json_response({"results": results, "last_seq": since + len(results)})

    async def listing(request: web.Request) -> web.Response:
        return web.json_response({n: {"time": {"modified": "x"}} for n in state["docs"]})

    async def doc(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in state["docs"]:
            return web.json_response({"error": "not_found"}, status=404)
        return web.json_response(state["docs"][name])

    async def tarball(request: web.Request) -> web.Response:
        return web.Response(body=b"", headers={"Content-Length": request.match_info["size"]})

    app = web.Application()
    app.router.add_get("/_changes", changes)
    app.router.add_get("/-/all", listing)
    app.router.add_route("HEAD", "/tarballs/{size}", tarball)
    app.router.add_get("/{name}", doc)
    return app


def publish(state: dict[str, Any], base: str, name: str, version: str, size: int) -> None:
    doc = state["docs"].setdefault(name, {"name": name, "versions": {}, "time": {}})
    doc["versions"][version] = {
        "dist": {"tarball": f"{base}/tarballs/{size}", "integrity": f"sha512-{name}{version}"},
        "_npmUser": {"name": "mallory"},
    }
    doc["time"][version] = "2026-07-01T00:00:00.000Z"
    state["log"].append({"seq": len(state["log"]) + 1, "id": name, "changes": [{"rev": "1-x"}]})


async def test_changes_feed_reads_only_changed_packages() -> None:
    state: dict[str, Any] = {"log": [], "docs": {}}
    async with serve(couchdb_changes_app(state)) as site:
        publish(state, site.base, "left-pad", "1.0.0", 100)
        rec = Recorder()
        source = collector(rec, api="npm", url=site.base + "/")
        assert await poll(source, rec)
        assert rec.rows() == [] and rec.position["state"]["feed"] == "changes"  # type: ignore[index]
        for i in range(3):
            publish(state, site.base, "exfil", f"1.0.{i}", 1000 + i)
        publish(state, site.base, "left-pad", "1.0.1", 50)
        rec.clear()
        assert await poll(source, rec)
        rows = rec.rows()
        assert sorted((r.repository, r.artifact, r.nbytes) for r in rows) == [
            ("exfil", "1.0.0", 1000),
            ("exfil", "1.0.1", 1001),
            ("exfil", "1.0.2", 1002),
            ("left-pad", "1.0.1", 50),
        ]
        assert all(r.contributor.endswith("by mallory") for r in rows)
        assert rec.position["state"]["seq"] == 5  # type: ignore[index]
