#!/usr/bin/env python3
"""Figure: live ingest at 100,000 surfaces against 100 (issue 28, "At 100,000 surfaces";
floor: within 2x).

    python bench/ingest_scale.py [--surfaces 100,100000] [--seconds 600] [--rate 2000]
        [--state saved|fresh]

For each surface count, the installed service (alarm.service.Service, its state in a temporary
directory) is handed kernel fence records the way a kernel source hands them over: the fence
reader's write events in batches of 1,000, each applied on the pipeline thread's path
(``Service._apply``: classify and count, close the ticks the watermark allows, evaluate them,
record alert changes, save a checkpoint when one is due).  ``--seconds`` of event time at
``--rate`` records/s (10 s ticks), every record to one of 50 surfaces: few surfaces change, the
others are declared and idle.  Prints records/s per surface count, the share of that time
spent in ``StateStore.save`` and in ``EgressClassifier.classify``, the ratio against the
smallest count (the anchor, same run), and records/s and ratio outside the save; "start" is
the config and Service construction (the egress rule index is built there).

``--state saved`` (the default): the state directory holds what an earlier run of the service
saved at its shutdown (the same surfaces, untimed), as for any start but the very first, and the
measured service loads it at its start; its saves then write what moved since.  ``--state
fresh``: an empty directory, the first start ever, whose first checkpoint writes every array
(what every run of this bench measured before 2026-12-04: the bench applies minutes of records
in seconds, so that first checkpoint was nearly the only save it timed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # after site-packages

import alarm
from alarm.collectors.kernel.fence import FenceReader
from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.synthetic import fence_line
from alarm.config import config_from_dict
from alarm.events import Batch, SourceHealth
from alarm.service import Service

TICK = 10.0
WRITTEN = 50  # surfaces the records go to
BATCH = 1000


class Idle:
    """A source the bench feeds itself (Service._apply), never run."""

    kind = "egress"

    def __init__(self) -> None:
        self.health = SourceHealth(up=True, provenance_verified=True)

    async def run(self, emit: Any) -> None:  # pragma: no cover - not started
        raise NotImplementedError


def address(i: int) -> str:
    """Surface ``i``'s destination: one address each."""
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def batches(seconds: float, rate: int, start: float) -> list[Batch]:
    reader = FenceReader(("EGRESS_FENCE",), require_trusted=True, tick=TICK)
    total = int(seconds * rate)
    out = []
    for lo in range(0, total, BATCH):
        records = [
            KernelRecord(
                ts=start + i / rate,
                message=fence_line("EGRESS_FENCE", address(i % WRITTEN), 443, "TCP", 600, i),
                facility=0,
                trusted=True,
            )
            for i in range(lo, min(total, lo + BATCH))
        ]
        read = reader.read(records)
        out.append(Batch(read.events, {"records_read": len(records)}, watermark=records[-1].ts))
    return out


def stop(svc: Service) -> None:
    svc.executor.shutdown()
    svc.store.close()
    svc.notify.close()


def run(n: int, seconds: float, rate: int, state: str) -> dict[str, float]:
    surfaces = [{"name": f"s{i}", "match": {"dst": [f"{address(i)}/32"]}} for i in range(n)]
    # The records end a minute ago: every tick they fall in closes as they are applied.
    start = (time.time() - seconds - 60) // TICK * TICK
    work = batches(seconds, rate, start)
    with tempfile.TemporaryDirectory(prefix="capalarm-ingest-") as tmp:
        config = config_from_dict(
            {"tick": f"{TICK:g}s", "state_dir": tmp, "sources": [], "surfaces": surfaces}
        )
        if state == "saved":
            earlier = Service(config, collectors={"kern": Idle()})
            earlier.pipeline.start(time.time())
            earlier._save_state(final=True)
            stop(earlier)
        t0 = time.perf_counter()
        config = config_from_dict(
            {"tick": f"{TICK:g}s", "state_dir": tmp, "sources": [], "surfaces": surfaces}
        )
        svc = Service(config, collectors={"kern": Idle()})
        startup = time.perf_counter() - t0
        saving = [0.0, 0]
        save = svc.store.save

        def timed_save(*args: Any, **kwargs: Any) -> None:
            s0 = time.perf_counter()
            try:
                save(*args, **kwargs)
            finally:
                saving[0] += time.perf_counter() - s0
                saving[1] += 1

        svc.store.save = timed_save  # type: ignore[method-assign]
        classifying = [0.0]
        classifier = svc.pipeline.classifiers["egress"]
        classify = classifier.classify

        def timed_classify(*args: Any, **kwargs: Any) -> Any:
            c0 = time.perf_counter()
            try:
                return classify(*args, **kwargs)
            finally:
                classifying[0] += time.perf_counter() - c0

        classifier.classify = timed_classify  # type: ignore[method-assign]
        health = {"kern": SourceHealth(up=True, provenance_verified=True)}
        svc.pipeline.start(time.time())
        t0 = time.perf_counter()
        for b in work:
            svc._apply("kern", b, health)
        wall = time.perf_counter() - t0
        ticks = svc.pipeline.ticks
        counted = int(svc.pipeline.table.events_total.sum())
        stop(svc)
    records = sum(b.counts["records_read"] for b in work)
    if counted != records:
        raise SystemExit(f"{n} surfaces: counted {counted} events of {records}")
    return {
        "records": records,
        "wall": wall,
        "rate": records / wall,
        "save": saving[0],
        "classify": classifying[0],
        "saves": saving[1],
        "ticks": ticks,
        "startup": startup,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--surfaces", default="100,100000")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--state", choices=("saved", "fresh"), default="saved")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.surfaces.split(",")]
    print(
        f"code path: Service._apply (installed package at {Path(alarm.__file__).parent}); "
        f"state directory: {args.state}"
    )
    results = {n: run(n, args.seconds, args.rate, args.state) for n in counts}
    anchor = results[min(counts)]
    for n, r in results.items():
        # Outside the save: what the records cost (classify, count, close and judge ticks).
        unsaved = r["records"] / (r["wall"] - r["save"])
        anchor_unsaved = anchor["records"] / (anchor["wall"] - anchor["save"])
        print(
            f"{n:>7,} surfaces: {r['rate']:10,.0f} records/s ({r['records']:,} records, "
            f"{r['ticks']:.0f} ticks, {r['wall']:.2f} s; StateStore.save {r['save']:.2f} s "
            f"in {r['saves']:.0f} saves = {100 * r['save'] / r['wall']:.0f} %; "
            f"EgressClassifier.classify {r['classify']:.3f} s = "
            f"{100 * r['classify'] / r['wall']:.0f} %; start {r['startup']:.1f} s)  "
            f"x{anchor['rate'] / r['rate']:.2f} slower than {min(counts):,}; outside the save "
            f"{unsaved:,.0f} records/s, x{anchor_unsaved / unsaved:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
