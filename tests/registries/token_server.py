"""A Docker Registry token server on loopback, for distribution's ``auth: token``.

Follows https://distribution.github.io/distribution/spec/auth/token/ ("Requesting a Token":
``GET <realm>?service=...&scope=...``, HTTP Basic for a named account, the answer
``{"token", "access_token", "expires_in", "issued_at"}``) and the JWT format of "Token
Authentication Implementation" (claims ``iss, sub, aud, exp, nbf, iat, jti, access``; header
``alg: RS256`` with the signing certificate in ``x5c``, which the registry checks against
its ``rootcertbundle``).  The key and a self-signed certificate are made with openssl; each
token is signed by ``openssl dgst -sha256 -sign`` (RSASSA-PKCS1-v1_5, i.e. RS256).

What it grants: every requested action to the one account (``user``/``password``), and
``pull`` of nothing to anonymous callers (an empty ``access``), so an unauthenticated poll
fails at the registry.  Every request is recorded (``requests``) for the tests to read.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.registries.servers import program

ISSUER = "capalarm-test-issuer"
SERVICE = "capalarm-test-registry"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_signing_cert(workdir: Path) -> tuple[Path, Path]:
    """An RSA key and a self-signed certificate for it (the registry's rootcertbundle)."""
    openssl = program("openssl")
    key, cert = workdir / "token.key", workdir / "token.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=capalarm test token issuer", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


@dataclass
class TokenServer:
    key: Path
    cert: Path
    user: str
    password: str
    expires_in: int = 300
    requests: list[dict[str, Any]] = field(default_factory=list)

    def _der(self) -> str:
        pem = self.cert.read_text()
        body = "".join(line for line in pem.splitlines() if not line.startswith("-----"))
        return body  # x5c holds base64 DER (not url-safe), which is the PEM body

    def _sign(self, signing_input: bytes) -> bytes:
        return subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key)],
            input=signing_input,
            capture_output=True,
            check=True,
        ).stdout

    async def token(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        scopes = request.query.getall("scope", [])
        self.requests.append(
            {
                "authorization": auth,
                "service": request.query.get("service"),
                "scopes": scopes,
                "host": request.host,
                "at": time.time(),
            }
        )
        account = ""
        if auth:
            expected = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            if auth != f"Basic {expected}":
                return web.json_response({"errors": [{"code": "UNAUTHORIZED"}]}, status=401)
            account = self.user
        access = []
        if account:
            for scope in scopes:
                kind, _, rest = scope.partition(":")
                name, _, actions = rest.rpartition(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._der()]}
        claims = {
            "iss": ISSUER,
            "sub": account,
            "aud": SERVICE,
            "exp": now + self.expires_in,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = (
            _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(claims).encode())
        ).encode()
        signature = await asyncio.to_thread(self._sign, signing_input)
        token = signing_input.decode() + "." + _b64url(signature)
        return web.json_response(
            {"token": token, "expires_in": self.expires_in, "issued_at": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
        )  # fmt: skip

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/token", self.token)
        return app
