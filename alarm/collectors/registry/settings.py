"""``type: registry`` configuration: one model per ``api``, a tagged union on that field.

Every member shares :class:`RegistryBase` (where, how often, how patiently, with which
credentials) and adds what its API needs.  The union is nested under the configuration's
``type`` union, so a source is written flat::

    {name: internal-pypi, type: registry, api: pypi, url: "http://pypi.internal:8080/simple/"}

``canary:`` (:class:`CanarySettings`) turns on proof of sight by upload for the APIs that have
an upload the canary can use (pypi, npm, oci/docker, mediawiki); elsewhere it is an error.
"""

from __future__ import annotations

import base64
import ipaddress
from typing import Annotated, ClassVar, Literal, Union

from pydantic import Field, SecretStr, field_validator, model_validator

from alarm.collectors.base import SourceSettings
from alarm.collectors.registry import names
from alarm.notify_config import SecretSource
from alarm.patterns import Pattern
from alarm.settings import Duration, Strict

MiB = 1024 * 1024
# Without ``blind_after``: blind after this many intervals without a successful poll, and
# never sooner than BLIND_AFTER_MIN (a short interval must not page on one slow poll).
BLIND_AFTER_INTERVALS = 3
BLIND_AFTER_MIN = 60.0
# Without ``canary.deadline``: this many poll intervals, and never less than CANARY_DEADLINE_MIN.
# A canary uploaded just after a poll began is listed first by the next poll, which starts up
# to one interval later and takes its own time: two intervals is the least that is fair.
CANARY_DEADLINE_INTERVALS = 2
CANARY_DEADLINE_MIN = 300.0


class Credentials(SecretSource):
    """``{file: /etc/capalarm/wiki}`` or ``{env: NAME}``, and how the secret is sent.

    ``auto``: a secret of the form ``user:password`` is HTTP Basic (RFC 7617), anything else a
    bearer token (RFC 6750).  ``header`` sends the secret as-is in the named header instead
    (Artifactory's ``X-JFrog-Art-Api``).  Sent only to the registry's own origin."""

    scheme: Literal["auto", "basic", "bearer"] = "auto"
    header: str | None = Field(None, pattern=r"^[A-Za-z0-9-]{1,64}$")

    def authorization(self) -> tuple[str, SecretStr]:
        """The header name and value to send.  Reads the secret; raises ValueError naming
        where it comes from, never the value."""
        secret = self.read_one().get_secret_value()
        if self.header is not None:
            return self.header, SecretStr(secret)
        basic = self.scheme == "basic" or (self.scheme == "auto" and ":" in secret)
        if basic:
            if ":" not in secret:
                raise ValueError(f"secret from {self.where()}: basic needs user:password")
            token = base64.b64encode(secret.encode()).decode()
            return "Authorization", SecretStr(f"Basic {token}")
        return "Authorization", SecretStr(f"Bearer {secret}")


class CanarySettings(Strict):
    """``canary:``: every ``interval`` one tiny, uniquely named artifact is uploaded through the
    registry's own upload API (alarm/collectors/registry/canary.py), and a poll must list it
    within ``deadline``; otherwise the source is blind.  ``credentials`` are the canary's own
    (a principal that may write ``repository`` and nothing else), sent as the source's are."""

    interval: Duration = Field(600.0, ge=1.0, le=7 * 86400.0)
    # None: 2 x the source's interval, at least 5 min (``RegistryBase.canary_deadline``).
    deadline: Duration | None = Field(None, gt=0, le=7 * 86400.0)
    credentials: Credentials | None = None
    # The package (pypi, npm), image repository (oci) or page (mediawiki) the canary writes.
    repository: str = Field("capalarm-canary", min_length=1, max_length=200)
    # Where uploads go when that is not where the source polls (pypi: the index URL without
    # its ``simple/``; the others: ``url``).
    url: str | None = Field(None, pattern=r"^https?://[^\s]+$")


class RegistryBase(SourceSettings):
    type: Literal["registry"]
    url: str = Field(pattern=r"^https?://[^\s]+$")
    interval: Duration = Field(30.0, ge=1.0, le=86400.0)
    timeout: Duration = Field(10.0, gt=0, le=600.0)  # per request, connect to last byte
    retries: int = Field(3, ge=0, le=20)  # per request, with jittered exponential backoff
    # The longest Retry-After honoured inside a poll; longer ones end the poll, and the next
    # one starts no earlier than the server asked.
    max_retry_after: Duration = Field(60.0, ge=0, le=3600.0)
    concurrency: int = Field(4, ge=1, le=64)  # requests in flight to this registry
    max_response_bytes: int = Field(64 * MiB, ge=4096)  # one body, streamed, then abandoned
    # A listing longer than this is not trusted as complete (a hostile or broken server).
    max_items: int = Field(2_000_000, ge=1)
    # What one poll holds at once of response bodies: the raw bytes being read and, while a
    # body is decoded, its bytes, its text and the estimated size of its decoded objects.
    # A poll that would need more fails (``poll_bytes_exceeded``): docs/registry-source.md.
    max_poll_bytes: int = Field(256 * MiB, ge=64 * 1024)
    # The longest URL requested: a paging link, continuation token or redirect longer than
    # this fails the poll (``urls_too_long``).  RFC 9110 asks for 8000 octets at least.
    max_url_bytes: int = Field(8192, ge=256, le=1024 * 1024)
    # The pages one paged listing (a catalog, a tag list, an asset listing) may have in one
    # poll; more fails the poll (``pages_over_limit``).  Pages are remembered as 8-byte hashes.
    max_pages: int = Field(10_000, ge=1, le=10_000_000)
    # Only these repositories (package, image, page patterns as in surfaces' ``repository``).
    packages: list[str] = []
    credentials: Credentials | None = None
    ca_file: str | None = None  # PEM bundle to verify the registry's TLS certificate with
    # Hosts (names or IP addresses, exact) that a redirect may lead to besides the source's
    # own origin; followed without the credentials.  A loopback or link-local address is
    # reached only where that address (or a localhost name) is listed itself.
    allow_redirect_hosts: list[Annotated[str, Field(pattern=r"^[^\s/@?#]{1,253}$")]] = []
    # The source is blind (the surface_blind alarm) while its last successful poll is older
    # than this; None: 3 x interval, at least 60 s (``blind_seconds``).
    blind_after: Duration | None = Field(None, gt=0, le=7 * 86400.0)
    # Proof of sight by upload; None: off.  Only where the API has an upload (CANARY).
    canary: CanarySettings | None = None

    # Whether ``canary:`` is possible for this API (an upload the canary can use).
    CANARY: ClassVar[bool] = False

    @property
    def blind_seconds(self) -> float:
        if self.blind_after is not None:
            return self.blind_after
        return max(BLIND_AFTER_INTERVALS * self.interval, BLIND_AFTER_MIN)

    @property
    def canary_deadline(self) -> float:
        c = self.canary
        if c is not None and c.deadline is not None:
            return c.deadline
        return max(CANARY_DEADLINE_INTERVALS * self.interval, CANARY_DEADLINE_MIN)

    def canary_upload_url(self) -> str | None:
        """Where the canary uploads; None where it cannot be told from ``url``."""
        return self.canary.url if self.canary is not None and self.canary.url else self.url

    def canary_listed_as(self, repository: str) -> str | None:
        """The canary's repository as the poll lists it (None: a name the API refuses)."""
        return None

    @model_validator(mode="after")
    def _canary_can_be_seen(self) -> RegistryBase:
        c = self.canary
        if c is None:
            return self
        api = getattr(self, "api", "")
        if not self.CANARY:
            raise ValueError(
                f"canary: api {api!r} has no canary upload here (it works with "
                "pypi, npm, oci, docker and mediawiki)"
            )
        if c.deadline is not None and c.deadline < CANARY_DEADLINE_INTERVALS * self.interval:
            raise ValueError(
                f"canary.deadline ({c.deadline:g}s) must be at least "
                f"{CANARY_DEADLINE_INTERVALS} x interval "
                f"({CANARY_DEADLINE_INTERVALS * self.interval:g}s): a canary uploaded as a "
                "poll begins is listed only by the next poll"
            )
        listed = self.canary_listed_as(c.repository)
        if listed is None:
            raise ValueError(f"canary.repository {c.repository!r} is not a valid {api} name")
        if self.packages and not any(Pattern.compile(p).matches(listed) for p in self.packages):
            raise ValueError(
                f"canary.repository {c.repository!r} is not in packages: the polls would "
                "never list the canary (name one that packages matches)"
            )
        if self.canary_upload_url() is None:
            raise ValueError(
                "canary.url: cannot tell the upload URL from url (it does not end in "
                "/simple/): give canary.url"
            )
        return self

    @field_validator("allow_redirect_hosts")
    @classmethod
    def _hosts_as_compared(cls, hosts: list[str]) -> list[str]:
        """As a URL's host is compared: lower case, an IP address in its canonical form
        (``0:0::1`` is ``::1``), an IPv6 address without its brackets."""
        out = []
        for entry in hosts:
            host = entry.lower().removeprefix("[").removesuffix("]")
            try:
                host = str(ipaddress.ip_address(host))
            except ValueError:
                if ":" in host:
                    raise ValueError(f"{entry!r}: a host name or address, without a port") from None
            out.append(host)
        return out

    @model_validator(mode="after")
    def _one_body_fits_a_poll(self) -> RegistryBase:
        if self.max_poll_bytes < self.max_response_bytes:
            raise ValueError(
                f"max_poll_bytes ({self.max_poll_bytes}) must be at least max_response_bytes "
                f"({self.max_response_bytes}): the largest body allowed could never be read"
            )
        return self

    @model_validator(mode="after")
    def _blind_after_an_interval(self) -> RegistryBase:
        if self.blind_after is not None and self.blind_after <= self.interval:
            raise ValueError(
                f"blind_after ({self.blind_after:g}s) must be longer than interval "
                f"({self.interval:g}s): every poll would be late"
            )
        return self


class PypiSettings(RegistryBase):
    """A PEP 503/691 simple index (pypiserver, devpi, Artifactory/Nexus PyPI views)."""

    api: Literal["pypi"]
    CANARY: ClassVar[bool] = True

    def canary_upload_url(self) -> str | None:
        """The legacy upload API lives where the simple index's ``simple/`` (pypiserver,
        Nexus, Artifactory) or ``+simple/`` (devpi) begins."""
        if self.canary is not None and self.canary.url:
            return self.canary.url
        base = self.url if self.url.endswith("/") else self.url + "/"
        for tail in ("+simple/", "simple/"):
            if base.endswith("/" + tail):
                return base[: -len(tail)]
        return None

    def canary_listed_as(self, repository: str) -> str | None:
        return names.normalize(repository) if names.PYPI_NAME.match(repository) else None


class NpmSettings(RegistryBase):
    """An npm registry (verdaccio, the CouchDB-backed registry, npm proxies)."""

    api: Literal["npm"]
    # CouchDB ``_changes``: auto uses it where the server has one.
    changes: Literal["auto", "off"] = "auto"
    CANARY: ClassVar[bool] = True

    def canary_listed_as(self, repository: str) -> str | None:
        return repository if names.NPM_NAME.match(repository) else None


class OciSettings(RegistryBase):
    """A Docker Registry HTTP API v2 / OCI distribution registry."""

    api: Literal["oci", "docker"]
    CANARY: ClassVar[bool] = True

    def canary_listed_as(self, repository: str) -> str | None:
        return repository if names.OCI_NAME.match(repository) else None


class ArtifactorySettings(RegistryBase):
    """JFrog Artifactory, read through AQL (``/api/search/aql``); ``url`` is the
    ``.../artifactory/`` base."""

    api: Literal["artifactory"]
    repositories: list[str] = []  # AQL ``repo`` filter; empty: every repository
    page_size: int = Field(1000, ge=1, le=50000)


class NexusSettings(RegistryBase):
    """Sonatype Nexus Repository 3, read through ``/service/rest/v1/assets``."""

    api: Literal["nexus"]
    repositories: list[str] = Field(min_length=1)  # the API lists one repository at a time


class MediaWikiSettings(RegistryBase):
    """A MediaWiki's action API (``.../api.php``): recent changes and the upload log."""

    api: Literal["mediawiki"]
    namespaces: list[int] = []  # empty: every namespace
    page_size: int = Field(500, ge=1, le=500)
    CANARY: ClassVar[bool] = True

    def canary_listed_as(self, repository: str) -> str | None:
        title = names.wiki_title(repository) if names.WIKI_TITLE.match(repository) else ""
        return title or None

    @model_validator(mode="after")
    def _canary_in_a_namespace(self) -> MediaWikiSettings:
        c = self.canary
        # A title without a prefix is in the main namespace (0); a prefixed one may be in
        # any, which only the wiki knows.
        if (
            c is not None
            and self.namespaces
            and ":" not in c.repository
            and 0 not in self.namespaces
        ):
            raise ValueError(
                f"canary.repository {c.repository!r} is in namespace 0, not in namespaces: "
                "the polls would never list the canary"
            )
        return self


class JsonSettings(RegistryBase):
    """Any board or API that lists items as JSON: where the items are and which fields
    mean what (dotted paths, e.g. ``data.posts``, ``author.name``)."""

    api: Literal["json"]
    items: str = ""  # path to the list of items; "" the body itself
    id: str = "id"
    size: str | None = None  # bytes of the item; None: the size of its JSON
    time: str | None = None  # ISO 8601 or unix seconds
    repository: str | None = None  # what surfaces match on; None: the source name
    uploader: str | None = None
    next: str | None = None  # path to the next page's URL; a Link rel="next" header also works
    # What the board tells of edits and deletions (generic.py): an item's revision or update
    # time (a change is an edit, a write of the new size); a number that grows by one per
    # item made in a repository (gaps: items deleted before a poll); a count of items ever
    # made, in the first page's document.
    revision: str | None = None
    updated: str | None = None
    sequence: str | None = None
    created_total: str | None = None

    @model_validator(mode="after")
    def _paths_plain(self) -> JsonSettings:
        for path in (
            self.items,
            self.id,
            self.size,
            self.time,
            self.repository,
            self.uploader,
            self.revision,
            self.updated,
            self.sequence,
            self.created_total,
        ):
            if path and not all(part for part in path.split(".")):
                raise ValueError(f"{path!r}: a field path is names joined by dots")
        if self.created_total and self.sequence:
            raise ValueError(
                "sequence and created_total both count posts deleted before a poll: give one"
            )
        if self.created_total and self.packages:
            raise ValueError(
                "created_total counts every repository's items: it cannot be used with packages"
            )
        return self


ApiSettings = Union[  # noqa: UP007 - a discriminated union is spelled with Union
    PypiSettings,
    NpmSettings,
    OciSettings,
    ArtifactorySettings,
    NexusSettings,
    MediaWikiSettings,
    JsonSettings,
]
RegistrySettings = Annotated[ApiSettings, Field(discriminator="api")]
