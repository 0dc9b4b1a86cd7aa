"""A swarm posting on a JSON board while the whole service polls it: how many posts count late
(``capalarm_source_late_events_total``) and how many land in the tick of their own time.

The service runs in-process, built from a configuration as ``capalarm run`` builds it, polling
the local board of the tests (tests/fakes/board.py) on loopback; the swarm posts at an even
rate through the board's own code (``Board.post``, stamped by the board's clock).  Every
evaluated tick's events on the board's surface are recorded and compared with the posts'
own times.  Run from the repository root:

    python bench/board_lateness.py [--posts 3000] [--seconds 30] [--tick 1] [--interval 3]
        [--per-page 50] [--page-delay 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from alarm.eventtime import Cells
from tests.fakes.board import Board
from tests.fakes.server import serve
from tests.servicekit import running_service, wait_for

SOURCE = "board"


def config(state_dir: str, url: str, tick: float, interval: float) -> dict:
    return {
        "tick": f"{tick:g}s",
        "state_dir": state_dir,
        "sources": [
            {
                "name": SOURCE,
                "type": "registry",
                "api": "json",
                "url": url,
                "interval": f"{interval:g}s",
                "items": "posts",
                "id": "id",
                "repository": "channel",
                "time": "created_at",
                "next": "meta.next",
                "max_items": 1_000_000,
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


async def measure(
    posts: int, seconds: float, tick: float, interval: float, per_page: int, page_delay: float
) -> dict[str, Any]:
    board = Board(per_page=per_page, page_delay=page_delay)
    for i in range(10):  # what the first poll learns
        board.post("general", "agent-0", f"old {i}")
    per_tick: Counter[int] = Counter()
    with tempfile.TemporaryDirectory() as state:
        async with serve(board.app()) as site:
            cfg = config(state, f"{site.base}/api/posts", tick, interval)
            async with running_service(cfg) as service:
                pipeline = service.pipeline
                row = pipeline.table.index[("registry", SOURCE)]
                take = pipeline.clock.take

                def recording_take(index: int) -> Cells:
                    cells = take(index)
                    per_tick[index] += int(cells.sums(len(pipeline.table))[1][row])
                    return cells

                pipeline.clock.take = recording_take  # type: ignore[method-assign]
                await wait_for(lambda: pipeline.sources[SOURCE].counters["polls"] >= 1, 30)
                start = time.time()
                for k in range(posts):
                    wait = start + seconds * k / posts - time.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    board.post(f"ch{k % 20}", f"agent-{k % 97}", "x" * (40 + k % 200))
                made = [p["created_at"] for p in board.posts.values()][10:]
                last_tick = math.floor(max(made) / tick)
                await wait_for(
                    lambda: (
                        sum(per_tick.values()) >= posts
                        and pipeline.clock.next_index is not None
                        and pipeline.clock.next_index > last_tick
                    ),
                    seconds + 4 * interval + 60,
                )
                counters = pipeline.sources[SOURCE].counters
                late = counters["late_events"]
                polls = counters["polls"]
                read = service.sources[SOURCE].collector.health.read_seconds
    own = Counter(math.floor(ts / tick) for ts in made)
    in_own_tick = sum(min(n, per_tick.get(t, 0)) for t, n in own.items())
    return {
        "posts": posts,
        "seconds": seconds,
        "tick": tick,
        "interval": interval,
        "per_page": per_page,
        "page_delay": page_delay,
        "polls": polls,
        "last_poll_seconds": round(read, 3),
        "late_events": late,
        "counted": sum(per_tick.values()),
        "in_own_tick": in_own_tick,
        "ticks_differing": sum(1 for t in own.keys() | per_tick.keys() if own[t] != per_tick[t]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--posts", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--tick", type=float, default=1.0)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--per-page", type=int, default=50)
    ap.add_argument("--page-delay", type=float, default=0.0, help="seconds before each page")
    a = ap.parse_args()
    result = measure(a.posts, a.seconds, a.tick, a.interval, a.per_page, a.page_delay)
    print(json.dumps(asyncio.run(result)))


if __name__ == "__main__":
    main()
