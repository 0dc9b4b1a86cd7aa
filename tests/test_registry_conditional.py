"""Steady polls of a PyPI index do only what changed (issue 29).

- A server that sends validators (ETag, Last-Modified) on its index and project pages is
  asked with ``If-None-Match`` / ``If-Modified-Since``; a 304 is a success with nothing new
  (``not_modified``), the project's files unchanged; a page that did change is read and only
  its new file counted.
- The real indexes here send none: pypiserver (neither on ``/simple/`` nor on a project page)
  and devpi (its ``X-Devpi-Serial`` instead: an unchanged serial reads the index page only,
  tests/test_registry_pypi.py).  A page read again byte for byte as before is not parsed
  again (``pages_unchanged``), and an upload still changes its page and is counted.
"""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.fakes.server import serve
from tests.registries import servers
from tests.registries.clients import make_wheel, twine_upload
from tests.registries.harness import Recorder, collector, poll

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def index_app(state: dict[str, Any]) -> web.Application:
    """PEP 691 pages with validators: ETag on the index and on project ``a``, Last-Modified
    only on project ``b``.  ``state['files']`` maps a project to its file names;
    ``state['asked']`` records the conditional headers each request carried."""

    def etag(name: str) -> str:
        return f'"{name}-{len(state["files"][name])}"'

    def modified(name: str) -> str:
        return formatdate(1_700_000_000 + len(state["files"][name]), usegmt=True)

    async def index(request: web.Request) -> web.Response:
        state["asked"].append(("/", request.headers.get("If-None-Match")))
        tag = '"index"'
        if request.headers.get("If-None-Match") == tag:
            return web.Response(status=304, headers={"ETag": tag})
        body = {"meta": {"api-version": "1.1"}, "projects": [{"name": n} for n in state["files"]]}
        return web.Response(text=json.dumps(body), content_type=JSON_TYPE, headers={"ETag": tag})

    async def project(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == "a":
            validator = {"ETag": etag(name)}
            asked = request.headers.get("If-None-Match")
            fresh = asked == etag(name)
        else:
            validator = {"Last-Modified": modified(name)}
            asked = request.headers.get("If-Modified-Since")
            fresh = asked == modified(name)
        state["asked"].append((name, asked))
        if fresh:
            return web.Response(status=304, headers=validator)
        files = [
            {"filename": f, "url": f"../../files/{f}", "hashes": {"sha256": f"{len(f):064x}"},
             "size": 100 + len(f), "upload-time": "2026-01-01T00:00:00Z"}
            for f in state["files"][name]
        ]  # fmt: skip
        doc = {"meta": {"api-version": "1.1"}, "name": name, "files": files}
        return web.Response(text=json.dumps(doc), content_type=JSON_TYPE, headers=validator)

    app = web.Application()
    app.router.add_get("/simple/", index)
    app.router.add_get("/simple/{name}/", project)
    return app


async def test_conditional_requests_per_page_and_listing_and_a_304_is_nothing_new() -> None:
    state: dict[str, Any] = {
        "files": {"a": ["a-1.0.whl", "a-1.1.whl"], "b": ["b-1.0.whl"]},
        "asked": [],
    }
    async with serve(index_app(state)) as site:
        rec = Recorder()
        source = collector(rec, api="pypi", url=f"{site.base}/simple/")
        assert await poll(source, rec)
        assert rec.counts()["baseline_artifacts"] == 3
        assert state["asked"] == [("/", None), ("a", None), ("b", None)]

        state["asked"].clear()
        rec.clear()
        assert await poll(source, rec)
        assert sorted(state["asked"], key=str) == sorted(
            [("/", '"index"'), ("a", '"a-2"'), ("b", formatdate(1_700_000_001, usegmt=True))],
            key=str,
        )
        counts = rec.counts()
        assert counts["not_modified"] == 3 and counts["polls"] == 1, counts
        assert rec.rows() == [] and source.health.up

        # One file more in b: its page is read (Last-Modified changed), a answers 304.
        state["files"]["b"].append("b-2.0.whl")
        rec.clear()
        assert await poll(source, rec)
        assert [(r.repository, r.artifact, r.nbytes) for r in rec.rows()] == [
            ("b", "b-2.0.whl", 109)
        ]
        assert rec.counts()["not_modified"] == 2

        # A restart keeps the validators with the listing: still conditional, nothing new.
        state["asked"].clear()
        again = collector(rec, api="pypi", url=f"{site.base}/simple/")
        rec.clear()
        assert await poll(again, rec)
        assert rec.rows() == [] and rec.counts()["not_modified"] == 3
        assert all(asked is not None for _, asked in state["asked"])


@pytest.mark.slow
async def test_pypiserver_sends_no_validators_so_unchanged_pages_are_not_parsed_again(
    pypiserver: servers.Server, tmp_path: Path
) -> None:
    prefix = "steady"
    for i in range(3):
        twine_upload(pypiserver, make_wheel(tmp_path, f"{prefix}-p{i}", "1.0", 100))
    rec = Recorder()
    source = collector(rec, api="pypi", url=pypiserver.url, packages=[f"{prefix}-*"])
    async with source.client() as client:
        page = await client.get(f"{pypiserver.url}{prefix}-p0/")
        index = await client.get(pypiserver.url)
    for reply in (page, index):
        assert "ETag" not in reply.headers and "Last-Modified" not in reply.headers, (
            "pypiserver began to send validators: test conditional requests against it"
        )

    assert await poll(source, rec)
    assert rec.counts()["baseline_artifacts"] == 3
    rec.clear()
    assert await poll(source, rec)
    counts = rec.counts()
    assert counts["pages_unchanged"] == 3 and counts["not_modified"] == 0, counts
    assert rec.rows() == []

    wheel = make_wheel(tmp_path, f"{prefix}-p1", "1.1", 700)
    twine_upload(pypiserver, wheel)
    rec.clear()
    started = time.time()
    assert await poll(source, rec)
    rows = rec.rows()
    assert [(r.repository, r.artifact) for r in rows] == [(f"{prefix}-p1", wheel.name)]
    assert rows[0].nbytes == wheel.stat().st_size and rows[0].ts <= time.time()
    assert rows[0].ts >= started - 60
    assert rec.counts()["pages_unchanged"] == 2
