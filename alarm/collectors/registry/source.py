"""``type: registry``: the source type, its factory and its counters.  The adapter is chosen
by ``api`` from :data:`ADAPTERS` (no if-chain)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from alarm.collectors.base import SourceContext, SourceType, SourceUnavailable
from alarm.collectors.registry import (
    artifactory,
    generic,
    http,
    mediawiki,
    nexus,
    npm,
    oci,
    poller,
    pypi,
)
from alarm.collectors.registry.settings import RegistrySettings

ADAPTERS: Mapping[str, Callable[[Any], poller.Adapter]] = MappingProxyType(
    {
        "pypi": lambda cfg: pypi.PypiAdapter(cfg.url),
        "npm": npm.NpmAdapter,
        "oci": oci.OciAdapter,
        "docker": oci.OciAdapter,
        "artifactory": artifactory.ArtifactoryAdapter,
        "nexus": nexus.NexusAdapter,
        "mediawiki": mediawiki.MediaWikiAdapter,
        "json": generic.JsonAdapter,
    }
)


def build(cfg: Any, ctx: SourceContext) -> poller.RegistryPoller:
    authorization = None
    if cfg.credentials is not None:
        try:
            authorization = cfg.credentials.authorization()
        except ValueError as exc:
            raise SourceUnavailable(f"source {cfg.name!r}: {exc}") from None
    return poller.RegistryPoller(
        cfg, ADAPTERS[cfg.api](cfg), ctx.position, ctx.ledger, authorization
    )


COUNTERS: Mapping[str, str] = MappingProxyType({**http.COUNTERS, **poller.COUNTERS})
SOURCE = SourceType("registry", RegistrySettings, build, kind="registry", counters=COUNTERS)
