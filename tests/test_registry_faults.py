"""Hostile and broken registries on loopback: down at start, 500s, 429 with Retry-After, hangs,
slow drip, garbage, a 2 GB body, endless bodies, repeated and vanishing items, redirects to
another host, TLS.  Each must end as counted errors and a failed (or completed) poll: never a
crash, never unbounded memory, never a storm of false "new"."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import ssl
import subprocess
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from alarm.collectors.registry.http import special_address_refusal
from tests.fakes.server import free_port, serve
from tests.registries import servers
from tests.registries.harness import Recorder, collector, poll, settings

BOARD = {"api": "json", "items": "posts", "id": "id", "size": "bytes", "time": "at"}


def board_app(state: dict[str, Any]) -> web.Application:
    """A message board listing ``state['posts']``; ``state['faults']`` is a list of what the
    next requests get instead (a status, 'hang', 'garbage', ...), consumed in order."""

    async def posts(request: web.Request) -> web.StreamResponse:
        state["requests"] = state.get("requests", 0) + 1
        state["auth"].append(request.headers.get("Authorization"))
        faults = state.setdefault("faults", [])
        fault = faults.pop(0) if faults else None
        if isinstance(fault, tuple):  # (status, headers)
            return web.Response(status=fault[0], headers=fault[1])
        if isinstance(fault, int):
            return web.Response(status=fault, text="boom")
        if fault == "hang":
            await asyncio.sleep(3600)
        if fault == "garbage":
            return web.Response(text='{"posts": [{"id": 1,', content_type="application/json")
        if fault == "nested":  # deeper than json.loads can recurse: RecursionError, not ValueError
            return web.Response(text="[" * 100_000, content_type="application/json")
        if fault == "drip":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            for _ in range(100):
                await resp.write(b" ")
                await asyncio.sleep(0.2)
            return resp
        return web.json_response({"posts": state["posts"]})

    app = web.Application()
    app.router.add_get("/posts", posts)
    return app


def board(**extra: Any) -> dict[str, Any]:
    return {"posts": [], "auth": [], **extra}


def post(i: int, nbytes: int = 100, at: float | None = None) -> dict[str, Any]:
    return {"id": i, "bytes": nbytes, "at": time.time() if at is None else at, "body": "x"}


async def test_down_at_start_then_up_learns_without_counting() -> None:
    port = free_port()
    rec = Recorder()
    source = collector(rec, **BOARD, url=f"http://127.0.0.1:{port}/posts", retries=0)
    assert not await poll(source, rec)
    assert not source.health.up and source.health.errors == 1
    assert "ClientConnectorError" in source.health.last_error
    assert rec.counts()["poll_errors"] == 1 and rec.position is None

    state = board(posts=[post(1), post(2)])
    async with serve(board_app(state), port):
        assert await poll(source, rec)
        assert rec.rows() == [] and rec.counts()["baseline_artifacts"] == 2
        assert source.health.up and source.health.last_success_at > 0
        state["posts"].append(post(3, 777))
        rec.clear()
        assert await poll(source, rec)
        assert [(r.artifact, r.nbytes) for r in rec.rows()] == [("3", 777)]


async def test_500s_are_retried_with_backoff() -> None:
    state = board(posts=[post(1)], faults=[500, 502])
    async with serve(board_app(state)) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, url=f"{site.base}/posts", retries=2)
        assert await poll(source, rec)
        counts = rec.counts()
        assert counts["retries"] == 2 and counts["http_errors"] == 2 and counts["poll_errors"] == 0


async def test_429_retry_after_is_honoured_and_a_long_one_ends_the_poll() -> None:
    state = board(posts=[post(1)], faults=[(429, {"Retry-After": "1"})])
    async with serve(board_app(state)) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, url=f"{site.base}/posts", retries=1)
        began = time.monotonic()
        assert await poll(source, rec)
        assert time.monotonic() - began >= 0.95, "waited as asked"
        assert rec.counts()["rate_limited"] == 1

        state["faults"] = [(429, {"Retry-After": "3600"})]
        rec.clear()
        assert not await poll(source, rec)
        assert state["requests"] == 3, "not hammered: one request, then the poll ends"
        assert source.not_before >= time.time() + 3500
        assert rec.position is not None and rec.position["not_before"] == source.not_before


async def test_hang_and_slow_drip_are_cut_off_by_the_timeout() -> None:
    state = board(posts=[post(1)], faults=["hang", "drip"])
    async with serve(board_app(state)) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, url=f"{site.base}/posts", retries=1, timeout=0.5)
        began = time.monotonic()
        assert not await poll(source, rec)
        assert time.monotonic() - began < 5
        assert rec.counts()["timeouts"] == 2 and "timed out" in source.health.last_error


@pytest.mark.parametrize("fault", ["garbage", "nested"])
async def test_garbage_json_is_a_counted_failed_poll(fault: str) -> None:
    state = board(posts=[post(1)], faults=[fault])
    async with serve(board_app(state)) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, url=f"{site.base}/posts")
        assert not await poll(source, rec)
        assert rec.counts()["garbage_responses"] == 1 and "not JSON" in source.health.last_error
        assert await poll(source, rec), "the next poll is fine"


def huge_app(sent: list[int]) -> web.Application:
    """A 2 GB body with its length declared, and an endless chunked one; ``sent`` is how many
    bytes the server managed to write."""

    async def declared(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(2 * 1024**3)})
        await resp.prepare(request)
        chunk = b"[" + b"0," * 32767
        try:
            for _ in range(2 * 1024**3 // len(chunk)):
                await resp.write(chunk)
                sent[0] += len(chunk)
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        chunk = b"[" + b"0," * 32767
        try:
            while sent[1] < 4 * 1024**3:  # bounded, in case the client never stops reading
                await resp.write(chunk)
                sent[1] += len(chunk)
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    app = web.Application()
    app.router.add_get("/declared", declared)
    app.router.add_get("/endless", endless)
    return app


async def test_2gb_and_endless_bodies_are_abandoned_at_the_cap_in_bounded_memory() -> None:
    sent = [0, 0]
    cap = 1024 * 1024
    async with serve(huge_app(sent)) as site:
        rec = Recorder()
        tracemalloc.start()
        try:
            declared = collector(rec, **BOARD, url=f"{site.base}/declared", max_response_bytes=cap)
            assert not await poll(declared, rec)
            endless = collector(rec, **BOARD, url=f"{site.base}/endless", max_response_bytes=cap)
            assert not await poll(endless, rec)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert rec.counts()["oversized_responses"] == 2
        assert "2147483648 bytes over" in declared.health.last_error
        assert "over the 1048576 byte cap" in endless.health.last_error
        assert peak < 8 * cap, f"peak {peak} bytes while refusing a 2 GB body"
        await asyncio.sleep(0.2)
        assert sent[0] < 64 * cap and sent[1] < 64 * cap, f"the server wrote {sent}"


async def test_repeated_ids_and_a_listing_that_goes_empty_make_no_storm() -> None:
    state = board(posts=[post(i) for i in range(10)])
    async with serve(board_app(state)) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, url=f"{site.base}/posts")
        assert await poll(source, rec)
        state["posts"] = state["posts"] + [post(3), post(3), post(10, 50), post(10, 50)]
        rec.clear()
        assert await poll(source, rec)
        assert [(r.artifact, r.nbytes) for r in rec.rows()] == [("10", 50)]
        assert rec.counts()["duplicate_items"] == 3

        everything = state["posts"]
        state["posts"] = []  # a glitch: the board lists nothing for a while
        rec.clear()
        assert await poll(source, rec)
        assert rec.counts()["listing_shrinks"] >= 1
        state["posts"] = everything
        rec.clear()
        assert await poll(source, rec)
        assert rec.rows() == [], "what came back is not new"


async def test_max_items_bounds_a_listing_of_millions() -> None:
    many = [{"id": i, "bytes": 1, "at": 0} for i in range(200_000)]
    body = json.dumps({"posts": many}).encode()

    async def listing(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/posts", listing)
    async with serve(app) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, url=f"{site.base}/posts", max_items=100_000)
        assert not await poll(source, rec)
        assert rec.counts()["listing_truncated"] == 1 and rec.ledger == {}


async def test_credentials_never_follow_a_redirect_to_another_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "alice:s3cret-value"
    (tmp_path / "cred").write_text(secret)
    other = board(posts=[post(1)])
    async with serve(board_app(other)) as elsewhere:

        async def moved(request: web.Request) -> web.Response:
            home["auth"].append(request.headers.get("Authorization"))
            # The same service under another name: another origin (RFC 6454).
            raise web.HTTPFound(f"http://localhost:{elsewhere.port}/posts")

        home: dict[str, Any] = {"auth": []}
        app = web.Application()
        app.router.add_get("/posts", moved)
        async with serve(app) as site:
            rec = Recorder()
            source = collector(
                rec,
                **BOARD,
                url=f"{site.base}/posts",
                credentials={"file": str(tmp_path / "cred")},
                allow_redirect_hosts=["localhost"],  # another origin is followed only if listed
            )
            with caplog.at_level(logging.DEBUG):
                assert await poll(source, rec)
    assert home["auth"] == ["Basic YWxpY2U6czNjcmV0LXZhbHVl"], "sent to the registry itself"
    assert other["auth"] == [None], "not to the host it redirected to"
    assert rec.counts()["credentials_withheld"] == 1
    assert "s3cret" not in caplog.text and "s3cret" not in repr(source.settings)


def redirecting_app(state: dict[str, Any], location: str) -> web.Application:
    """A registry whose listing moved: ``/old`` answers 302 to ``location``; ``/posts`` is the
    board itself (a same-origin redirect lands there)."""

    async def old(request: web.Request) -> web.Response:
        state["auth"].append(request.headers.get("Authorization"))
        raise web.HTTPFound(location)

    app = board_app(state)
    app.router.add_get("/old", old)
    return app


async def test_a_redirect_on_the_same_origin_is_followed(tmp_path: Path) -> None:
    (tmp_path / "cred").write_text("alice:s3cret-value")
    state = board(posts=[post(1), post(2)])
    async with serve(redirecting_app(state, "/posts")) as site:
        rec = Recorder()
        cred = {"file": str(tmp_path / "cred")}
        source = collector(rec, **BOARD, url=f"{site.base}/old", credentials=cred)
        assert await poll(source, rec)
    assert rec.counts()["baseline_artifacts"] == 2 and rec.counts()["redirects_refused"] == 0
    assert state["auth"] == ["Basic YWxpY2U6czNjcmV0LXZhbHVl"] * 2  # its own origin: both


async def test_a_redirect_to_another_origin_is_a_failed_poll_unless_its_host_is_listed() -> None:
    """Another port of the same address is another origin (RFC 6454), standing in for another
    host: what it answered used to be polled and shown as the registry's evidence."""
    elsewhere = board(posts=[post(7)])
    async with serve(board_app(elsewhere)) as other:
        home = board()
        async with serve(redirecting_app(home, f"{other.base}/posts?token=t0k")) as site:
            rec = Recorder()
            source = collector(rec, **BOARD, url=f"{site.base}/old", retries=2)
            assert not await poll(source, rec)
            assert elsewhere.get("requests", 0) == 0, "the other origin was never asked"
            assert home["auth"] == [None], "refused at once, not retried"
            counts = rec.counts()
            assert counts["redirects_refused"] == 1 and counts["poll_errors"] == 1
            assert not source.health.up
            assert source.health.last_error == (
                f"reg: {site.base}/old: redirect to {other.base}/posts refused: another origin, "
                "and allow_redirect_hosts does not list 127.0.0.1"
            )

            # Listed: followed (an IP address listed as itself may be loopback).
            rec = Recorder()
            source = collector(
                rec, **BOARD, url=f"{site.base}/old", allow_redirect_hosts=["127.0.0.1"]
            )
            assert await poll(source, rec)
            assert elsewhere["requests"] == 1 and rec.counts()["baseline_artifacts"] == 1


async def test_a_listed_name_is_not_followed_onto_a_loopback_or_link_local_address() -> None:
    """A listed name pointed (by DNS) at 169.254.169.254 or 127.0.0.1 is refused; listing the
    address itself, or a localhost name, says that is meant."""
    allowed = ["cdn.example", "127.0.0.1"]
    for address in ("169.254.169.254", "fe80::1%2", "::ffff:169.254.169.254", "::1", "0.0.0.0"):
        why = special_address_refusal("cdn.example", ["203.0.113.5", address], allowed)
        assert why is not None and "cdn.example is at" in why, address
    assert special_address_refusal("cdn.example", ["203.0.113.5"], allowed) is None
    assert special_address_refusal("cdn.example", ["127.0.0.1"], allowed) is None
    assert special_address_refusal("localhost", ["::1", "127.0.0.1"], ["localhost"]) is None
    # Entries are compared as a URL's host is: lower case, canonical addresses, no brackets.
    hosts = ["CDN.Example", "[0:0::1]", "169.254.169.254"]
    assert settings(**BOARD, url="http://r/", allow_redirect_hosts=hosts).allow_redirect_hosts == [
        "cdn.example",
        "::1",
        "169.254.169.254",
    ]
    with pytest.raises(ValueError, match="without a port"):
        settings(**BOARD, url="http://r/", allow_redirect_hosts=["cdn.example:8443"])
    # Link-local or loopback literals are other origins, refused unless listed as such.
    state = board()
    async with serve(redirecting_app(state, "http://169.254.169.254/latest/meta-data/")) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, url=f"{site.base}/old", allow_redirect_hosts=["x.example"])
        assert not await poll(source, rec)
        assert "allow_redirect_hosts does not list 169.254.169.254" in source.health.last_error


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        servers.unavailable("openssl is not installed")
    assert openssl is not None
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


async def test_tls_is_verified_and_a_custom_ca_is_trusted(tmp_path: Path) -> None:
    key, cert = self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    runner = web.AppRunner(board_app(board(posts=[post(1)])))
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx)
    await site.start()
    try:
        url = f"https://127.0.0.1:{port}/posts"
        rec = Recorder()
        untrusted = collector(rec, **BOARD, url=url, retries=0)
        assert not await poll(untrusted, rec), "an unknown CA is refused"
        assert "Certificate" in untrusted.health.last_error or "SSL" in untrusted.health.last_error
        trusted = collector(Recorder(), **BOARD, url=url, ca_file=str(cert))
        assert await poll(trusted, Recorder())
    finally:
        await runner.cleanup()


async def test_requests_in_flight_stay_within_the_concurrency_limit() -> None:
    live = {"now": 0, "max": 0}
    names = [f"p{i}" for i in range(24)]

    async def index(request: web.Request) -> web.Response:
        doc = {"meta": {"api-version": "1.1"}, "projects": [{"name": n} for n in names]}
        return web.Response(
            text=json.dumps(doc), content_type="application/vnd.pypi.simple.v1+json"
        )

    async def project(request: web.Request) -> web.Response:
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        await asyncio.sleep(0.05)
        live["now"] -= 1
        doc = {"meta": {"api-version": "1.1"}, "name": request.match_info["name"], "files": []}
        return web.Response(
            text=json.dumps(doc), content_type="application/vnd.pypi.simple.v1+json"
        )

    app = web.Application()
    app.router.add_get("/simple/", index)
    app.router.add_get("/simple/{name}/", project)
    async with serve(app) as site:
        rec = Recorder()
        source = collector(rec, api="pypi", url=f"{site.base}/simple/", concurrency=3)
        assert await poll(source, rec)
    assert live["max"] == 3


async def test_unreadable_ledger_rows_are_relearned_not_counted() -> None:
    state = board(posts=[post(1), post(2)])
    async with serve(board_app(state)) as site:
        rec = Recorder()
        cfg = {**BOARD, "url": f"{site.base}/posts"}
        assert await poll(collector(rec, **cfg), rec)
        (key,) = rec.ledger
        rec.ledger[key] = "{not json"
        restarted = collector(rec, **cfg)
        rec.clear()
        assert await poll(restarted, rec)
        assert rec.counts()["ledger_rows_invalid"] == 1
        assert rec.rows() == [], "the group is learned again, not counted as new"
        assert rec.ledger[key] != "{not json"
        state["posts"].append(post(3, 30))
        rec.clear()
        assert await poll(restarted, rec)
        assert [(r.artifact, r.nbytes) for r in rec.rows()] == [("3", 30)]


async def test_an_out_of_range_size_is_one_counted_parse_error_not_a_crash_loop() -> None:
    """A size no artifact can have (``10**30``: beyond int64; a negative one) made the batch
    fail to build: the poll raised, nothing was saved, and every poll after a restart found
    the same item new and raised again.  It is one parse error, once; the rest is counted."""
    state = board(posts=[post(1)])
    async with serve(board_app(state)) as site:
        rec = Recorder()
        cfg = {**BOARD, "url": f"{site.base}/posts"}
        source = collector(rec, **cfg)
        assert await poll(source, rec)
        state["posts"] += [post(2, 10**30), post(3, -5), post(4, 40)]
        rec.clear()
        assert await poll(source, rec)
        assert [(r.artifact, r.nbytes) for r in rec.rows()] == [("4", 40)]
        counts = rec.counts()
        assert counts["parse_errors"] == 2 and counts["poll_errors"] == 0
        assert source.health.up

        restarted = collector(rec, **cfg)  # as the service restarts a failed collector
        state["posts"].append(post(5, 50))
        rec.clear()
        assert await poll(restarted, rec)
        assert [(r.artifact, r.nbytes) for r in rec.rows()] == [("5", 50)]
        assert rec.counts()["parse_errors"] == 0, "the bad item is not counted again"


@pytest.mark.parametrize("at", [10**30, 1e18, -1e18, -1e11])
async def test_an_out_of_range_time_is_an_unknown_time(at: Any) -> None:
    """An upload time no datetime can hold is taken as unknown: the item counts, now."""
    state = board(posts=[post(1)])
    async with serve(board_app(state)) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, url=f"{site.base}/posts")
        assert await poll(source, rec)
        state["posts"].append(post(2, 20, at=at))
        rec.clear()
        began = time.time()
        assert await poll(source, rec)
        (row,) = rec.rows()
        assert (row.artifact, row.nbytes) == ("2", 20) and row.ts >= began
        assert row.evidence is not None and row.evidence["uploaded_at"] is None


def flapping_app(state: dict[str, Any]) -> web.Application:
    """A board behind a load balancer with one lagging replica: requests alternate between
    the listings in ``state['listings']``."""

    async def posts(request: web.Request) -> web.Response:
        n = state["requests"] = state.get("requests", 0) + 1
        listings = state["listings"]
        return web.json_response({"posts": listings[n % len(listings)]})

    app = web.Application()
    app.router.add_get("/posts", posts)
    return app


async def test_an_item_flapping_in_and_out_of_a_listing_is_counted_once() -> None:
    base = [post(i, at=1_700_000_000 + i) for i in range(1, 10)]
    state: dict[str, Any] = {"listings": [base]}
    async with serve(flapping_app(state)) as site:
        rec = Recorder()
        cfg = {**BOARD, "url": f"{site.base}/posts"}
        source = collector(rec, **cfg)
        assert await poll(source, rec)  # learns the nine

        flapper = post(10, 7777, at=time.time())
        state["listings"] = [[*base, flapper], base]  # one replica has it, the other not yet
        rec.clear()
        for _ in range(8):
            assert await poll(source, rec)
        assert [(r.artifact, r.nbytes) for r in rec.rows()] == [("10", 7777)]
        assert rec.counts()["items_reappeared"] == 3

        # The memory is saved with the position: a restarted collector does not count it again.
        restarted = collector(rec, **cfg)
        rec.clear()
        for _ in range(4):
            assert await poll(restarted, rec)
        assert rec.rows() == []

        # A genuinely new revision under the same id (another size and time) is a write.
        changed = post(10, 8888, at=time.time() + 1)
        state["listings"] = [[*base, changed], base]
        rec.clear()
        for _ in range(6):
            assert await poll(restarted, rec)
        assert [(r.artifact, r.nbytes) for r in rec.rows()] == [("10", 8888)]


def test_the_memory_of_what_was_counted_is_bounded_and_survives_a_save() -> None:
    from alarm.collectors.registry.recent import RecentlyCounted

    recent = RecentlyCounted(limit=3, window=100.0)
    for key in range(5):
        recent.remember(key, 1000.0 + key)
    assert len(recent) == 3 and not recent.seen_again(0, 1005.0)
    assert recent.seen_again(2, 1050.0)  # found again: kept from now on
    assert not recent.seen_again(3, 1110.0), "older than the window"
    assert recent.seen_again(2, 1110.0)

    back = RecentlyCounted(limit=3, window=100.0)
    assert back.restore(recent.to_json()) and back.seen_again(2, 1120.0)
    assert not back.restore({"h": "!!", "t": ""}) and len(back) == 0
    assert back.restore(None) and len(back) == 0


async def test_a_board_that_pages_for_ever_fails_the_poll_at_max_pages() -> None:
    """A JSON board whose every page links to a new one, each link a few kB: the source kept
    every page URL it read (up to 100,000: hundreds of MB).  It is bounded by the source's
    ``max_pages`` like every other paged listing, and the poll fails, counted."""
    served = {"n": 0}

    async def page(request: web.Request) -> web.Response:
        served["n"] += 1
        nxt = f"/posts?p={served['n']}&pad={'x' * 4000}"
        return web.json_response({"posts": [post(served["n"])], "next": nxt})

    app = web.Application()
    app.router.add_get("/posts", page)
    async with serve(app) as site:
        rec = Recorder()
        source = collector(rec, **BOARD, next="next", url=f"{site.base}/posts", max_pages=20)
        assert not await poll(source, rec)
        assert rec.counts()["pages_over_limit"] == 1
        assert "max_pages" in source.health.last_error
        assert served["n"] == 20
