"""Map a fence record to exactly one declared surface; what matches nothing is `unclassified`.

Rules are tried in config order and the first match wins.  Matching is done once per distinct
(destination, port, protocol, interface, uid, prefix) key and cached; the cache is bounded so a
workload spraying millions of destinations costs a fixed amount of memory (it is cleared when
full: a miss only costs a re-classification).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from alarm.config import UNCLASSIFIED, SurfaceConfig

if TYPE_CHECKING:
    from alarm.fastscan import FlowScan

FenceKey = tuple[str, str, int | None, str, int | None, str]  # dst, proto, dpt, out, uid, prefix


_LOW64 = (1 << 64) - 1
Address = tuple[int, int] | None  # (IP version, integer value); None when not an address


def parse_address(text: str) -> Address:
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    return addr.version, int(addr)


@dataclass(slots=True, frozen=True)
class _Rule:
    surface: str
    # Networks as integer ranges: comparing ints is several times cheaper than ``addr in net``,
    # and a miss on a hostile spray of destinations pays for it once per key.
    networks: tuple[tuple[int, int, int], ...]  # (version, first, last)
    ports: tuple[tuple[int, int], ...]
    protos: frozenset[str]
    outs: tuple[str, ...]
    uids: frozenset[int]
    prefixes: frozenset[str]

    def matches(self, key: FenceKey, address: Callable[[], Address]) -> bool:
        _, proto, dpt, out, uid, prefix = key
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
            addr = address()
            if addr is None:
                return False
            version, value = addr
            if not any(v == version and lo <= value <= hi for v, lo, hi in self.networks):
                return False
        return True


def _network_range(text: str) -> tuple[int, int, int]:
    net = ipaddress.ip_network(text, strict=False)
    return net.version, int(net.network_address), int(net.broadcast_address)


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
                networks=tuple(_network_range(d) for d in s.match.dst),
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

    def classify_columns(self, scan: FlowScan) -> tuple[list[str], np.ndarray]:
        """``classify`` for every flow identity of a scan at once: (surface names, the index
        of each identity's surface in them).  Each rule is evaluated on the distinct values
        of each field, then combined over the identity columns with numpy; the first rule
        that matches wins, as in ``classify``."""
        names = [UNCLASSIFIED]
        surface_of = np.zeros(len(scan.id_dst), dtype=np.int64)
        undecided = np.ones(len(scan.id_dst), dtype=bool)
        for rule in self._rules:
            m = undecided.copy()
            if rule.protos:
                ok = np.array([p.lower() in rule.protos for p in scan.protos] + [False])
                m &= ok[scan.id_proto]
            if rule.ports:
                in_range = np.zeros(len(m), dtype=bool)
                for lo, hi in rule.ports:
                    in_range |= (scan.id_dpt >= lo) & (scan.id_dpt <= hi)
                m &= in_range & (scan.id_dpt >= 0)
            if rule.uids:
                m &= np.isin(scan.id_uid, np.array(sorted(rule.uids), dtype=np.int64))
                m &= scan.id_uid >= 0
            if rule.prefixes:
                ok = np.array([p in rule.prefixes for p in scan.prefixes] + [False])
                m &= ok[scan.id_prefix]
            if rule.outs:
                ok = np.array(
                    [any(_iface_matches(pat, o) for pat in rule.outs) for o in scan.outs] + [False]
                )
                m &= ok[scan.id_out]
            if rule.networks:
                version, hi, lo = scan.dst_words.T
                ok = np.zeros(len(scan.dsts) + 1, dtype=bool)
                for v, first, last in rule.networks:
                    f_hi, f_lo = np.uint64(first >> 64), np.uint64(first & _LOW64)
                    l_hi, l_lo = np.uint64(last >> 64), np.uint64(last & _LOW64)
                    above = (hi > f_hi) | ((hi == f_hi) & (lo >= f_lo))
                    below = (hi < l_hi) | ((hi == l_hi) & (lo <= l_lo))
                    ok[:-1] |= (version == v) & above & below
                m &= ok[scan.id_dst]
            if m.any():
                names.append(rule.surface)
                surface_of[m] = len(names) - 1
                undecided &= ~m
        return names, surface_of

    def _match(self, key: FenceKey) -> str:
        parsed: list[Address] = []

        def address() -> Address:
            # Parsed at most once per key, and only if some rule looks at the destination.
            if not parsed:
                parsed.append(parse_address(key[0]))
            return parsed[0]

        for rule in self._rules:
            if rule.matches(key, address):
                return rule.surface
        return UNCLASSIFIED
