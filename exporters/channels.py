"""The channels of the running configuration, as one immutable snapshot.

A channel is one queue of one destination (``exporters/delivery.py``: its counters and the
rows held in memory while the disk is full).  A reload builds the next ``ChannelSet`` aside —
a channel that keeps its name and type keeps its counters and held rows — and the notifier
swaps it in with one assignment, so the pipeline thread, the outbox thread and a scrape each
read one consistent set and never a map that changes under them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import overload
from urllib.parse import urlsplit

from alarm.collectors.registry.sight import shown_url
from exporters.delivery import Channel, MemoryRows
from exporters.destinations import DestinationSet
from exporters.outbox import ChannelStats, NewRow, Row


@dataclass(slots=True, frozen=True)
class ChannelSet:
    views: tuple[Channel, ...]  # in configuration order: what /metrics and the API show
    by_name: Mapping[str, Channel]
    memory: Mapping[str, MemoryRows]

    # -- the disk-full fallback (called with the notifier's lock held) ---------------------
    def hold(self, rows: list[NewRow], now: float) -> None:
        """Hold these rows in memory, each in its channel's queue, replacing what was held."""
        by_channel: dict[str, list[Row]] = {}
        for r in rows:  # ids are given by MemoryRows, stable per idempotency key
            row = Row(0, r.channel, r.order_key, r.idem_key, r.event, now, 0, r.body)
            by_channel.setdefault(r.channel, []).append(row)
        for name, mem in self.memory.items():
            self.by_name[name].unpersisted = mem.replace(by_channel.get(name, []))

    def stored(self) -> None:
        """What was held in memory is in the outbox now."""
        for name, mem in self.memory.items():
            mem.clear()
            self.by_name[name].unpersisted = 0

    def delivered_from_memory(self) -> set[str]:
        keys: set[str] = set()
        for mem in self.memory.values():
            keys |= mem.delivered_keys()
        return keys

    def forget_delivered(self, keys: set[str]) -> None:
        for mem in self.memory.values():
            mem.forget_delivered(keys)


def shown_target(target: str) -> str:
    """A channel's target as the API shows it: a URL without its userinfo and query, where a
    webhook's credentials and signature often ride (``http://user:pass@host/hook?sig=...``),
    cut as registry URLs are; anything else (Slack's "secret (env NAME)") is already safe."""
    return shown_url(target) if urlsplit(target).scheme in ("http", "https") else target


def channel_set(
    destinations: DestinationSet,
    previous: ChannelSet | None,
    stats: Callable[[], Mapping[str, ChannelStats]],
) -> ChannelSet:
    """The channels of ``destinations``.  One that ``previous`` had, with the same type, is
    the same object (its counters go on, its worker may keep running); its target is updated."""
    views: list[Channel] = []
    memory: dict[str, MemoryRows] = {}
    for name, ct in destinations.channels.items():
        ch = previous.by_name.get(name) if previous else None
        if ch is None or ch.type != ct.destination.type:
            ch = Channel(name, ct.destination.route.name, ct.destination.type, "", stats)
        ch.target = shown_target(ct.target)
        views.append(ch)
        held = previous.memory.get(name) if previous else None
        memory[name] = held if held is not None else MemoryRows()
    return ChannelSet(
        tuple(views),
        MappingProxyType({ch.name: ch for ch in views}),
        MappingProxyType(memory),
    )


class LiveChannels(Sequence[Channel]):
    """The channels of whatever configuration is running, for a reader that keeps a reference
    (the HTTP server renders ``/metrics`` from it): each iteration reads one snapshot."""

    __slots__ = ("_current",)

    def __init__(self, current: Callable[[], tuple[Channel, ...]]):
        self._current = current

    def __iter__(self) -> Iterator[Channel]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    @overload
    def __getitem__(self, index: int) -> Channel: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Channel, ...]: ...
    def __getitem__(self, index: int | slice) -> Channel | tuple[Channel, ...]:
        return self._current()[index]

    def __repr__(self) -> str:
        return f"LiveChannels({[ch.name for ch in self._current()]!r})"
