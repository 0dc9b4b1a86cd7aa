"""TLS and basic auth for the HTTP side, in the web configuration format of the Prometheus
exporter-toolkit that node_exporter uses (``--web.config.file FILE``), as documented in
https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md::

    tls_server_config:
      cert_file: server.crt            # or cert: <PEM text>; relative paths: next to FILE
      key_file: server.key             # or key: <PEM text>
      client_auth_type: RequireAndVerifyClientCert   # default NoClientCert
      client_ca_file: clients.pem      # or client_ca: <PEM text>
      client_allowed_sans: [scraper.example]
      min_version: TLS12               # TLS10..TLS13, default TLS12; max_version default TLS13
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go names, TLS 1.2 and below
      curve_preferences: [X25519]
      prefer_server_cipher_suites: true
    http_server_config:
      headers: {X-Frame-Options: deny}  # the five headers the toolkit allows
    basic_auth_users:
      alice: $2y$10$...                 # bcrypt: htpasswd -nBC 10 "" | tr -d ':\\n'
    rate_limit: {interval: 1s, burst: 20}

Followed as the toolkit does: unknown keys are errors (its YAML is read strictly); TLS is on
once any TLS key is given; a CA without a client-auth policy is an error; with users, a
request without valid credentials is 401 with ``WWW-Authenticate: Basic``; an unknown user is
checked against a fixed hash at the users' own bcrypt cost, so timing does not tell which
users exist.  Password checks cannot stall anything else (:class:`AuthGate`): bcrypt runs on
two threads of its own, at most two checks per client address and sixteen in all may wait
(more are answered 429 at once), credentials that passed are trusted for five minutes and a
user and password that failed are refused for a minute without bcrypt.  Without
``cipher_suites``, TLS 1.2 offers AEAD suites only (``DEFAULT_CIPHERS``).  Where Python's ``ssl`` cannot do what Go does, the file is
rejected with the reason rather than served differently: ``RequestClientCert`` and
``RequireAnyClientCert`` (they accept unverified client certificates, which the toolkit's own
docs call insecure), and more than one curve (OpenSSL through ``ssl`` takes one).
``http_server_config.http2`` is accepted and has no effect (the server speaks HTTP/1.1).

The toolkit reads the file on every request; here :class:`WebConfigWatcher` checks the file
and every file it names once a second and applies a new version that validates; one that does
not is logged key by key and the running one is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import re
import ssl
import tempfile
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import bcrypt
import yaml
from pydantic import Field, ValidationError, field_validator

from alarm.settings import Duration, Strict, problems_of
from alarm.yamltext import load_yaml

log = logging.getLogger("capalarm.web")

POLL_SECONDS = 1.0
# Password checks (AuthGate, BasicAuth).  bcrypt costs ~60 ms at cost 10 and a flood of wrong
# passwords must not take the service's threads or the scrapes with it: checks run on their
# own AUTH_THREADS threads (never the default executor, which the sources read with); at most
# AUTH_WAITING may wait for one, and at most AUTH_PER_CLIENT of one peer address may be
# waiting or running; any more is answered 429 at once.
AUTH_THREADS = 2
AUTH_WAITING = 16
AUTH_PER_CLIENT = 2
# Credentials that passed are trusted AUTH_OK_TTL seconds without bcrypt (a scraper pays
# bcrypt once every five minutes, not every scrape); after that they are checked again, ahead
# of credentials never seen to pass.  A user and password that failed are refused for
# AUTH_FAILED_TTL seconds without bcrypt.  Both tables are bounded, keyed by a keyed hash
# (HMAC with a key of the process's own, never the password or a plain digest of it), and
# start empty whenever the web config is applied again.
AUTH_OK_TTL = 300.0
AUTH_OK_ENTRIES = 256
AUTH_FAILED_TTL = 60.0
AUTH_FAILED_ENTRIES = 4096
AUTH_REFUSED_LOG_EVERY = 60.0
# An unknown user is checked against a hash (of "fakepassword") so that it costs as long as a
# known one; BasicAuth gives it the users' own cost (``dummy_hash``), since a fixed cost 10
# against users at cost 12 answers unknown names four times faster.
DUMMY_HASH = b"$2b$10$EHO443BLadc5dM39u0n6Kuz6MgO.VXHEP9y4mzKsw5U0xt0BSgeBq"
BCRYPT_RE = re.compile(rb"^\$2[abxy]?\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$")
# TLS 1.2 and below without ``cipher_suites``: ECDHE with AES-GCM or ChaCha20-Poly1305 only
# (AEAD with forward secrecy, RFC 9325 4.2), not OpenSSL's default list, which offers CBC
# suites (Lucky13-style padding oracles).  TLS 1.3 suites are AEAD by definition.
DEFAULT_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
TlsVersionName = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
# Go's crypto/tls suite names (tls.CipherSuites()) for TLS 1.2 and below, as OpenSSL names.
# Go ignores the TLS 1.3 suites in this list (they are not configurable); so does capalarm.
GO_CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
GO_TLS13_CIPHERS = {
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
}
GO_CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}
CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
# The headers the toolkit lets a file set, with the values it accepts (None: any).
EXTRA_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}


class WebConfigError(ValueError):
    """Every problem of a web config file, each naming its key."""

    def __init__(self, path: str, problems: list[str]):
        super().__init__(f"{path}: " + "; ".join(problems))
        self.path = path
        self.problems = problems


class TlsServerConfig(Strict):
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    client_auth_type: str | None = None
    client_ca_file: str | None = None
    client_allowed_sans: list[str] | None = None
    min_version: TlsVersionName = "TLS12"
    max_version: TlsVersionName = "TLS13"
    cipher_suites: list[str] = []
    curve_preferences: list[str] = []
    prefer_server_cipher_suites: bool = True

    @field_validator("client_auth_type")
    @classmethod
    def _known_policy(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if value not in CLIENT_AUTH_TYPES:
            raise ValueError(
                f"invalid ClientAuth {value!r} (one of {', '.join(CLIENT_AUTH_TYPES)})"
            )
        if value in ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert"):
            raise ValueError(
                f"{value} accepts client certificates nobody verified (the toolkit's docs call "
                "it insecure) and is not supported: use RequireAndVerifyClientCert"
            )
        return value

    @field_validator("cipher_suites")
    @classmethod
    def _known_ciphers(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in GO_CIPHERS and name not in GO_TLS13_CIPHERS:
                raise ValueError(f"unknown cipher: {name}")
        return value

    @field_validator("curve_preferences")
    @classmethod
    def _known_curves(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in GO_CURVES:
                raise ValueError(f"unknown curve: {name} (one of {', '.join(GO_CURVES)})")
        if len(value) > 1:
            raise ValueError("capalarm can restrict TLS to one curve only: give one")
        return value


def tls_problems(t: TlsServerConfig) -> list[str]:
    """What the toolkit rejects in a TLS section (tls_config.go), each naming its key."""
    problems = []
    where = "tls_server_config"
    if not (t.cert_file or t.cert):
        problems.append(f"{where}.cert_file: missing one of cert or cert_file")
    if not (t.key_file or t.key):
        problems.append(f"{where}.key_file: missing one of key or key_file")
    for inline, path in (
        ("cert", "cert_file"),
        ("key", "key_file"),
        ("client_ca", "client_ca_file"),
    ):
        if getattr(t, inline) and getattr(t, path):
            problems.append(f"{where}.{inline}: give {inline} or {path}, not both")
    policy = t.client_auth_type or "NoClientCert"
    has_ca = bool(t.client_ca_file or t.client_ca)
    if has_ca and policy == "NoClientCert":
        problems.append(
            f"{where}.client_auth_type: client CAs are configured without a client auth policy "
            "(set RequireAndVerifyClientCert)"
        )
    if policy != "NoClientCert" and not has_ca:
        problems.append(f"{where}.client_ca_file: {policy} needs a CA to verify clients with")
    if t.client_allowed_sans is not None and policy != "RequireAndVerifyClientCert":
        problems.append(
            f"{where}.client_allowed_sans: requires client_auth_type RequireAndVerifyClientCert"
        )
    if TLS_VERSIONS[t.min_version] > TLS_VERSIONS[t.max_version]:
        problems.append(
            f"{where}.min_version: {t.min_version} is above max_version {t.max_version}"
        )
    return problems


class HttpServerConfig(Strict):
    http2: bool = True  # accepted for compatibility: the server speaks HTTP/1.1
    headers: dict[str, str] = {}

    @field_validator("headers")
    @classmethod
    def _allowed_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, v in value.items():
            if name not in EXTRA_HEADERS:
                raise ValueError(f"HTTP header {name!r} can not be configured")
            allowed = EXTRA_HEADERS[name]
            if allowed is not None and v not in allowed:
                raise ValueError(
                    f"invalid value for {name}: expected one of {list(allowed)}, got {v!r}"
                )
        return value


class RateLimitConfig(Strict):
    interval: Duration = 0.0  # between two requests; 0: no limit
    burst: int = Field(0, ge=0)


class WebConfigFile(Strict):
    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig = HttpServerConfig()
    basic_auth_users: dict[str, str] | None = None
    rate_limit: RateLimitConfig = RateLimitConfig()

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for user, hashed in (value or {}).items():
            if ":" in user:
                raise ValueError(f"{user!r}: a user name cannot contain ':' (RFC 7617)")
            if not BCRYPT_RE.match(str(hashed).encode()):
                raise ValueError(
                    f"{user!r}: not a bcrypt hash (make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')"
                )
        return value


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A validated web config: the TLS context it builds (None: plain HTTP), the users, and
    what else a request is checked against."""

    path: str
    ssl_context: ssl.SSLContext | None
    users: dict[str, bytes]
    headers: dict[str, str]
    allowed_sans: frozenset[str] | None
    rate_interval: float
    rate_burst: int
    # The TLS part as written (a change of only users or headers keeps the listener).
    tls_key: tuple[Any, ...] | None
    # Every file the config depends on, with what it looked like when read.
    files: dict[str, tuple[int, int, int, int] | None] = field(default_factory=dict)


def _stat(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _joined(base: Path, path: str | None) -> str | None:
    """Relative paths are relative to the config file's directory, as in the toolkit."""
    if not path:
        return None
    p = Path(path)
    return str(p if p.is_absolute() else base / p)


def _load_chain(
    ctx: ssl.SSLContext, cert_file: str | None, key_file: str | None, t: TlsServerConfig
) -> None:
    """``load_cert_chain`` reads files only: inline PEM goes through a private temporary file."""
    with contextlib.ExitStack() as stack:

        def path_of(path: str | None, inline: str | None) -> str:
            if path:
                return path
            fh = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".pem"))
            os.fchmod(fh.fileno(), 0o600)
            fh.write(inline or "")
            fh.flush()
            return fh.name

        ctx.load_cert_chain(path_of(cert_file, t.cert), path_of(key_file, t.key))


def _ssl_context(t: TlsServerConfig, base: Path, problems: list[str]) -> ssl.SSLContext | None:
    cert_file, key_file = _joined(base, t.cert_file), _joined(base, t.key_file)
    ca_file = _joined(base, t.client_ca_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[t.min_version]
    ctx.maximum_version = TLS_VERSIONS[t.max_version]
    for key, path in (
        ("cert_file", cert_file),
        ("key_file", key_file),
        ("client_ca_file", ca_file),
    ):
        if path and not os.access(path, os.R_OK):
            why = "no such file" if not os.path.exists(path) else "not readable"
            problems.append(f"tls_server_config.{key}: cannot read {path}: {why}")
    if problems:
        return None
    try:
        _load_chain(ctx, cert_file, key_file, t)
    except (ssl.SSLError, OSError, ValueError) as exc:
        problems.append(
            f"tls_server_config.cert_file: failed to load the certificate and key: {exc}"
        )
        return None
    policy = t.client_auth_type or "NoClientCert"
    if policy != "NoClientCert":
        try:
            if ca_file:
                ctx.load_verify_locations(cafile=ca_file)
            else:
                ctx.load_verify_locations(cadata=t.client_ca)
        except (ssl.SSLError, OSError, ValueError) as exc:
            key = "client_ca_file" if ca_file else "client_ca"
            problems.append(f"tls_server_config.{key}: no usable CA certificate: {exc}")
            return None
        ctx.verify_mode = (
            ssl.CERT_REQUIRED if policy == "RequireAndVerifyClientCert" else ssl.CERT_OPTIONAL
        )
    # The configured suites (an operator who lists CBC ones gets them), else AEAD only.
    ciphers = [GO_CIPHERS[c] for c in t.cipher_suites if c in GO_CIPHERS]
    try:
        ctx.set_ciphers(":".join(ciphers) or DEFAULT_CIPHERS)
    except ssl.SSLError as exc:
        problems.append(f"tls_server_config.cipher_suites: {exc}")
        return None
    if t.curve_preferences:
        ctx.set_ecdh_curve(GO_CURVES[t.curve_preferences[0]])
    if t.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


def load_web_config(path: str) -> WebConfig:
    """Read and validate ``path`` and build its TLS context (blocking: run it in a thread).
    Raises :class:`WebConfigError` naming every problem by its key."""
    before = _stat(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise WebConfigError(path, [f"(file): cannot read {path}: {exc.strerror}"]) from None
    except UnicodeDecodeError:
        raise WebConfigError(path, [f"(file): {path} is not UTF-8 text"]) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())
        raise WebConfigError(path, [f"(yaml): not valid YAML: {first}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WebConfigError(path, ["(top level): expected a mapping of keys to values"])
    try:
        model = WebConfigFile.model_validate(data)
    except ValidationError as exc:
        raise WebConfigError(path, problems_of(exc)) from None
    base = Path(path).resolve().parent
    t = model.tls_server_config
    problems = tls_problems(t) if t is not None else []
    ctx = _ssl_context(t, base, problems) if t is not None and not problems else None
    if problems:
        raise WebConfigError(path, problems)
    files = {str(Path(path).resolve()): before}
    tls_key = None
    if t is not None:
        named = [_joined(base, p) for p in (t.cert_file, t.key_file, t.client_ca_file)]
        for p in named:
            if p:
                files[p] = _stat(p)
        tls_key = (t.model_dump_json(), tuple(files.get(p or "") for p in named))
    return WebConfig(
        path=path,
        ssl_context=ctx,
        users={u: h.encode() for u, h in (model.basic_auth_users or {}).items()},
        headers=dict(model.http_server_config.headers),
        allowed_sans=None
        if t is None or t.client_allowed_sans is None
        else frozenset(t.client_allowed_sans),
        rate_interval=model.rate_limit.interval,
        rate_burst=model.rate_limit.burst,
        tls_key=tls_key,
        files=files,
    )


def changed(config: WebConfig) -> bool:
    """Whether the file or a file it names is not what it was when ``config`` was read."""
    return any(_stat(p) != seen for p, seen in config.files.items())


class TokenBucket:
    """golang.org/x/time/rate's limiter as the toolkit uses it: one token every ``interval``,
    at most ``burst`` held; a request without a token is refused (429)."""

    def __init__(self, interval: float, burst: int):
        self.interval = interval
        self.burst = burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) / self.interval)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def bcrypt_cost(hashed: bytes) -> int | None:
    """The cost (log2 rounds) written in a bcrypt hash; None if it is not one."""
    m = BCRYPT_RE.match(hashed)
    return int(m.group(1)) if m else None


def dummy_hash(hashes: Iterable[bytes]) -> bytes:
    """DUMMY_HASH at the cost most of ``hashes`` use (the higher on a tie), so that checking an
    unknown user takes as long as checking one of them.  Only the cost field changes: checkpw
    spends the same time whatever the stored digest, and no password matches it anyway (an
    unknown user is refused whatever checkpw says)."""
    costs = Counter(c for c in map(bcrypt_cost, hashes) if c is not None)
    if not costs:
        return DUMMY_HASH
    cost = max(costs, key=lambda c: (costs[c], c))
    return b"$2b$%02d$" % cost + DUMMY_HASH[7:]


class AuthBusy(Exception):
    """A password check refused without running: too many waiting, or from this client."""


class AuthGate:
    """Where bcrypt runs: ``threads`` threads of its own; at most ``waiting`` checks waiting
    for one and at most ``per_client`` of one client (peer address) waiting or running.  A
    check beyond these raises :class:`AuthBusy` at once instead of queueing.  ``first``
    checks (credentials seen to pass since the web config was applied) go ahead of the others
    and are not held to the per-client limit, which a flood from the same address would
    otherwise exhaust.  Used on the event loop only."""

    def __init__(
        self,
        threads: int = AUTH_THREADS,
        waiting: int = AUTH_WAITING,
        per_client: int = AUTH_PER_CLIENT,
    ):
        self.threads = threads
        self.waiting = waiting
        self.per_client = per_client
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="capalarm-auth")
        self._running = 0  # threads taken (a thread is handed on, not given back, to a waiter)
        self._queues: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (
            deque(),  # first: credentials that passed before
            deque(),
        )
        self._clients: Counter[str] = Counter()
        self.checks = 0
        self.refused = 0
        self._refused_logged = 0
        self._last_log = 0.0

    async def run(
        self, client: str, fn: Callable[..., bool], *args: Any, first: bool = False
    ) -> bool:
        queue = self._queues[0 if first else 1]
        if len(queue) >= self.waiting or (not first and self._clients[client] >= self.per_client):
            self._refuse()
            raise AuthBusy
        loop = asyncio.get_running_loop()
        self._clients[client] += 1
        try:
            if self._running < self.threads:
                self._running += 1
            else:
                turn: asyncio.Future[None] = loop.create_future()
                queue.append(turn)
                try:
                    await turn
                except asyncio.CancelledError:
                    if turn.done() and not turn.cancelled():
                        self._release()  # the thread was handed to us: hand it on
                    else:
                        with contextlib.suppress(ValueError):
                            queue.remove(turn)
                    raise
            self.checks += 1
            job = self._executor.submit(fn, *args)
            # The thread is free when the check is done, not when its caller stops waiting.
            job.add_done_callback(lambda _: self._release_from_thread(loop))
            return await asyncio.wrap_future(job, loop=loop)
        finally:
            self._clients[client] -= 1
            if not self._clients[client]:
                del self._clients[client]

    def _release_from_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: so is everyone waiting
            loop.call_soon_threadsafe(self._release)

    def _release(self) -> None:
        for queue in self._queues:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._running -= 1

    def _refuse(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._last_log >= AUTH_REFUSED_LOG_EVERY:
            log.warning(
                "basic auth: %d password checks refused with 429 since the last report "
                "(more than %d waiting, or more than %d from one client address): "
                "a password-guessing flood?",
                self.refused - self._refused_logged,
                self.waiting,
                self.per_client,
            )
            self._refused_logged = self.refused
            self._last_log = now

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class BasicAuth:
    """bcrypt checks for one user table (each costs ~60 ms at cost 10), through an
    :class:`AuthGate`, with a bounded table of credentials that passed (AUTH_OK_TTL) and one
    of credentials that failed (AUTH_FAILED_TTL), both keyed by an HMAC under a key of this
    table's own.  A new user table (every applied web config) is a new BasicAuth: both
    tables start empty."""

    def __init__(self, users: dict[str, bytes], gate: AuthGate | None = None):
        self.users = users
        self.dummy_hash = dummy_hash(users.values())
        self.gate = gate if gate is not None else AuthGate()
        self._key = os.urandom(32)
        self._passed: OrderedDict[bytes, float] = OrderedDict()  # key -> when verified
        self._failed: OrderedDict[bytes, float] = OrderedDict()  # key -> when refused
        self._checking: dict[bytes, asyncio.Future[bool | None]] = {}

    def _cache_key(self, user: str, password: str) -> bytes:
        u = user.encode("utf-8", "surrogatepass")
        msg = len(u).to_bytes(4, "big") + u + password.encode("utf-8", "surrogatepass")
        return hmac.digest(self._key, msg, "sha256")

    def _bcrypt(self, user: str, password: str) -> bool:
        """On a gate thread."""
        hashed = self.users.get(user)
        try:
            ok = bcrypt.checkpw(
                password.encode("utf-8", "surrogatepass"), hashed or self.dummy_hash
            )
        except ValueError:
            ok = False
        return hashed is not None and ok

    async def verdict(self, user: str, password: str, client: str = "") -> bool | None:
        """True: let in; False: 401; None: not checked (the gate is full; 429)."""
        key = self._cache_key(user, password)
        now = time.monotonic()
        passed = self._passed.get(key)
        if passed is not None and now - passed < AUTH_OK_TTL:
            self._passed.move_to_end(key)
            return True
        failed = self._failed.get(key)
        if failed is not None:
            if now - failed < AUTH_FAILED_TTL:
                return False
            del self._failed[key]
        # The same credentials being checked already (a scraper's retries): that check's
        # answer, not another bcrypt.
        pending = self._checking.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        pending = asyncio.get_running_loop().create_future()
        self._checking[key] = pending
        try:
            ok: bool | None = await self.gate.run(
                client, self._bcrypt, user, password, first=passed is not None
            )
        except AuthBusy:
            ok = None
        except asyncio.CancelledError:
            pending.cancel()
            raise
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: the callers waiting on it, if any, get it too
            raise
        finally:
            del self._checking[key]
        pending.set_result(ok)
        if ok is not None:
            self._remember(key, ok, time.monotonic())
        return ok

    def _remember(self, key: bytes, ok: bool, now: float) -> None:
        table, bound = (
            (self._passed, AUTH_OK_ENTRIES) if ok else (self._failed, AUTH_FAILED_ENTRIES)
        )
        if ok:
            self._failed.pop(key, None)
        table[key] = now
        table.move_to_end(key)
        while len(table) > bound:
            table.popitem(last=False)

    async def check(self, user: str, password: str, client: str = "") -> bool:
        """Whether the credentials are good (a check the gate refused is not)."""
        return bool(await self.verdict(user, password, client))


class WebConfigWatcher:
    """The running web config, re-read when its file (or a file it names) changes.  A new
    version that validates replaces it and ``on_change`` is awaited with it; one that does not
    is logged problem by problem and counted, and the running one is kept.

    ``executor``: where the files are read (the HTTP side's own threads; never the default
    executor, which the sources read with)."""

    def __init__(self, config: WebConfig, executor: Executor | None = None):
        self.config = config
        self.gate = AuthGate()
        self.auth = BasicAuth(config.users, self.gate)
        self._own_executor = executor is None
        self.executor: Executor = executor or ThreadPoolExecutor(
            1, thread_name_prefix="capalarm-webconfig"
        )
        self.limiter = self._limiter(config)
        self.reloads = 0
        self.rejected = 0
        self.last_reload_ok = True

    @staticmethod
    def _limiter(config: WebConfig) -> TokenBucket | None:
        return (
            TokenBucket(config.rate_interval, config.rate_burst)
            if config.rate_interval > 0
            else None
        )

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def reload(self, on_change: Callable[[WebConfig], Awaitable[None]]) -> bool:
        try:
            new = await self._off_loop(load_web_config, self.config.path)
        except WebConfigError as exc:
            self.rejected += 1
            self.last_reload_ok = False
            log.error("web config %s rejected, keeping the running one:", exc.path)
            for problem in exc.problems:
                log.error("  %s", problem)
            # Don't report the same broken version again every second.
            self.config = _with_files(self.config)
            return False
        old = self.config
        self.config = new
        # Every applied version starts with empty tables of passed and failed credentials.
        self.auth = BasicAuth(new.users, self.gate)
        if (new.rate_interval, new.rate_burst) != (old.rate_interval, old.rate_burst):
            self.limiter = self._limiter(new)
        self.reloads += 1
        self.last_reload_ok = True
        log.info("web config %s reloaded", new.path)
        await on_change(new)
        return True

    async def run(self, on_change: Callable[[WebConfig], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            if await self._off_loop(changed, self.config):
                await self.reload(on_change)

    def close(self) -> None:
        self.gate.close()
        if self._own_executor:
            self.executor.shutdown(wait=False, cancel_futures=True)


def _with_files(config: WebConfig) -> WebConfig:
    """``config`` with its files' current state, so a rejected version is reported once."""
    return replace(config, files={p: _stat(p) for p in config.files})


__all__ = [
    "AuthBusy",
    "AuthGate",
    "BasicAuth",
    "TokenBucket",
    "WebConfig",
    "WebConfigError",
    "WebConfigWatcher",
    "changed",
    "load_web_config",
]
