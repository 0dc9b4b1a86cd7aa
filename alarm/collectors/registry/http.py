"""The HTTP side of every registry adapter: one client per registry, patient and suspicious.

- **Bounded bodies.**  A body is read as a stream and abandoned past ``max_response_bytes``
  (``oversized_responses``); a ``Content-Length`` above the cap is refused before any of it is
  read, so a 2 GB (or endless) body costs one cap of memory at most.  Decompression happens
  before the count, so a gzip bomb is capped the same way.
- **Bounded polls.**  What one poll holds at once of bodies — the bytes being read, and while
  a body is decoded its bytes, its text and an upper estimate of its decoded objects
  (decode.py) — is charged to the poll's :class:`PollBudget` and kept within
  ``max_poll_bytes``; past it the poll fails (``poll_bytes_exceeded``).  A URL longer than
  ``max_url_bytes`` (a paging link or redirect a server made up) is not requested
  (``urls_too_long``).
- **Timeouts.**  Each attempt has a total deadline (connect to last byte, aiohttp
  ``ClientTimeout(total=...)``): a server that drips one byte a second is cut off (``timeouts``).
- **Retries** of idempotent requests (GET, HEAD) on connection errors, timeouts, 5xx and 429,
  with full-jitter exponential backoff (the AWS Architecture Blog's "Exponential Backoff And
  Jitter").  ``Retry-After`` on 429/503 is honoured (RFC 9110 §10.2.3: delay-seconds or an
  HTTP-date); one longer than ``max_retry_after`` ends the poll with :class:`RetryLater`, so the
  next poll waits as asked instead of hammering.
- **Conditional requests** (RFC 9110 §13.1): ``If-None-Match`` / ``If-Modified-Since`` from the
  validators the caller kept; a 304 is returned as such, with no body.
- **Credentials** go only to the registry's own origin (scheme, host, port: RFC 6454).
  Redirects are followed by hand so that a redirect to another origin is followed *without*
  them (``credentials_withheld``); the secret is held as ``SecretStr`` and never formatted
  into a message.
- **Redirects** stay on the registry's own origin unless ``allow_redirect_hosts`` lists the
  other host; a loopback or link-local address (a cloud metadata endpoint, a local admin
  port) only where the address itself is listed.  Anything else fails the poll
  (``redirects_refused``): a registry must not turn the poller into a way to read another
  host and show its answer as evidence.
- **TLS** is always verified: the system store, or ``ca_file`` for a private CA.
- **Concurrency**: at most ``concurrency`` requests in flight to one registry.
- **Token authentication** (``api: oci``/``docker``): a 401 with a ``Bearer realm=...``
  challenge is answered as the Docker Registry token spec says (token_auth.py), once per
  request, and the token is cached until it expires.
- **Uploads** (:meth:`RegistryClient.send`, the canary's only): one attempt, never retried
  (an upload is not idempotent), with the same credential and redirect rules.
"""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import random
import socket
import ssl
import time
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from multidict import CIMultiDictProxy
from pydantic import SecretStr

from alarm.collectors.registry.decode import decoded_estimate
from alarm.collectors.registry.settings import RegistryBase
from alarm.collectors.registry.token_auth import (
    MAX_TOKEN_BYTES,
    Challenge,
    TokenCache,
    parse_challenge,
    realm_refusal,
    scope_of,
    token_of,
)
from alarm.jsontext import loads_json
from alarm.retryafter import retry_after

# The longest a server's Retry-After puts the next poll off: the longest poll interval.
MAX_RETRY_AFTER = 86400.0
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5
BACKOFF_BASE = 0.5  # seconds: the first retry waits up to this, each next one up to twice as long
BACKOFF_CAP = 10.0
USER_AGENT = "capalarm-registry-poller/1"
# Bodies larger than this are parsed in a worker thread (about 10 ms of json.loads).
PARSE_OFF_LOOP_BYTES = 1024 * 1024

# The counters this module keeps are declared with the source type (registry_type.py).
TOKEN_APIS = frozenset({"oci", "docker"})

if TYPE_CHECKING:
    import aiohttp


def _aiohttp() -> ModuleType:
    """aiohttp, imported when a registry is first polled: validating a configuration or
    replaying a backtest, which import this module for its settings, do not pay the fifth of
    a second it takes."""
    import aiohttp

    return aiohttp


class PollError(Exception):
    """A poll cannot complete.  The message names the URL and what went wrong, never a
    secret."""


class RetryLater(PollError):
    """The server asked to be left alone until ``not_before`` (unix s)."""

    def __init__(self, message: str, not_before: float):
        super().__init__(message)
        self.not_before = not_before


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def special_address_refusal(
    host: str, addresses: Iterable[str], allowed: Collection[str]
) -> str | None:
    """Why ``host`` may not be reached at ``addresses`` although allow_redirect_hosts lists
    it, or None.  A loopback, link-local or unspecified address is reached only where that
    address is listed itself: a listed name is a promise about who answers, not about where
    DNS points it, and a name moved onto 169.254.169.254 would hand the poller the cloud
    metadata endpoint.  A ``localhost`` name (RFC 6761) is loopback by definition, so
    listing one says loopback."""
    if host == "localhost" or host.endswith(".localhost"):
        return None
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address.partition("%")[0])  # without an IPv6 zone
        except ValueError:
            continue
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:169.254.169.254 is reached as 169.254.169.254
        special = ip.is_loopback or ip.is_link_local or ip.is_unspecified
        if special and str(ip) not in allowed:
            return (
                f"{host} is at {ip}, a loopback or link-local address that "
                "allow_redirect_hosts does not list"
            )
    return None


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """RFC 9110 §10.2.3: ``Retry-After: 120`` or ``Retry-After: <HTTP-date>``, at most
    MAX_RETRY_AFTER: the next poll is never put off longer than the longest poll interval."""
    return retry_after(value, now, MAX_RETRY_AFTER)


def _origin_prefix(url: str) -> str:
    """``scheme://host[:port]/`` as the URLs built from ``url`` begin (lower case scheme and
    host); a URL that begins so is on ``url``'s origin."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return "\0"  # userinfo in the URL: compare parsed origins only
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}/"


def safe_url(url: str) -> str:
    """The URL without userinfo and query (a query may carry a token), for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"[:300]


@dataclass(slots=True)
class Reply:
    status: int
    url: str  # after redirects
    headers: CIMultiDictProxy[str]
    body: bytes | bytearray  # a large body stays the buffer it was read into

    def json(self) -> Any:
        """The body as JSON; anything else is a :class:`PollError` (garbage)."""
        try:
            return loads_json(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise GarbageResponse(f"{safe_url(self.url)}: not JSON ({exc})") from None

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def validator(self) -> dict[str, str]:
        """What a conditional request for the same URL sends back (RFC 9110 §8.8)."""
        out = {}
        if etag := self.headers.get("ETag"):
            out["etag"] = etag
        if modified := self.headers.get("Last-Modified"):
            out["modified"] = modified
        return out


class GarbageResponse(PollError):
    """A body that is not what the API documents."""


class PollBudget:
    """The bytes of response bodies one poll holds at once, kept within ``max_poll_bytes``.

    Charged while a body is read (its bytes so far) and while it is decoded (decode.py's
    estimate of bytes, text and objects); what an adapter keeps afterwards is its own compact
    state (hashes, a few fields of new items), bounded by ``max_items``.  ``take`` past the
    limit raises :class:`PollError` (``poll_bytes_exceeded``): the poll fails and is
    reported, the next one tries again."""

    __slots__ = ("counts", "held", "limit", "peak")

    def __init__(self, limit: int, counts: Counter[str]):
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.counts = counts

    def take(self, n: int, url: str, what: str = "a body") -> None:
        if self.held + n > self.limit:
            self.counts["poll_bytes_exceeded"] += 1
            raise PollError(
                f"{safe_url(url)}: {what} would have this poll hold {self.held + n} bytes of "
                f"responses, over max_poll_bytes ({self.limit})"
            )
        self.held += n
        self.peak = max(self.peak, self.held)

    def give(self, n: int) -> None:
        self.held -= n


class RegistryClient:
    """The aiohttp session of one registry source, with its policy.  Counters go into
    ``counts`` (the poller hands them over with each batch).

    ``home``: the URL whose origin gets the credentials (the source's ``url``; the canary's
    upload URL for the canary's client).  ``cookies``: keep the session's cookies (only the
    canary's MediaWiki login needs them; its client lives for one upload)."""

    def __init__(
        self,
        settings: RegistryBase,
        counts: Counter[str],
        authorization: tuple[str, SecretStr] | None = None,
        rng: random.Random | None = None,
        *,
        home: str | None = None,
        cookies: bool = False,
    ):
        self.settings = settings
        self.counts = counts
        self.authorization = authorization
        self.home_url = home or settings.url
        self.home = origin(self.home_url)
        self.rng = rng or random.Random()
        self.limit = asyncio.Semaphore(settings.concurrency)
        self.session: aiohttp.ClientSession | None = None
        self.cookies = cookies
        api = str(getattr(settings, "api", ""))
        self.tokens: TokenCache | None = TokenCache() if api in TOKEN_APIS else None
        self.budget = PollBudget(settings.max_poll_bytes, counts)
        self._timeout: Any = None  # aiohttp.ClientTimeout, made once with the session
        # Requests to URLs starting with this are on the home origin without parsing them
        # (the common case, once per request).
        self._home_prefix = _origin_prefix(self.home_url)

    def begin_poll(self) -> PollBudget:
        """A fresh budget for a new poll (what a failed poll left charged is dropped)."""
        self.budget = PollBudget(self.settings.max_poll_bytes, self.counts)
        return self.budget

    async def __aenter__(self) -> RegistryClient:
        ctx = ssl.create_default_context(cafile=self.settings.ca_file)
        aiohttp = _aiohttp()
        self._timeout = aiohttp.ClientTimeout(total=self.settings.timeout)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=self.settings.concurrency),
            headers={"User-Agent": USER_AGENT},
            # Cookies are state a hostile server could grow; no poll needs them.  (``unsafe``:
            # a registry addressed by IP, as on loopback, keeps them too.)
            cookie_jar=aiohttp.CookieJar(unsafe=True) if self.cookies else aiohttp.DummyCookieJar(),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def get(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        validator: dict[str, str] | None = None,
        ok: frozenset[int] = frozenset({200}),
        max_bytes: int | None = None,
        data: bytes | None = None,
    ) -> Reply:
        """One idempotent request (GET, HEAD, or a read-only query POSTed) with retries.  Returns a reply whose status is in ``ok``
        (or 304 when a validator was sent); raises :class:`PollError` otherwise."""
        sent = dict(headers or {})
        if validator:
            if "etag" in validator:
                sent["If-None-Match"] = validator["etag"]
            if "modified" in validator:
                sent["If-Modified-Since"] = validator["modified"]
            ok = ok | {304}
        attempts = self.settings.retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                reply = await self._follow(method, url, sent, max_bytes, data)
            except TimeoutError:
                self.counts["timeouts"] += 1
                if last:
                    raise PollError(f"{safe_url(url)}: timed out after {attempts} tries") from None
            except _aiohttp().ClientError as exc:
                self.counts["http_errors"] += 1
                if last:
                    raise PollError(f"{safe_url(url)}: {type(exc).__name__}") from None
            else:
                if reply.status in ok:
                    if reply.status == 304:
                        self.counts["not_modified"] += 1
                    return reply
                self.counts["http_errors"] += 1
                if reply.status not in RETRY_STATUSES:
                    raise PollError(f"{safe_url(url)}: HTTP {reply.status}")
                wait = None
                if reply.status in (429, 503):
                    if reply.status == 429:
                        self.counts["rate_limited"] += 1
                    now = time.time()
                    wait = retry_after_seconds(reply.headers.get("Retry-After"), now)
                    if wait is not None and (wait > self.settings.max_retry_after or last):
                        raise RetryLater(
                            f"{safe_url(url)}: HTTP {reply.status}, Retry-After {wait:.0f}s",
                            now + wait,
                        )
                if last:
                    raise PollError(f"{safe_url(url)}: HTTP {reply.status} after {attempts} tries")
                if wait is not None:
                    self.counts["retries"] += 1
                    await asyncio.sleep(wait)
                    continue
            self.counts["retries"] += 1
            await asyncio.sleep(self.rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt)))
        raise AssertionError("unreachable")  # pragma: no cover

    async def get_json(self, url: str, **kw: Any) -> tuple[Reply, Any]:
        """``get``, and the body as JSON (None on a 304); a body that is not JSON is a
        :class:`GarbageResponse` (counted where it is caught: the poller, or an adapter
        that carries on without it)."""
        reply = await self.get(url, **kw)
        if reply.status == 304:
            return reply, None
        return reply, await self.decode(reply)

    async def decode(self, reply: Reply) -> Any:
        """The body as JSON, its decoding charged to the poll's budget (bytes, text and the
        estimated objects together), in a worker thread when large."""
        need = decoded_estimate(reply.body)
        self.budget.take(need, reply.url, f"decoding {len(reply.body)} bytes of JSON")
        try:
            if len(reply.body) > PARSE_OFF_LOOP_BYTES:
                return await asyncio.to_thread(reply.json)
            return reply.json()
        finally:
            self.budget.give(need)

    async def send(
        self,
        method: str,
        url: str,
        *,
        data: bytes,
        headers: dict[str, str] | None = None,
        ok: frozenset[int] = frozenset({200, 201, 202}),
        max_bytes: int = 1024 * 1024,
    ) -> Reply:
        """One upload (POST, PUT): a single attempt, not retried — an upload is not
        idempotent, and the canary's next round is its retry.  Raises :class:`PollError`
        (naming the URL and the status, never the credentials or the body) unless the status
        is in ``ok``."""
        try:
            reply = await self._follow(
                method, url, dict(headers or {}), max_bytes, data, keep_method=True
            )
        except TimeoutError:
            self.counts["timeouts"] += 1
            raise PollError(f"{safe_url(url)}: timed out") from None
        except _aiohttp().ClientError as exc:
            self.counts["http_errors"] += 1
            raise PollError(f"{safe_url(url)}: {type(exc).__name__}") from None
        if reply.status not in ok:
            self.counts["http_errors"] += 1
            raise PollError(f"{method} {safe_url(url)}: HTTP {reply.status}")
        return reply

    async def probe(self, url: str) -> tuple[int | None, float | None]:
        """HEAD: the size (Content-Length) and Last-Modified of a file, or None where the
        server does not say or the request failed (already counted)."""
        try:
            reply = await self.get(url, method="HEAD")
        except RetryLater:
            raise
        except PollError:
            return None, None
        size = reply.headers.get("Content-Length")
        modified = reply.headers.get("Last-Modified")
        when = None
        if modified:
            try:
                when = email.utils.parsedate_to_datetime(modified).timestamp()
            except (TypeError, ValueError):
                when = None
        return (int(size) if size and size.isdigit() else None), when

    async def _follow(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        max_bytes: int | None,
        data: bytes | None = None,
        *,
        keep_method: bool = False,
    ) -> Reply:
        """One attempt, following redirects by hand (credentials only to the home origin);
        a token challenge from the home origin is answered once (token_auth.py).
        ``keep_method``: a redirect that would turn the request into a GET (303; 301/302
        after a POST) is returned, not followed (an upload must not become a read)."""
        challenged = False
        for _ in range(MAX_REDIRECTS + 2):
            if len(url) > self.settings.max_url_bytes:
                self.counts["urls_too_long"] += 1
                raise PollError(
                    f"{safe_url(url)}: URL of {len(url)} bytes, over max_url_bytes "
                    f"({self.settings.max_url_bytes}): not requested"
                )
            sent = dict(headers)
            home = url.startswith(self._home_prefix) or origin(url) == self.home
            if home:
                self._authorize(sent, method, url)
            reply = await self._once(method, url, sent, max_bytes, data)
            if reply.status == 401 and home and self.tokens is not None and not challenged:
                challenge = parse_challenge(reply.headers.getall("WWW-Authenticate", []))
                if challenge is not None:
                    challenged = True
                    await self._fetch_token(challenge, scope_of(method, url))
                    continue  # the same request again, with the token
            if reply.status in (303,) or (reply.status in (301, 302) and method == "POST"):
                if keep_method:
                    return reply
                method, data = "GET", None  # RFC 9110 §15.4.4: a 303 is followed by GET
            location = reply.headers.get("Location")
            if reply.status not in REDIRECT_STATUSES or not location:
                return reply
            target = urljoin(url, location)
            if urlsplit(target).scheme not in ("http", "https"):
                raise PollError(f"{safe_url(url)}: redirect to a non-HTTP URL")
            refusal = await self._redirect_refusal(target)
            if refusal is not None:
                # Not retried (get() retries only network errors and statuses): the
                # registry would answer the same; the poll fails saying why.
                self.counts["redirects_refused"] += 1
                raise PollError(
                    f"{safe_url(url)}: redirect to {safe_url(target)} refused: {refusal}"
                )
            if self.authorization is not None and origin(target) != self.home:
                self.counts["credentials_withheld"] += 1
            url = target
        raise PollError(f"{safe_url(url)}: more than {MAX_REDIRECTS} redirects")

    async def _redirect_refusal(self, target: str) -> str | None:
        """Why a redirect to ``target`` is not followed, or None: the home origin always is;
        another only to a host allow_redirect_hosts lists, at an address it may reach."""
        to = origin(target)
        if to == self.home:
            return None
        host, allowed = to[1], self.settings.allow_redirect_hosts
        if host not in allowed:
            return f"another origin, and allow_redirect_hosts does not list {host}"
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, to[2], type=socket.SOCK_STREAM
            )
        except OSError:
            return None  # the request itself fails then, counted as any unreachable host
        # aiohttp resolves the name again to connect (a DNS answer that changes in between
        # is not caught here); this stops the plain case of a listed name pointing there.
        return special_address_refusal(host, [str(info[4][0]) for info in infos], allowed)

    def _authorize(self, headers: dict[str, str], method: str, url: str) -> None:
        """The credentials for a request to the home origin: a cached registry token for
        the request's scope where there is one, else the configured credentials."""
        token = self.tokens.get(scope_of(method, url)) if self.tokens is not None else None
        if self.authorization is not None:
            name, value = self.authorization
            headers[name] = value.get_secret_value()
        if token is not None:
            headers["Authorization"] = f"Bearer {token.get_secret_value()}"

    async def _fetch_token(self, challenge: Challenge, scope: str | None) -> None:
        """GET the challenge's realm for a token (with the configured Basic credentials, to
        a realm the registry named over its own scheme) and cache it."""
        assert self.tokens is not None
        refusal = realm_refusal(challenge.realm, self.home_url)
        if refusal is not None:
            raise PollError(f"{safe_url(challenge.realm)}: {refusal}: not asked")
        headers: dict[str, str] = {"Accept": "application/json"}
        if self.authorization is not None:
            name, value = self.authorization
            secret = value.get_secret_value()
            if name.lower() == "authorization" and secret.startswith("Basic "):
                headers["Authorization"] = secret
        url = challenge.token_url()
        reply = await self._once("GET", url, headers, MAX_TOKEN_BYTES, None)
        if reply.status != 200:
            self.counts["http_errors"] += 1
            raise PollError(f"token realm {safe_url(url)}: HTTP {reply.status}")
        got = token_of(reply.json())
        if got is None:
            raise GarbageResponse(f"token realm {safe_url(url)}: no token in the answer")
        self.counts["tokens_fetched"] += 1
        self.tokens.put(challenge, [scope] if scope else [], *got)

    async def _once(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        max_bytes: int | None,
        data: bytes | None,
    ) -> Reply:
        assert self.session is not None, "use the client as an async context manager"
        cap = max_bytes or self.settings.max_response_bytes
        timeout = self._timeout
        async with (
            self.limit,
            self.session.request(
                method, url, headers=headers, data=data, allow_redirects=False, timeout=timeout
            ) as resp,
        ):
            declared = resp.content_length
            if method == "HEAD" or resp.status in REDIRECT_STATUSES or resp.status == 304:
                body = b""
            elif declared is not None and declared > cap:
                self.counts["oversized_responses"] += 1
                raise PollError(f"{safe_url(url)}: body of {declared} bytes over the {cap} cap")
            else:
                body = await self._read(resp.content, url, cap, declared)
            # The response's headers are immutable (a CIMultiDictProxy): kept as they are.
            return Reply(resp.status, str(resp.url), resp.headers, body)

    async def _read(
        self, content: Any, url: str, cap: int, declared: int | None
    ) -> bytes | bytearray:
        """The body, at most ``cap`` bytes, charged to the poll's budget while it is read.
        One buffer, grown in place and never copied (``bytes(buf)`` of a grown bytearray,
        or a join of the chunks, held the body twice at the end)."""
        budget = self.budget
        charged = 0
        first: bytes | None = None
        buf: bytearray | None = None
        try:
            if declared is not None:
                budget.take(declared, url, f"a body of {declared} bytes")
                charged = declared
            size = 0
            async for chunk in content.iter_chunked(256 * 1024):
                size += len(chunk)
                if size > cap:
                    self.counts["oversized_responses"] += 1
                    raise PollError(f"{safe_url(url)}: body over the {cap} byte cap")
                if size > charged:
                    budget.take(size - charged, url)
                    charged = size
                if first is None:
                    first = chunk
                elif buf is None:
                    buf = bytearray(first)
                    buf += chunk
                else:
                    buf += chunk
            return buf if buf is not None else (first or b"")
        finally:
            budget.give(charged)
