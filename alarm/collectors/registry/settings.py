"""``type: registry`` configuration: one model per ``api``, a tagged union on that field.

Every member shares :class:`RegistryBase` (where, how often, how patiently, with which
credentials) and adds what its API needs.  The union is nested under the configuration's
``type`` union, so a source is written flat::

    {name: internal-pypi, type: registry, api: pypi, url: "http://pypi.internal:8080/simple/"}
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal, Union

from pydantic import Field, SecretStr, model_validator

from alarm.collectors.base import SourceSettings
from alarm.notify_config import SecretSource
from alarm.settings import Duration

MiB = 1024 * 1024
# Without ``blind_after``: blind after this many intervals without a successful poll, and
# never sooner than BLIND_AFTER_MIN (a short interval must not page on one slow poll).
BLIND_AFTER_INTERVALS = 3
BLIND_AFTER_MIN = 60.0


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
    # Only these repositories (package, image, page patterns as in surfaces' ``repository``).
    packages: list[str] = []
    credentials: Credentials | None = None
    ca_file: str | None = None  # PEM bundle to verify the registry's TLS certificate with
    # The source is blind (the surface_blind alarm) while its last successful poll is older
    # than this; None: 3 x interval, at least 60 s (``blind_seconds``).
    blind_after: Duration | None = Field(None, gt=0, le=7 * 86400.0)

    @property
    def blind_seconds(self) -> float:
        if self.blind_after is not None:
            return self.blind_after
        return max(BLIND_AFTER_INTERVALS * self.interval, BLIND_AFTER_MIN)

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


class NpmSettings(RegistryBase):
    """An npm registry (verdaccio, the CouchDB-backed registry, npm proxies)."""

    api: Literal["npm"]
    # CouchDB ``_changes``: auto uses it where the server has one.
    changes: Literal["auto", "off"] = "auto"


class OciSettings(RegistryBase):
    """A Docker Registry HTTP API v2 / OCI distribution registry."""

    api: Literal["oci", "docker"]


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

    @model_validator(mode="after")
    def _paths_plain(self) -> JsonSettings:
        for path in (self.items, self.id, self.size, self.time, self.repository, self.uploader):
            if path and not all(part for part in path.split(".")):
                raise ValueError(f"{path!r}: a field path is names joined by dots")
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
# The tags pydantic puts in error locations after ``registry`` (not keys the user wrote).
API_TAGS: tuple[str, ...] = (
    "pypi",
    "npm",
    "oci",
    "docker",
    "artifactory",
    "nexus",
    "mediawiki",
    "json",
)
