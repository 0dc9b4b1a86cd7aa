"""Egress: map a fence flow to exactly one declared surface; what matches nothing is
`unclassified`.

Rules are tried in config order and the first match wins.  A batch's flows are classified at
once, in columns: each rule is evaluated on the distinct values of each field (destinations,
protocols, interfaces, prefixes), then combined over the flow identities with numpy, so a
workload spraying millions of destinations costs vector passes, not a Python call per flow.
``classify_key`` is the same rule for one flow, the reference the tests hold the columns to.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, field_validator

from alarm.collectors.kernel.fence import FlowSubjects
from alarm.settings import Strict

FenceKey = tuple[str, str, int | None, str, int | None, str]  # dst, proto, dpt, out, uid, prefix


_LOW64 = (1 << 64) - 1

# What the kernel's LOG target prints after PROTO= (net/netfilter/nf_log_syslog.c): these
# names, and any other IP protocol as its number.  A ``match.proto`` item must be one of them,
# else the surface silently matches nothing.
KERNEL_PROTO_NAMES: dict[str, int] = {
    "tcp": 6,
    "udp": 17,
    "udplite": 136,
    "icmp": 1,
    "icmpv6": 58,
    "ah": 51,  # IPv4 (IPv6 prints AH and ESP as extension headers, without PROTO=)
    "esp": 50,
}
# Names people write for protocols the kernel prints only as a number.
_NUMBERED = {
    "sctp": 132, "gre": 47, "ipip": 4, "igmp": 2, "ospf": 89, "vrrp": 112, "pim": 103,
    "l2tp": 115, "dccp": 33, "ipv6": 41, "ipencap": 4, "ipv6-icmp": 58,
}  # fmt: skip


def proto_name(value: Any) -> str:
    """``value`` as the classifier compares it with a record's PROTO= (lower case), or
    ValueError saying what to write instead."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a protocol")
    text = str(value).strip().lower()
    known = ", ".join(KERNEL_PROTO_NAMES)
    if text in KERNEL_PROTO_NAMES:
        return text
    if text.isdigit():
        number = int(text)
        if number > 255:
            raise ValueError(f"protocol {value!r} is not an IP protocol number (0-255)")
        for name, n in KERNEL_PROTO_NAMES.items():
            if n == number:
                raise ValueError(
                    f"the kernel logs protocol {number} as PROTO={name.upper()}: write {name}"
                )
        return str(number)
    if text in _NUMBERED:
        number = _NUMBERED[text]
        if number == 58:
            raise ValueError(f"{value!r}: the kernel logs it as PROTO=ICMPv6: write icmpv6")
        raise ValueError(f"{value!r}: the kernel logs it as PROTO={number}: write {number}")
    raise ValueError(
        f"unknown protocol {value!r}: the kernel logs {known}, or any other as its number"
    )


def port_range(value: Any) -> tuple[int, int]:
    if isinstance(value, bool):
        raise ValueError("a port is a number or a range like 8000-8100")
    if isinstance(value, int):
        lo = hi = value
    else:
        text = str(value).strip()
        parts = text.split("-")
        if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"{value!r} is not a port or a range like 8000-8100")
        lo, hi = int(parts[0]), int(parts[-1])
    if not (0 <= lo <= hi <= 65535):
        raise ValueError(f"{value!r} is outside 0-65535 or reversed")
    return lo, hi


class EgressMatch(Strict):
    """All given fields must match (AND); each list matches any of its items (OR)."""

    dst: list[str] = []  # CIDRs or addresses
    dport: list[Any] = []  # ports or "lo-hi"
    # tcp, udp, udplite, icmp, icmpv6, ah, esp, or a number; each checked (proto_name)
    proto: list[Annotated[Any, AfterValidator(proto_name)]] = []
    out: list[str] = []  # output interface; a trailing '+' matches a prefix, like iptables
    uid: list[int] = []
    log_prefix: list[str] = []  # the nft rule's prefix text, e.g. "EGRESS_FENCE proxy"
    source: list[str] = []  # names of the sources whose records this surface takes

    @field_validator("dst")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        for v in values:
            try:
                ipaddress.ip_network(str(v), strict=False)
            except ValueError as exc:
                raise ValueError(f"{v!r} is not an address or CIDR") from exc
        return values

    @field_validator("dport")
    @classmethod
    def _ports(cls, values: list[Any]) -> list[Any]:
        for v in values:
            port_range(v)
        return values

    def port_ranges(self) -> list[tuple[int, int]]:
        return [port_range(v) for v in self.dport]


Address = tuple[int, int] | None  # (IP version, integer value); None when not an address


def parse_address(text: str) -> Address:
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    return addr.version, int(addr)


@dataclass(slots=True, frozen=True)
class _Rule:
    surface: int  # index in the classifier's ``surfaces``
    # Networks as integer ranges: comparing ints is several times cheaper than ``addr in net``,
    # and a miss on a hostile spray of destinations pays for it once per key.
    networks: tuple[tuple[int, int, int], ...]  # (version, first, last)
    ports: tuple[tuple[int, int], ...]
    protos: frozenset[str]
    outs: tuple[str, ...]
    uids: frozenset[int]
    prefixes: frozenset[str]
    sources: frozenset[str]

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


def _iface_matches(pattern: str, name: str) -> bool:
    if pattern.endswith("+"):
        return name.startswith(pattern[:-1])
    return name == pattern


class EgressClassifier:
    """``classify(subjects, source)``: for each flow of a batch, the index of its surface in
    ``surfaces`` (-1: unclassified)."""

    kind = "egress"

    def __init__(self, names: Sequence[str], matches: Sequence[EgressMatch]):
        self.surfaces = list(names)
        self._rules = [
            _Rule(
                surface=i,
                networks=tuple(_network_range(d) for d in m.dst),
                ports=tuple(m.port_ranges()),
                protos=frozenset(m.proto),
                outs=tuple(m.out),
                uids=frozenset(m.uid),
                prefixes=frozenset(m.log_prefix),
                sources=frozenset(m.source),
            )
            for i, m in enumerate(matches)
        ]

    def classify(self, subjects: FlowSubjects, source: str) -> np.ndarray:
        """Each rule is evaluated on the distinct values of each field, then combined over
        the identity columns; the first rule that matches wins, as in ``classify_key``."""
        scan = subjects.scan
        surface_of = np.full(len(scan.id_dst), -1, dtype=np.int64)
        undecided = np.ones(len(scan.id_dst), dtype=bool)
        for rule in self._rules:
            if rule.sources and source not in rule.sources:
                continue
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
                surface_of[m] = rule.surface
                undecided &= ~m
        return surface_of

    def classify_key(self, key: FenceKey, source: str = "") -> int:
        """The surface index of one flow (-1: unclassified)."""
        parsed: list[Address] = []

        def address() -> Address:
            # Parsed at most once per key, and only if some rule looks at the destination.
            if not parsed:
                parsed.append(parse_address(key[0]))
            return parsed[0]

        for rule in self._rules:
            if rule.sources and source not in rule.sources:
                continue
            if rule.matches(key, address):
                return rule.surface
        return -1
