#!/usr/bin/env python3
"""Figure: backlog catch-up — the installed service started on a kern.log that already holds
one hour of a steady 10k fence records/s (36M lines): time until it is live, and its peak RSS.

    python bench/backlog_catchup.py [--seconds 3600] [--rate 10000] [--runs 1] [--keep DIR]

1. Generates the kern.log (into a temp dir, or ``--keep DIR`` to keep and reuse it) with a
   small C helper compiled with gcc at bench time (Python formatting 36M lines would take
   minutes; the helper writes them in 8 MiB blocks at disk speed).  Lines are what rsyslog
   writes on Debian 12 (RSYSLOG_FileFormat, RFC3339 with microseconds, UTC) around what
   nf_log_syslog prints for the ``log prefix "EGRESS_FENCE "`` rule:
   ``2026-11-30T19:07:05.000100+00:00 node-7 kernel: [ 4321.000100] EGRESS_FENCE IN= OUT=eth0
   SRC=10.99.0.2 DST=10.20.1.7 LEN=1500 TOS=0x00 PREC=0x00 TTL=64 ID=4242 DF PROTO=TCP ...``.
   ``--rate`` records in every second, evenly spaced, for ``--seconds`` seconds ending when the
   file is written; 200 destinations (IPv4 and fully expanded IPv6; TCP, UDP, ICMP) in five
   groups: four declared surfaces (registry-proxy, dns, git, web) and what matches none
   (``unclassified``).  The helper counts packets and bytes per flow, so the expected bytes of
   every surface are known without capalarm's classifier.
2. Starts the installed ``capalarm run --config ...`` (the console script next to this
   interpreter; the repo is appended to ``sys.path`` after site-packages, so this script too
   imports the installed package) with one ``type: file`` source reading the log from its
   first byte (``start_at_end: false``, the default), tick 10 s, a state dir in the temp dir and
   http on a free loopback port.
3. Time to live: from the process start until a scrape of /metrics shows the service live —
   ``capalarm_source_caught_up{source="kern"} == 1``, ``capalarm_source_records_read_total``
   equal to the lines written, ``capalarm_open_ticks == 0``, and
   ``capalarm_last_tick_timestamp_seconds`` (end of the last evaluated tick, event time) both
   past the last backlog record's tick and within one tick (+ 2 s) of the wall clock: every
   backlog tick is evaluated and the service ticks on wall-clock time.  /metrics is scraped
   every 0.25 s, so the figure is exact to about that.  Peak RSS: ``VmHWM`` of the service
   process from /proc/PID/status, read once it is live.
4. Exactness, from the same /metrics: bytes and events summed over the egress surfaces equal
   what the generator wrote, and per surface; records lost (known and unknown), parse
   errors, late and future events and skipped backlog cells are 0; ``capalarm_ticks_total``
   is one per tick from the first record's tick to the last evaluated (none twice, none
   skipped).
5. Anchors on the same file in the same invocation: ``cat FILE > /dev/null`` (raw read, the
   floor of any reader), the native scanner alone on one core over 16 MiB blocks of whole
   lines (the parser's floor; its totals are checked too), and ``capalarm backtest`` of the
   same file and config (the same pipeline on recorded input with a simulated clock).  The
   scanner anchor is the call the file source's chunk reader makes on every poll's lines
   (``fastscan.scan_live``, through ``FenceReader.read_chunk``): C alone, nothing else.  It
   returns the lines the C scanner could not read with certainty, which the file source
   would hand to the per-line regex path; the anchor does not read those, counts them and
   prints them as "handed back" (and its totals are then short, which is reported).  Before,
   the anchor called ``scan_flows``, which sends what the C scanner hands back through the
   regex path: when the C scanner could not read RFC 3339 stamps (every line of this file
   handed back), the "native scanner alone" figure was the regex path's (2026-12-03: 19.7 s
   for 3M lines, ~152k lines/s, the regex rate), and nothing said so.

Which scanner path ran: the service exports none, so the script asks the service's own
interpreter (the console script's ``#!``, started outside the repo) what it imports:
``alarm.collectors.kernel.fastscan.native_available()`` — the file source then reads every
poll's lines with ``scan_live``, the anchor's call, and takes the per-line path only for the
lines it hands back; the anchor's count of handed-back lines is how many of the service's
lines took that path.

``--runs N`` runs the service N times on the same file (a fresh state dir each) and prints the
median; the default, 1, because the full figure is long.  Needs gcc.  Exits 1 when a run is not
live within ``--timeout`` or a count is not exact.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.append(
    str(Path(__file__).resolve().parents[1])
)  # after site-packages: an installed capalarm is what runs

from prometheus_client.parser import text_string_to_metric_families

TICK = 10.0
SOURCE = "kern"
PREFIX = "EGRESS_FENCE"
SCRAPE_EVERY = 0.25
ANCHOR_BLOCK = 16 << 20
GENERATOR_VERSION = 1  # bump when the helper's output changes: kept files are regenerated

# Surfaces in the config's order (first match wins), and the flow groups that go to each:
# (count of destinations, share of the records).  What matches no surface is "unclassified".
SURFACES: tuple[dict[str, Any], ...] = (
    {
        "name": "registry-proxy",
        "match": {"dst": ["10.20.0.0/16"], "dport": [443, 3128], "proto": ["tcp"]},
    },
    {"name": "dns", "match": {"dport": [53], "proto": ["udp"]}},
    {"name": "git", "match": {"dport": [22, 9418], "proto": ["tcp"]}},
    {"name": "web", "match": {"dport": [80, 443, 8080], "proto": ["tcp"]}},
)
UNCLASSIFIED = "unclassified"

GENERATOR_C = r"""
/* kern.log generator for bench/backlog_catchup.py: RATE fence lines a second, evenly spaced,
   for SECONDS seconds from START (unix seconds), flows drawn by weight from SPEC.
   SPEC lines: "dst v6 proto dport weight" (proto 0 tcp, 1 udp, 2 icmp; dport -1 for icmp).
   Prints "lines N", "file_bytes N" and one "flow I PACKETS BYTES" line per flow. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#define MAXFLOWS 4096
#define BUFSZ (8u << 20)
#define TABLE 65536

typedef struct { char dst[64]; int v6, proto, dport; double weight; uint64_t packets, bytes; } flow_t;

static flow_t flows[MAXFLOWS];
static uint16_t table[TABLE];
static uint64_t rng_state;
static char *buf;
static size_t pos;
static uint64_t file_bytes;
static int out_fd;

static uint64_t next64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint32_t below(uint32_t n) { return (uint32_t)(((next64() >> 32) * (uint64_t)n) >> 32); }

static void flush_buf(void) {
    size_t off = 0;
    while (off < pos) {
        ssize_t w = write(out_fd, buf + off, pos - off);
        if (w < 0) { perror("write"); exit(1); }
        off += (size_t)w;
    }
    file_bytes += pos;
    pos = 0;
}
static inline void put(const char *s, size_t n) { memcpy(buf + pos, s, n); pos += n; }
#define PUTS(lit) put(lit, sizeof(lit) - 1)
static inline void putu(uint64_t v) {
    char t[24]; int i = 24;
    do { t[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    put(t + i, (size_t)(24 - i));
}
static inline void putu_width(uint64_t v, int width, char pad) {
    char t[24]; int i = 24;
    do { t[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    while (24 - i < width) t[--i] = pad;
    put(t + i, (size_t)(24 - i));
}

static const char *tcp_flags[] = {"ACK ", "ACK PSH ", "SYN ", "ACK FIN ", "ACK PSH "};
static const int tcp_lengths[] = {52, 60, 1500, 1500, 1500, 0};

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: gen OUT SPEC START SECONDS RATE SEED\n"); return 2; }
    const char *out = argv[1];
    FILE *spec = fopen(argv[2], "r");
    if (!spec) { perror(argv[2]); return 1; }
    long long start = atoll(argv[3]), seconds = atoll(argv[4]), rate = atoll(argv[5]);
    rng_state = strtoull(argv[6], NULL, 10) * 0x2545F4914F6CDD1Dull + 1;
    int n = 0;
    while (n < MAXFLOWS && fscanf(spec, "%63s %d %d %d %lf", flows[n].dst, &flows[n].v6,
                                  &flows[n].proto, &flows[n].dport, &flows[n].weight) == 5) n++;
    fclose(spec);
    if (n == 0 || rate <= 0 || seconds <= 0) { fprintf(stderr, "nothing to generate\n"); return 2; }
    double total = 0; for (int i = 0; i < n; i++) total += flows[i].weight;
    /* Each flow owns a share of a 64k table proportional to its weight (at least one slot). */
    int slot = 0;
    for (int i = 0; i < n; i++) {
        double upto = 0; for (int j = 0; j <= i; j++) upto += flows[j].weight;
        int end = i == n - 1 ? TABLE : (int)(upto / total * TABLE);
        if (end <= slot) end = slot + 1;
        while (slot < end && slot < TABLE) table[slot++] = (uint16_t)i;
    }
    out_fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out_fd < 0) { perror(out); return 1; }
    buf = malloc(BUFSZ);
    if (!buf) return 1;
    const uint64_t boot_us = 4321ull * 1000000ull; /* kernel uptime at START */
    char stamp[32];
    for (long long s = 0; s < seconds; s++) {
        time_t t = (time_t)(start + s);
        struct tm g;
        gmtime_r(&t, &g);
        strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S.", &g);
        size_t stamp_len = strlen(stamp);
        for (long long k = 0; k < rate; k++) {
            if (pos > BUFSZ - 1024) flush_buf();
            uint64_t usec = (uint64_t)(k * 1000000 / rate);
            uint64_t up = boot_us + (uint64_t)s * 1000000ull + usec;
            flow_t *f = &flows[table[next64() & (TABLE - 1)]];
            put(stamp, stamp_len);
            putu_width(usec, 6, '0');
            PUTS("+00:00 node-7 kernel: [");
            putu_width(up / 1000000, 5, ' ');
            PUTS(".");
            putu_width(up % 1000000, 6, '0');
            PUTS("] EGRESS_FENCE IN= OUT=eth0 SRC=");
            if (f->v6) PUTS("2001:0db8:0063:0000:0000:0000:0000:0002"); else PUTS("10.99.0.2");
            PUTS(" DST=");
            put(f->dst, strlen(f->dst));
            unsigned length, ulen = 0;
            if (f->proto == 0) {
                int pick = tcp_lengths[below(6)];
                length = pick ? (unsigned)pick : 40 + below(1461);
            } else if (f->proto == 1) {
                ulen = f->dport == 53 ? 28 + below(484) : 20 + below(1380);
                length = ulen + (f->v6 ? 40 : 20);
            } else {
                length = f->v6 ? 104 : 84;
            }
            PUTS(" LEN="); putu(length);
            if (f->v6) { PUTS(" TC=0 HOPLIMIT=64 FLOWLBL="); putu(below(1u << 20)); PUTS(" "); }
            else { PUTS(" TOS=0x00 PREC=0x00 TTL=64 ID="); putu(below(65536)); PUTS(" DF "); }
            if (f->proto == 0) {
                PUTS("PROTO=TCP SPT="); putu(32768 + below(28232));
                PUTS(" DPT="); putu((uint64_t)f->dport);
                PUTS(" WINDOW="); putu(below(65536));
                PUTS(" RES=0x00 ");
                const char *fl = tcp_flags[below(5)];
                put(fl, strlen(fl));
                PUTS("URGP=0 ");
            } else if (f->proto == 1) {
                PUTS("PROTO=UDP SPT="); putu(32768 + below(28232));
                PUTS(" DPT="); putu((uint64_t)f->dport);
                PUTS(" LEN="); putu(ulen); PUTS(" ");
            } else {
                if (f->v6) PUTS("PROTO=ICMPv6 TYPE=128 CODE=0 ID="); else PUTS("PROTO=ICMP TYPE=8 CODE=0 ID=");
                putu(below(65536)); PUTS(" SEQ="); putu(1 + below(200)); PUTS(" ");
            }
            if (below(10) < 6) PUTS("UID=1000 GID=1000 ");
            buf[pos++] = '\n';
            f->packets++;
            f->bytes += length;
        }
    }
    flush_buf();
    if (close(out_fd) != 0) { perror("close"); return 1; }
    printf("lines %lld\nfile_bytes %llu\n", seconds * rate, (unsigned long long)file_bytes);
    for (int i = 0; i < n; i++)
        printf("flow %d %llu %llu\n", i, (unsigned long long)flows[i].packets,
               (unsigned long long)flows[i].bytes);
    return 0;
}
"""


@dataclass(frozen=True, slots=True)
class Flow:
    dst: str
    v6: bool
    proto: str  # "tcp", "udp", "icmp"
    dport: int | None
    weight: float
    surface: str  # where the config's first matching rule puts it


@dataclass(slots=True)
class Backlog:
    path: Path
    start: int  # unix seconds of the first record
    seconds: int
    rate: int
    lines: int
    file_bytes: int
    surface_bytes: dict[str, int]
    surface_events: dict[str, int]
    generated_in: float | None  # None: reused from --keep

    @property
    def records(self) -> int:
        return sum(self.surface_events.values())

    @property
    def nbytes(self) -> int:
        return sum(self.surface_bytes.values())

    @property
    def end(self) -> int:
        return self.start + self.seconds


# What kern.log.json keeps of a Backlog, to reuse a kept file.
SAVED = ("start", "seconds", "rate", "lines", "file_bytes", "surface_bytes", "surface_events")


@dataclass(slots=True)
class Run:
    live_after: float
    read_after: float  # every line read (records_read == lines), before the last ticks closed
    peak_rss: int  # bytes (VmHWM)
    metrics: dict[str, float]
    problems: list[str] = field(default_factory=list)


# -- the flows and the generator ---------------------------------------------------------------


def public_ipv4(rng: random.Random, taken: set[str]) -> str:
    """A unicast internet address (not private, loopback or in the registry-proxy range)."""
    while True:
        a, b, c, d = (
            rng.randrange(11, 224),
            rng.randrange(256),
            rng.randrange(256),
            rng.randrange(1, 255),
        )
        if (a == 172 and 16 <= b < 32) or (a == 192 and b == 168) or a == 127 or a == 100:
            continue
        addr = f"{a}.{b}.{c}.{d}"
        if addr not in taken:
            taken.add(addr)
            return addr


def ipv6_exploded(rng: random.Random) -> str:
    """A 2001:db8::/32 address as nf_log prints it (%pI6: every group, four digits)."""
    raw = (0x20010DB8 << 96) | rng.getrandbits(64)
    return ":".join(f"{(raw >> s) & 0xFFFF:04x}" for s in range(112, -1, -16))


def flows(seed: int) -> list[Flow]:
    """200 destinations: a registry proxy range, DNS, git hosts, web (IPv4 and IPv6) and a
    tail that matches no surface; within each group a Zipf-like spread of weights."""
    rng = random.Random(seed)
    taken: set[str] = set()
    out: list[Flow] = []

    def group(share: float, members: list[tuple[str, bool, str, int | None]], surface: str) -> None:
        zipf = [1 / (rank + 1) for rank in range(len(members))]
        for (dst, v6, proto, dport), z in zip(members, zipf, strict=True):
            out.append(Flow(dst, v6, proto, dport, share * z / sum(zipf), surface))

    proxy = []
    while len(proxy) < 40:
        addr = f"10.20.{rng.randrange(4)}.{rng.randrange(1, 255)}"
        if addr not in taken:
            taken.add(addr)
            proxy.append((addr, False, "tcp", 443 if len(proxy) < 30 else 3128))
    group(0.45, proxy, "registry-proxy")
    dns = [(a, False, "udp", 53) for a in ("10.96.0.10", "1.1.1.1", "8.8.8.8")]
    group(0.12, dns, "dns")
    git = [(public_ipv4(rng, taken), False, "tcp", 22 if i < 6 else 9418) for i in range(12)]
    group(0.05, git, "git")
    web: list[tuple[str, bool, str, int | None]] = []
    for i in range(120):
        port = 443 if i % 4 < 2 or i % 12 == 3 else (80 if i % 12 != 7 else 8080)
        if i % 6 == 5:
            web.append((ipv6_exploded(rng), True, "tcp", port))
        else:
            web.append((public_ipv4(rng, taken), False, "tcp", port))
    group(0.33, web, "web")
    tail: list[tuple[str, bool, str, int | None]] = []
    tail += [(public_ipv4(rng, taken), False, "icmp", None) for _ in range(5)]
    tail += [(ipv6_exploded(rng), True, "icmp", None) for _ in range(2)]
    tail += [(public_ipv4(rng, taken), False, "udp", p) for p in (123, 123, 4789, 443, 51820, 3478)]
    tail += [
        (public_ipv4(rng, taken), False, "tcp", p)
        for p in (5432, 6379, 25, 3389, 8443, 9000, 27017, 6443, 1194, 2222, 4444, 31337)
    ]
    group(0.05, tail, UNCLASSIFIED)
    assert len({f.dst for f in out}) == 200, "200 distinct destinations"
    return out


def compile_generator(work: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        sys.exit("backlog_catchup: needs gcc for its generator (apt-get install gcc)")
    src, exe = work / "gen_backlog.c", work / "gen_backlog"
    src.write_text(GENERATOR_C)
    subprocess.run([gcc, "-O2", "-Wall", "-o", str(exe), str(src)], check=True)
    return exe


def generate(where: Path, work: Path, seconds: int, rate: int, seed: int) -> Backlog:
    """Write the kern.log into ``where`` (or reuse the one there, if it was made with these
    parameters less than a day ago) and return what it holds."""
    log, meta_path = where / "kern.log", where / "kern.log.json"
    params = {"seconds": seconds, "rate": rate, "seed": seed, "version": GENERATOR_VERSION}
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        meta = json.loads(meta_path.read_text())
        fresh = time.time() - meta["start"] - seconds < 86400
        if meta["params"] == params and fresh and log.stat().st_size == meta["file_bytes"]:
            return Backlog(log, **{k: meta[k] for k in SAVED}, generated_in=None)
    table = flows(seed)
    spec = work / "flows.txt"
    proto_code = {"tcp": 0, "udp": 1, "icmp": 2}
    spec.write_text(
        "".join(
            f"{f.dst} {int(f.v6)} {proto_code[f.proto]} {-1 if f.dport is None else f.dport} "
            f"{f.weight!r}\n"
            for f in table
        )
    )
    exe = compile_generator(work)
    start = int(time.time()) - seconds  # the backlog ends now: the service was down an hour
    t0 = time.perf_counter()
    cmd = [str(exe), str(log), str(spec), str(start), str(seconds), str(rate), str(seed)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    elapsed = time.perf_counter() - t0
    counts: dict[str, int] = {}
    surface_bytes = {s["name"]: 0 for s in SURFACES} | {UNCLASSIFIED: 0}
    surface_events = dict.fromkeys(surface_bytes, 0)
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "flow":
            f = table[int(parts[1])]
            surface_events[f.surface] += int(parts[2])
            surface_bytes[f.surface] += int(parts[3])
        else:
            counts[parts[0]] = int(parts[1])
    backlog = Backlog(
        log,
        start,
        seconds,
        rate,
        counts["lines"],
        counts["file_bytes"],
        surface_bytes,
        surface_events,
        elapsed,
    )
    meta = {k: getattr(backlog, k) for k in SAVED}
    meta_path.write_text(json.dumps({**meta, "params": params}) + "\n")
    return backlog


# -- the service --------------------------------------------------------------------------------


def service_command() -> list[str]:
    """The installed console script: next to this interpreter, else on PATH (a pyenv shim
    would put its own process in front), else ``python -m alarm.cli``."""
    here = Path(sys.executable).parent / "capalarm"
    exe = str(here) if here.exists() else shutil.which("capalarm")
    return [exe] if exe else [sys.executable, "-m", "alarm.cli"]


def service_python(cmd: list[str]) -> str:
    """The interpreter the service runs under (the console script's #! line)."""
    if len(cmd) > 1:
        return cmd[0]
    with open(cmd[0], "rb") as fh:
        first = fh.readline().decode(errors="replace").strip()
    return first[2:].split()[0] if first.startswith("#!") else sys.executable


def scanner_path(python: str, cwd: Path) -> tuple[str, str]:
    """('native' or 'regex', where alarm was imported from), as the service's interpreter sees
    it from outside the repo."""
    probe = (
        "import alarm; from alarm.collectors.kernel.fastscan import native_available; "
        "print('native' if native_available() else 'regex', alarm.__file__)"
    )
    out = subprocess.run([python, "-c", probe], cwd=cwd, capture_output=True, text=True, check=True)
    path, where = out.stdout.split(maxsplit=1)
    return path, str(Path(where.strip()).parent)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, log: Path, state: Path, port: int) -> None:
    config = {
        "tick": f"{TICK:g}s",
        "state_dir": str(state),
        "http": {"listen": f"127.0.0.1:{port}"},
        "sources": [{"name": SOURCE, "type": "file", "paths": [str(log)], "prefixes": [PREFIX]}],
        "surfaces": [{"kind": "egress", **s} for s in SURFACES],
    }
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML


def scrape(port: int) -> dict[str, float] | None:
    """Every sample of /metrics as ``name{k="v",...}`` (labels sorted) -> value."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def src(name: str) -> str:
    return f'capalarm_source_{name}{{source="{SOURCE}"}}'


def surface(name: str, metric: str) -> str:
    return f'capalarm_surface_{metric}{{kind="egress",surface="{name}"}}'


def vm_status(pid: int, key: str) -> int:
    """A ``Vm*`` line of /proc/PID/status, in bytes."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def is_live(m: dict[str, float], backlog: Backlog, now: float) -> bool:
    last_tick = m.get("capalarm_last_tick_timestamp_seconds", 0.0)
    backlog_last_tick_end = math.floor((backlog.end - 1e-6) / TICK) * TICK + TICK
    return (
        m.get(src("caught_up")) == 1
        and m.get(src("records_read_total")) == backlog.lines
        and m.get("capalarm_open_ticks") == 0
        and last_tick >= backlog_last_tick_end
        and now - last_tick < TICK + 2
    )


def run_service(backlog: Backlog, work: Path, cmd: list[str], timeout: float, n: int) -> Run:
    run_dir = work / f"run{n}"
    run_dir.mkdir()
    port = free_port()
    config = run_dir / "capalarm.json"
    write_config(config, backlog.path, run_dir / "state", port)
    log_path = run_dir / "capalarm.log"
    with log_path.open("w") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [*cmd, "run", "--config", str(config)],
            cwd=run_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    read_after = live_after = None
    last: dict[str, float] = {}
    next_progress = t0 + 30
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"capalarm exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
                )
            elapsed = time.monotonic() - t0
            if elapsed > timeout:
                raise TimeoutError(f"not live after {timeout:.0f} s; last scrape: {progress(last)}")
            m = scrape(port)
            if m is not None:
                last = m
                if read_after is None and m.get(src("records_read_total")) == backlog.lines:
                    read_after = time.monotonic() - t0
                if is_live(m, backlog, time.time()):
                    live_after = time.monotonic() - t0
                    break
            if time.monotonic() >= next_progress:
                next_progress += 30
                rss = vm_status(proc.pid, "VmRSS") >> 20
                print(f"  {elapsed:6.0f} s: {progress(last)}, RSS {rss} MiB", file=sys.stderr)
            time.sleep(SCRAPE_EVERY)
        peak = vm_status(proc.pid, "VmHWM")
        # One more scrape a tick later: the counts must stay exact while it ticks live.
        time.sleep(TICK)
        final = scrape(port) or last
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    run = Run(live_after, read_after or live_after, peak, final)
    run.problems = exactness(final, backlog)
    if "Traceback" in log_path.read_text():
        run.problems.append(f"a traceback in the service's log ({log_path})")
    return run


def progress(m: dict[str, float]) -> str:
    if not m:
        return "no scrape yet"
    last = m.get("capalarm_last_tick_timestamp_seconds", 0.0)
    return (
        f"{m.get(src('records_read_total'), 0):,.0f} lines read, "
        f"{m.get('capalarm_ticks_total', 0):.0f} ticks evaluated (last ends "
        f"{time.time() - last:,.0f} s ago), {m.get('capalarm_open_ticks', 0):.0f} open"
    )


def exactness(m: dict[str, float], backlog: Backlog) -> list[str]:
    """Every difference between what the service counted and what was written."""
    problems = []

    def same(what: str, got: float | None, want: int) -> None:
        if got != want:
            problems.append(f"{what}: {got} counted, {want} written")

    names = [*backlog.surface_bytes]
    same("bytes", sum(m.get(surface(s, "written_bytes_total"), 0) for s in names), backlog.nbytes)
    same("events", sum(m.get(surface(s, "write_events_total"), 0) for s in names), backlog.records)
    for s in names:
        same(f"{s} bytes", m.get(surface(s, "written_bytes_total")), backlog.surface_bytes[s])
        same(f"{s} events", m.get(surface(s, "write_events_total")), backlog.surface_events[s])
    same("lines read", m.get(src("records_read_total")), backlog.lines)
    for counter in (
        "records_lost",
        "records_lost_unknown",
        "parse_errors",
        "late_events",
        "future_events",
    ):
        same(counter, m.get(src(f"{counter}_total")), 0)
    same("skipped backlog cells", m.get("capalarm_backlog_skipped_cells_total"), 0)
    first = math.floor(backlog.start / TICK) * TICK
    last = m.get("capalarm_last_tick_timestamp_seconds", first)
    same("ticks evaluated", m.get("capalarm_ticks_total"), round((last - first) / TICK))
    return problems


# -- anchors -----------------------------------------------------------------------------------


def anchor_cat(backlog: Backlog) -> float:
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        subprocess.run(["cat", str(backlog.path)], stdout=null, check=True)
    return time.perf_counter() - t0


def anchor_scanner(backlog: Backlog) -> tuple[float, str, list[str]]:
    """The native scanner alone, one core: ``scan_live`` (the file source's chunk reader's
    call) over the file's 16 MiB blocks of whole lines, read as it goes (as a tailer would):
    (seconds, the code path measured, problems).  Lines the C scanner hands back are counted,
    not read (the file source would read them on the per-line regex path)."""
    import alarm
    from alarm.collectors.kernel.fastscan import live_formats, scan_live

    if "syslog" not in live_formats():
        return math.nan, "none", ["the installed package has no native scanner"]
    year = time.gmtime(backlog.start).tm_year
    lines = records = nbytes = handed_back = 0
    native = True
    t0 = time.perf_counter()
    with open(backlog.path, "rb") as fh:
        rest = b""
        while block := fh.read(ANCHOR_BLOCK):
            cut = block.rfind(b"\n") + 1
            data, rest = rest + block[:cut], block[cut:]
            scan, back = scan_live(data, "syslog", (PREFIX,), TICK, year)
            native &= scan.native
            lines += scan.lines
            records += scan.records
            nbytes += int(scan.nbytes.sum())
            handed_back += back.count(b"\n")
    elapsed = time.perf_counter() - t0
    path = (
        f"fastscan.scan_live, C only ({'native' if native else 'NOT native'}; "
        f"{handed_back:,} of {backlog.lines:,} lines handed back, not read; alarm from "
        f"{Path(alarm.__file__).parent})"
    )
    got = (lines, records, nbytes, handed_back, len(rest))
    want = (backlog.lines, backlog.records, backlog.nbytes, 0, 0)
    problems = [] if got == want else [f"scanner counted {got}, written {want}"]
    return elapsed, path, problems


def anchor_backtest(backlog: Backlog, work: Path, cmd: list[str]) -> tuple[float, list[str]]:
    config = work / "backtest.json"
    write_config(config, backlog.path, work / "backtest-state", free_port())
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*cmd, "backtest", "--config", str(config), str(backlog.path), "--output", os.devnull],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        return elapsed, [f"backtest exited {proc.returncode}: {proc.stderr[-500:]}"]
    summary: dict[str, Any] = {}
    for line in proc.stderr.splitlines():
        if line.startswith('{"backtest"'):
            summary = json.loads(line)["backtest"]
    if summary.get("records") != backlog.records:
        return elapsed, [f"backtest counted {summary.get('records')} records"]
    return elapsed, []


# -- main --------------------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=int, default=3600, help="seconds of backlog (default 3600)")
    ap.add_argument("--rate", type=int, default=10_000, help="fence records a second (10000)")
    ap.add_argument("--runs", type=int, default=1, help="service runs, median printed (1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="write the kern.log here, keep it and reuse it")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds to wait for live")
    ap.add_argument("--skip-backtest", action="store_true", help="no capalarm backtest anchor")
    args = ap.parse_args()
    if args.seconds < 1 or args.rate < 1 or args.runs < 1:
        ap.error("--seconds, --rate and --runs must be positive")

    failed = False
    with tempfile.TemporaryDirectory(prefix="backlog-catchup-") as tmp:
        work = Path(tmp)
        where = args.keep or work
        where.mkdir(parents=True, exist_ok=True)
        backlog = generate(where.resolve(), work, args.seconds, args.rate, args.seed)
        how = (
            f"generated in {backlog.generated_in:.1f} s by a gcc-compiled C helper"
            if backlog.generated_in is not None
            else f"reused from {where}"
        )
        print(
            f"backlog: {backlog.path}: {backlog.lines:,} lines, {backlog.records:,} fence records "
            f"({backlog.seconds} s at {backlog.rate:,}/s), {mib(backlog.file_bytes)}, "
            f"{backlog.nbytes:,} bytes of packets; {how}; ends {time.time() - backlog.end:.0f} s "
            "before the service starts"
        )
        cmd = service_command()
        scanner, where_from = scanner_path(service_python(cmd), work)
        print(f"service: {' '.join(cmd)} run (alarm from {where_from}, {scanner} scanner)")

        runs: list[Run] = []
        try:
            for n in range(args.runs):
                runs.append(run_service(backlog, work, cmd, args.timeout, n))
                r = runs[-1]
                print(
                    f"  run {n + 1}: live after {r.live_after:.1f} s (all lines read after "
                    f"{r.read_after:.1f} s), {backlog.records / r.live_after:,.0f} records/s, "
                    f"peak RSS {mib(r.peak_rss)}, exact: {'yes' if not r.problems else 'NO'}"
                )
                for p in r.problems:
                    print(f"    {p}")
        except (RuntimeError, TimeoutError) as exc:
            print(f"  run {len(runs) + 1} failed: {exc}")
            failed = True
        cat_s = anchor_cat(backlog)
        scan_s, scan_path, scan_problems = anchor_scanner(backlog)
        if args.skip_backtest:
            bt_s, bt_problems = math.nan, []
        else:
            bt_s, bt_problems = anchor_backtest(backlog, work, cmd)
        print("anchors on the same file:")
        for name, secs, problems in (
            ("cat > /dev/null", cat_s, []),
            ("native scanner (1 core)", scan_s, scan_problems),
            ("capalarm backtest", bt_s, bt_problems),
        ):
            if math.isnan(secs):
                continue
            check = "" if not problems else "  " + "; ".join(problems)
            print(f"  {name:27s} {secs:8.1f} s  {backlog.lines / secs:12,.0f} lines/s{check}")
            failed |= bool(problems)
        print(f"  native scanner anchor measured: {scan_path}")
        if not runs:
            return 1
        live = statistics.median(r.live_after for r in runs)
        rss = statistics.median(r.peak_rss for r in runs)
        exact = all(not r.problems for r in runs)
        med = f"median of {len(runs)} runs" if len(runs) > 1 else "1 run"
        anchor = f"anchor: cat {cat_s:.1f} s, native scanner alone (scan_live) {scan_s:.1f} s"
        if not math.isnan(bt_s):
            anchor += f", backtest {bt_s:.1f} s"
        hours = backlog.seconds / 3600
        print(
            f"backlog catch-up: {backlog.records} records ({hours:g} h at {backlog.rate // 1000:g}k/s"
            f"): live after {live:.1f} s ({backlog.records / live:,.0f} records/s), peak RSS "
            f"{mib(rss)}, exact: {'yes' if exact else 'NO'}; {anchor} ({med})"
        )
        print(
            f"code paths: the service `{' '.join(cmd)} run`, file source, {scanner} chunk reader "
            f"(alarm from {where_from}); the scanner anchor {scan_path}"
        )
        return 0 if exact and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
