"""The shared poller and the generic JSON adapter: the schedule, proof of sight, watermarks,
event time across a restart, pagination, field paths, and the configuration users write."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from aiohttp import web

from alarm.collectors import SOURCE_TYPES
from alarm.config import config_from_dict
from alarm.events import Batch
from tests.fakes.server import serve
from tests.registries.harness import Recorder, collector, poll


def paged_board(posts: list[dict[str, Any]], per_page: int, style: str) -> web.Application:
    """Pages of ``per_page`` posts, linked by a ``next`` field or a ``Link`` header."""

    async def page(request: web.Request) -> web.Response:
        n = int(request.query.get("page", "0"))
        chunk = posts[n * per_page : (n + 1) * per_page]
        more = (n + 1) * per_page < len(posts)
        body: dict[str, Any] = {"data": {"items": chunk}}
        headers = {}
        if more and style == "field":
            body["data"]["next"] = f"?page={n + 1}"
        if more and style == "link":
            headers["Link"] = f'</board?page={n + 1}>; rel="next"'
        return web.json_response(body, headers=headers)

    app = web.Application()
    app.router.add_get("/board", page)
    return app


def message(i: int, channel: str, author: str, text: str, at: float) -> dict[str, Any]:
    return {"id": f"m{i}", "channel": channel, "author": {"name": author}, "text": text, "ts": at}


@pytest.mark.parametrize("style", ["field", "link"])
async def test_generic_json_board_follows_pages_and_reads_field_paths(style: str) -> None:
    posts = [message(i, "general", "bot", "hello", 1.0) for i in range(7)]
    cfg = {
        "api": "json",
        "items": "data.items",
        "id": "id",
        "time": "ts",
        "repository": "channel",
        "uploader": "author.name",
        "next": "data.next",
    }
    async with serve(paged_board(posts, 3, style)) as site:
        rec = Recorder()
        source = collector(rec, **cfg, url=f"{site.base}/board")
        assert await poll(source, rec)
        assert rec.counts()["baseline_artifacts"] == 7
        posts.append(message(7, "leaks", "agent-17", "A" * 500, time.time()))
        rec.clear()
        assert await poll(source, rec)
        (row,) = rec.rows()
        assert (row.repository, row.artifact) == ("leaks", "m7")
        assert row.contributor == "leaks m7 by agent-17"
        # Without a size field a post's bytes are its JSON (the text and what frames it).
        assert row.nbytes > 500


async def test_run_polls_on_its_interval_with_watermark_and_proof_of_sight() -> None:
    posts = [message(0, "c", "a", "x", 1.0)]
    batches: list[Batch] = []
    async with serve(paged_board(posts, 100, "field")) as site:
        rec = Recorder()
        source = collector(
            rec, api="json", items="data.items", url=f"{site.base}/board", interval=1
        )

        async def emit(batch: Batch) -> None:
            batches.append(batch)
            await rec(batch)

        task = asyncio.create_task(source.run(emit))
        try:
            await asyncio.sleep(0.5)
            assert source.health.up and source.health.caught_up
            first_sight = source.health.last_success_at
            posts.append(message(1, "c", "a", "y", time.time()))
            await asyncio.sleep(1.2)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert source.health.last_success_at > first_sight, "every poll proves sight again"
    finals = [b for b in batches if b.watermark is not None]
    assert len(finals) >= 2
    assert finals[1].watermark - finals[0].watermark == pytest.approx(1.0, abs=0.3)  # type: ignore[operator]
    assert [r.artifact for r in rec.rows()] == ["m1"]
    assert source.lag < 0.5


async def test_upload_times_are_clamped_into_the_outage_window() -> None:
    posts = [message(0, "c", "a", "x", 1.0)]
    async with serve(paged_board(posts, 100, "field")) as site:
        rec = Recorder()
        cfg = {"api": "json", "items": "data.items", "time": "ts", "url": f"{site.base}/board"}
        assert await poll(collector(rec, **cfg), rec)
        saved_since = rec.position["since"]  # type: ignore[index]
        now = time.time()
        posts.append(message(1, "c", "a", "during the outage", now - 0.5))
        posts.append(message(2, "c", "a", "claims to be ancient", 1000.0))
        posts.append(message(3, "c", "a", "claims the future", now + 86400))
        rec.clear()
        assert await poll(collector(rec, **cfg), rec)
    ts = {r.artifact: r.ts for r in rec.rows()}
    assert ts["m1"] == pytest.approx(now - 0.5)
    assert ts["m2"] == saved_since, "never before the last complete poll: that tick is closed"
    assert ts["m3"] <= time.time(), "a registry clock ahead of ours is cut back to now"


async def test_a_position_for_another_url_is_not_reused() -> None:
    posts = [message(0, "c", "a", "x", 1.0)]
    async with serve(paged_board(posts, 100, "field")) as site:
        rec = Recorder()
        assert await poll(
            collector(rec, api="json", items="data.items", url=f"{site.base}/board"), rec
        )
        assert rec.ledger
        moved = collector(rec, api="json", items="data.items", url=f"{site.base}/board?v=2")
        rec.clear()
        assert await poll(moved, rec)
        assert rec.rows() == [] and rec.counts()["baseline_artifacts"] == 1


def test_the_configurations_users_write_are_accepted() -> None:
    cfg = config_from_dict(
        {
            "sources": [
                {"name": "internal-pypi", "type": "registry", "api": "pypi",
                 "url": "http://pypi.internal:8080/simple/", "interval": "30s"},
                {"name": "npm-proxy", "type": "registry", "api": "npm",
                 "url": "http://verdaccio:4873/", "packages": ["@sandbox/*"]},
                {"name": "board", "type": "registry", "api": "mediawiki",
                 "url": "http://wiki/api.php", "credentials": {"file": "/etc/capalarm/wiki"}},
            ],
            "surfaces": [
                {"name": "internal-pypi", "kind": "registry", "match": {"source": ["internal-pypi"]}},
                {"name": "sandbox-npm", "kind": "registry",
                 "match": {"source": ["npm-proxy"], "repository": ["@sandbox/*"]}},
            ],
        }
    )  # fmt: skip
    pypi, npm, wiki = cfg.sources
    assert (pypi.api, pypi.interval, npm.packages) == ("pypi", 30.0, ["@sandbox/*"])
    assert wiki.credentials.file == "/etc/capalarm/wiki"
    assert SOURCE_TYPES["registry"].kind == "registry"


def test_an_unknown_api_is_named_with_the_known_ones() -> None:
    with pytest.raises(Exception, match=r"sources\[0\]\.api: unknown api 'pypy'"):
        config_from_dict(
            {"sources": [{"name": "x", "type": "registry", "api": "pypy", "url": "http://x/"}]}
        )
