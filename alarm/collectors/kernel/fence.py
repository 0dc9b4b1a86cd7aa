"""Kernel records -> egress write events: the one place that knows what a fence record is.

Every kernel source (kmsg, journald, file) reads :class:`KernelRecord` s its own way and hands
them to a :class:`FenceReader`, which keeps those that start with a fence prefix, parses them
(netfilter LOG layout), rejects what the kernel provably did not write (``forged_records``),
and sums the rest per (tick, flow) into columns.  Large batches go through the native scanner,
small ones record by record through ``parse_fence``; both give the same cells (tests).

A flow is (destination, protocol, port, output interface, uid, log prefix): the egress
classifier's input.  Its contributor name is ``10.0.0.5:443/TCP``; where the fence logs the
socket's owner (``log flags skuid``: ``UID= GID=``), the UIDs that wrote to it are the
contributor's evidence (``{"uid": "1000"}``), and so is a log prefix that names more than the
fence (one per workload's cgroup: ``"EGRESS_FENCE agent-17"``); never a label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from alarm.collectors.kernel.fastscan import (
    FlowScan,
    Row,
    find_forged,
    forged_sample_text,
    live_formats,
    native_available,
    scan_flows,
    scan_live,
)
from alarm.collectors.kernel.netfilter import MAX_LINE, FenceParseError, parse_fence
from alarm.collectors.kernel.records import KernelRecord
from alarm.events import WriteEvents
from alarm.sanitize import shown
from alarm.surfaces import MAX_CONTRIBUTOR_CHARS, bounded_receipt

if TYPE_CHECKING:
    from alarm.collectors.kernel.canary import CanaryClaims

# Batches at least this large go through the native scanner (below it, its fixed cost of a
# few numpy arrays is more than the per-record parser's).
NATIVE_BATCH = 32
# The native scanner reads a kmsg stamp of up to 15 digits (microseconds) itself.
_KMSG_USEC_LIMIT = 10**15


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def contributor_name(dst: str, dpt: int | None, proto: str) -> str:
    """The heavy-hitter key of a flow: ``10.0.0.5:443/TCP``, or ``10.0.0.5/ICMP``.  The
    protocol is the line's text (a journal export may carry a lone surrogate): made safe to
    show (alarm/sanitize.py)."""
    return f"{dst}/{shown(proto)}" if dpt is None else f"{dst}:{dpt}/{shown(proto)}"


@dataclass(slots=True)
class FlowSubjects:
    """The egress subjects of a batch: the flow identities of a scan, in its columns."""

    scan: FlowScan

    def __len__(self) -> int:
        return len(self.scan.id_dst)

    def contributor(self, i: int) -> str:
        s = self.scan
        dpt = int(s.id_dpt[i])
        return contributor_name(
            s.dsts[s.id_dst[i]], None if dpt < 0 else dpt, s.protos[s.id_proto[i]]
        )

    def evidence(self, i: int) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        uid, prefix = int(self.scan.id_uid[i]), self.scan.prefixes[self.scan.id_prefix[i]]
        if uid >= 0:
            out["uid"] = str(uid)
        if " " in prefix:
            out["prefix"] = prefix
        return out or None

    def contributor_table(self) -> FlowContributors | None:
        """The flows' contributors by key (None: a key would not fit in int64, only on
        adversarial input of millions of distinct destinations and protocols in one batch;
        the pipeline then names each flow)."""
        s = self.scan
        if len(s.dsts) * _PORTS * max(len(s.protos), 1) >= 1 << 62:
            return None
        return FlowContributors(s)


class FlowContributors:
    """The contributors of a scan's flows without naming them: a contributor is a
    (destination, port, protocol) of the scan's tables, one int64 key each; names are made
    for the few indexes asked (``names``), and a name is found by reading it back (``find``).
    Naming every flow of every batch was a fifth of a 20,000-flow backtest.

    Two keys can make one name only where an IPv6 destination ending in ``:digits`` without a
    port meets the address before it with that port (``2001:db8::5:1/TCP``): both are then
    summed under that name where they meet in one heavy-hitter summary, as before, except that
    ``find`` reads the name back as the port-less flow."""

    __slots__ = (
        "_alone",
        "_before_port",
        "_distinct",
        "_index",
        "_keys",
        "_named",
        "_parts",
        "_read",
        "count",
        "evidence",
        "of_subject",
        "scan",
    )

    def __init__(self, scan: FlowScan):
        self.scan = scan
        # key = (dst * PORTS + port + 1) * protocols + protocol: distinct per flow name.
        key = (scan.id_dst * _PORTS + scan.id_dpt + 1) * max(len(scan.protos), 1) + scan.id_proto
        self._keys, self.of_subject = np.unique(key, return_inverse=True)
        self.count = len(self._keys)
        # Who the fence says wrote, per contributor (None: it says nothing).
        self.evidence: FlowOwners | None = owners(scan, self.of_subject)
        # (destination -> its index, protocol part "/TCP" -> its index), for ``find``.
        self._index: tuple[dict[str, int], dict[str, int]] | None = None
        # Names made so far, by index, and names read back (``_find``), by name: a batch
        # spans many ticks, and each (tick, surface) asks again for the flows it holds.
        self._named: dict[int, str] = {}
        self._read: dict[str, int] = {}
        self._parts: tuple[list[str], list[bool]] | None = None
        self._alone: list[bool] | None = None
        self._before_port: set[int] | None = None
        self._distinct: bool | None = None

    def names(self, ids: Sequence[int]) -> list[str]:
        named = self._named
        wanted = np.asarray(ids, dtype=np.int64).tolist()
        fresh = [i for i in dict.fromkeys(wanted) if i not in named]
        if fresh:
            self._name(fresh)
        return [named[i] for i in wanted]

    def _name(self, fresh: list[int]) -> None:
        """Name contributors ``fresh`` (distinct, not named yet), and read each back."""
        s = self.scan
        named, read = self._named, self._read
        dsts, _ = self._tables()
        suffix, plain = self._protocol_parts()
        alone, before_port = self._destination_parts()
        rest, proto = np.divmod(self._keys[fresh], max(len(s.protos), 1))
        dst, port = np.divmod(rest, _PORTS)
        hard = []
        for i, d, p, x in zip(fresh, dst.tolist(), port.tolist(), proto.tolist(), strict=True):
            where = s.dsts[d]
            name = named[i] = f"{where}:{p - 1}{suffix[x]}" if p else where + suffix[x]
            # What is named is what is looked for next: read back now, as ``_find`` reads
            # it, without parsing the name where it can only read back as ``i`` (the
            # address has no "/" and is its own, the protocol part is this protocol's, and
            # a name with a port is not also an address without one).
            if (
                plain[x]
                and alone[d]
                and (p == 0 or d not in before_port or f"{where}:{p - 1}" not in dsts)
            ):
                read[name] = i
            else:
                hard.append(name)
        if hard:
            read.update(zip(hard, self._find(hard).tolist(), strict=True))

    @property
    def names_distinct(self) -> bool:
        """Whether each index names itself alone, as the surfaces keep names: every
        destination and protocol part reads back as itself, no address continues another
        with ":digits", and no name is long enough to be cut (alarm/surfaces.py)."""
        if self._distinct is None:
            suffix, plain = self._protocol_parts()
            alone, before_port = self._destination_parts()
            longest = max(map(len, self.scan.dsts), default=0) + len(":99999")
            self._distinct = (
                all(plain)
                and all(alone)
                and not before_port
                and longest + max(map(len, suffix), default=0) <= MAX_CONTRIBUTOR_CHARS
            )
        return self._distinct

    def _destination_parts(self) -> tuple[list[bool], set[int]]:
        """Per destination, whether it has no "/" and reads back as itself; and the
        destinations that another one continues with ":digits" (only there can an address
        and port spell another address), made once."""
        if self._alone is None:
            dsts, _ = self._tables()
            listed = self.scan.dsts
            self._alone = [
                "/" not in where and dsts.get(where) == d for d, where in enumerate(listed)
            ]
            self._before_port = {
                dsts[host]
                for where in listed
                if ":" in where
                for host, _, port in (where.rpartition(":"),)
                if port.isdigit() and host in dsts
            }
        assert self._before_port is not None
        return self._alone, self._before_port

    def _protocol_parts(self) -> tuple[list[str], list[bool]]:
        """Per protocol: the end of a name ("/TCP", as ``contributor_name`` writes it), and
        whether a name ending so reads back as this protocol (made once)."""
        if self._parts is None:
            _, protos = self._tables()
            suffix = [contributor_name("", None, p) for p in self.scan.protos]
            self._parts = (suffix, [protos.get(end) == x for x, end in enumerate(suffix)])
        return self._parts

    def _tables(self) -> tuple[dict[str, int], dict[str, int]]:
        """(destination -> its index, protocol part "/TCP" -> its index), made once."""
        if self._index is None:
            s = self.scan
            self._index = (
                dict(zip(s.dsts, range(len(s.dsts)), strict=True)),
                {contributor_name("", None, p): i for i, p in enumerate(s.protos)},
            )
        return self._index

    def find(self, names: Sequence[str]) -> np.ndarray:
        read = self._read
        at = np.fromiter(map(read.get, names, repeat(-2)), dtype=np.int64, count=len(names))
        rest = np.flatnonzero(at == -2)
        if len(rest):
            missed = [names[i] for i in rest.tolist()]
            found = self._find(missed)
            read.update(zip(missed, found.tolist(), strict=True))
            at[rest] = found
        return at

    def _find(self, names: Sequence[str]) -> np.ndarray:
        s = self.scan
        dsts, protos = self._tables()
        width = max(len(s.protos), 1)
        # Up to two keys a name can be read as, each looked up in one searchsorted: the
        # port-less flow first (ICMP, a fragment), then the address before the last ":".
        keys = np.full((len(names), 2), -1, dtype=np.int64)
        for i, name in enumerate(names):
            cut = name.find("/")  # an address has no "/": the protocol part starts here
            proto = protos.get(name[cut:]) if cut >= 0 else None
            if proto is None:
                continue
            where = name[:cut]
            dst = dsts.get(where)
            if dst is not None:
                keys[i, 0] = dst * _PORTS * width + proto
            host, colon, port = where.rpartition(":")
            if colon and port.isdigit() and len(port) <= 5:
                dst = dsts.get(host)
                if dst is not None:
                    keys[i, 1] = (dst * _PORTS + int(port) + 1) * width + proto
        at = np.minimum(np.searchsorted(self._keys, keys), max(self.count - 1, 0))
        hit = (keys >= 0) & (self._keys[at] == keys)
        return np.where(hit[:, 0], at[:, 0], np.where(hit[:, 1], at[:, 1], -1))


# Port values a key leaves room for: -1 (none) to 99999 (DPT= reads at most five digits).
_PORTS = 1 << 17
# UIDs (and prefixes) named in one contributor's evidence; more are summed up as "+N".
MAX_OWNERS_SHOWN = 4


class FlowOwners:
    """Per contributor index, who the fence says wrote to it, as a receipt: the UIDs of the
    sending sockets' owners (``log flags skuid``), ``{"uid": "1000"}`` or ``"1000,1001,+3"``,
    and the log prefixes that name more than the fence (one rule per workload's cgroup,
    ``socket cgroupv2 ... log prefix "EGRESS_FENCE agent-17 "``), ``{"prefix": ...}``.

    Receipts are found for every contributor at once, on the first ``get``: most
    contributors' flows all name one owner (one UID, one prefix), and those take the receipt
    of that pair, made once; only a contributor whose flows name several is read flow by
    flow.  Asking each contributor's receipt by its flows, once per tick and surface it
    wrote in, was a sixth of a 20,000-flow backtest's main process."""

    __slots__ = ("_alike", "_columns", "_contributor", "_of", "_prefixes", "_receipts", "_spans")

    def __init__(
        self, contributor: np.ndarray, uid: np.ndarray, prefix: np.ndarray, names: list[str]
    ):
        self._contributor = contributor  # per flow that names an owner: its contributor
        self._columns: tuple[Any, Any] = (uid, prefix)  # UID (-1: none), prefix (-1: the fence's)
        self._prefixes = names
        # Per contributor index: its receipt's place in _receipts, -1 where its flows name
        # several owners (made from _spans), -2 where none (made on the first ``get``).
        self._of: list[int] | None = None
        self._receipts: list[dict[str, Any] | None] = []
        # contributor -> (first, end) of its flows in _columns, for those naming several.
        self._spans: dict[int, tuple[int, int]] = {}
        # Receipts by what they are made of (the UIDs and prefixes of the contributor's
        # flows): most contributors are written by the same few owners.
        self._alike: dict[tuple[frozenset[int], frozenset[int]], dict[str, Any]] = {}

    def __bool__(self) -> bool:
        return bool(len(self._contributor))

    def get(self, index: int, default: Any = None) -> dict[str, Any] | None:
        of = self._of if self._of is not None else self._sort()
        at = of[index] if 0 <= index < len(of) else -2
        if at == -1:  # its flows name several owners: read once, then kept
            at = of[index] = len(self._receipts)
            self._receipts.append(self._make(index))
        made = self._receipts[at] if at >= 0 else None
        return default if made is None else made

    def _sort(self) -> list[int]:
        """Group the flows by contributor; the receipt of each contributor whose flows
        all name one (UID, prefix) pair."""
        order = np.argsort(self._contributor, kind="stable")
        contributor = self._contributor[order]
        uid, prefix = self._columns[0][order], self._columns[1][order]
        keys, starts = np.unique(contributor, return_index=True)
        one = np.minimum.reduceat(uid, starts) == np.maximum.reduceat(uid, starts)
        one &= np.minimum.reduceat(prefix, starts) == np.maximum.reduceat(prefix, starts)
        # One receipt per distinct pair, keyed (uid + 1) * width + prefix + 1 (a UID has at
        # most 10 digits: far inside int64).
        width = len(self._prefixes) + 1
        pair = (uid[starts] + 1) * width + prefix[starts] + 1
        pairs, which = np.unique(pair[one], return_inverse=True)
        self._receipts = [
            self._receipt(frozenset((k // width - 1,)), frozenset((k % width - 1,)))
            for k in pairs.tolist()
        ]
        of = np.full(int(keys[-1]) + 1 if len(keys) else 0, -2, dtype=np.int64)
        of[keys[one]] = which
        of[keys[~one]] = -1
        self._of = of.tolist()
        several = np.flatnonzero(~one)
        if len(several):
            ends = np.append(starts[1:], len(order))
            self._spans = dict(
                zip(
                    keys[several].tolist(),
                    zip(starts[several].tolist(), ends[several].tolist(), strict=True),
                    strict=True,
                )
            )
            self._columns = (uid.tolist(), prefix.tolist())
        return self._of

    def _make(self, index: int) -> dict[str, Any]:
        lo, hi = self._spans[index]
        uid, prefix = (column[lo:hi] for column in self._columns)
        return self._receipt(frozenset(uid), frozenset(prefix))

    def _receipt(self, uid: frozenset[int], prefix: frozenset[int]) -> dict[str, Any]:
        made = self._alike.get((uid, prefix))
        if made is not None:
            return made
        out: dict[str, Any] = {}
        uids = sorted(uid - {-1})
        if uids:
            out["uid"] = _listed([str(u) for u in uids])
        named = sorted({self._prefixes[p] for p in prefix - {-1}})
        if named:
            out["prefix"] = _listed(named)
        # As the surfaces keep it, made once a batch for each set of owners.
        made = self._alike[(uid, prefix)] = bounded_receipt(out)
        return made


def _listed(values: list[str]) -> str:
    shown = values[:MAX_OWNERS_SHOWN]
    if len(values) > MAX_OWNERS_SHOWN:
        shown.append(f"+{len(values) - MAX_OWNERS_SHOWN}")
    return ",".join(shown)


def owners(scan: FlowScan, of_flow: np.ndarray) -> FlowOwners | None:
    """The owners of a scan's flows by contributor (``of_flow``: each flow's contributor);
    None where no flow names one."""
    named = np.array([" " in p for p in scan.prefixes] + [False], dtype=bool)
    prefix = np.where(named[scan.id_prefix], scan.id_prefix, -1)
    keep = (scan.id_uid >= 0) | (prefix >= 0)
    if not keep.any():
        return None
    return FlowOwners(of_flow[keep], scan.id_uid[keep], prefix[keep], scan.prefixes)


def flow_events(scan: FlowScan, tick: float) -> WriteEvents | None:
    """The cells of a scan as egress write events, stamped at the middle of their tick (so
    that the pipeline, with the same tick, puts each exactly where the scan did)."""
    if not len(scan.ids):
        return None
    return WriteEvents(
        kind="egress",
        subjects=FlowSubjects(scan),
        subject=scan.ids,
        ts=(scan.ticks.astype(np.float64) + 0.5) * tick,
        nbytes=scan.nbytes,
        events=scan.packets,
    )


@dataclass(slots=True)
class FenceRead:
    events: WriteEvents | None
    parse_errors: int = 0
    forged: int = 0
    # The first forged record's message, sanitised and bounded: the alert's sample line.
    forged_sample: str | None = None


class FenceReader:
    """``read(records)``: the fence records among ``records`` as write events.  Thread-safe
    (no state but settings): kernel sources call it in a worker thread.

    ``require_trusted``: the source can prove kernel origin, so a record it cannot vouch for
    is forged, not traffic.  ``canary``: set by the egress canary (canary.py) while it
    watches this source: the records of its outstanding canaries are taken out first and
    counted there, never as writes."""

    def __init__(self, prefixes: tuple[str, ...], require_trusted: bool, tick: float):
        self.prefixes = prefixes
        self.require_trusted = require_trusted
        self.tick = tick
        self.canary: CanaryClaims | None = None

    def read(self, records: list[KernelRecord], scan: FlowScan | None = None) -> FenceRead:
        """``scan``: cells already read from the same batch (``read_chunk``), added to."""
        out = FenceRead(None)
        canary = self.canary
        if canary is not None and canary.expecting():
            records = canary.divert(records, self.prefixes, self.require_trusted)
        base, scan = scan, FlowScan()
        if len(records) >= NATIVE_BATCH and native_available():
            scan, records = self._native(records, out)
        rows: list[Row] = []
        for rec in records:
            try:
                fence = parse_fence(rec.message, self.prefixes)
            except FenceParseError:
                out.parse_errors += 1
                continue
            if fence is None:
                continue
            if self.require_trusted and not rec.trusted:
                out.forged += 1
                if out.forged_sample is None:
                    out.forged_sample = forged_sample_text(rec.message)
                continue
            rows.append(
                (
                    rec.ts,
                    fence.log_prefix,
                    fence.out_if,
                    fence.dst,
                    fence.length,
                    fence.proto,
                    fence.dpt,
                    fence.uid,
                    True,
                )
            )
        scan.add_rows(rows, self.tick)
        if base is not None:
            base.merge(scan)
            scan = base
        out.events = flow_events(scan, self.tick)
        return out

    def can_read_chunks(self, fmt: str) -> bool:
        return fmt in live_formats() and all(p.isascii() for p in self.prefixes)

    def read_chunk(
        self,
        data: bytes,
        fmt: str,
        year: int,
        boot_wall: float,
        parse_lines: Callable[[bytes], list[KernelRecord]],
    ) -> tuple[FenceRead, float]:
        """Complete lines of a text log in ``fmt`` (as file.kernel_line_parser reads them)
        as ``read`` would make them into events line by line, through the native scanner;
        what it cannot read with certainty goes through ``parse_lines`` (the line parser)
        and ``read``.  Returns the read and the newest record time the scanner read.  While
        the canary waits for its records, every line goes the per-line way: its claims are
        made on records."""
        canary = self.canary
        if canary is not None and canary.expecting():
            return self.read(parse_lines(data)), 0.0
        scan, rest = scan_live(
            data,
            fmt,
            self.prefixes,
            self.tick,
            year,
            boot_wall=boot_wall,
            require_trusted=self.require_trusted,
        )
        out = self.read(parse_lines(rest) if rest else [], scan)
        out.forged += scan.forged
        if scan.forged and out.forged_sample is None:
            out.forged_sample = find_forged(data, fmt, self.prefixes)
        return out, scan.max_ts

    def _native(
        self, records: list[KernelRecord], out: FenceRead
    ) -> tuple[FlowScan, list[KernelRecord]]:
        """The fence records of a large batch through the native scanner; returns its scan and
        the records it cannot take (a message spanning lines), for the per-record path.  Each
        message becomes a kmsg line whose facility carries its trust (0: the kernel's; 1: not
        provably) and whose clock is the record's own time, so the scanner counts forged
        records and ticks as the per-record path does; fastscan's regex agrees with
        ``parse_fence`` on every message (tests)."""
        lines: list[str] = []
        rest: list[KernelRecord] = []
        prefixes = self.prefixes
        strict = self.require_trusted
        # The scanner reads kmsg clocks of up to 15 digits (microseconds since boot): wall
        # times go in relative to a whole second at or before the batch's first record.
        base = float(math.floor(min(rec.ts for rec in records)))
        for rec in records:
            msg = rec.message
            if not msg.startswith(prefixes):
                continue  # not a fence record (the per-record path would skip it too)
            if len(msg) > MAX_LINE:
                out.parse_errors += 1
                continue
            usec = max(0, round((rec.ts - base) * 1e6))
            # A record the scanner cannot read as a kmsg line goes the per-record way: a
            # message spanning lines, one that is not UTF-8 (a journal entry's lone surrogate
            # ended the batch in UnicodeEncodeError) and a time further from the batch's first
            # than the scanner's 15-digit stamp (past 20 digits the line was dropped: neither
            # bytes nor an error).
            if "\n" in msg or usec >= _KMSG_USEC_LIMIT or not _utf8(msg):
                rest.append(rec)
            else:
                trust = "0" if rec.trusted or not strict else "8"
                lines.append(f"{trust},0,{usec},-;{msg}")
        if not lines:
            return FlowScan(), rest
        lines.append("")
        scan = scan_flows(
            "\n".join(lines).encode(), "kmsg", prefixes, self.tick, 1970, boot_wall=base
        )
        out.parse_errors += scan.parse_errors
        out.forged += scan.forged
        if scan.forged and out.forged_sample is None:
            # Only records the source could not vouch for are forged: few, and looked at
            # only when the scan found one.
            for rec in records:
                msg = rec.message
                if not rec.trusted and msg.startswith(prefixes) and "\n" not in msg:
                    try:
                        if parse_fence(msg, prefixes) is not None:
                            out.forged_sample = forged_sample_text(msg)
                            break
                    except FenceParseError:
                        continue
        return scan, rest
