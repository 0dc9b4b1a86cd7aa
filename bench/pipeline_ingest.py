"""Live ingest: kernel records/s through the kind-neutral interface — the fence reader turning
records into write events, then ``Pipeline.apply`` classifying and counting them — with the
reader's native batches, next to the per-record parser (its anchor) on the same records.

    python bench/pipeline_ingest.py [--records 200000] [--batch 1000] [--reps 5]

Records are the kernel messages of the generated kern.log corpus (bench/gen_fence_corpus.py,
seed 1; ~90% fence records), fed in batches as the collectors hand them over.  Prints the
median records/s of each path, the ratio, and which code path ran; exits 1 if the two paths'
counts differ.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from kernel_ingest import corpus

import alarm
from alarm.collectors.kernel import fence as fence_module
from alarm.collectors.kernel.fastscan import native_available
from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.formats import parse_syslog_line
from alarm.config import load_config
from alarm.events import Batch
from alarm.pipeline import Pipeline


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not native_available():
        print(
            f"the native scanner is not built in the alarm package at {alarm.__file__} "
            "(pip install needs a C compiler)",
            file=sys.stderr,
        )
        return 1
    path, _ = corpus(200_000, "rfc3164", 0)  # the open mix of flows, seed 1
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            rec = parse_syslog_line(line.rstrip("\n"), 2026)
            if rec is not None:
                records.append(rec)
            if len(records) == args.records:
                break
    config = load_config(str(path.parents[1] / "fence_bench.yaml"))
    reader = FenceReader(("EGRESS_FENCE",), require_trusted=False, tick=config.tick)
    results = {}
    for name, threshold in (("per-record parse_fence", 10**12), ("native batches", 32)):
        fence_module.NATIVE_BATCH = threshold
        rates, totals = [], None
        for _ in range(args.reps):
            pipe = Pipeline(config)
            t0 = time.perf_counter()
            for i in range(0, len(records), args.batch):
                chunk = records[i : i + args.batch]
                read = reader.read(chunk)
                counts = {"records_read": len(chunk), "parse_errors": read.parse_errors}
                pipe.apply("kernel", Batch(read.events, counts), None)
            rates.append(len(records) / (time.perf_counter() - t0))
            totals = (pipe.table.bytes_total.tolist(), pipe.table.events_total.tolist())
        results[name] = (statistics.median(rates), totals)
    base = results["per-record parse_fence"][0]
    print(f"{len(records):,} kernel records, batches of {args.batch}, median of {args.reps}")
    print(f"measured: FenceReader.read + Pipeline.apply, alarm from {alarm.__file__}")
    for name, (rate, _) in results.items():
        print(f"  {name:24s} {rate:12,.0f} records/s  {rate / base:5.1f}x")
    same = results["native batches"][1] == results["per-record parse_fence"][1]
    print("counts per surface: " + ("identical" if same else "DIFFERENT"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
