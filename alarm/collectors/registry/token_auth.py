"""Docker Registry token authentication, for ``api: oci`` / ``docker``.

Follows "Docker Registry v2 authentication via central service"
(https://distribution.github.io/distribution/spec/auth/token/) and "Token Authentication
Specification" on the same site: a registry that wants a token answers 401 with
``WWW-Authenticate: Bearer realm="<url>",service="<name>",scope="<type>:<name>:<actions>"``;
the client GETs the realm with ``service`` and ``scope`` as query parameters (HTTP Basic with
the configured ``user:password``, if any; anonymous otherwise), receives ``{"token": ...}``
(or the OAuth 2 spelling ``{"access_token": ...}``) with ``expires_in`` seconds (60 when
absent) and retries with ``Authorization: Bearer <token>``.  Harbor, GitLab, Docker Hub and
distribution with ``auth: token`` work this way.

Tokens are cached per (realm, service, scope) until ``expires_in`` (less a margin), and sent
before any challenge to requests whose scope is known from their path (``/v2/_catalog`` is
``registry:catalog:*``, ``/v2/<name>/...`` is ``repository:<name>:pull``, or ``pull,push``
for an upload), so a poll costs one 401 per scope per token lifetime, not one per request.

**Where the credentials go.**  The realm may be on another host (Docker Hub's registry and
``auth.docker.io``): the configured Basic credentials are sent there only because the
registry named it in its challenge, and only over the registry's own scheme or a stronger
one: an ``https`` registry's realm must be ``https`` (a cleartext realm is refused, not
asked, since a token fetched in the clear could be replayed).  This is what the Docker
client does; a registry is trusted with these credentials anyway, and naming a realm is the
registry's documented way to delegate checking them.  A redirect from the realm is not
followed.  The token itself, like the credentials, is sent only to the registry's origin.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from pydantic import SecretStr

DEFAULT_EXPIRES_IN = 60.0  # the spec's default when ``expires_in`` is absent
EXPIRY_MARGIN = 5.0  # a token is renewed this long (at most 10 % of its life) before it ends
MAX_TOKENS = 4096  # cached scopes (one per image repository polled), oldest dropped first
MAX_TOKEN_BYTES = 1024 * 1024
_PARAM = re.compile(r'\s*([A-Za-z][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')


@dataclass(frozen=True, slots=True)
class Challenge:
    realm: str
    service: str
    scopes: tuple[str, ...]

    def token_url(self) -> str:
        query: list[tuple[str, str]] = []
        if self.service:
            query.append(("service", self.service))
        query.extend(("scope", s) for s in self.scopes)
        if not query:
            return self.realm
        return self.realm + ("&" if "?" in self.realm else "?") + urlencode(query)


def parse_challenge(values: list[str]) -> Challenge | None:
    """The ``Bearer`` challenge among ``WWW-Authenticate`` values (RFC 9110 §11.6.1
    auth-params, quoted or not), or None when there is none or it names no realm."""
    for value in values:
        scheme, _, rest = value.strip().partition(" ")
        if scheme.lower() != "bearer":
            continue
        params: dict[str, str] = {}
        pos = 0
        while pos < len(rest):
            m = _PARAM.match(rest, pos)
            if m is None or m.end() == pos:
                break
            quoted, bare = m.group(2), m.group(3)
            params[m.group(1).lower()] = (
                re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare or ""
            )
            pos = m.end()
        realm = params.get("realm", "")
        if not realm:
            continue
        scopes = tuple(params.get("scope", "").split())
        return Challenge(realm, params.get("service", ""), scopes)
    return None


def realm_refusal(realm: str, registry_url: str) -> str | None:
    """Why the realm must not be asked (None: it may be)."""
    scheme = urlsplit(realm).scheme
    if scheme not in ("http", "https") or not urlsplit(realm).hostname:
        return "the token realm is not an HTTP URL"
    if urlsplit(registry_url).scheme == "https" and scheme != "https":
        return "the token realm of an https registry is not https"
    return None


def scope_of(method: str, url: str) -> str | None:
    """The scope a request to ``url`` needs, from its path, where the path says (None:
    unknown; the registry's challenge will say)."""
    path = urlsplit(url).path
    at = path.find("/v2/")
    if at < 0:
        return None
    rest = path[at + len("/v2/") :]
    if rest == "_catalog":
        return "registry:catalog:*"
    for part in ("/tags/", "/manifests/", "/blobs/"):
        cut = rest.rfind(part)
        if cut > 0:
            actions = "pull" if method in ("GET", "HEAD") else "pull,push"
            return f"repository:{rest[:cut]}:{actions}"
    return None


def token_of(doc: Any) -> tuple[SecretStr, float] | None:
    """(token, expires_in) from a token endpoint's answer; None when it holds no token."""
    if not isinstance(doc, dict):
        return None
    token = doc.get("token") or doc.get("access_token")
    if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
        return None
    expires = doc.get("expires_in")
    ok = isinstance(expires, int | float) and not isinstance(expires, bool) and expires > 0
    return SecretStr(token), float(expires) if ok else DEFAULT_EXPIRES_IN


class TokenCache:
    """Bearer tokens by (realm, service, scope), each until it expires (monotonic clock);
    the realm and service of the registry's last challenge, to look tokens up before one."""

    def __init__(self) -> None:
        self._tokens: OrderedDict[tuple[str, str, str], tuple[SecretStr, float]] = OrderedDict()
        self.realm: tuple[str, str] | None = None

    def __len__(self) -> int:
        return len(self._tokens)

    def get(self, scope: str | None) -> SecretStr | None:
        if self.realm is None or scope is None:
            return None
        key = (*self.realm, scope)
        hit = self._tokens.get(key)
        if hit is None:
            return None
        if time.monotonic() >= hit[1]:
            del self._tokens[key]
            return None
        self._tokens.move_to_end(key)
        return hit[0]

    def put(
        self, challenge: Challenge, scopes: list[str], token: SecretStr, expires_in: float
    ) -> None:
        """Keep ``token`` for the challenge's scopes and for ``scopes`` (what the request's
        path said it needs, so the next such request finds it)."""
        self.realm = (challenge.realm, challenge.service)
        until = time.monotonic() + expires_in - min(EXPIRY_MARGIN, expires_in / 10)
        for scope in {*challenge.scopes, *scopes} or {""}:
            key = (challenge.realm, challenge.service, scope)
            self._tokens[key] = (token, until)
            self._tokens.move_to_end(key)
        while len(self._tokens) > MAX_TOKENS:
            self._tokens.popitem(last=False)
