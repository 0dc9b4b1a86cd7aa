"""Map a fence record to exactly one declared surface; what matches nothing is `unclassified`.

Rules are tried in config order and the first match wins.  Matching is done once per distinct
(destination, port, protocol, interface, uid, prefix) key and cached; the cache is bounded so a
workload spraying millions of destinations costs a fixed amount of memory (it is cleared when
full: a miss only costs a re-classification).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from alarm.config import UNCLASSIFIED, SurfaceConfig

FenceKey = tuple[str, str, int | None, str, int | None, str]  # dst, proto, dpt, out, uid, prefix


@dataclass(slots=True, frozen=True)
class _Rule:
    surface: str
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    ports: tuple[tuple[int, int], ...]
    protos: frozenset[str]
    outs: tuple[str, ...]
    uids: frozenset[int]
    prefixes: frozenset[str]

    def matches(self, key: FenceKey) -> bool:
        dst, proto, dpt, out, uid, prefix = key
        if self.protos and proto.lower() not in self.protos:
            return False
        if self.ports and (dpt is None or not any(lo <= dpt <= hi for lo, hi in self.ports)):
            return False
        if self.uids and uid not in self.uids:
            return False
        if self.prefixes and prefix not in self.prefixes:
            return False
        if self.outs and not any(_iface_matches(pattern, out) for pattern in self.outs):
            return False
        if self.networks:
            try:
                addr = ipaddress.ip_address(dst)
            except ValueError:
                return False
            if not any(addr.version == net.version and addr in net for net in self.networks):
                return False
        return True


def contributor_name(dst: str, dpt: int | None, proto: str) -> str:
    """The heavy-hitter key of a fence record: ``10.0.0.5:443/TCP``, or ``10.0.0.5/ICMP``."""
    return f"{dst}/{proto}" if dpt is None else f"{dst}:{dpt}/{proto}"


def _iface_matches(pattern: str, name: str) -> bool:
    if pattern.endswith("+"):
        return name.startswith(pattern[:-1])
    return name == pattern


class EgressClassifier:
    def __init__(self, surfaces: Sequence[SurfaceConfig], cache_size: int = 65536):
        self._rules = [
            _Rule(
                surface=s.name,
                networks=tuple(ipaddress.ip_network(d, strict=False) for d in s.match.dst),
                ports=tuple(s.match.port_ranges()),
                protos=frozenset(s.match.proto),
                outs=tuple(s.match.out),
                uids=frozenset(s.match.uid),
                prefixes=frozenset(s.match.log_prefix),
            )
            for s in surfaces
            if s.kind == "egress"
        ]
        self._cache: dict[FenceKey, str] = {}
        self._cache_size = cache_size
        self.cache_clears = 0

    def classify(self, key: FenceKey) -> str:
        surface = self._cache.get(key)
        if surface is None:
            surface = self._match(key)
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
                self.cache_clears += 1
            self._cache[key] = surface
        return surface

    def _match(self, key: FenceKey) -> str:
        for rule in self._rules:
            if rule.matches(key):
                return rule.surface
        return UNCLASSIFIED
