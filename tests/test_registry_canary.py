"""The registry canary (``canary:``; alarm/collectors/registry/canary.py, uploads.py) against
real registries on loopback: each API's canary is a real upload through that API's own upload
(the legacy PyPI upload to pypiserver and devpi, an npm publish to verdaccio, a blob and
manifest push to Debian's docker-registry, an edit of Debian's MediaWiki, anonymous and with a
bot password), a later poll lists it, and it is counted apart — never a write — while a
workload's upload named like it is counted.  A canary the polls do not list (a stale cache
between the poller and the registry: tests/registries/stale_proxy.py) or uploads that are
refused make the source blind, saying why; a canary listed again clears it.  Bad ``canary:``
configuration is exit 2 from ``capalarm check-config``, one line naming the key."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin

import pytest

from alarm.collectors.registry.canary import RECENT, Canaries, Sent
from alarm.collectors.registry.names import packument_url
from alarm.collectors.registry.uploads import Upload
from tests.fakes.kit import wait_for
from tests.fakes.server import serve
from tests.registries import servers
from tests.registries.clients import make_wheel, twine_upload
from tests.registries.harness import Recorder, collector, poll, running
from tests.registries.stale_proxy import StaleProxy

pytestmark = pytest.mark.slow


def secret_file(tmp_path: Path, secret: str) -> dict[str, str]:
    path = tmp_path / f"secret-{secrets.token_hex(4)}"
    path.write_text(secret + "\n")
    return {"file": str(path)}


def canary(repository: str, **more: Any) -> dict[str, Any]:
    """A canary every second, due within two (the source polls every second)."""
    return {"interval": 1, "deadline": 2, "repository": repository, **more}


def source_with_canary(rec: Recorder, **cfg: Any) -> Any:
    return collector(rec, interval=1, **cfg)


async def test_pypi_canary_is_listed_and_set_apart_and_a_lookalike_upload_is_counted(
    pypiserver: servers.Server, tmp_path: Path
) -> None:
    rec = Recorder()
    source = source_with_canary(
        rec, api="pypi", url=pypiserver.url, packages=["t1-*"], canary=canary("t1-canary")
    )
    assert source.canary is not None
    assert await poll(source, rec), "the first poll learns"
    upload = await source.canary.upload_once()
    assert upload is not None, source.canary.last_error
    # A real upload through the legacy API: on the server, a few hundred bytes.
    status, _, page = servers.request("GET", f"{pypiserver.url}t1-canary/")
    assert status == 200 and upload.artifact in page.decode()
    href = re.search(rf'href="([^"#]*{re.escape(upload.artifact)})', page.decode())
    assert href is not None
    file_url = urljoin(f"{pypiserver.url}t1-canary/", href.group(1))
    status, headers, _ = servers.request("HEAD", file_url)
    assert status == 200 and int(headers["Content-Length"]) == upload.nbytes <= 400

    # A workload's upload into the canary's project, named like a canary: it is a write.
    lookalike = make_wheel(tmp_path, "t1-canary", "0.1.7", 700)
    twine_upload(pypiserver, lookalike)
    rec.clear()
    assert await poll(source, rec)
    rows = [(r.repository, r.artifact, r.nbytes) for r in rec.rows()]
    assert rows == [("t1-canary", lookalike.name, lookalike.stat().st_size)]
    counts = rec.counts()
    assert (counts["canary_uploaded"], counts["canary_seen"], counts["canary_missed"]) == (1, 1, 0)
    assert source.health.blind == ""

    rec.clear()
    assert await poll(source, rec)
    assert rec.rows() == [] and rec.counts()["canary_seen"] == 0, "listed again: nothing new"


def pypi_listed(server: servers.Server, upload: Upload) -> None:
    _, _, page = servers.request("GET", f"{server.url}{upload.repository}/")
    assert upload.artifact in page.decode()


def npm_listed(server: servers.Server, upload: Upload) -> None:
    _, _, body = servers.request("GET", packument_url(server.url, upload.repository))
    doc = json.loads(body)
    assert doc["versions"][upload.artifact]["dist"]["integrity"] == upload.digest


def oci_listed(server: servers.Server, upload: Upload) -> None:
    _, _, body = servers.request("GET", f"{server.url}v2/{upload.repository}/tags/list")
    assert json.loads(body)["tags"] == ["canary"], "one tag, pushed again each round"
    _, headers, _ = servers.request(
        "HEAD",
        f"{server.url}v2/{upload.repository}/manifests/canary",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    assert headers["Docker-Content-Digest"] == upload.digest


def wiki_listed(server: servers.Server, upload: Upload) -> None:
    query = {"action": "query", "prop": "revisions", "revids": upload.artifact[1:]}
    _, _, body = servers.request("GET", f"{server.url}?{urlencode({**query, 'format': 'json'})}")
    (page,) = json.loads(body)["query"]["pages"].values()
    assert page["title"] == upload.repository


@pytest.mark.parametrize(
    ("which", "api", "repository", "listed"),
    [
        ("devpi", "pypi", "t2-canary", pypi_listed),
        ("verdaccio", "npm", "@t2/canary", npm_listed),
        ("registry", "oci", "t2/canary", oci_listed),
        ("wiki", "mediawiki", "T2/canary", wiki_listed),
    ],
)
async def test_each_api_canary_is_a_real_upload_listed_and_set_apart(
    which: str,
    api: str,
    repository: str,
    listed: Any,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    server: servers.Server = request.getfixturevalue(which)
    more: dict[str, Any] = {}
    if which == "devpi":
        more["credentials"] = secret_file(tmp_path, "alice:alice-pass")
    if which == "verdaccio":
        more["credentials"] = secret_file(tmp_path, server.extra["token"])
    rec = Recorder()
    source = source_with_canary(rec, api=api, url=server.url, canary=canary(repository, **more))
    assert source.canary is not None
    assert await poll(source, rec)
    for round_ in (1, 2):
        upload = await source.canary.upload_once()
        assert upload is not None, source.canary.last_error
        assert upload.nbytes <= 600, "a tiny artifact"
        listed(server, upload)
        rec.clear()
        assert await poll(source, rec)
        assert rec.rows() == [], f"round {round_}: the canary is not a write"
        assert rec.counts()["canary_seen"] == 1, f"round {round_}: listed by the next poll"
    assert source.health.blind == ""


async def test_mediawiki_canary_logs_in_with_a_bot_password_and_edits_as_the_bot(
    wiki: servers.Server, tmp_path: Path
) -> None:
    password = secrets.token_hex(16)  # bot passwords are 32+ characters of [0-9a-w]
    proc = subprocess.run(
        ["php", f"{servers.MEDIAWIKI}/maintenance/createBotPassword.php",
         "--appid", "canary", "--grants", "basic,editpage,createeditmovepage", "Admin", password],
        env={**os.environ, "MW_CONFIG_FILE": str(wiki.workdir / "LocalSettings.php")},
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout + proc.stderr
    rec = Recorder()
    credentials = secret_file(tmp_path, f"Admin@canary:{password}")
    source = source_with_canary(
        rec, api="mediawiki", url=wiki.url, canary=canary("T3/canary", credentials=credentials)
    )
    assert source.canary is not None
    assert await poll(source, rec)
    upload = await source.canary.upload_once()
    assert upload is not None, source.canary.last_error
    query = {"action": "query", "prop": "revisions", "revids": upload.artifact[1:]}
    query |= {"rvprop": "user", "format": "json", "formatversion": "2"}
    _, _, body = servers.request("GET", f"{wiki.url}?{urlencode(query)}")
    (page,) = json.loads(body)["query"]["pages"]
    assert page["revisions"][0]["user"] == "Admin", "edited as the bot's user, not anonymously"
    rec.clear()
    assert await poll(source, rec)
    assert rec.rows() == [] and rec.counts()["canary_seen"] == 1


async def test_refused_canary_uploads_make_the_source_blind_naming_why_never_the_secret(
    devpi: servers.Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    credentials = secret_file(tmp_path, "alice:wrong-s3cret-42")
    source = source_with_canary(
        rec,
        api="pypi",
        url=devpi.url,
        packages=["t4-*"],
        canary=canary("t4-canary", credentials=credentials),
    )
    async with running(source, rec):
        await wait_for(lambda: bool(source.health.blind), 15)
        blind = source.health.blind
        assert source.health.up, "the polls still succeed: blind, not down"
        # Counters go out with the next poll's batch.
        await wait_for(lambda: rec.counts()["canary_upload_errors"] >= 2, 5)
    upload_url = devpi.url.removesuffix("+simple/")
    assert re.fullmatch(
        rf"canary upload failed 2 times in a row \(every 1s\): POST {re.escape(upload_url)}: "
        r"HTTP 40[13]",
        blind,
    ), blind
    counts = rec.counts()
    assert counts["canary_upload_errors"] >= 2 and counts["canary_uploaded"] == 0
    assert "canary upload failed" in source.health.last_error
    shown = blind + source.health.last_error + caplog.text + json.dumps(rec.position)
    assert "s3cret" not in shown and "YWxpY2U6d3Jvbmct" not in shown  # nor its base64


async def test_a_canary_the_polls_do_not_list_is_missed_and_a_later_one_listed_clears_it(
    pypiserver: servers.Server,
) -> None:
    proxy = StaleProxy(pypiserver.base)
    async with serve(proxy.app()) as site:
        rec = Recorder()
        source = source_with_canary(
            rec,
            api="pypi",
            url=f"{site.base}/simple/",  # polled through the cache
            blind_after=30,
            packages=["t5-*"],
            # Uploaded to the registry itself, as a workload would.
            canary=canary("t5-canary", url=pypiserver.extra["upload"]),
        )
        async with running(source, rec):
            await wait_for(lambda: rec.counts()["canary_seen"] >= 3, 20)
            assert source.health.blind == "" and rec.counts()["canary_missed"] == 0

            proxy.frozen = True  # the cache stops refreshing; polls through it still succeed
            await wait_for(lambda: bool(source.health.blind), 15)
            blind = source.health.blind
            assert re.fullmatch(
                r"canary not seen within 2s: t5-canary t5_canary-0\.\d+\.\d+\.tar\.gz "
                rf"uploaded to {re.escape(pypiserver.extra['upload'])} at \d\d:\d\d:\d\dZ is "
                r"not listed by the polls",
                blind,
            ), blind
            assert source.health.up and source.health.errors == 0, "up: the polls succeed"
            await wait_for(lambda: rec.counts()["canary_missed"] >= 1, 5)

            proxy.frozen = False
            await wait_for(lambda: source.health.blind == "", 15)
        assert rec.rows() == [], "the canaries listed late are set apart too"
        counts = rec.counts()
        assert counts["canary_seen"] >= counts["canary_uploaded"] - 2  # the last may be in flight


async def test_a_canary_no_poll_listed_before_a_restart_is_still_set_apart_after_it(
    pypiserver: servers.Server,
) -> None:
    proxy = StaleProxy(pypiserver.base)
    async with serve(proxy.app()) as site:
        rec = Recorder()
        cfg = {
            "api": "pypi",
            "url": f"{site.base}/simple/",
            "packages": ["t6-*"],
            "canary": canary("t6-canary", url=pypiserver.extra["upload"]),
        }
        source = source_with_canary(rec, **cfg)
        assert source.canary is not None
        assert await poll(source, rec)
        proxy.frozen = True
        assert await source.canary.upload_once() is not None
        assert await poll(source, rec), "a poll that does not list it saves it as unseen"
        del source  # the service stops

        restarted = source_with_canary(rec, **cfg)
        proxy.frozen = False
        rec.clear()
        assert await poll(restarted, rec)
        assert rec.rows() == [], "recognised from the saved position, not counted"
        assert rec.counts()["canary_seen"] == 1


async def test_a_canary_listed_before_its_upload_is_answered_or_whose_answer_is_lost_is_no_write(
    pypiserver: servers.Server,
) -> None:
    proxy = StaleProxy(pypiserver.base)
    async with serve(proxy.app()) as site:
        rec = Recorder()
        source = source_with_canary(
            rec,
            api="pypi",
            url=pypiserver.url,
            packages=["t7-*"],
            timeout=1,
            retries=0,
            canary=canary("t7-canary", url=f"{site.base}/"),  # uploads through the proxy
        )
        assert source.canary is not None
        assert await poll(source, rec)

        # Stored by the registry at once, answered half a second later; a poll meanwhile.
        proxy.answer_delay = 0.5
        uploading = asyncio.create_task(source.canary.upload_once())
        await wait_for(lambda: proxy.stored == 1, 5)
        rec.clear()
        assert await poll(source, rec)
        assert await uploading is not None
        assert await poll(source, rec)
        assert rec.rows() == [] and rec.counts()["canary_seen"] == 1

        # Stored, but the answer never comes (the client gives up): still not a write.
        proxy.answer_delay = 3.0
        assert await source.canary.upload_once() is None
        assert proxy.stored == 2
        rec.clear()
        assert await poll(source, rec)
        assert rec.rows() == [], "recognised by the name and digest made before sending"
        counts = rec.counts()
        assert counts["canary_seen"] == 1 and counts["canary_upload_errors"] == 1


def test_only_the_exact_canaries_this_process_made_are_recognised_and_memory_is_bounded() -> None:
    canaries = Canaries(deadline=10.0)
    made = [Upload("p", f"p-0.{i}.tar.gz", f"sha256:{i:064x}", 200) for i in range(RECENT + 44)]
    for up in made:
        canaries.add(Sent(up, time.time()))
    assert len(canaries) == RECENT, "the last RECENT only"
    assert canaries.claim("p", made[0].artifact, made[0].digest) is None, "forgotten"
    last = made[-1]
    assert canaries.claim("p", last.artifact, last.digest) is not None
    assert canaries.claim("p", last.artifact, "sha256:" + "f" * 64) is None, "other content"
    assert canaries.claim("p", last.artifact + "x", last.digest) is None
    assert canaries.claim("q", last.artifact, last.digest) is None
    assert canaries.claim("p", last.artifact, None) is not None, "a poll without digests"

    # An image tag pushed again: the canary listed replaces the earlier, which is not missed.
    tags = Canaries(deadline=1.0)
    first, second = (Upload("img", "canary", f"sha256:{d * 64}", 450) for d in "ab")
    tags.add(Sent(first, 100.0))
    tags.add(Sent(second, 100.5))
    seen = tags.claim("img", "canary", second.digest)
    assert seen is not None and seen.upload is second
    seen.seen_at = 101.0
    tags.supersede(seen)
    assert tags.overdue(200.0) == []


BAD_CANARIES = [
    (
        {"api": "nexus", "url": "http://n/", "repositories": ["r"], "canary": {}},
        "sources[0]: canary: api 'nexus' has no canary upload here",
    ),
    (
        {"api": "artifactory", "url": "http://a/artifactory/", "canary": {}},
        "sources[0]: canary: api 'artifactory' has no canary upload here",
    ),
    (
        {"api": "json", "url": "http://b/posts", "canary": {}},
        "sources[0]: canary: api 'json' has no canary upload here",
    ),
    (
        {"api": "pypi", "url": "http://p/simple/", "interval": "5m", "canary": {"deadline": "9m"}},
        "sources[0]: canary.deadline (540s) must be at least 2 x interval (600s)",
    ),
    (
        {"api": "pypi", "url": "http://p/simple/", "packages": ["sandbox-*"], "canary": {}},
        "sources[0]: canary.repository 'capalarm-canary' is not in packages",
    ),
    (
        {"api": "pypi", "url": "http://p/index/", "canary": {}},
        "sources[0]: canary.url: cannot tell the upload URL from url",
    ),
    (
        {"api": "oci", "url": "http://r/", "canary": {"repository": "Not/An/Image"}},
        "sources[0]: canary.repository 'Not/An/Image' is not a valid oci name",
    ),
    (
        {"api": "mediawiki", "url": "http://w/api.php", "namespaces": [2], "canary": {}},
        "sources[0]: canary.repository 'capalarm-canary' is in namespace 0, not in namespaces",
    ),
    (
        {"api": "npm", "url": "http://n/", "canary": {"interval": "10m", "dead_line": "5m"}},
        "sources[0].canary.dead_line: Extra inputs are not permitted",
    ),
]


@pytest.mark.parametrize(("source", "line"), BAD_CANARIES)
def test_check_config_names_the_canary_key_that_is_wrong(
    source: dict[str, Any], line: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "capalarm.yaml"
    cfg.write_text(json.dumps({"sources": [{"name": "reg", "type": "registry", **source}]}))
    res = subprocess.run(
        [sys.executable, "-m", "alarm.cli", "check-config", str(cfg)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    (only,) = res.stderr.strip().splitlines()
    assert line in only and "Traceback" not in only


def test_check_config_accepts_the_documented_canary() -> None:
    from alarm.config import config_from_dict

    cfg = config_from_dict(
        {
            "sources": [
                {
                    "name": "internal-pypi",
                    "type": "registry",
                    "api": "pypi",
                    "url": "http://pypi.internal:8080/simple/",
                    "canary": {
                        "interval": "10m",
                        "deadline": "5m",
                        "credentials": {"file": "/etc/capalarm/pypi-canary"},
                        "repository": "capalarm-canary",
                    },
                },
                {"name": "proxy", "type": "registry", "api": "oci", "url": "http://r:5000/"},
            ]
        }
    )
    pypi, oci = cfg.sources
    assert pypi.canary_upload_url() == "http://pypi.internal:8080/"
    assert pypi.canary_deadline == 300.0
    assert oci.canary is None
