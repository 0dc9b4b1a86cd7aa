#!/usr/bin/env python3
"""Figure: the egress classifier at 100,000 surfaces (issue 28, "At 100,000 surfaces"): what
building its rule index adds to startup, and what a batch of new flows costs, against 100
surfaces and against classifying rule by rule (the numpy columns, the path every batch took
before the index), both in the same run.

    python bench/egress_index.py [--surfaces 100,100000] [--flows 1000] [--reps 5]

Configs of three shapes, each surface's ``match`` as a user would write it and validated by
``config_from_dict``:

- ``dst32``: one destination address a surface (bench/ingest_scale.py's config);
- ``sandbox``: one sandbox a surface, told apart by its log prefix ("EGRESS_FENCE sb-N", an nft
  rule per sandbox cgroup) and its uid, all on tcp/443 and 8000-8100 out of ``veth+``;
- ``mixed``: a /24 of IPv4 or a /64 of IPv6, a port range, tcp or udp, ``vethN+`` (every
  field indexed, overlapping ranges).

For each: the config parse (``config_from_dict``), the classifier as the pipeline builds it
(``EgressClassifier(names, matches)``) and, inside it, the index (``index_seconds``); then the
median over ``--reps`` batches of ``--flows`` flows never seen before (up to half match a
surface, at most one flow a surface; the rest match none) through ``EgressClassifier.classify`` (index and memo: the installed
package's path) and ``classify_columns`` (rule by rule; run once at 100,000 surfaces, it takes
seconds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # after site-packages

import alarm
from alarm.classify.egress import EgressClassifier
from alarm.collectors.kernel.fastscan import FlowScan
from alarm.collectors.kernel.fence import FlowSubjects
from alarm.config import config_from_dict

Key = tuple[str, str, int | None, str, int | None, str]


def v4(i: int) -> str:
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def match(shape: str, i: int) -> dict[str, Any]:
    if shape == "dst32":
        return {"dst": [f"{v4(i)}/32"]}
    if shape == "sandbox":
        return {
            "log_prefix": [f"EGRESS_FENCE sb-{i}"],
            "uid": [100000 + i],
            "dport": [443, "8000-8100"],
            "proto": ["tcp"],
            "out": ["veth+"],
        }
    net = f"10.{i >> 8 & 255}.{i & 255}.0/24" if i % 2 else f"fd00:{i >> 16:x}:{i & 65535:x}::/64"
    lo = 1024 + i % 50_000
    return {
        "dst": [net],
        "dport": [f"{lo}-{lo + 100}"],
        "proto": ["udp" if i % 3 == 0 else "tcp"],
        "out": [f"veth{i % 97}+"],
    }


def flow(shape: str, i: int, n: int, rep: int) -> Key:
    """A flow of surface ``i`` (``i < n``) or of none, new in each rep."""
    if shape == "dst32":
        return (v4(i if i < n else (1 << 24) + i), "TCP", 1000 + rep, "eth0", None, "EGRESS_FENCE")
    if shape == "sandbox":
        uid = 100000 + i
        return ("203.0.113.9", "TCP", 8000 + rep, "veth3", uid, f"EGRESS_FENCE sb-{i}")
    lo = 1024 + i % 50_000
    if i < n:
        dst = (
            f"10.{i >> 8 & 255}.{i & 255}.{rep + 1}"
            if i % 2
            else f"fd00:{i >> 16:x}:{i & 65535:x}::{rep + 1:x}"
        )
    else:
        dst = f"192.0.2.{rep + 1}"
    proto = "UDP" if i % 3 == 0 else "TCP"
    return (dst, proto, lo + rep, f"veth{i % 97}ab", None, "EGRESS_FENCE")


def subjects(keys: list[Key]) -> FlowSubjects:
    scan = FlowScan()
    scan.add_rows([(0.0, x, o, d, 1, p, dp, u, True) for d, p, dp, o, u, x in keys], 10.0)
    return FlowSubjects(scan)


def run(shape: str, n: int, flows: int, reps: int) -> dict[str, float]:
    surfaces = [{"name": f"s{i}", "match": match(shape, i)} for i in range(n)]
    t0 = time.perf_counter()
    config = config_from_dict({"sources": [{"name": "kern"}], "surfaces": surfaces})
    parse = time.perf_counter() - t0
    egress = [s for s in config.surfaces if s.kind == "egress"]
    names, matches = [s.name for s in egress], [s.match for s in egress]
    t0 = time.perf_counter()
    c = EgressClassifier(names, matches)
    build = time.perf_counter() - t0
    index = c.index_seconds
    owned = min(flows // 2, n)  # distinct surfaces a batch's matching flows go to
    step = n // owned
    indexed, columns = [], []
    for rep in range(reps):
        own = [flow(shape, j * step, n, rep) for j in range(owned)]
        none = [flow(shape, n + j, n, rep) for j in range(flows - owned)]
        s = subjects(own + none)
        t0 = time.perf_counter()
        got = c.classify(s, "kern")
        indexed.append(time.perf_counter() - t0)
        if rep == 0 or n <= 10_000:
            t0 = time.perf_counter()
            ref = c.classify_columns(s, "kern")
            columns.append(time.perf_counter() - t0)
            if got.tolist() != ref.tolist():
                raise SystemExit(f"{shape}, {n} surfaces: the index and the columns disagree")
        if int((got >= 0).sum()) != len(own):
            raise SystemExit(
                f"{shape}, {n} surfaces: {int((got >= 0).sum())} of {len(own)} matched"
            )
    return {
        "parse": parse,
        "build": build,
        "index": index,
        "indexed": statistics.median(indexed),
        "columns": statistics.median(columns),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--surfaces", default="100,100000")
    ap.add_argument("--shapes", default="dst32,sandbox,mixed")
    ap.add_argument("--flows", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.surfaces.split(",")]
    print(
        "code path: EgressClassifier.classify (index + memo) against classify_columns (rule by "
        f"rule), installed package at {Path(alarm.__file__).parent}\n"
    )
    for shape in args.shapes.split(","):
        results = {n: run(shape, n, args.flows, args.reps) for n in counts}
        anchor = results[min(counts)]["indexed"]
        for n, r in results.items():
            print(
                f"{shape:>8} {n:>7,} surfaces: config {r['parse']:.2f} s, classifier "
                f"{r['build']:.2f} s (index {r['index']:.2f} s); a batch of {args.flows:,} new "
                f"flows {1e3 * r['indexed']:.1f} ms (x{r['indexed'] / anchor:.2f} of "
                f"{min(counts):,} surfaces), rule by rule {1e3 * r['columns']:.1f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
