"""Parser for netfilter LOG / nftables ``log`` lines (nf_log_syslog format).

Interface:

``parse_fence(message, prefixes) -> FenceRecord | None``
    ``message`` is the record text after any record header (kmsg ``PRI,SEQ,USEC,FLAGS;``,
    dmesg ``[  12.345]``, syslog ``... kernel: ``).  Returns None when the message does not
    start with one of ``prefixes`` (not a fence record: not an error).  Raises
    ``FenceParseError`` when a prefix matches but the rest is not a well-formed LOG line.
    No other exception escapes, whatever the input.

The layout follows net/netfilter/nf_log_syslog.c (Linux 6.18), which writes, in order::

    <prefix>IN=<if> OUT=<if> [PHYSIN=<if> ][PHYSOUT=<if> ]
    [MAC=<hex:hex..>[ TUNNEL=a->b] | MACSRC=.. MACDST=.. [VPROTO=.. VID=.. ]MACPROTO=.. ]
    SRC=<addr> DST=<addr> LEN=<n>
      IPv4: TOS=0x.. PREC=0x.. TTL=n ID=n [CE ][DF ][MF ][FRAG:n ][OPT (HEX) ]
      IPv6: TC=n HOPLIMIT=n FLOWLBL=n [extension headers, e.g. FRAG:n [INCOMPLETE ]ID:hex ]
    PROTO=TCP SPT= DPT= [SEQ= ACK= ]WINDOW= RES=0x.. [AE CWR ECE URG ACK PSH RST SYN FIN ]URGP=
          [OPT (HEX) ]
    PROTO=UDP|UDPLITE SPT= DPT= LEN=          (the second LEN: the UDP length)
    PROTO=ICMP|ICMPv6 TYPE= CODE= [ID= SEQ= | [<inner packet>] ...]   (ID repeats the IP ID)
    PROTO=<number>                            (SCTP is printed as PROTO=132, without ports)
    [INCOMPLETE [n bytes] ] [UID=n GID=n ][MARK=0x.. ]

Keys repeat (LEN, ID, SRC/DST inside an ICMP error's quoted packet): the first occurrence at
the top level is the packet's own; PROTO is the first one after LEN; UID/GID the last pair of
the line (the kernel prints them last, only MARK may follow).  Fragments and truncated headers leave the ports out; an
IPv6 packet with an unknown extension header has no PROTO at all (``proto`` is then "").
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache

MAX_LINE = 64 * 1024  # the kernel's LOG buffer is 1 KiB; anything this long is not its output

# Shared with alarm.collectors.kernel.fastscan, which must read a line exactly as parse_fence does.  Written
# for Python's regex engine: no quantified groups ("(?:x)?" allocates a repeat context per
# attempt; "(?:x|)" does not), and the kernel's usual layouts tried before the general case.
#
# IP header fields up to the first PROTO= (a quoted packet only ever comes after it): IPv4,
# IPv6 without extension headers, else anything that is not "PROTO=".
NET_SKIP = (
    r"(?:TOS=0x\w\w PREC=0x\w\w TTL=\d{1,3} ID=\d{1,5} [CDEFM ]{0,9}"
    r"|TC=\d{1,3} HOPLIMIT=\d{1,3} FLOWLBL=\d{1,7} "
    r"|[^P\n]{0,1100}(?:P(?!ROTO=)[^P\n]{0,1100}){0,40})"
)
# Socket owner: the last "UID=n GID=n" of the line (it comes last; only MARK may follow).
OWNER = r"[^\n]*UID=(\d{1,10}) GID=(\d{1,10})(?!\S)"

# One pass over the common layout.  Every quantifier is bounded, so a hostile line costs
# linear time, and every digit run is short enough for int() (no 4300-digit limit error).
FENCE_RE = re.compile(
    r"IN=(\S*) OUT=(\S*) "
    # Link layer and bridge ports: only on input/forward paths, so try "absent" first.
    r"(?:|([^\n]{0,400}?) )"
    r"SRC=(\S{1,64}) DST=(\S{1,64}) LEN=(\d{1,10}) "
    r"(?:" + NET_SKIP + r"PROTO=(\S{1,16}) "
    r"(?:SPT=(\d{1,5}) DPT=(\d{1,5}) "
    r"(?:(?:SEQ=\d{1,10} ACK=\d{1,10} |)WINDOW=\d{1,5} RES=0x\w\w? ([A-Z ]{0,40})URGP=\d{1,5} |)"
    r"|TYPE=(\d{1,3}) CODE=(\d{1,3}) |)"
    r"|)",
    re.ASCII,
)
OWNER_RE = re.compile(OWNER, re.ASCII)
MARK_RE = re.compile(r"(?<!\S)MARK=0x([0-9a-fA-F]{1,8})(?!\S)", re.ASCII)
_MAC_RE = re.compile(r"(?:^| )MAC=(\S*)", re.ASCII)
_MACDECODE_RE = re.compile(r"MACSRC=(\S+) MACDST=(\S+) (?:VPROTO=\S+ VID=\d+ )?MACPROTO=(\S+)")


class FenceParseError(ValueError):
    pass


@dataclass(slots=True)
class FenceRecord:
    prefix: str  # the configured prefix that matched, e.g. "EGRESS_FENCE"
    log_prefix: str  # the full free-text prefix before " IN=", stripped, e.g. "EGRESS_FENCE T1"
    in_if: str
    out_if: str
    src: str  # canonical text form (IPv6 compressed, as ipaddress prints it)
    dst: str
    length: int  # first LEN=: the IP packet's size on the wire
    proto: str  # "TCP", "UDP", "ICMP", "ICMPv6", or the number/name the kernel printed
    spt: int | None = None
    dpt: int | None = None
    uid: int | None = None
    gid: int | None = None
    mark: int | None = None
    mac: str | None = None
    icmp_type: int | None = None
    icmp_code: int | None = None
    tcp_flags: tuple[str, ...] = ()


# A bounded memo of a pure function (not state: results never depend on what was cached).
# The kernel prints IPv6 fully expanded, and ipaddress costs microseconds per call, while a
# fence log repeats a few thousand destinations millions of times.
@lru_cache(maxsize=1 << 14)
def canonical_ip(text: str) -> str:
    """The address as ``ipaddress`` prints it (IPv6 compressed); ValueError if invalid."""
    return ipaddress.ip_address(text).compressed


def match_prefix(message: str, prefixes: tuple[str, ...]) -> str | None:
    """The longest configured prefix ``message`` starts with."""
    if not message.startswith(prefixes):  # one C call rejects the non-fence majority
        return None
    best = ""
    for p in prefixes:
        if len(p) >= len(best) and message.startswith(p):
            best = p
    return best


def _diagnose(message: str) -> str:
    for key in ("IN=", "OUT=", "SRC=", "DST=", "LEN="):
        if key not in message:
            return f"no {key}"
    if re.search(r"(?<!\S)LEN=\d", message, re.ASCII) is None:
        return "LEN is not an integer"
    return "fields out of order or malformed"


def _mac(l2: str) -> str | None:
    """The link-layer header as ``MAC=`` prints it (dst:src:type for Ethernet)."""
    m = _MAC_RE.search(l2)
    if m is not None:
        return m[1]
    m = _MACDECODE_RE.search(l2)
    if m is not None and len(m[3]) == 4:
        return f"{m[2]}:{m[1]}:{m[3][:2]}:{m[3][2:]}"
    return None


def parse_fence(message: str, prefixes: tuple[str, ...]) -> FenceRecord | None:
    if not message.startswith(prefixes):  # one C call rejects the non-fence majority
        return None
    prefix = prefixes[0] if len(prefixes) == 1 else match_prefix(message, prefixes)
    if prefix is None:  # unreachable, but keeps the type checker honest
        return None
    if len(message) > MAX_LINE:
        raise FenceParseError(f"line of {len(message)} characters")
    if not message.endswith(" "):
        message += " "  # syslog daemons may strip the kernel's trailing space
    m = FENCE_RE.search(message, len(prefix))
    if m is None:
        raise FenceParseError(f"{_diagnose(message)}: {message[:120]!r}")
    try:
        src = canonical_ip(m[4])
        dst = canonical_ip(m[5])
    except ValueError:
        raise FenceParseError(f"bad address: {message[:160]!r}") from None
    end = m.end()
    uid = gid = mark = None
    if message.find("UID=", end) >= 0:
        um = OWNER_RE.match(message, end)
        if um is not None:
            uid, gid = int(um[1]), int(um[2])
    if message.find("MARK=", end) >= 0:
        mm = MARK_RE.search(message, end)
        if mm is not None:
            mark = int(mm[1], 16)
    in_if, out_if, l2, _, _, length, proto, spt, dpt, tfl, itype, icode = m.groups()
    return FenceRecord(
        prefix,
        message[: m.start()].strip(),
        in_if,
        out_if,
        src,
        dst,
        int(length),
        proto or "",
        None if spt is None else int(spt),
        None if dpt is None else int(dpt),
        uid,
        gid,
        mark,
        None if l2 is None else _mac(l2),
        None if itype is None else int(itype),
        None if icode is None else int(icode),
        tuple(tfl.split()) if tfl else (),
    )
