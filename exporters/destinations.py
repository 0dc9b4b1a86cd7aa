"""Destinations built from the configuration: each one's sender (with its secrets read), its
route, and the channels it delivers through (one per URL; an Alertmanager HA pair is two).

Built whole from a configuration that has validated; the result is immutable, so a reload
builds the next set aside and the notifier swaps it in with one assignment.  A destination
that cannot be built (a secret that is missing or malformed) fails the whole set with a
``ConfigError`` naming it, and the running set stays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from alarm.notify_config import (
    AlertmanagerDestination,
    NotificationsConfig,
    PagerDutyDestination,
    SlackDestination,
    WebhookDestination,
)
from alarm.settings import ConfigError
from exporters.alertmanager import AlertmanagerSender
from exporters.delivery import Sender
from exporters.pagerduty import PagerDutySender
from exporters.payload import LinkSet
from exporters.routing import Route
from exporters.signing import decode_secret
from exporters.slack import SlackSender
from exporters.webhook import WebhookSender

if TYPE_CHECKING:  # the assembled model: importing it imports every source type's settings
    from alarm.config import Config


@dataclass(slots=True, frozen=True)
class BuiltDestination:
    route: Route
    type: str
    sender: Sender
    targets: tuple[tuple[str, str], ...]  # (channel, target URL or where the secret URL is)
    timeout: float
    concurrency: int
    max_attempts: int | None


@dataclass(slots=True, frozen=True)
class ChannelTarget:
    """One channel of a destination: where its worker sends."""

    destination: BuiltDestination
    target: str


@dataclass(slots=True, frozen=True)
class DestinationSet:
    """Everything built from one configuration's notifications section."""

    config: NotificationsConfig
    # Shared by every sender; its status page is filled in once the listen port is known.
    links: LinkSet
    destinations: tuple[BuiltDestination, ...]
    channels: Mapping[str, ChannelTarget]  # in configuration order


def destinations_of(config: Config) -> list[Any]:
    """The configured destinations, with the ``webhooks`` shorthand as unsigned webhooks."""
    legacy = [
        WebhookDestination(
            name=w.name or f"webhook{i}",
            url=w.url,
            timeout=w.timeout,
            headers=w.headers,
            max_attempts=w.max_retries + 1,
            body="change",
        )
        for i, w in enumerate(config.webhooks)
    ]
    return [*config.notifications.destinations, *legacy]


def sender_for(destination: Any, links: LinkSet, top: int) -> Sender:
    """The sender of one configured destination.  Raises ValueError (a secret that cannot be
    read or decoded), naming where the secret comes from, never its value."""
    if isinstance(destination, WebhookDestination):
        keys = [decode_secret(s) for src in destination.secrets for s in src.read_all()]
        return WebhookSender(destination, links, keys, top)
    if isinstance(destination, AlertmanagerDestination):
        return AlertmanagerSender(destination, links, top)
    if isinstance(destination, PagerDutyDestination):
        return PagerDutySender(destination, links, destination.routing_key.read_one(), top)
    if isinstance(destination, SlackDestination):
        return SlackSender(destination, links, destination.url.read_one(), top)
    raise ValueError(f"unknown destination type {type(destination).__name__}")


def build_destinations(config: Config, status_page: str) -> DestinationSet:
    """Destinations with their secrets read.  Raises ConfigError naming each destination that
    cannot be built."""
    ncfg = config.notifications
    links = LinkSet(ncfg.links.external_url or status_page, ncfg.links.runbook)
    built: list[BuiltDestination] = []
    problems: list[str] = []
    seen: set[str] = set()
    for i, d in enumerate(destinations_of(config)):
        where = f"notifications.destinations[{i}] ({d.name})"
        if d.name in seen:
            problems.append(f"{where}: name {d.name!r} is declared twice (webhooks included)")
            continue
        seen.add(d.name)
        try:
            sender = sender_for(d, links, ncfg.top_contributors)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        built.append(
            BuiltDestination(
                route=Route(d.name, d.filter, d.repeat_interval),
                type=d.type,
                sender=sender,
                targets=tuple(sender.targets()),
                timeout=d.timeout,
                concurrency=d.concurrency,
                max_attempts=d.max_attempts,
            )
        )
    if problems:
        raise ConfigError(problems)
    channels = {ch: ChannelTarget(d, target) for d in built for ch, target in d.targets}
    return DestinationSet(ncfg, links, tuple(built), MappingProxyType(channels))
