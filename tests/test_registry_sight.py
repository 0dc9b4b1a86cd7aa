"""Proof of sight for registry sources: ``health.blind`` (the service's ``surface_blind``
alarm) while the last successful poll is older than ``blind_after`` — a registry down at
start, one that hangs mid-poll — cleared by the next successful poll; the default and the
check of ``blind_after``; no credentials in the message."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

from alarm.config import ConfigError, config_from_dict
from tests.fakes.kit import wait_for
from tests.fakes.server import free_port, serve
from tests.registries.harness import Recorder, collector, running, settings

BOARD = {"api": "json", "items": "posts", "id": "id", "size": "bytes"}


def board_app(state: dict[str, Any]) -> web.Application:
    """A board listing ``state['posts']``; while ``state['hang']`` is set a request hangs."""

    async def posts(request: web.Request) -> web.Response:
        state["requests"] = state.get("requests", 0) + 1
        if state.get("hang"):
            await asyncio.sleep(3600)
        return web.json_response({"posts": state["posts"]})

    app = web.Application()
    app.router.add_get("/posts", posts)
    return app


async def test_down_at_start_is_blind_after_blind_after_and_sees_when_it_is_up() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/posts"
    rec = Recorder()
    source = collector(rec, **BOARD, url=url, interval=1, blind_after=2, retries=0)
    began = time.time()
    async with running(source, rec):
        await wait_for(lambda: source.health.errors >= 1, 5)
        assert source.health.blind == "", "a failed poll is down at once, blind only later"
        assert not source.health.up
        await wait_for(lambda: bool(source.health.blind), 5)
        assert time.time() - began >= 2.0, "not before blind_after"
        assert source.health.blind == f"no successful poll of {url} for 2s"
        assert rec.counts()["poll_errors"] >= 2, "failed polls are counted as before"
        await wait_for(lambda: source.health.blind.endswith("for 4s"), 5)  # its age, kept up

        async with serve(board_app({"posts": [{"id": 1, "bytes": 10}]}), port):
            await wait_for(lambda: source.health.up, 5)
            assert source.health.blind == "", "a successful poll sees again at once"
            await asyncio.sleep(2.5)
            assert source.health.blind == "", "and stays seeing while polls succeed"
    assert rec.counts()["baseline_artifacts"] == 1


async def test_a_poll_that_hangs_is_blind_while_it_hangs() -> None:
    state: dict[str, Any] = {"posts": [{"id": 1, "bytes": 10}]}
    async with serve(board_app(state)) as site:
        rec = Recorder()
        source = collector(
            rec, **BOARD, url=f"{site.base}/posts", interval=1, blind_after=2, timeout=30
        )
        async with running(source, rec):
            await wait_for(lambda: source.health.up, 5)
            state["hang"] = True
            seen = source.health.last_success_at
            await wait_for(lambda: bool(source.health.blind), 5)
            assert time.time() - seen >= 2.0
            # No poll has failed yet (the request is still in flight): up, but blind.
            assert source.health.up and source.health.errors == 0
            assert source.health.blind.startswith(f"no successful poll of {site.base}/posts")
            state["hang"] = False
            # The hanging request is cut by its timeout only; the next poll after it sees.


def test_blind_after_defaults_to_three_intervals_at_least_a_minute() -> None:
    base = {**BOARD, "url": "http://127.0.0.1:1/posts"}
    assert settings(**base, interval=30).blind_seconds == 90.0
    assert settings(**base, interval=5).blind_seconds == 60.0
    assert settings(**base, interval=5, blind_after="10s").blind_seconds == 10.0
    with pytest.raises(ConfigError, match=r"sources\[0\]: .*blind_after \(5s\) must be longer"):
        config_from_dict(
            {
                "sources": [
                    {"name": "b", "type": "registry", **base, "interval": 5, "blind_after": 5}
                ]
            }
        )


async def test_the_blind_message_shows_no_credentials_or_query() -> None:
    port = free_port()
    url = f"http://agent:s3cret-pass@127.0.0.1:{port}/posts?token=t0ken#frag"
    rec = Recorder()
    source = collector(rec, **BOARD, url=url, interval=1, blind_after=1.5, retries=0)
    async with running(source, rec):
        await wait_for(lambda: bool(source.health.blind), 5)
    blind = source.health.blind
    assert blind.startswith(f"no successful poll of http://127.0.0.1:{port}/posts for ")
    assert "s3cret" not in blind and "t0ken" not in blind and "agent" not in blind
