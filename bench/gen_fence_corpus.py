"""Generate a syslog kern.log corpus of EGRESS_FENCE lines for throughput benchmarks.

    python bench/gen_fence_corpus.py --lines 2000000 --out bench/out/kern.log --seed 1

RFC3164 lines as rsyslog writes them (``Nov 30 19:07:05 host kernel: [  455.929995] MSG``),
laid out as nf_log_syslog prints them: mixed IPv4/IPv6, TCP/UDP/ICMP, thousands of distinct
destinations and ports, about 10% other kernel lines, a few lines from other programs and a
few malformed fence lines.  Deterministic for a seed.  Writes ``OUT.totals.json`` next to the
corpus with the true totals (well-formed fence lines, their bytes, distinct dst/port pairs),
which the benchmark checks every tool against.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import random
import time
from pathlib import Path

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
START = 1_796_065_625  # 2026-11-30T19:07:05Z
BATCH = 50_000

OTHER_KERNEL = (
    "usb 1-1: new high-speed USB device number 4 using xhci_hcd",
    'audit: type=1400 audit(1764529625.123:42): apparmor="DENIED" operation="open"',
    "IPv6: ADDRCONF(NETDEV_CHANGE): veth1: link becomes ready",
    "TCP: request_sock_TCP: Possible SYN flooding on port 8080. Sending cookies.",
    "eth0: renamed from veth7c1d2e",
    "EXT4-fs (sda1): mounted filesystem with ordered data mode. Quota mode: none.",
    "nf_conntrack: nf_conntrack: table full, dropping packet",
    "EGRESS_FENCF IN= OUT=eth0 SRC=10.99.0.2 DST=10.0.0.1 LEN=60 almost a fence line",
)
OTHER_PROGRAMS = (
    "systemd[1]: Started session-42.scope - Session 42 of User root.",
    "sshd[2211]: EGRESS_FENCE IN= OUT=eth0 SRC=10.99.0.2 DST=10.20.0.1 LEN=9999 not kernel",
    "CRON[901]: (root) CMD (command -v debian-sa1 > /dev/null && debian-sa1 1 1)",
)
MALFORMED = (
    "EGRESS_FENCE IN= OUT=eth0 SRC=10.99.0.2 DST=",
    "EGRESS_FENCE IN= OUT=eth0 SRC=10.99.0.2 DST=10.20.0.1 LEN=abc TOS=0x00 PROTO=TCP ",
    "EGRESS_FENCE IN= OUT=eth0 SRC=10.99.0.2 LEN=60 DST=10.20.0.1 TOS=0x00 PREC=0x00 TTL=64 ID=1 PROTO=UDP ",
    "EGRESS_FENCE garbage",
)


def _destinations(rng: random.Random) -> list[tuple[str, bool, tuple[int, ...]]]:
    """(address as the kernel prints it, is IPv6, the TCP ports it serves): a registry proxy
    range, DNS servers, a long tail of internet hosts, IPv6 hosts printed fully expanded."""
    common = (443, 443, 443, 80, 8080, 22, 5432, 6379, 9418)

    def ports() -> tuple[int, ...]:
        # Each host serves a port or two; a third of them an unusual high port.
        return tuple(
            rng.randrange(1024, 65536) if rng.random() < 0.3 else rng.choice(common)
            for _ in range(rng.randint(1, 2))
        )

    dsts = [
        (f"10.20.{rng.randrange(4)}.{rng.randrange(1, 255)}", False, (443, 3128)) for _ in range(40)
    ]
    dsts += [("10.96.0.10", False, (53,)), ("1.1.1.1", False, (53, 443)), ("8.8.8.8", False, (53,))]
    dsts += [
        (str(ipaddress.IPv4Address(rng.randrange(0x01000000, 0xDF000000))), False, ports())
        for _ in range(3000)
    ]
    for _ in range(600):
        raw = (
            (0x20010DB8 << 96) | rng.getrandbits(64) if rng.random() < 0.9 else rng.getrandbits(128)
        )
        dsts.append((ipaddress.IPv6Address(raw).exploded, True, ports()))
    return dsts


def generate(
    lines: int, out: Path, seed: int, stamps: str = "rfc3164", flows: int = 0
) -> dict[str, int]:
    rng = random.Random(seed)
    dsts = _destinations(rng)
    hot = dsts[:43]  # proxy + DNS: most of the traffic goes there
    udp_ports = [53] * 7 + [123, 443, 4789] + [rng.randrange(1024, 65536) for _ in range(200)]
    # A node has one or two fence rules and one uplink, plus a bridge for the sandboxes.
    prefixes = ("EGRESS_FENCE ",) * 6 + ("EGRESS_FENCE: ",)
    outs = ("eth0",) * 4 + ("veth9a",)
    src4, src6 = "10.99.0.2", "2001:0db8:0063:0000:0000:0000:0000:0002"
    packets = total_bytes = 0
    pairs: set[tuple[str, int | None]] = set()
    t = float(START)
    uptime = 455.929995
    rnd = rng.random
    randrange = rng.randrange
    choice = rng.choice
    last_sec = -1
    stamp = ""

    Flow = tuple[str, bool, tuple[int, ...], float, str, str, int, bool]

    def draw_flow() -> Flow:
        """(dst, v6, ports served, kind, prefix, out, dpt, owned); dpt and owned are drawn
        with the packet in the open mix (-1, False here), in the order the corpus always
        drew them, so a seed still makes the same corpus."""
        dst, v6, served = choice(hot) if rnd() < 0.5 else choice(dsts)
        return (dst, v6, served, rnd(), choice(prefixes), choice(outs), -1, False)

    def packet(flow: Flow, fixed: bool) -> tuple[str, int, int | None]:
        dst, v6, served, kind, pfx, o, dpt_fixed, owned = flow
        src = src6 if v6 else src4
        dpt: int | None
        if kind < 0.15:  # UDP, mostly DNS
            dpt = dpt_fixed if fixed else choice(udp_ports)
            ulen = randrange(20, 1400)
            length = ulen + (40 if v6 else 20)
            l4 = f"PROTO=UDP SPT={randrange(32768, 61000)} DPT={dpt} LEN={ulen} "
        elif kind < 0.2:  # ICMP echo
            dpt = None
            length = 84 if not v6 else 104
            icmp = "ICMPv6 TYPE=128" if v6 else "ICMP TYPE=8"
            l4 = f"PROTO={icmp} CODE=0 ID={randrange(65536)} SEQ={randrange(1, 200)} "
        else:  # TCP
            dpt = dpt_fixed if fixed else choice(served)
            length = choice((52, 60, 1500, 1500, 1500, randrange(40, 1500)))
            flags = choice(("ACK ", "ACK PSH ", "SYN ", "ACK FIN ", "ACK PSH "))
            l4 = (
                f"PROTO=TCP SPT={randrange(32768, 61000)} DPT={dpt} WINDOW={randrange(65536)} "
                f"RES=0x00 {flags}URGP=0 "
            )
        if v6:
            ip = f"TC=0 HOPLIMIT=64 FLOWLBL={randrange(1 << 20)} "
        else:
            ip = f"TOS=0x00 PREC=0x00 TTL=64 ID={randrange(65536)} DF "
        has_owner = owned if fixed else rnd() < 0.6
        owner = "UID=1000 GID=1000 " if has_owner else ""
        line = f"{pfx}IN= OUT={o} SRC={src} DST={dst} LEN={length} {ip}{l4}{owner}"
        return line, length, dpt

    # --flows: a fixed set of distinct flow identities to draw every fence line from.
    pool: list[Flow] = []
    seen: set[tuple[object, ...]] = set()
    while len(pool) < flows:
        dst, v6, served, kind, pfx, o, _, _ = draw_flow()
        dpt = choice(udp_ports) if kind < 0.15 else -1 if kind < 0.2 else choice(served)
        proto = "udp" if kind < 0.15 else "icmp" if kind < 0.2 else "tcp"
        flow = (dst, v6, served, kind, pfx, o, dpt, rnd() < 0.6)
        key = (dst, proto, dpt, o, flow[7], pfx.strip())
        if key not in seen:
            seen.add(key)
            pool.append(flow)

    with out.open("w", encoding="ascii") as fh:
        done = 0
        while done < lines:
            chunk = []
            for _ in range(min(BATCH, lines - done)):
                step = rng.expovariate(200.0)  # ~200 lines/s on average
                t += step
                uptime += step
                sec = int(t)
                if stamps == "rfc3339":  # RSYSLOG_FileFormat: microseconds, numeric zone
                    if sec != last_sec:
                        last_sec = sec
                        g = time.gmtime(sec)
                        day = time.strftime("%Y-%m-%dT%H:%M:%S", g)
                    stamp = f"{day}.{int((t - sec) * 1e6):06d}+00:00"
                elif sec != last_sec:  # gmtime per line would dominate the run
                    last_sec = sec
                    g = time.gmtime(sec)
                    stamp = f"{MONTHS[g.tm_mon - 1]} {g.tm_mday:2d} {g.tm_hour:02d}:{g.tm_min:02d}:{g.tm_sec:02d}"
                head = f"{stamp} node-7 kernel: [{uptime:12.6f}] "
                r = rnd()
                if r < 0.09:
                    chunk.append(head + choice(OTHER_KERNEL))
                    continue
                if r < 0.0999:
                    chunk.append(f"{stamp} node-7 {choice(OTHER_PROGRAMS)}")
                    continue
                if r < 0.1:
                    chunk.append(head + choice(MALFORMED))
                    continue
                line, length, dpt = (
                    packet(choice(pool), True) if pool else packet(draw_flow(), False)
                )
                chunk.append(head + line)
                packets += 1
                total_bytes += length
                pairs.add((line.split(" DST=", 1)[1].split(" ", 1)[0], dpt))
            fh.write("\n".join(chunk) + "\n")
            done += len(chunk)
    totals = {
        "lines": lines,
        "packets": packets,
        "bytes": total_bytes,
        "dst_port_pairs": len(pairs),
        "flows": len(pool) or None,
        "stamps": stamps,
    }
    Path(str(out) + ".totals.json").write_text(json.dumps(totals) + "\n")
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stamps", choices=["rfc3164", "rfc3339"], default="rfc3164")
    ap.add_argument("--flows", type=int, default=0, help="distinct flows (default: open mix)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    totals = generate(args.lines, args.out, args.seed, args.stamps, args.flows)
    print(json.dumps({**totals, "seconds": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    main()
