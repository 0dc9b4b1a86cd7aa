"""A name the workload chooses cannot take the status page down (issue 28, item 3).

A file whose name is not UTF-8 reaches the service as ``os.fsdecode`` gives it, its bytes as
surrogate escapes; a registry's JSON may carry a lone ``\\ud800``.  Neither can be encoded as
UTF-8: one among a surface's contributors or in a recent alert made ``/`` answer 500, and
the API, /api/v1/alerts and the notifications carry text strict JSON readers refuse.  Such
text is made safe once, where it enters (alarm/events.py KeyedSubjects, with
alarm/sanitize.py ``shown``): an escaped byte reads ``\\xNN``, any other lone surrogate
U+FFFD."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time

from alarm.events import Batch, Event, SourceHealth, WriteEvents
from alarm.sanitize import sanitize, shown, shown_evidence
from alarm.surfaces import HeavyHitters
from tests.chromium import chromium
from tests.fakes.receiver import Receiver
from tests.fakes.server import serve
from tests.servicekit import get, running_service, wait_for

# A file named with bytes that are not UTF-8, as os.fsdecode hands it over.
ESCAPED = b"/srv/cache/r\xe9sum\xff.bin".decode("utf-8", "surrogateescape")
# A registry item's name with lone surrogates (JSON "\ud800" and "\udfff").
LONE = "pkg-\ud800-\udfff.tgz"
SURROGATE_ESCAPE = re.compile(r"\\ud[89a-f][0-9a-f]{2}", re.IGNORECASE)


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_shown_makes_any_text_encodable_and_leaves_good_text_alone():
    assert shown(ESCAPED) == "/srv/cache/r\\xe9sum\\xff.bin"
    assert shown(LONE) == "pkg-\ufffd-\ufffd.tgz"
    for good in ("/srv/cache/résumé.bin", "plain", "数据/файл", "emoji 😀"):
        assert shown(good) is good or shown(good) == good
    assert encodable(sanitize(ESCAPED + LONE))
    receipt = {"comm": LONE, "path": ESCAPED, "size": 3, "nested": {LONE: [ESCAPED, 1]}}
    assert encodable(json.dumps(shown_evidence(receipt), ensure_ascii=False))
    assert shown_evidence(receipt)["size"] == 3


def test_names_saved_before_are_made_safe_when_read_back():
    hitters = HeavyHitters(5)
    hitters.load_state({"counts": [[ESCAPED, 10], [LONE, 5]]})
    assert all(encodable(name) for name, _ in hitters.top(5))


class HostileWriter:
    """An fs source writing two files with hostile names as fast as a tick, with a process
    name (its receipt's comm) that is a lone surrogate."""

    kind = "fs"

    def __init__(self) -> None:
        self.health = SourceHealth(up=True)

    async def run(self, emit) -> None:
        self.health.up = True
        while True:
            now = time.time()
            rows = [
                Event(now, ESCAPED, 50_000, ESCAPED, 1, {"comm": LONE, "path": ESCAPED}),
                Event(now, "/srv/cache/pkg", 50_000, LONE, 1, None),
            ]
            await emit(Batch(WriteEvents.of("fs", rows), {"records_read": 2}, watermark=now))
            self.health.caught_up = True
            # What a source reports of a name it could not read is made safe as well.
            self.health.failed(f"cannot stat {ESCAPED}", now)
            await asyncio.sleep(0.2)


async def test_hostile_names_go_through_the_page_the_api_and_a_webhook(tmp_path):
    rx = Receiver()
    async with serve(rx.app()) as hook:
        cfg = {
            "tick": "0.5s",
            "state_dir": str(tmp_path / "state"),
            "sources": [],
            "surfaces": [
                {
                    "name": "cache",
                    "kind": "fs",
                    "match": {"path": ["/srv/cache/**"]},
                    "budget": {"allowance_bits_per_second": 800, "tolerance_bits": 16000},
                }
            ],
            "notifications": {
                "destinations": [{"type": "webhook", "name": "w", "url": f"{hook.base}/hook"}]
            },
        }
        async with running_service(cfg, collectors={"writer": HostileWriter()}) as service:
            await wait_for(lambda: len(service.recent) > 0 and len(rx.received) > 0, timeout=30)
            bodies = {}
            for path in ("/", "/api/v1/surfaces", "/api/v1/surfaces?history=1",
                         "/api/v1/alerts", "/metrics"):  # fmt: skip
                status, _, body = await get(service, path)
                assert status == 200, (path, body[:300])
                assert encodable(body) and not SURROGATE_ESCAPE.search(body), path
                bodies[path] = body
            page = bodies["/"]
            assert "r\\xe9sum\\xff.bin" in page and "pkg-\ufffd-\ufffd.tgz" in page

            doc = json.loads(bodies["/api/v1/surfaces"])
            (cache,) = [s for s in doc["surfaces"] if s["surface"] == "cache"]
            names = {c["contributor"] for c in cache["top_contributors"]}
            assert names == {"/srv/cache/r\\xe9sum\\xff.bin", "pkg-\ufffd-\ufffd.tgz"}
            (writer,) = [s for s in doc["sources"] if s["source"] == "writer"]
            assert writer["last_error"] == "cannot stat /srv/cache/r\\xe9sum\\xff.bin"

            changes = json.loads(bodies["/api/v1/alerts"])["changes"]
            (alert,) = [c for c in changes if c.get("surface") == "cache"]
            got = {c["contributor"]: c.get("receipt") for c in alert["contributors"]}
            assert got["/srv/cache/r\\xe9sum\\xff.bin"]["comm"] == "pkg-\ufffd-\ufffd.tgz"
            # The alert as it went out: strict JSON with no surrogate in it.
            payload = rx.received[0].payload
            assert encodable(json.dumps(payload, ensure_ascii=False))
            assert not SURROGATE_ESCAPE.search(json.dumps(payload))
            sent = {c["contributor"] for c in payload["data"]["top_contributors"]}
            assert "/srv/cache/r\\xe9sum\\xff.bin" in sent

            # And the page as a browser shows it (where there is one; CI has one).
            if not (shutil.which("chromium") or os.environ.get("CI") == "true"):
                return
            async with chromium(tmp_path) as browser:
                tab = await browser.page(1280, 800)
                await tab.goto(f"http://127.0.0.1:{service.http_port}/")
                text = await tab.evaluate("document.body.innerText")
                assert "r\\xe9sum\\xff.bin" in text and "pkg-\ufffd-\ufffd.tgz" in text
