"""A board polled on schedule while a swarm posts (issue 27): where every source polls (the
Helm chart's registry Deployment), every post counts in the tick of its own time, none late,
because the pipeline holds ticks at the start of the source's last successful poll until the
next poll has listed what came after.  A board that is down holds no ticks open, and one whose
poll hangs holds them no longer than one interval plus ``event_time.lateness``.  Beside a
source that reads records as they come, a board holds nothing: that source's alarms do not
wait a poll interval.  The whole service, built from a configuration as ``capalarm run``
builds it, polls the local board (tests/fakes/board.py) on loopback."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from alarm.events import SourceHealth
from alarm.eventtime import MAX_POLL_HOLD, Cells, EventClock
from alarm.service import Service
from tests.fakes.board import SOURCE_FIELDS, Board
from tests.fakes.server import serve
from tests.servicekit import running_service, wait_for

pytestmark = pytest.mark.slow

SOURCE = "board"
TICK = 0.5
INTERVAL = 1.5
LATENESS = 3.0
GRACE = 0.25


class Steady:
    """A source that reads records as they come, up and caught up, writing nothing: ticks
    close ``grace`` behind the clock."""

    name = "steady"

    def __init__(self) -> None:
        self.health = SourceHealth(up=True, caught_up=True)

    async def run(self, emit: Any) -> None:
        await asyncio.Event().wait()


def config(tmp_path: Path, url: str, **source: Any) -> dict[str, Any]:
    return {
        "tick": f"{TICK}s",
        "state_dir": str(tmp_path / "state"),
        "event_time": {"grace": f"{GRACE}s", "lateness": f"{LATENESS}s"},
        "sources": [
            {
                "name": SOURCE,
                "type": "registry",
                **SOURCE_FIELDS,
                "url": url,
                "interval": f"{INTERVAL}s",
                **source,
            }
        ],
        "surfaces": [
            {
                "name": SOURCE,
                "kind": "registry",
                "match": {"source": [SOURCE]},
                "spike": {"enabled": False},
            }
        ],
    }


def record_ticks(service: Service) -> Counter[int]:
    """Events on the board's surface in each tick as it is evaluated (tick index -> events)."""
    pipeline = service.pipeline
    row = pipeline.table.index[("registry", SOURCE)]
    take = pipeline.clock.take
    seen: Counter[int] = Counter()

    def recording_take(index: int) -> Cells:
        cells = take(index)
        seen[index] += int(cells.sums(len(pipeline.table))[1][row])
        return cells

    pipeline.clock.take = recording_take  # type: ignore[method-assign]
    return seen


def lag(service: Service) -> float:
    """How far behind the clock the last evaluated tick ends."""
    return time.time() - service.pipeline.last_tick_end


async def test_posts_listed_by_the_next_on_time_poll_count_in_their_own_ticks(tmp_path) -> None:
    # 20 posts a page, each page 20 ms: the last polls page through 40 pages, longer than a
    # tick, while the swarm goes on posting.
    board = Board(per_page=20, page_delay=0.02)
    for i in range(5):
        board.post("general", "agent-0", f"old {i}")
    async with (
        serve(board.app()) as site,
        running_service(config(tmp_path, f"{site.base}/api/posts")) as service,
    ):
        ticks = record_ticks(service)
        counters = service.pipeline.sources[SOURCE].counters
        await wait_for(lambda: counters["polls"] >= 1, 20)
        posts, seconds = 800, 4.0
        start = time.time()
        for k in range(posts):
            await asyncio.sleep(max(0.0, start + seconds * k / posts - time.time()))
            board.post(f"ch{k % 7}", f"agent-{k % 13}", "x" * (40 + k % 90))
        made = [p["created_at"] for p in board.posts.values()][5:]
        own = Counter(math.floor(ts / TICK) for ts in made)
        last = max(own)
        clock = service.pipeline.clock
        await wait_for(
            lambda: clock.next_index is not None and clock.next_index > last + 1, 3 * LATENESS
        )
        assert counters["late_events"] == 0, "an on-time poller's posts are not late"
        got = {t: n for t, n in ticks.items() if n}
        assert sum(got.values()) == posts
        assert got == dict(own), "every post in the tick of its own time"
        assert counters["polls"] >= 4, "listed by several polls while the swarm posted"


@pytest.mark.parametrize("fault", ["polls", "down", "hangs"])
async def test_beside_a_streaming_source_a_board_never_holds_its_ticks(tmp_path, fault) -> None:
    board = Board()
    board.post("general", "agent-0", "old")
    # One try a request, 30 s to answer: a refused listing fails the poll at once (down), a
    # page that never comes keeps the poll going, the source up (hangs).
    cfg_source = {"retries": 0, "timeout": "30s"}
    async with (
        serve(board.app()) as site,
        running_service(
            config(tmp_path, f"{site.base}/api/posts", **cfg_source),
            collectors={"steady": Steady()},
        ) as service,
    ):
        health = service.sources[SOURCE].collector.health
        counters = service.pipeline.sources[SOURCE].counters
        await wait_for(lambda: counters["polls"] >= 2, 20)
        if fault == "down":
            board.down = True
            await wait_for(lambda: not health.up, 2 * INTERVAL + 2)
        elif fault == "hangs":
            board.page_delay = 3600.0
            await asyncio.sleep(INTERVAL + 0.2)  # the next poll has begun, and hangs
            assert health.up, "a hanging poll leaves the source up"
        # Over two intervals, the streaming source's ticks close a tick behind the clock.
        lags = []
        for _ in range(int(2 * INTERVAL / 0.1)):
            lags.append(lag(service))
            await asyncio.sleep(0.1)
        assert max(lags) <= TICK + GRACE + 0.3, max(lags)


def closes_at(at: float, board: SourceHealth, beside_kernel: bool = False) -> float:
    """Up to where ticks close ``at`` seconds after a board's poll started at 0 (its
    watermark), alone or beside a kernel source that is caught up; lateness 30 s, grace
    0.25 s."""
    clock = EventClock(10.0, 0.25, 30.0, 7 * 86400.0)
    clock.advance("board", 0.0, 1.0)
    health = {"board": board}
    if beside_kernel:
        clock.advance("kernel", 0.0, 1.0)
        health["kernel"] = SourceHealth(up=True, caught_up=True)
    return clock.closable_end(at, health)


def test_a_poller_holds_ticks_at_its_watermark_for_one_interval_at_most_five_minutes() -> None:
    minutely = SourceHealth(up=True, caught_up=True, poll_interval=60)
    assert closes_at(5.0, minutely) == 0.0, "held at its last poll's start"
    # Its next poll starts at 60 s; it may take lateness (30 s) to page and hand over.
    assert closes_at(89.0, minutely) == 0.0
    assert closes_at(91.0, minutely) == 91.0 - 30.0, "stuck: it holds nothing"
    down = SourceHealth(up=False, poll_interval=60)
    assert closes_at(5.0, down) == 5.0 - 30.0, "a poller that is down holds nothing"
    # Polled hourly: held MAX_POLL_HOLD + lateness behind its last poll, not an hour.
    hourly = SourceHealth(up=True, caught_up=True, poll_interval=3600)
    assert closes_at(MAX_POLL_HOLD + 29.0, hourly) == 0.0
    assert closes_at(MAX_POLL_HOLD + 31.0, hourly) == MAX_POLL_HOLD + 31.0 - 30.0
    # Beside a streaming source a poller holds nothing: the kernel's alarms do not wait.
    assert closes_at(5.0, minutely, beside_kernel=True) == 5.0 - 0.25
