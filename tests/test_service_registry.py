"""The whole service polling a real pypiserver on loopback, built from the configuration as
``capalarm run`` builds it, packages uploaded with twine: bytes and events per surface in
/metrics equal what was uploaded, the first poll counts nothing that was there before, the
alert's evidence names the artifacts (name, version, file, digest, upload time),
``surface_blind`` fires ``blind_after`` once the registry stops and resolves when it is back,
and a restart of the service between polls counts each upload once.  With ``canary:`` the
canaries are real uploads that the service sees and counts apart (the surface's bytes are the
workload's uploads only), and ``surface_blind`` fires when the polls stop listing them (a
stale cache in front of the registry) or their uploads are refused, and resolves when a
canary is listed again."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

import alarm.detector.sources
from alarm.service import Service
from tests.fakes.server import free_port, serve
from tests.registries import servers
from tests.registries.clients import make_wheel, twine_upload
from tests.registries.stale_proxy import StaleProxy
from tests.servicekit import get, metric, running_service, wait_for

pytestmark = pytest.mark.slow

SOURCE = "internal-pypi"
# A budget the test trips at once: one small wheel is over 8,000 bits of tolerance.
TRIPWIRE = {"allowance_bits_per_second": 100, "tolerance_bits": 8000, "horizons": []}


def registry_config(tmp_path: Path, url: str, prefix: str, **source: Any) -> dict:
    return {
        "tick": "0.5s",
        "state_dir": str(tmp_path / "state"),
        # With its only source down (a failed poll) nothing holds ticks open, and they close
        # ``lateness`` behind the clock: 30 s by default, 2 s here.
        "event_time": {"lateness": "2s"},
        "sources": [
            {
                "name": SOURCE,
                "type": "registry",
                "api": "pypi",
                "url": url,
                "interval": "1s",
                "packages": [f"{prefix}-*"],
                **source,
            }
        ],
        "surfaces": [
            {
                "name": SOURCE,
                "kind": "registry",
                "match": {"source": [SOURCE]},
                "budget": TRIPWIRE,
                "spike": {"enabled": False},
            }
        ],
    }


async def upload(server: servers.Server, tmp_path: Path, *wheels: tuple[str, str, int]) -> list:
    """Wheels (name, version, payload bytes) made and uploaded with twine, in one go."""
    made = [make_wheel(tmp_path, n, v, size) for n, v, size in wheels]
    for wheel in made:
        await asyncio.to_thread(twine_upload, server, wheel)
    return made


async def scrape(service: Service) -> dict[str, float | None]:
    _, _, text = await get(service, "/metrics")
    return {
        "bytes": metric(text, "capalarm_surface_written_bytes_total", surface=SOURCE),
        "events": metric(text, "capalarm_surface_write_events_total", surface=SOURCE),
        "polls": metric(text, "capalarm_source_polls_total", source=SOURCE),
        "baseline": metric(text, "capalarm_source_baseline_artifacts_total", source=SOURCE),
        "up": metric(text, "capalarm_source_up", source=SOURCE),
        "blind": metric(text, "capalarm_source_blind", source=SOURCE),
        **{
            c: metric(text, f"capalarm_source_{c}_total", source=SOURCE)
            for c in ("canary_uploaded", "canary_seen", "canary_missed", "canary_upload_errors")
        },
    }


async def until(service: Service, what: str, **want: float) -> dict[str, float | None]:
    """Until /metrics shows ``want``; fails naming what it showed instead."""

    async def shown() -> bool:
        got = await scrape(service)
        return all(got[k] == v for k, v in want.items())

    try:
        await wait_for(shown, 30)
    except AssertionError:
        shown = await scrape(service)
        raise AssertionError(f"{what}: /metrics shows {shown}, want {want}") from None
    return await scrape(service)


async def at_least(service: Service, what: str, counter: str, n: float) -> dict[str, float | None]:
    """Until /metrics shows ``counter`` at ``n`` or more."""

    async def shown() -> bool:
        return ((await scrape(service))[counter] or 0) >= n

    try:
        await wait_for(shown, 30)
    except AssertionError:
        raise AssertionError(f"{what}: /metrics shows {await scrape(service)}") from None
    return await scrape(service)


async def alert_changes(service: Service, key: str, rule: str) -> list[dict]:
    _, _, body = await get(service, "/api/v1/alerts")
    return [c for c in json.loads(body)["changes"] if c.get(key) == SOURCE and c["rule"] == rule]


async def test_uploads_count_exactly_and_the_alert_names_the_artifacts(
    pypiserver: servers.Server, tmp_path: Path
) -> None:
    (old,) = await upload(pypiserver, tmp_path, ("evid-old", "0.9", 2000))
    cfg = registry_config(tmp_path, pypiserver.url, "evid")
    async with running_service(cfg) as service:
        await until(service, "the first poll learns", bytes=0, events=0, baseline=1, up=1)
        polls = (await scrape(service))["polls"] or 0
        await until(service, "later polls count nothing old", polls=polls + 2, bytes=0)

        before = time.time()
        wheels = await upload(
            pypiserver,
            tmp_path,
            ("evid-pkg", "1.0.1", 9000),
            ("evid-pkg", "1.0.2", 5000),
            ("evid-other", "2.0", 1500),
        )
        after = time.time()
        sizes = {w.name: w.stat().st_size for w in wheels}
        await until(service, "the uploads", bytes=sum(sizes.values()), events=3)

        firing = await wait_for(
            lambda: alert_changes(service, "surface", "budget"), 30
        )  # at least the first firing change

        # The surface's recent contributors are credited as the ticks their uploads count in
        # are evaluated (event time): every upload is listed once those ticks are.
        async def listed() -> dict | None:
            _, _, body = await get(service, "/api/v1/surfaces")
            (surface,) = [s for s in json.loads(body)["surfaces"] if s["surface"] == SOURCE]
            return surface if len(surface["top_contributors"]) == len(wheels) else None

        surface = await wait_for(listed, 30)
        await asyncio.sleep(2.5)
        assert (await scrape(service))["bytes"] == sum(sizes.values()), "counted once"

    change = firing[0]
    assert change["state"] == "firing" and change["kind"] == "registry"
    assert change["contributors"], "the evidence names what was uploaded"
    by_file = {w.name: w for w in wheels}
    for c in change["contributors"]:
        receipt = c["receipt"]
        wheel = by_file[receipt["file"]]
        name, version = receipt["name"], receipt["version"]
        assert wheel.name.startswith(f"{name.replace('-', '_')}-{version}-")
        assert c["contributor"].startswith(f"{name} {version} {wheel.name}")
        assert c["bytes"] == receipt["bytes"] == sizes[wheel.name]
        assert receipt["digest"] == "sha256:" + hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert receipt["source"] == SOURCE and receipt["repository"] == name
        uploaded = datetime.datetime.fromisoformat(receipt["uploaded_at"]).timestamp()
        # pypiserver's Last-Modified has whole seconds.
        assert before - 1 <= uploaded <= after + 1
        assert old.name not in c["contributor"]
    # The surface's recent top contributors: every upload, largest first.
    assert [t["contributor"].split(" ")[2] for t in surface["top_contributors"]] == [
        w.name for w in sorted(wheels, key=lambda w: -w.stat().st_size)
    ]


async def test_a_restart_between_polls_counts_each_upload_once(
    pypiserver: servers.Server, tmp_path: Path
) -> None:
    cfg = registry_config(tmp_path, pypiserver.url, "rst")
    async with running_service(cfg) as service:
        await until(service, "the first poll", baseline=0, up=1)
        (first,) = await upload(pypiserver, tmp_path, ("rst-pkg", "1.0", 3000))
        await until(service, "the first upload", bytes=first.stat().st_size, events=1)

    # Uploaded while the service is down.
    down = await upload(pypiserver, tmp_path, ("rst-pkg", "1.1", 4000), ("rst-b", "0.1", 800))
    expected = first.stat().st_size + sum(w.stat().st_size for w in down)

    async with running_service(cfg) as service:
        shown = await until(service, "after the restart", bytes=expected, events=3)
        assert shown["baseline"] == 0, "a restart does not learn again"
        polls = shown["polls"] or 0
        await until(service, "more polls", polls=polls + 3)
        assert (await scrape(service))["bytes"] == expected, "nothing counted twice"
        (late,) = await upload(pypiserver, tmp_path, ("rst-pkg", "1.2", 1200))
        await until(service, "an upload after", bytes=expected + late.stat().st_size, events=4)


async def test_surface_blind_after_blind_after_when_the_registry_stops_and_resolved_when_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The detector holds a source alert for a minute of clear before resolving; what is tested
    # here is that it resolves once the registry is polled again, so the hold is made short.
    monkeypatch.setattr(alarm.detector.sources, "SOURCE_RESOLVE_HOLD", 1.0)
    workdir = tmp_path / "pypi"
    workdir.mkdir()
    port = free_port()
    blind_after = 3.0
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(servers.pypiserver(workdir, port))
        await upload(server, tmp_path, ("bl-old", "1.0", 1000))
        cfg = registry_config(
            tmp_path, server.url, "bl", blind_after=f"{blind_after}s", retries=0, timeout="1s"
        )
        async with running_service(cfg) as service:
            await until(service, "the first poll", baseline=1, up=1, blind=0)
            stack.close()  # the registry stops
            stopped = time.time()
            # A failed poll is down at once (source_down); blind only after blind_after.
            await until(service, "a failed poll", up=0)
            assert (await scrape(service))["blind"] == 0
            fired = await wait_for(lambda: alert_changes(service, "source", "surface_blind"), 20)
            assert time.time() - stopped >= blind_after - 1.0  # the last success <= 1 s before
            assert fired[0]["state"] == "firing"
            assert fired[0]["summary"].endswith(
                f"cannot see what it watches: no successful poll of {server.url} for 3s"
            )
            assert await alert_changes(service, "source", "source_down")
            _, _, body = await get(service, "/api/v1/surfaces")
            (src,) = json.loads(body)["sources"]
            assert src["blind"].startswith(f"no successful poll of {server.url} for ")

            with servers.pypiserver(workdir, port) as again:  # back, with what it held
                await until(service, "polled again", up=1, blind=0)

                async def resolved() -> bool:
                    changes = await alert_changes(service, "source", "surface_blind")
                    return [c["state"] for c in changes] == ["firing", "resolved"]

                await wait_for(resolved, 20)
                shown = await scrape(service)
                assert shown["bytes"] == 0, "what it held before is not new"
                (new,) = await upload(again, tmp_path, ("bl-new", "1.0", 2500))
                await until(service, "an upload after", bytes=new.stat().st_size, events=1)


CANARY = {"interval": "1s", "deadline": "2s"}


async def test_the_canary_is_seen_and_counted_apart_from_the_surface_writes(
    pypiserver: servers.Server, tmp_path: Path
) -> None:
    cfg = registry_config(
        tmp_path, pypiserver.url, "cn", canary={**CANARY, "repository": "cn-canary"}
    )
    async with running_service(cfg) as service:
        await until(service, "the first poll", baseline=0, up=1)
        shown = await at_least(service, "canaries listed", "canary_seen", 3)
        assert (shown["bytes"], shown["events"]) == (0, 0), "a canary is not a write"
        assert (shown["blind"], shown["canary_missed"], shown["canary_upload_errors"]) == (0, 0, 0)
        assert (shown["canary_uploaded"] or 0) >= 3

        (wheel,) = await upload(pypiserver, tmp_path, ("cn-pkg", "1.0", 4000))
        size = wheel.stat().st_size
        await until(service, "the workload's upload", bytes=size, events=1)
        await at_least(service, "more canaries", "canary_seen", (shown["canary_seen"] or 0) + 3)
        assert (await scrape(service))["bytes"] == size, "only the workload's bytes"
        _, _, body = await get(service, "/api/v1/surfaces")
        (surface,) = [s for s in json.loads(body)["surfaces"] if s["surface"] == SOURCE]
        assert [t["contributor"].split(" ")[2] for t in surface["top_contributors"]] == [wheel.name]
        assert await alert_changes(service, "source", "surface_blind") == []

    # The canaries are on the registry, where an operator can see (and clean) them.
    _, _, page = servers.request("GET", f"{pypiserver.url}cn-canary/")
    assert page.decode().count("cn_canary-0.") >= 6


async def test_surface_blind_when_canaries_go_unlisted_or_refused_and_resolved_when_seen(
    pypiserver: servers.Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(alarm.detector.sources, "SOURCE_RESOLVE_HOLD", 1.0)
    proxy = StaleProxy(pypiserver.base)
    async with serve(proxy.app()) as site:
        # Polled, and uploaded to, through a cache in front of the registry.
        cfg = registry_config(
            tmp_path, f"{site.base}/simple/", "sb", canary={**CANARY, "repository": "sb-canary"}
        )
        async with running_service(cfg) as service:

            async def states() -> list[str]:
                return [c["state"] for c in await alert_changes(service, "source", "surface_blind")]

            async def until_states(*want: str) -> dict:
                async def reached() -> bool:
                    return await states() == list(want)

                try:
                    await wait_for(reached, 30)
                except AssertionError:
                    raise AssertionError(f"surface_blind went {await states()}") from None
                return (await alert_changes(service, "source", "surface_blind"))[-1]

            await at_least(service, "canaries listed", "canary_seen", 2)
            assert await states() == []

            proxy.frozen = True  # a cache that stopped refreshing: every poll still succeeds
            fired = await until_states("firing")
            assert fired["summary"].endswith("is not listed by the polls")
            assert (
                "cannot see what it watches: canary not seen within 2s: sb-canary "
                in (fired["summary"])
            )
            shown = await at_least(service, "the miss counted", "canary_missed", 1)
            assert shown["up"] == 1 and shown["blind"] == 1
            assert await alert_changes(service, "source", "source_down") == []

            proxy.frozen = False
            await until_states("firing", "resolved")
            assert (await scrape(service))["blind"] == 0

            proxy.refuse_uploads = True  # the canary's credential revoked, say
            fired = await until_states("firing", "resolved", "firing")
            assert fired["summary"].endswith(
                f"canary upload failed 2 times in a row (every 1s): POST {site.base}/: HTTP 403"
            )
            assert (await scrape(service))["up"] == 1

            proxy.refuse_uploads = False
            await until_states("firing", "resolved", "firing", "resolved")
            shown = await scrape(service)
            assert (shown["bytes"], shown["events"]) == (0, 0), "no canary counted as a write"
            assert (shown["canary_upload_errors"] or 0) >= 2
