"""Bulk fence-line scanner for backtests: a whole chunk of kernel log in, plain rows out.

``parse_fence`` costs a few microseconds per line in Python objects.  Here one compiled regex
per format runs over the whole chunk with ``findall`` (the per-line loop stays in C and only
the row's fields are captured), and one comprehension turns the captures into rows through
small per-chunk memo dicts (stamps, addresses, lengths and ports repeat), so the per-row
Python work is a few dict lookups and the row tuple.  The regex is most of the cost.

It agrees with ``kernel_formats`` + ``netfilter.parse_fence`` on every line (the tests check
it with hypothesis, on kernel lines and mutated ones): the same header rules, log prefix,
first ``LEN=``, first ``PROTO=``, ports right after it, the last ``UID=``/``GID=`` pair, and
the addresses validated and canonicalised by ``netfilter.canonical_ip``.  Two differences:
lines longer than ``netfilter.MAX_LINE`` are not singled out, and a fence line whose syslog
stamp is invalid counts as a parse error (the per-line parser refuses the whole record).

Everything is top level and returns plain tuples, so worker processes can run it.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alarm.collectors.kernel.formats import parse_journal_json, rfc3339_time, syslog_time
from alarm.collectors.kernel.netfilter import (
    NET_SKIP,
    OWNER,
    FenceParseError,
    canonical_ip,
    parse_fence,
)
from alarm.events import FORGED_SAMPLE_CHARS
from alarm.jsontext import loads_json
from alarm.sanitize import sanitize

try:  # the native one-pass scanner (alarm/collectors/kernel/_fastscan.c), built by pip where a compiler is
    from alarm.collectors.kernel import _fastscan as _native
except ImportError:  # pragma: no cover - exercised where the extension was not built
    _native = None

# (ts, log_prefix, out_if, dst, length, proto, dpt, uid, trusted)
Row = tuple[float, str, str, str, int, str, int | None, int | None, bool]
# (tick index, dst, proto, dpt, out_if, uid, log_prefix): what a tick's figures are kept by
FlowKey = tuple[int, str, str, int | None, str, int | None, str]
BULK_FORMATS = ("syslog", "kmsg", "dmesg")
# The native scanner's format codes; "auto" (per line) only live, where the per-line parsers
# take what it hands back.
_NATIVE_FORMATS = {"syslog": 0, "kmsg": 1, "dmesg": 2, "journal-json": 3}
_LIVE_FORMATS = {**_NATIVE_FORMATS, "auto": 4}

# Record headers, each starting at the "\n" before the line (_findall gives the first line
# one), so the regex engine's literal-prefix search jumps from line to line in C.  They follow
# the header regexes of alarm.collectors.kernel.formats exactly, without quantified groups ("(?:x)?"
# allocates a repeat context per attempt in Python's engine; "(?:x|)" does not).
_HEADERS = {
    # RFC3164 stamp | RFC3339 seconds, fraction, zone; host; the "kernel:" tag; kernel uptime.
    "syslog": (
        r"\n([A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d"
        r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9}|)(?:Z|[+-]\d\d:?\d\d|))"
        r" \S+ kernel: (?:\[ *\d{1,12}\.\d{1,9}\] ?|)"
    ),
    # PRI,SEQ,USEC,FLAGS[,...];
    "kmsg": r"\n(\d{1,10}),\d{1,20},(\d{1,20}),[^;,\n]*(?:,[^;\n]*|);",
    # [<PRI>][  uptime] [caller]
    "dmesg": r"\n(?:<\d{1,10}>|)\[ *(\d{1,12}\.\d{1,9})\] ?(?:\[ *[TC]\d{1,10}\] |)",
}

# The message, mirroring netfilter.FENCE_RE with "." as "[^\n]" and only the row's fields
# captured.  A line that starts with a prefix but does not fit takes the second alternative
# (nothing captured): a parse error.
_EOL = r"(?:[ ]|(?=\n|\Z))"  # the kernel's trailing space, which syslog daemons may strip
_BODY = (
    r"(?:({pfx}[^\n]*?)IN=\S* OUT=(\S*) (?:|[^\n]{{0,400}}? )"
    r"SRC=(\S{{1,64}}) DST=(\S{{1,64}}) LEN=(\d{{1,10}}){eol}"
    r"(?:{skip}PROTO=(\S{{1,16}}){eol}(?:SPT=\d{{1,5}} DPT=(\d{{1,5}}){eol}|)|)"
    r"(?:{owner}|)"
    r"|{pfx})"
)


@dataclass(slots=True)
class ScanResult:
    rows: list[Row] = field(default_factory=list)
    lines: int = 0
    parse_errors: int = 0  # a prefix matched but the line is malformed
    forged: int = 0  # well-formed fence lines the kernel provably did not write (not in rows)
    # Newest time among the fence lines read, forged ones included: a chunk of nothing but
    # forged lines has no rows, yet its time has passed (the backtest's clock moves on it).
    max_ts: float = 0.0


class _Memo(dict[Any, Any]):
    """dict.__getitem__ runs in C on hits; ``fn`` runs once per distinct key (per chunk)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], Any], initial: dict[Any, Any] | None = None) -> None:
        super().__init__(initial or {})
        self.fn = fn

    def __missing__(self, key: Any) -> Any:
        value = self[key] = self.fn(key)
        return value


def fence_regex(fmt: str, prefixes: tuple[str, ...]) -> re.Pattern[str]:
    """The bulk regex for a format (``re`` caches the compiled pattern)."""
    if not prefixes:
        raise ValueError("no prefixes")
    # Longest first: the alternation then picks the longest prefix, as parse_fence does.
    alts = "|".join(re.escape(p) for p in sorted(set(prefixes), key=len, reverse=True))
    owner = OWNER.replace("GID=(", "GID=(?:")  # one group: the uid
    body = _BODY.format(pfx=f"(?:{alts})", eol=_EOL, skip=NET_SKIP, owner=owner)
    return re.compile(_HEADERS[fmt] + body, re.ASCII)


def _addr(text: str) -> str | None:
    try:
        return canonical_ip(text)
    except ValueError:
        return None


def _port(text: str) -> int | None:
    return int(text) if text else None


def _syslog_clock(year: int) -> Callable[[str], float | None]:
    def stamp_to_ts(key: str) -> float | None:
        try:
            if key[0].isdigit():
                return rfc3339_time(key)
            mon, day, hms = key[:3], key[4:6], key[-8:]
            return syslog_time(mon, day, hms[:2], hms[3:5], hms[6:], year)
        except ValueError:
            return None  # e.g. "Foo 31": kernel_formats refuses it as a record

    return stamp_to_ts


def _findall(regex: re.Pattern[str], text: str) -> list[tuple[str, ...]]:
    """``findall`` over the lines of ``text``.  Patterns start at the newline before a line;
    the first line gets one of its own, so the chunk itself is never copied."""
    first = text.find("\n") + 1 or len(text)
    matches = regex.findall("\n" + text[:first])
    if first < len(text):
        matches += regex.findall(text, first - 1)
    return matches


def scan_text(
    text: str,
    fmt: str,
    prefixes: tuple[str, ...],
    year: int | None = None,
    *,
    boot_wall: float = 0.0,
) -> ScanResult:
    """Every fence line of one chunk of complete lines.  ``fmt``: "syslog", "kmsg", "dmesg"
    (bulk) or "journal-json" (per entry).  ``year`` completes RFC3164 stamps (default: this
    year, UTC; a log spanning New Year is not split).  kmsg ``ts`` is ``boot_wall`` + USEC
    (seconds since boot by default), dmesg ``ts`` ``boot_wall`` + the uptime.  Row ``trusted``: kmsg rows are all True (facility != 0
    lines are ``forged`` instead); syslog and dmesg cannot prove origin, so False."""
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    if fmt == "journal-json":
        return _scan_journal(text, prefixes, lines)
    if fmt not in _HEADERS:
        raise ValueError(f"scan_text does not read {fmt!r}")
    result = ScanResult(lines=lines)
    matches = _findall(fence_regex(fmt, prefixes), text)
    if not matches:
        return result
    # Per-chunk memos: C-speed lookups on hits.  Invalid stamps and addresses map to None.
    addr = _Memo(_addr).__getitem__
    length = _Memo(int).__getitem__
    strip = _Memo(str.strip).__getitem__
    port = _Memo(_port, {"": None}).__getitem__
    stamp = _Memo(_syslog_clock(year or time.gmtime().tm_year)).__getitem__
    # One comprehension per format: the per-row work is a handful of dict lookups and the row
    # tuple.  "ln" is empty for lines that took the bare-prefix alternative (malformed); a bad
    # address or stamp maps to None.  Either way the line is a parse error, as it would be for
    # kernel_formats + parse_fence, and is counted from the difference.
    rows: list[Any]
    if fmt == "syslog":
        rows = [
            (t, strip(p), o, dd, length(ln), pr, port(dp), port(u), False)
            for s, p, o, sr, d, ln, pr, dp, u in matches
            if ln and addr(sr) and (dd := addr(d)) and (t := stamp(s)) is not None
        ]
    elif fmt == "kmsg":
        kernel = _Memo(lambda pri: int(pri) >> 3 == 0).__getitem__
        rows = [
            (
                boot_wall + int(us) / 1e6,
                strip(p),
                o,
                dd,
                length(ln),
                pr,
                port(dp),
                port(u),
                kernel(pri),
            )
            for pri, us, p, o, sr, d, ln, pr, dp, u in matches
            if ln and addr(sr) and (dd := addr(d))
        ]
    else:
        rows = [
            (float(t) + boot_wall, strip(p), o, dd, length(ln), pr, port(dp), port(u), False)
            for t, p, o, sr, d, ln, pr, dp, u in matches
            if ln and addr(sr) and (dd := addr(d))
        ]
    result.parse_errors = len(matches) - len(rows)
    result.max_ts = max((r[0] for r in rows), default=0.0)
    if fmt == "kmsg":
        # Facility 0 proves the kernel wrote it; user space writing to /dev/kmsg cannot.
        trusted = [r for r in rows if r[8]]
        result.forged = len(rows) - len(trusted)
        rows = trusted
    result.rows = rows
    return result


Identity = tuple[str, str, int | None, str, int | None, str]  # dst, proto, dpt, out_if, uid, prefix
_I64 = np.int64


def _empty() -> np.ndarray:
    return np.zeros(0, _I64)


@dataclass(slots=True)
class FlowScan:
    """Fence records of a chunk summed per (tick, flow identity), in columns.

    Flow identities are rows of indexes into tables of distinct values: identity ``i`` is
    ``(dsts[id_dst[i]], protos[id_proto[i]], id_dpt[i], outs[id_out[i]], id_uid[i],
    prefixes[id_prefix[i]])`` with -1 for an absent port or uid.  Cell ``j`` holds
    ``nbytes[j]`` bytes in ``packets[j]`` records of identity ``ids[j]`` in tick ``ticks[j]``
    (index ``int(ts // tick)``); a (tick, identity) pair may appear in more than one cell."""

    dsts: list[str] = field(default_factory=list)
    outs: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    protos: list[str] = field(default_factory=list)
    # Per destination: (IP version, high 64 bits, low 64 bits) of the address (uint64), for
    # classification by network without parsing text.
    dst_words: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.uint64))
    id_dst: np.ndarray = field(default_factory=_empty)
    id_out: np.ndarray = field(default_factory=_empty)
    id_prefix: np.ndarray = field(default_factory=_empty)
    id_proto: np.ndarray = field(default_factory=_empty)
    id_dpt: np.ndarray = field(default_factory=_empty)
    id_uid: np.ndarray = field(default_factory=_empty)
    ticks: np.ndarray = field(default_factory=_empty)
    ids: np.ndarray = field(default_factory=_empty)
    nbytes: np.ndarray = field(default_factory=_empty)
    packets: np.ndarray = field(default_factory=_empty)
    lines: int = 0
    records: int = 0  # fence records in the cells
    parse_errors: int = 0
    forged: int = 0
    native: bool = False  # the native scanner read it (lines it handed back excepted)
    handed_back: int = 0  # lines the native scanner left to the regex path
    # Newest record time among the headers the native scanner read (the regex path: among
    # the fence lines, forged ones included).
    max_ts: float = 0.0
    # The message of the first forged record, sanitised and bounded (None: none forged).
    forged_sample: str | None = None
    # (index from 0, text) of the first parse errors, where ``scan_flows`` was asked to
    # locate them and could cheaply (None: not located).
    error_lines: list[tuple[int, bytes]] | None = None

    def identities(self) -> list[Identity]:
        return [
            (
                self.dsts[d],
                self.protos[p],
                None if dp < 0 else dp,
                self.outs[o],
                None if u < 0 else u,
                self.prefixes[x],
            )
            for d, p, dp, o, u, x in zip(
                self.id_dst.tolist(),
                self.id_proto.tolist(),
                self.id_dpt.tolist(),
                self.id_out.tolist(),
                self.id_uid.tolist(),
                self.id_prefix.tolist(),
                strict=True,
            )
        ]

    def flows(self) -> dict[FlowKey, list[int]]:
        """``{(tick, *identity): [bytes, packets]}``, summed (for tests and small inputs)."""
        idents = self.identities()
        out: dict[FlowKey, list[int]] = {}
        for t, i, b, n in zip(
            self.ticks.tolist(),
            self.ids.tolist(),
            self.nbytes.tolist(),
            self.packets.tolist(),
            strict=True,
        ):
            acc = out.setdefault((t, *idents[i]), [0, 0])
            acc[0] += b
            acc[1] += n
        return out

    def add_rows(self, rows: list[Row], tick: float) -> None:
        """Append scanned rows (the regex path) as cells, one per distinct flow and tick."""
        if not rows:
            return
        tables = [
            {v: i for i, v in enumerate(t)}
            for t in (self.dsts, self.outs, self.prefixes, self.protos)
        ]
        lists = (self.dsts, self.outs, self.prefixes, self.protos)

        def index(k: int, value: str) -> int:
            i = tables[k].get(value)
            if i is None:
                i = tables[k][value] = len(lists[k])
                lists[k].append(value)
            return i

        n_old = len(self.id_dst)
        cols = [c.tolist() for c in self._id_columns()]
        known = {row: i for i, row in enumerate(zip(*cols, strict=True))}
        flows: dict[tuple[int, int], list[int]] = {}
        for ts, log_prefix, out_if, dst, length, proto, dpt, uid, _trusted in rows:
            row = (
                index(0, dst),
                index(1, out_if),
                index(2, log_prefix),
                index(3, proto),
                -1 if dpt is None else dpt,
                -1 if uid is None else uid,
            )
            i = known.get(row)
            if i is None:
                i = known[row] = len(known)
            acc = flows.setdefault((int(ts // tick), i), [0, 0])
            acc[0] += length
            acc[1] += 1
        if len(self.dsts) > len(self.dst_words):
            self.dst_words = np.concatenate(
                [self.dst_words, address_words(self.dsts[len(self.dst_words) :])]
            )
        new_rows = np.array(list(known)[n_old:], dtype=_I64).reshape(-1, 6)
        for name, col in zip(_ID_COLUMNS, new_rows.T, strict=True):
            setattr(self, name, np.concatenate([getattr(self, name), col]))
        keys = np.array(list(flows), dtype=_I64).reshape(-1, 2)
        sums = np.array(list(flows.values()), dtype=_I64).reshape(-1, 2)
        self.ticks = np.concatenate([self.ticks, keys[:, 0]])
        self.ids = np.concatenate([self.ids, keys[:, 1]])
        self.nbytes = np.concatenate([self.nbytes, sums[:, 0]])
        self.packets = np.concatenate([self.packets, sums[:, 1]])
        self.records += len(rows)

    def merge(self, other: FlowScan) -> None:
        """Append another scan's cells and counts (its identities mapped onto ours)."""
        self.lines += other.lines
        self.records += other.records
        self.parse_errors += other.parse_errors
        self.forged += other.forged
        self.forged_sample = self.forged_sample or other.forged_sample
        self.handed_back += other.handed_back
        self.max_ts = max(self.max_ts, other.max_ts)
        if not len(other.ids):
            return
        maps = []
        for mine, theirs in (
            (self.dsts, other.dsts),
            (self.outs, other.outs),
            (self.prefixes, other.prefixes),
            (self.protos, other.protos),
        ):
            table = {v: i for i, v in enumerate(mine)}
            index = []
            for v in theirs:
                i = table.get(v)
                if i is None:
                    i = table[v] = len(mine)
                    mine.append(v)
                index.append(i)
            maps.append(np.array(index, dtype=_I64))
        if len(self.dsts) > len(self.dst_words):
            self.dst_words = np.concatenate(
                [self.dst_words, address_words(self.dsts[len(self.dst_words) :])]
            )
        rows = np.stack(
            [
                maps[0][other.id_dst],
                maps[1][other.id_out],
                maps[2][other.id_prefix],
                maps[3][other.id_proto],
                other.id_dpt,
                other.id_uid,
            ],
            axis=1,
        )
        n_old = len(self.id_dst)
        cols = [c.tolist() for c in self._id_columns()]
        known = {row: i for i, row in enumerate(zip(*cols, strict=True))}
        remap = np.array(
            [known.setdefault(tuple(row), len(known)) for row in rows.tolist()], dtype=_I64
        )
        new_rows = np.array(list(known)[n_old:], dtype=_I64).reshape(-1, 6)
        for name, col in zip(_ID_COLUMNS, new_rows.T, strict=True):
            setattr(self, name, np.concatenate([getattr(self, name), col]))
        self.ticks = np.concatenate([self.ticks, other.ticks])
        self.ids = np.concatenate([self.ids, remap[other.ids]])
        self.nbytes = np.concatenate([self.nbytes, other.nbytes])
        self.packets = np.concatenate([self.packets, other.packets])

    def _id_columns(self) -> list[np.ndarray]:
        return [getattr(self, name) for name in _ID_COLUMNS]


def address_words(addresses: list[str]) -> np.ndarray:
    """(version, high 64 bits, low 64 bits) of each address as uint64 rows; version 0 for
    a text that is not an address (no network contains it)."""
    rows = []
    for text in addresses:
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            rows.append((0, 0, 0))
            continue
        value = int(addr)
        rows.append((addr.version, value >> 64, value & 0xFFFFFFFFFFFFFFFF))
    return np.array(rows, dtype=np.uint64).reshape(-1, 3)


# The order of the native scanner's identity columns.
_ID_COLUMNS = ("id_dst", "id_out", "id_prefix", "id_proto", "id_dpt", "id_uid")


def native_available() -> bool:
    return _native is not None


def scan_flows(
    data: bytes,
    fmt: str,
    prefixes: tuple[str, ...],
    tick: float,
    year: int | None = None,
    *,
    boot_wall: float = 0.0,
    native: bool = True,
    locate_errors: int = 0,
) -> FlowScan:
    """``scan_text`` of a chunk of complete lines (bytes), summed per flow and tick.

    With the native scanner, lines in the layout the kernel, syslog daemons and journalctl
    write are read and summed in C; every other line holding a prefix (every journal line
    that is not a plain entry) comes back and goes through ``scan_text``, so the result is
    the regex's, line for line (the tests check it).

    ``locate_errors``: find up to that many parse errors' lines (``error_lines``) where the
    native scanner handed back few lines (the errors are among them), so that nothing has
    to read the chunk again to say where they are."""
    year = year or time.gmtime().tm_year
    if not (native and _native is not None and fmt in _NATIVE_FORMATS and _ascii(prefixes)):
        text = data.decode("utf-8", "replace")
        result = scan_text(text, fmt, prefixes, year, boot_wall=boot_wall)
        scan = FlowScan(
            lines=result.lines,
            parse_errors=result.parse_errors,
            forged=result.forged,
            max_ts=result.max_ts,
        )
        scan.add_rows(result.rows, tick)
    else:
        scan, fallback = _native_scan(data, _NATIVE_FORMATS[fmt], prefixes, tick, year, boot_wall)
        if fallback:
            scan.handed_back = fallback.count(b"\n")
            text = fallback.decode("utf-8", "replace")
            rest = scan_text(text, fmt, prefixes, year, boot_wall=boot_wall)
            scan.parse_errors += rest.parse_errors
            scan.forged += rest.forged
            scan.max_ts = max(scan.max_ts, rest.max_ts)
            scan.add_rows(rest.rows, tick)
            if locate_errors and rest.parse_errors and fmt == "syslog":
                scan.error_lines = _error_lines(data, fallback, prefixes, year, locate_errors)
    if scan.forged:
        scan.forged_sample = find_forged(data, fmt, prefixes)
    return scan


# Handed-back lines read again one by one to find the parse errors among them; past this
# many, the caller locates them (backtest.locate_parse_errors).
LOCATE_LINES = 1000


def _error_lines(
    data: bytes, fallback: bytes, prefixes: tuple[str, ...], year: int, want: int
) -> list[tuple[int, bytes]] | None:
    """(index in ``data``, text) of the first ``want`` parse errors of a syslog chunk, read
    among the lines the native scanner handed back (``fallback``, in the order of ``data``);
    None where there are too many to read one by one.  A syslog line reads alike wherever
    it is, so each is found in ``data`` after the one before."""
    parts = fallback.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    if len(lines) > LOCATE_LINES:
        return None
    found: list[tuple[int, bytes]] = []
    pos = index = 0  # pos: the start of line ``index`` of data
    for line in lines:
        where = data.find(line, pos)
        while where > 0 and data[where - 1] != 0x0A:  # a whole line, not another's end
            where = data.find(line, where + 1)
        if where < 0:
            return None
        index += data.count(b"\n", pos, where)
        if scan_text(line.decode("utf-8", "replace"), "syslog", prefixes, year).parse_errors:
            found.append((index, line))
            if len(found) == want:
                break
        pos, index = where + len(line), index + 1
    return found


def forged_sample_text(message: str) -> str:
    """A forged record's message as its sample line: made safe to show and bounded (the
    forged-records alert carries it, exporters/payload.py)."""
    return sanitize(message, FORGED_SAMPLE_CHARS)


def _untrusted_kmsg(prefixes: tuple[str, ...]) -> re.Pattern[bytes]:
    """kmsg lines of a facility other than the kernel's (PRI 8 and up) whose message starts
    with a prefix: the only lines a kmsg scan counts as forged."""
    alts = b"|".join(re.escape(p.encode()) for p in sorted(set(prefixes), key=len, reverse=True))
    return re.compile(
        rb"(?m)^0*(?:[89]|[1-9]\d{1,9}),\d{1,20},\d{1,20},[^;\n]*;((?:" + alts + rb")[^\n]*)"
    )


def find_forged(data: bytes, fmt: str, prefixes: tuple[str, ...]) -> str | None:
    """The message of the first record in ``data`` that a scan counts as forged (a
    well-formed fence record the kernel provably did not write), as a bounded, sanitised
    sample; None where there is none.  Called only for chunks with forged records: a kmsg
    chunk is searched by one regex for untrusted lines, a journal export entry by entry."""
    if fmt == "kmsg":
        for m in _untrusted_kmsg(prefixes).finditer(data):
            message = m.group(1).decode("utf-8", "replace")
            if _fence_or_none(message, prefixes):
                return forged_sample_text(message)
        return None
    if fmt != "journal-json":
        return None  # syslog and dmesg cannot prove origin: nothing there is forged
    needles = tuple(p.encode() for p in prefixes)
    for line in data.splitlines():
        if not any(n in line for n in needles):
            continue
        try:
            rec = parse_journal_json(loads_json(line))
        except (ValueError, TypeError):
            continue
        if rec is not None and not rec.trusted and _fence_or_none(rec.message, prefixes):
            return forged_sample_text(rec.message)
    return None


def _fence_or_none(message: str, prefixes: tuple[str, ...]) -> bool:
    try:
        return parse_fence(message, prefixes) is not None
    except FenceParseError:
        return False


def _ascii(prefixes: tuple[str, ...]) -> bool:
    return all(p.isascii() for p in prefixes)


def live_formats() -> tuple[str, ...]:
    """The formats ``scan_live`` reads natively here (none without the extension)."""
    return tuple(_LIVE_FORMATS) if _native is not None else ()


def scan_live(
    data: bytes,
    fmt: str,
    prefixes: tuple[str, ...],
    tick: float,
    year: int,
    *,
    boot_wall: float = 0.0,
    require_trusted: bool = False,
) -> tuple[FlowScan, bytes]:
    """The file source's native reading of a chunk of complete lines: the lines it reads
    with certainty as formats.py's per-line parser (``file.kernel_line_parser(fmt)``) and
    ``parse_fence`` would, summed per flow and tick, and the lines it does not (each with
    its newline), for that per-line path: every line whose header it cannot read, whatever
    it holds (the line parser decides whether it is a parse error), and every line holding a
    prefix that it cannot read as a fence record.  ``max_ts`` is the newest header time
    among the lines it read.  Raises ValueError where ``live_formats`` lacks ``fmt`` or a
    prefix is not ASCII."""
    if fmt not in live_formats() or not _ascii(prefixes):
        raise ValueError(f"no native live reading of {fmt!r} with these prefixes")
    return _native_scan(
        data,
        _LIVE_FORMATS[fmt],
        prefixes,
        tick,
        year,
        boot_wall,
        live=True,
        trusted=require_trusted,
    )


def _native_scan(
    data: bytes,
    code: int,
    prefixes: tuple[str, ...],
    tick: float,
    year: int,
    boot_wall: float,
    *,
    live: bool = False,
    trusted: bool = True,
) -> tuple[FlowScan, bytes]:
    assert _native is not None
    lines, forged, fallback, tables, words, id_rows, cells, max_ts = _native.scan_flows(
        data, code, tuple(p.encode() for p in prefixes), year, tick, boot_wall, live, trusted
    )
    scan = FlowScan(lines=lines, forged=forged, native=True, max_ts=max_ts)
    scan.dsts, scan.outs, scan.prefixes, scan.protos = tables
    scan.dst_words = np.frombuffer(words, dtype=np.uint64).reshape(-1, 3)
    cols = np.frombuffer(id_rows, dtype=_I64).reshape(-1, 6)
    for name, col in zip(_ID_COLUMNS, cols.T, strict=True):
        setattr(scan, name, col)
    ticks, ids, nbytes, packets = cells
    scan.ticks = np.frombuffer(ticks, dtype=_I64)
    scan.ids = np.frombuffer(ids, dtype=np.int32).astype(_I64)
    scan.nbytes = np.frombuffer(nbytes, dtype=_I64)
    scan.packets = np.frombuffer(packets, dtype=_I64)
    scan.records = int(scan.packets.sum())
    return scan, fallback


def _scan_journal(text: str, prefixes: tuple[str, ...], lines: int) -> ScanResult:
    """``journalctl -o json`` lines, one entry at a time (journal exports are small)."""
    result = ScanResult(lines=lines)
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = parse_journal_json(loads_json(line))
        except (ValueError, TypeError):
            result.parse_errors += 1
            continue
        if rec is None:
            continue
        try:
            fence = parse_fence(rec.message, prefixes)
        except FenceParseError:
            result.parse_errors += 1
            continue
        if fence is None:
            continue
        result.max_ts = max(result.max_ts, rec.ts)
        if not rec.trusted:
            result.forged += 1
            continue
        row = (
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
        result.rows.append(row)
    return result
