"""Egress: map a fence flow to exactly one declared surface; what matches nothing is
`unclassified`.

Rules are tried in config order and the first match wins.  ``classify_key`` is that rule for
one flow, the reference the tests hold the two batch paths to:

- up to ``COLUMN_RULES`` rules, a batch's flows are classified at once, in columns: each rule
  is evaluated on the distinct values of each field (destinations, protocols, interfaces,
  prefixes), then combined over the flow identities with numpy, so a workload spraying
  millions of destinations costs vector passes, not a Python call per flow;
- above it (thousands of surfaces), a pass per rule would make every batch cost the rule count
  (issue 28): each distinct flow is looked up in an index of the rules by field
  (``RuleIndex``: prefix tables of destination networks and port blocks, dicts of the rest)
  and remembered in a bounded memo, so a batch costs its distinct flows.
"""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import numpy as np
from pydantic import AfterValidator, field_validator

from alarm.settings import Strict


class FlowSubjects(Protocol):
    """What the classifier reads of a batch's egress subjects (the kernel source's
    ``FlowSubjects``, alarm/collectors/kernel/fence.py): the flow columns of its scan."""

    scan: Any


FenceKey = tuple[str, str, int | None, str, int | None, str]  # dst, proto, dpt, out, uid, prefix


_LOW64 = (1 << 64) - 1
# Flow keys whose surface a classifier remembers: about 350 B each with the destination text
# (measured under a spray of IPv6 destinations), some 23 MB when full.
MEMO_LIMIT = 1 << 16
# Up to this many rules, a batch is classified rule by rule in numpy columns
# (``classify_columns``): a few ns per rule and flow, less than a memo look-up in Python, and
# no Python per flow under a spray of destinations.  Above it, through the index and memo.
COLUMN_RULES = 64
# A flow the memo does not hold costs about as much through the index (~4 us) as a numpy pass
# per rule over one flow does for this many rules (~5 ns a rule).  A batch goes rule by rule
# when that is cheaper: rules x (flows + 10 x distinct protocols, interfaces and prefixes)
# <= MISS_RULES x new flows (a spray of new destinations with a few hundred surfaces).
MISS_RULES = 800

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
    """(version, first, last) of ``ip_network(text, strict=False)``.  "address/length" is
    worked out from the address (100,000 /32s: 0.23 s instead of 0.43 s); other forms (a
    netmask after the slash) go through ``ip_network``."""
    address, slash, length = text.partition("/")
    if not slash or (length.isascii() and length.isdigit()):
        try:
            addr = ipaddress.ip_address(address)
        except ValueError:
            addr = None
        if addr is not None and (not slash or int(length) <= addr.max_prefixlen):
            host = (1 << (addr.max_prefixlen - int(length or addr.max_prefixlen))) - 1
            first = int(addr) & ~host
            return addr.version, first, first | host
    net = ipaddress.ip_network(text, strict=False)
    return net.version, int(net.network_address), int(net.broadcast_address)


def _iface_matches(pattern: str, name: str) -> bool:
    if pattern.endswith("+"):
        return name.startswith(pattern[:-1])
    return name == pattern


class _Exact:
    """Rules by the exact value they require of one field."""

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: dict[Any, list[int]] = {}

    def add(self, value: Any, rule: int) -> None:
        _append(self.table.setdefault(value, []), rule)

    def find(self, value: Any) -> list[list[int]]:
        found = self.table.get(value)
        return [found] if found else []


class _Interfaces:
    """Rules by output interface: exact names, and ``name+`` patterns by their prefix (one
    dict look-up per distinct pattern length)."""

    __slots__ = ("exact", "lengths", "prefixed")

    def __init__(self) -> None:
        self.exact = _Exact()
        self.prefixed: dict[str, list[int]] = {}
        self.lengths: tuple[int, ...] = ()

    def add(self, pattern: str, rule: int) -> None:
        if pattern.endswith("+"):
            _append(self.prefixed.setdefault(pattern[:-1], []), rule)
            self.lengths = tuple(sorted({*self.lengths, len(pattern) - 1}))
        else:
            self.exact.add(pattern, rule)

    def find(self, name: str) -> list[list[int]]:
        found = self.exact.find(name)
        for n in self.lengths:
            if n > len(name):
                break
            hit = self.prefixed.get(name[:n])
            if hit:
                found.append(hit)
        return found


class _Blocks:
    """Rules by aligned power-of-two blocks of integers (a prefix table): a CIDR is one block,
    a port range at most 32; a value finds its blocks with one dict look-up per block size
    present."""

    __slots__ = ("levels", "tables")

    def __init__(self) -> None:
        self.tables: dict[int, dict[int, list[int]]] = {}  # host bits -> block start -> rules
        self.levels: tuple[tuple[int, dict[int, list[int]]], ...] = ()

    def add(self, first: int, last: int, rule: int) -> None:
        while first <= last:
            bits = 0
            while first & ((2 << bits) - 1) == 0 and first + (2 << bits) - 1 <= last:
                bits += 1
            _append(self.tables.setdefault(bits, {}).setdefault(first, []), rule)
            first += 1 << bits
        self.levels = tuple(sorted(self.tables.items()))

    def find(self, value: int) -> list[list[int]]:
        found = []
        for bits, table in self.levels:
            hit = table.get(value >> bits << bits)
            if hit:
                found.append(hit)
        return found


class _Networks:
    """Rules by destination network, a prefix table per IP version."""

    __slots__ = ("versions",)

    def __init__(self) -> None:
        self.versions = {4: _Blocks(), 6: _Blocks()}

    def add(self, network: tuple[int, int, int], rule: int) -> None:
        version, first, last = network
        self.versions[version].add(first, last, rule)

    def find(self, address: Address) -> list[list[int]]:
        if address is None:
            return []
        return self.versions[address[0]].find(address[1])


class _Ports:
    __slots__ = ("blocks",)

    def __init__(self) -> None:
        self.blocks = _Blocks()

    def add(self, ports: tuple[int, int], rule: int) -> None:
        self.blocks.add(ports[0], ports[1], rule)

    def find(self, port: int | None) -> list[list[int]]:
        if port is None or not 0 <= port <= 65535:
            return []
        return self.blocks.find(port)


def _append(rules: list[int], rule: int) -> None:
    # Rules are indexed in order, so a rule listing a value twice is a repeat of the last.
    if not rules or rules[-1] != rule:
        rules.append(rule)


_FieldIndex = _Exact | _Interfaces | _Networks | _Ports
# The fields a rule may constrain, in the order of ``_Group.fields`` positions: each rule's
# constrained fields are its group's; the values a flow key gives them (``_key_values``).
_FIELDS = ("dst", "dport", "proto", "out", "uid", "prefix", "source")


@dataclass(slots=True)
class _Group:
    """Rules constraining the same fields, indexed by each of them."""

    first: int  # the group's lowest rule
    fields: tuple[int, ...]  # positions in _FIELDS
    indexes: tuple[_FieldIndex, ...]


class RuleIndex:
    """The rules indexed by field, for ``first_match``: a rule is a candidate for a flow key
    only if its entry in each field it constrains holds the key's value; the candidates of its
    group's most selective field are checked in rule order with ``_Rule.matches``, so the first
    match is the first match of the rule list (``EgressClassifier.classify_key``)."""

    def __init__(self, rules: Sequence[_Rule]) -> None:
        self.rules = list(rules)
        groups: dict[tuple[int, ...], _Group] = {}
        for i, rule in enumerate(self.rules):
            given = (
                rule.networks,
                rule.ports,
                rule.protos,
                rule.outs,
                rule.uids,
                rule.prefixes,
                rule.sources,
            )
            fields = tuple(f for f, values in enumerate(given) if values)
            group = groups.get(fields)
            if group is None:
                group = groups[fields] = _Group(i, fields, tuple(_new_index(f) for f in fields))
            for f, index in zip(fields, group.indexes, strict=True):
                for value in given[f]:
                    index.add(value, i)  # type: ignore[arg-type]
        self.groups = sorted(groups.values(), key=lambda g: g.first)
        self.needs_address = any(0 in g.fields for g in self.groups)

    def first_match(self, key: FenceKey, source: str) -> int:
        """The lowest rule that matches ``key`` from ``source`` (-1: none)."""
        dst, proto, dpt, out, uid, prefix = key
        parsed: list[Address] = []

        def address() -> Address:
            if not parsed:
                parsed.append(parse_address(dst))
            return parsed[0]

        values = (
            address() if self.needs_address else None,
            dpt,
            proto.lower(),
            out,
            uid,
            prefix,
            source,
        )
        rules = self.rules
        best = len(rules)
        for group in self.groups:
            if group.first >= best:
                break  # sorted by first rule: no later group can do better
            if not group.fields:
                best = group.first  # constrains nothing: its first rule matches everything
                continue
            chosen: list[list[int]] | None = None
            size = 0
            for f, index in zip(group.fields, group.indexes, strict=True):
                found = index.find(values[f])  # type: ignore[arg-type]
                n = sum(len(rs) for rs in found)
                if chosen is None or n < size:
                    chosen, size = found, n
                if not n:
                    break
            if not size or chosen is None:
                continue
            candidates = chosen[0] if len(chosen) == 1 else heapq.merge(*chosen)
            for r in candidates:
                if r >= best:
                    break
                rule = rules[r]
                if (not rule.sources or source in rule.sources) and rule.matches(key, address):
                    best = r
                    break
        return -1 if best == len(rules) else rules[best].surface


def _new_index(field: int) -> _FieldIndex:
    name = _FIELDS[field]
    if name == "dst":
        return _Networks()
    if name == "dport":
        return _Ports()
    if name == "out":
        return _Interfaces()
    return _Exact()


class EgressClassifier:
    """``classify(subjects, source)``: for each flow of a batch, the index of its surface in
    ``surfaces`` (-1: unclassified).

    A flow key is looked up in the rule index (``RuleIndex``) once and remembered in a memo
    of at most ``memo_limit`` keys (the oldest goes first: ``memo_evictions`` counts them),
    so a batch costs a dict look-up per distinct flow, and a new flow an index look-up whose
    cost follows the rules that could match it, not the number of rules."""

    kind = "egress"

    def __init__(
        self,
        names: Sequence[str],
        matches: Sequence[EgressMatch],
        memo_limit: int = MEMO_LIMIT,
        column_rules: int = COLUMN_RULES,
        miss_rules: int = MISS_RULES,
    ):
        self.surfaces = list(names)
        self.memo_limit = memo_limit
        self.column_rules = column_rules
        self.miss_rules = miss_rules
        self.memo_evictions = 0  # flow keys dropped from the memo (looked up again if seen)
        self._memo: dict[tuple[FenceKey, str], int] = {}
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
        t0 = time.perf_counter()
        self._index = RuleIndex(self._rules)
        self.index_seconds = time.perf_counter() - t0  # what building the index took

    def classify(self, subjects: FlowSubjects, source: str) -> np.ndarray:
        """The first rule that matches each flow, as in ``classify_key``: flows the memo
        holds from it, the others through the index, unless the rules are so few that a pass
        per rule over the whole batch costs less (``column_rules``, ``miss_rules``)."""
        if len(self._rules) <= self.column_rules:
            return self.classify_columns(subjects, source)
        memo = self._memo
        keys = subjects.scan.identities()
        found = [memo.get((key, source)) for key in keys]
        new = [i for i, surface in enumerate(found) if surface is None]
        if not new:
            return np.array(found, dtype=np.int64)
        scan = subjects.scan
        # A pass per rule costs ~5 ns a flow, and ~50 ns a distinct protocol, interface and
        # prefix, which it tests in Python.
        distinct = len(scan.protos) + len(scan.outs) + len(scan.prefixes)
        if len(new) * self.miss_rules >= len(self._rules) * (len(keys) + 10 * distinct):
            columns = self.classify_columns(subjects, source).tolist()
            for i in new:
                found[i] = self._remember(keys[i], source, columns[i])
        else:
            first_match = self._index.first_match
            for i in new:
                found[i] = self._remember(keys[i], source, first_match(keys[i], source))
        return np.array(found, dtype=np.int64)

    def _remember(self, key: FenceKey, source: str, surface: int) -> int:
        if self.memo_limit:
            if len(self._memo) >= self.memo_limit:
                self._forget_older_half()
            self._memo[key, source] = surface
        return surface

    @property
    def memo_size(self) -> int:
        """Flow keys remembered (at most ``memo_limit``)."""
        return len(self._memo)

    def _forget_older_half(self) -> None:
        # In one step: deleting the oldest key one at a time makes finding the next oldest
        # (the first live entry of the dict) slower with each deletion.
        keep = self.memo_limit // 2
        dropped = len(self._memo) - keep
        self._memo = dict(itertools.islice(self._memo.items(), dropped, None))
        self.memo_evictions += dropped

    def classify_columns(self, subjects: FlowSubjects, source: str) -> np.ndarray:
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
