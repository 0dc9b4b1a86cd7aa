"""Live pipeline ingest: records/s through ``Pipeline.ingest_kernel``, batched through the
native scanner, next to the per-record parser (its anchor) on the same records.

    python bench/pipeline_ingest.py [--records 200000] [--batch 1000] [--reps 5]

Records are the kernel messages of the generated kern.log corpus (bench/gen_fence_corpus.py,
seed 1; ~90% fence records), fed in batches as the collectors hand them over.  Prints the
median records/s of each path and the ratio; exits 1 if the two paths' counts differ.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from kernel_log_throughput import corpus

from alarm import pipeline as pipeline_module
from alarm.config import load_config
from alarm.collectors.kernel.fastscan import native_available
from alarm.collectors.kernel.formats import parse_syslog_line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not native_available():
        print("alarm._fastscan is not built (pip install needs a C compiler)", file=sys.stderr)
        return 1
    path, _ = corpus(200_000, 1)
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            rec = parse_syslog_line(line.rstrip("\n"), 2026)
            if rec is not None:
                records.append(rec)
            if len(records) == args.records:
                break
    config = load_config(str(path.parents[1] / "fence_bench.yaml"))
    prefixes = ("EGRESS_FENCE",)
    results = {}
    for name, threshold in (("per-record parse_fence", 10**12), ("native batches", 32)):
        pipeline_module.NATIVE_BATCH = threshold
        rates, totals = [], None
        for _ in range(args.reps):
            pipe = pipeline_module.Pipeline(config)
            t0 = time.perf_counter()
            for i in range(0, len(records), args.batch):
                pipe.ingest_kernel("k", records[i : i + args.batch], prefixes, False)
            rates.append(len(records) / (time.perf_counter() - t0))
            totals = {k: (s.bytes_total, s.events_total) for k, s in pipe.table.surfaces.items()}
        results[name] = (statistics.median(rates), totals)
    base = results["per-record parse_fence"][0]
    print(f"{len(records):,} kernel records, batches of {args.batch}, median of {args.reps}")
    for name, (rate, _) in results.items():
        print(f"  {name:24s} {rate:12,.0f} records/s  {rate / base:5.1f}x")
    same = results["native batches"][1] == results["per-record parse_fence"][1]
    print("counts per surface: " + ("identical" if same else "DIFFERENT"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
