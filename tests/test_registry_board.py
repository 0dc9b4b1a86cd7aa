"""A JSON board's edits and the posts deleted before a poll saw them (issue 27): metered from
what the board's API tells (a revision or update time per post, a per-channel post number, a
count of posts ever made), against a local board written through its own HTTP API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from alarm.config import config_from_dict
from alarm.settings import ConfigError
from tests.fakes.board import SOURCE_FIELDS, Board
from tests.fakes.server import Served, serve
from tests.registries.harness import Recorder, collector, poll

EDITS = {"revision": "version", "updated": "updated_at"}


class Agent:
    """Writes to the board through its API, as a workload would."""

    def __init__(self, http: aiohttp.ClientSession, site: Served):
        self.http = http
        self.base = f"{site.base}/api"

    async def post(self, channel: str, text: str) -> dict[str, Any]:
        url = f"{self.base}/channels/{channel}/posts"
        async with self.http.post(url, json={"author": "agent-7", "text": text}) as r:
            assert r.status == 201
            return await r.json()

    async def edit(self, ident: str, text: str) -> dict[str, Any]:
        async with self.http.patch(f"{self.base}/posts/{ident}", json={"text": text}) as r:
            assert r.status == 200
            return await r.json()

    async def delete(self, ident: str) -> None:
        async with self.http.delete(f"{self.base}/posts/{ident}") as r:
            assert r.status == 204


@pytest.fixture
async def board() -> AsyncIterator[tuple[Board, Served, Agent]]:
    b = Board(per_page=4)
    async with serve(b.app()) as site, aiohttp.ClientSession() as http:
        yield b, site, Agent(http, site)


def written(rec: Recorder) -> dict[tuple[str, str], tuple[int, int]]:
    """(repository, artifact) -> (bytes, events) of every write event handed over."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for batch in rec.batches:
        ev = batch.events
        if ev is None:
            continue
        for j in range(len(ev)):
            key = ev.subjects.keys[int(ev.subject[j])]  # type: ignore[attr-defined]
            b, n = out.get(key, (0, 0))
            out[key] = (b + int(ev.nbytes[j]), n + int(ev.events[j]))
    return out


def size_of(post: dict[str, Any]) -> int:
    return len(json.dumps(post, separators=(",", ":")).encode())


async def test_edits_and_posts_deleted_before_a_poll_are_written_and_counted(board) -> None:
    _, site, agent = board
    cfg = {**SOURCE_FIELDS, **EDITS, "sequence": "number", "url": f"{site.base}/api/posts"}
    for i in range(5):
        await agent.post("general", f"hello {i}")
    rec = Recorder()
    assert await poll(collector(rec, **cfg), rec)
    assert rec.counts()["baseline_artifacts"] == 5

    edited = await agent.edit("p2", "E" * 2000)  # a post rewritten with a payload
    made = [await agent.post("general", f"burst {i}") for i in range(4)]
    for post in made[:3]:  # three gone before the next poll: only the fourth is listed
        await agent.delete(post["id"])
    leaks = [await agent.post("leaks", "x" * 300) for _ in range(3)]
    for post in leaks[:2]:
        await agent.delete(post["id"])
    await agent.delete("p4")  # a post the last poll saw, deleted
    rec.clear()
    # A restart between the polls: what was learned is read back from the saved state.
    assert await poll(collector(rec, **cfg), rec)
    got = written(rec)
    assert got[("general", "p2")] == (size_of(edited), 1), "the edit: its new size, once"
    assert got[("general", made[3]["id"])] == (size_of(made[3]), 1)
    assert got[("leaks", leaks[2]["id"])] == (size_of(leaks[2]), 1)
    unseen = {k: n for k, (nbytes, n) in got.items() if k[1].startswith(k[0] + " #")}
    assert unseen == {("general", "general #6-9"): 3, ("leaks", "leaks #1-3"): 2}
    counts = rec.counts()
    assert counts["items_edited"] == 1
    assert counts["items_deleted_unseen"] == 5
    assert counts["items_gone"] == 1
    edit_rows = [r for r in rec.rows() if r.artifact == "p2"]
    assert edit_rows[0].ts == pytest.approx(edited["updated_at"])
    assert edit_rows[0].evidence["edited"] is True
    assert edit_rows[0].evidence["revision"] == "2"

    rec.clear()
    assert await poll(collector(rec, **cfg), rec)
    assert written(rec) == {}, "nothing changed: nothing counted again"


async def test_a_created_count_meters_posts_that_a_window_of_the_newest_never_showed(
    board,
) -> None:
    b, site, agent = board
    b.newest = 3  # the board lists its newest three posts only
    cfg = {**SOURCE_FIELDS, "created_total": "meta.created_total", "url": f"{site.base}/api/posts"}
    for i in range(3):
        await agent.post("general", f"old {i}")
    rec = Recorder()
    assert await poll(collector(rec, **cfg), rec)
    for i in range(5):
        await agent.post("general", f"new {i}")
    for _ in range(2):
        await agent.delete((await agent.post("general", "gone"))["id"])
    rec.clear()
    assert await poll(collector(rec, **cfg), rec)
    got = written(rec)
    listed = {k: v for k, v in got.items() if " created " not in k[1]}
    assert len(listed) == 3, "the three newest are listed and counted with their sizes"
    # 7 made, 3 listed: 2 deleted and 2 off the window before a poll showed them, counted
    # on the source (the count is the whole board's).
    unseen = {k: n for k, (_, n) in got.items() if " created " in k[1]}
    assert unseen == {("reg", "reg created 4-10"): 4}
    assert rec.counts()["items_deleted_unseen"] == 4
    assert rec.counts()["items_gone"] == 3


async def test_turning_edits_on_for_a_known_board_learns_revisions_without_counting(
    board,
) -> None:
    _, site, agent = board
    plain = {**SOURCE_FIELDS, "url": f"{site.base}/api/posts"}
    for i in range(6):
        await agent.post("general", f"hello {i}")
    rec = Recorder()
    assert await poll(collector(rec, **plain), rec)
    assert await poll(collector(rec, **plain), rec)
    rec.clear()
    with_edits = {**plain, **EDITS, "sequence": "number"}
    assert await poll(collector(rec, **with_edits), rec)
    assert written(rec) == {}, "no edit storm, no gaps: the revisions are learned"
    await agent.edit("p1", "changed")
    rec.clear()
    assert await poll(collector(rec, **with_edits), rec)
    assert list(written(rec)) == [("general", "p1")]


async def test_hostile_sequences_are_counted_and_bounded(board) -> None:
    b, site, agent = board
    cfg = {
        **SOURCE_FIELDS,
        "sequence": "number",
        "url": f"{site.base}/api/posts",
        "max_items": 1000,
    }
    await agent.post("general", "first")
    rec = Recorder()
    assert await poll(collector(rec, **cfg), rec)
    leap = await agent.post("general", "leap")
    b.posts[leap["id"]]["number"] = 10**17  # a sequence that jumps
    odd = await agent.post("general", "odd")
    b.posts[odd["id"]]["number"] = "seven"
    rec.clear()
    assert await poll(collector(rec, **cfg), rec)
    counts = rec.counts()
    assert counts["sequence_jumps"] == 1 and counts["sequence_unreadable"] == 1
    assert counts["items_deleted_unseen"] == 1000, "metered as max_items, not 10**17"
    assert len(written(rec)) == 3  # both posts, and the bounded jump


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"sequence": "number", "created_total": "meta.n"}, "give one"),
        ({"created_total": "meta.n", "packages": ["a*"]}, "cannot be used with packages"),
        ({"revision": "a..b"}, "names joined by dots"),
    ],
)
def test_board_settings_that_cannot_work_are_refused_naming_them(extra, message) -> None:
    source = {
        "name": "b",
        "type": "registry",
        "url": "http://board/api/posts",
        **SOURCE_FIELDS,
        **extra,
    }
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"sources": [source]})
