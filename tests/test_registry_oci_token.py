"""Docker Registry token authentication for ``api: oci`` (alarm/collectors/registry/
token_auth.py), against the real thing: Debian's docker-registry (distribution 2.8) configured
with ``auth: token`` and a root certificate made by openssl here, in front of a token server
on loopback (tests/registries/token_server.py) that follows the token spec and signs RS256
JWTs with that certificate's key.  The realm is on another host name than the registry
(``localhost`` against ``127.0.0.1``), as Docker Hub's is.

What a user relies on: polls, counts and the canary's push all work through the token dance
with the configured ``user:password`` (which only the realm gets as Basic), tokens are reused
until ``expires_in`` and then fetched again, and an https registry that names a cleartext
realm gets nothing (a local TLS stand-in of a registry, since that needs only the challenge).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from alarm.collectors.registry.token_auth import parse_challenge
from tests.fakes.kit import wait_for
from tests.fakes.server import free_port, serve
from tests.registries import servers
from tests.registries.clients import push_image
from tests.registries.harness import Recorder, collector, poll, running
from tests.registries.token_server import ISSUER, SERVICE, TokenServer, make_signing_cert

pytestmark = pytest.mark.slow

USER, PASSWORD = "alice", "alice-token-pass"


class TokenRegistry:
    def __init__(self, registry: servers.Server, tokens: TokenServer, realm: str):
        self.registry, self.tokens, self.realm = registry, tokens, realm

    def bearer(self, scope: str) -> dict[str, str]:
        """A token for a workload's own push, fetched as the Docker client would."""
        basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        status, _, body = servers.request(
            "GET",
            f"{self.realm}?service={SERVICE}&scope={scope}",
            headers={"Authorization": f"Basic {basic}"},
        )
        assert status == 200, body
        return {"Authorization": f"Bearer {json.loads(body)['token']}"}


@pytest.fixture
async def token_registry(tmp_path: Path) -> AsyncIterator[TokenRegistry]:
    key, cert = make_signing_cert(tmp_path)
    tokens = TokenServer(key, cert, USER, PASSWORD, expires_in=300)
    port = free_port()
    realm = f"http://localhost:{port}/token"  # another host than the registry's 127.0.0.1
    async with serve(tokens.app(), port):
        auth = {"realm": realm, "service": SERVICE, "issuer": ISSUER, "rootcertbundle": str(cert)}
        (tmp_path / "registry").mkdir()
        with servers.docker_registry(tmp_path / "registry", auth) as registry:
            yield TokenRegistry(registry, tokens, realm)


def credentials(tmp_path: Path, secret: str) -> dict[str, str]:
    path = tmp_path / "registry-credentials"
    path.write_text(secret + "\n")
    return {"file": str(path)}


async def test_polls_and_the_canary_push_go_through_the_token_realm(
    token_registry: TokenRegistry, tmp_path: Path
) -> None:
    url = token_registry.registry.url
    status, headers, _ = servers.request("GET", f"{url}v2/_catalog")
    assert status == 401 and headers["Www-Authenticate"].startswith("Bearer realm=")

    # The token server runs on this event loop: a blocking client must not.
    push = await asyncio.to_thread(token_registry.bearer, "repository:sandbox/app:pull,push")
    push_image(url, "sandbox/app", "v1", 1000, push)
    workload = len(token_registry.tokens.requests)
    cred = credentials(tmp_path, f"{USER}:{PASSWORD}")
    rec = Recorder()
    source = collector(
        rec,
        api="oci",
        url=url,
        interval=1,
        credentials=cred,
        canary={"interval": 1, "deadline": 2, "credentials": cred, "repository": "sandbox/canary"},
    )
    assert source.canary is not None
    assert await poll(source, rec), source.health.last_error
    assert rec.counts()["baseline_artifacts"] == 1

    pushed = push_image(url, "sandbox/app", "v2", 3000, push)
    assert await source.canary.upload_once() is not None, source.canary.last_error
    rec.clear()
    assert await poll(source, rec), source.health.last_error
    assert [(r.repository, r.artifact, r.nbytes) for r in rec.rows()] == [
        ("sandbox/app", "v2", pushed)
    ]
    assert rec.counts()["canary_seen"] == 1

    ours = token_registry.tokens.requests[workload:]
    assert ours, "the poll and the canary asked the realm"
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert all(r["authorization"] == expected for r in ours), "Basic, to the realm"
    assert {r["host"] for r in ours} == {token_registry.realm.split("/")[2]}
    scopes = {s for r in ours for s in r["scopes"]}
    assert "registry:catalog:*" in scopes and "repository:sandbox/app:pull" in scopes
    assert any(s.startswith("repository:sandbox/canary:") and "push" in s for s in scopes)
    assert rec.counts()["tokens_fetched"] >= 2

    # Without credentials the realm grants nothing, and the registry refuses the poll.
    anonymous = collector(Recorder(), api="oci", url=url, interval=1)
    assert not await poll(anonymous, Recorder())
    assert "HTTP 401" in anonymous.health.last_error


async def test_a_token_is_reused_until_expires_in_then_fetched_again(
    token_registry: TokenRegistry, tmp_path: Path
) -> None:
    token_registry.tokens.expires_in = 3
    rec = Recorder()
    source = collector(
        rec,
        api="oci",
        url=token_registry.registry.url,
        interval=1,
        credentials=credentials(tmp_path, f"{USER}:{PASSWORD}"),
    )
    async with running(source, rec):
        await wait_for(lambda: rec.counts()["polls"] >= 10, 20)
    fetched = [
        r["at"] for r in token_registry.tokens.requests if r["scopes"] == ["registry:catalog:*"]
    ]
    polls = rec.counts()["polls"]
    assert rec.counts()["poll_errors"] == 0
    # Ten polls a second apart; a token lasts 3 s (renewed 0.3 s early): one in three polls
    # asks the realm, not every poll.
    assert 3 <= len(fetched) <= polls // 2, (len(fetched), polls)
    gaps = [b - a for a, b in itertools.pairwise(fetched)]
    assert all(gap >= 2.5 for gap in gaps), gaps


def tls_cert(workdir: Path) -> tuple[Path, Path]:
    key, cert = workdir / "tls.key", workdir / "tls.pem"
    subprocess.run(
        [servers.program("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes",
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


async def test_an_https_registry_naming_a_cleartext_realm_gets_no_credentials(
    tmp_path: Path,
) -> None:
    asked: list[str] = []

    async def token(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Authorization", ""))
        return web.json_response({"token": "t"})

    realm_app = web.Application()
    realm_app.router.add_get("/token", token)

    async def challenge(request: web.Request) -> web.Response:
        return web.json_response(
            {"errors": [{"code": "UNAUTHORIZED"}]},
            status=401,
            headers={
                "WWW-Authenticate": f'Bearer realm="{realm_base}/token",service="s",'
                'scope="registry:catalog:*"'
            },
        )

    registry_app = web.Application()
    registry_app.router.add_get("/v2/_catalog", challenge)
    key, cert = tls_cert(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    async with serve(realm_app) as realm_served:
        realm_base = realm_served.base  # http://127.0.0.1:<port>
        runner = web.AppRunner(registry_app, access_log=None)
        await runner.setup()
        port = free_port()
        site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx)
        await site.start()
        try:
            source = collector(
                Recorder(),
                api="oci",
                url=f"https://127.0.0.1:{port}/",
                ca_file=str(cert),
                retries=0,
                credentials=credentials(tmp_path, f"{USER}:{PASSWORD}"),
            )
            assert not await poll(source, Recorder())
        finally:
            await runner.cleanup()
    assert asked == [], "a cleartext realm is not asked"
    assert source.health.last_error.endswith(
        f"{realm_base}/token: the token realm of an https registry is not https: not asked"
    )


def test_the_spec_example_challenge_is_read_as_written() -> None:
    # The example of "Docker Registry v2 authentication via central service", step 3.
    header = (
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:samalba/my-app:pull,push"'
    )
    challenge = parse_challenge(["Basic realm=x", header])
    assert challenge is not None
    assert challenge.realm == "https://auth.docker.io/token"
    assert challenge.service == "registry.docker.io"
    assert challenge.scopes == ("repository:samalba/my-app:pull,push",)
    assert challenge.token_url() == (
        "https://auth.docker.io/token?service=registry.docker.io"
        "&scope=repository%3Asamalba%2Fmy-app%3Apull%2Cpush"
    )
    assert parse_challenge(['Basic realm="registry"']) is None
