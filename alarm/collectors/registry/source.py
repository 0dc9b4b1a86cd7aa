"""``type: registry``: the factory (registry_type.py registers the type, with its counters).
The adapter is chosen by ``api`` from :data:`ADAPTERS` (no if-chain)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from alarm.collectors.base import SourceContext, SourceUnavailable
from alarm.collectors.registry import (
    artifactory,
    generic,
    mediawiki,
    nexus,
    npm,
    oci,
    poller,
    pypi,
    uploads,
)

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
    credential = None
    try:
        if cfg.credentials is not None:
            authorization = cfg.credentials.authorization()
        if cfg.canary is not None:
            credential = uploads.credential_for(cfg.api, cfg.canary.credentials)
    except ValueError as exc:
        raise SourceUnavailable(f"source {cfg.name!r}: {exc}") from None
    return poller.RegistryPoller(
        cfg, ADAPTERS[cfg.api](cfg), ctx.position, ctx.ledger, authorization, credential
    )
