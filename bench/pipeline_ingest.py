"""Live ingest: kern.log lines/s from the raw bytes on disk to events counted per surface, on
the path ``capalarm run`` takes for a ``type: file`` source: the source built from a config by
the service's own source table (``SOURCE_TYPES["file"].build``: the tailer reading the file
in its worker thread, the native chunk reader ``scan_live`` and the fence reader), each batch
it hands over applied to a ``Pipeline`` of that config (``Pipeline.apply`` on a pipeline
thread while the source waits, as the service's emit does).  The anchor, in the same run on
the same file: the same source with the native scanner off (chunk reader off and the fence
reader's native batches off), the per-line path (``kernel_line_parser`` + ``parse_fence``
per record) that an install without a C compiler runs.

    python bench/pipeline_ingest.py [--lines 200000] [--reps 5]

The file is the generated kern.log corpus (bench/gen_fence_corpus.py, seed 1, RFC 3164
stamps, ~90% fence records) that bench/kernel_ingest.py uses; the source follows it from its
first byte (``start_at_end: false``) until it has handed over every line.  Timed: from the
first poll until the last batch is applied (the source and pipeline are built before),
wall time and this process's CPU (every thread's).  Not timed, and not run: the detector's
evaluation of ticks (bench/backlog_catchup.py runs the whole service, ticks included).

The pipeline's clock: the service passes ``time.time()`` to ``apply``; the corpus's lines are
from 2026-11-30, so each batch is applied at ``time.time()`` shifted back to one second after
the corpus's last line -- the clock a service following the log as it was written had -- so
the figure does not change with the day it is run on (the corpus would become a backlog,
then too late to count).

Prints the median lines/s and CPU ns a line of each path (reps interleaved), which code path
each took (the source's chunk reader, the fence reader's native threshold, where ``alarm``
was imported from), and checks that both counted exactly the corpus's fence records and
bytes and the same bytes and events per surface; exits 1 if not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kernel_ingest import corpus

import alarm
from alarm.collectors import SOURCE_TYPES
from alarm.collectors.base import SourceContext
from alarm.collectors.kernel import fence as fence_module
from alarm.collectors.kernel import file as file_module
from alarm.collectors.kernel.fastscan import live_formats
from alarm.config import load_config
from alarm.events import Batch
from alarm.pipeline import Pipeline

HERE = Path(__file__).resolve().parent
NATIVE, PER_LINE = "native (scan_live chunks)", "per-line (no native scanner)"


def last_ts(path: Path) -> float:
    """The time of the corpus's last syslog line (RFC 3164, this year), as the source reads it."""
    from alarm.collectors.kernel.formats import parse_syslog_line

    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - 65536))
        lines = fh.read().decode("utf-8", "replace").splitlines()[1:]
    year = time.gmtime().tm_year
    return max(r.ts for r in map(lambda x: parse_syslog_line(x, year), lines) if r is not None)


def config_file(log: Path, work: Path) -> Path:
    """bench/fence_bench.yaml (its surfaces and file source) following ``log``."""
    cfg = yaml.safe_load((HERE / "fence_bench.yaml").read_text())
    [source] = cfg["sources"]
    source.update(paths=[str(log)], start_at_end=False)
    cfg["state_dir"] = str(work / "state")
    path = work / "capalarm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def one_run(cfg_path: Path, path_name: str, shift: float, lines: int) -> dict[str, Any]:
    config = load_config(str(cfg_path))
    [settings] = config.sources
    saved = file_module.fence_chunk_reader, fence_module.NATIVE_BATCH
    if path_name == PER_LINE:  # what an install without the extension builds
        file_module.fence_chunk_reader = lambda *a, **k: None
        fence_module.NATIVE_BATCH = 1 << 62
    try:
        source = SOURCE_TYPES[settings.type].build(settings, SourceContext(tick=config.tick))
        pipeline = Pipeline(config)
        pipeline.start(time.time() - shift)
        took = {
            "chunk_reader": "scan_live" if source.tailer.chunk_reader is not None else "none",
            "native_batch": fence_module.NATIVE_BATCH,
            "batch_lines": source.tailer.batch_lines,
        }
        done = asyncio.Event()
        read = [0]

        pool = ThreadPoolExecutor(1, thread_name_prefix="pipeline")

        async def emit(batch: Batch) -> None:
            # As the service's emit: applied on its pipeline thread, the source waiting.
            await asyncio.get_running_loop().run_in_executor(
                pool, pipeline.apply, settings.name, batch, time.time() - shift
            )
            read[0] += batch.counts.get("records_read", 0)
            if read[0] >= lines:
                done.set()

        async def follow() -> tuple[float, float]:
            c0, t0 = time.process_time(), time.perf_counter()
            task = asyncio.create_task(source.run(emit))
            waiter = asyncio.create_task(done.wait())
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            task.cancel()
            waiter.cancel()
            await asyncio.gather(task, waiter, return_exceptions=True)
            if not done.is_set():
                raise RuntimeError(f"the source stopped after {read[0]} of {lines} lines")
            return wall, cpu

        try:
            wall, cpu = asyncio.run(follow())
        finally:
            pool.shutdown()
    finally:
        file_module.fence_chunk_reader, fence_module.NATIVE_BATCH = saved
    state = pipeline.sources[settings.name]
    return {
        "wall": wall,
        "cpu": cpu,
        "took": took,
        "counters": dict(state.counters),
        "per_surface": (pipeline.table.bytes_total.tolist(), pipeline.table.events_total.tolist()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if "syslog" not in live_formats():
        print(
            f"the native scanner is not built in the alarm package at {alarm.__file__} "
            "(pip install needs a C compiler)",
            file=sys.stderr,
        )
        return 1
    log, totals = corpus(args.lines, "rfc3164", 0)  # the open mix of flows, seed 1
    lines = totals["lines"]
    shift = time.time() - (last_ts(log) + 1.0)
    print(f"load average {os.getloadavg()[0]:.2f} at start; alarm from {alarm.__file__}")
    results: dict[str, list[dict[str, Any]]] = {NATIVE: [], PER_LINE: []}
    with tempfile.TemporaryDirectory(prefix="pipeline-ingest-") as tmp:
        cfg_path = config_file(log, Path(tmp))
        for _ in range(args.reps):  # interleaved: a shared machine's load falls on both
            for name in results:
                results[name].append(one_run(cfg_path, name, shift, lines))
    print(
        f"{log.name}: {lines:,} lines, {totals['packets']:,} fence records, "
        f"{totals['bytes']:,} bytes; median of {args.reps}, interleaved"
    )
    print(
        "measured: SOURCE_TYPES['file'].build (FileTailCollector + FenceReader) -> "
        "FileSource.run -> Pipeline.apply, from the first poll to the last batch applied"
    )
    ok = True
    rates = {}
    for name, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        rates[name] = lines / wall
        c = runs[0]["counters"]
        exact = all(
            sum(r["per_surface"][1]) == totals["packets"]
            and sum(r["per_surface"][0]) == totals["bytes"]
            and r["counters"].get("records_read") == lines
            for r in runs
        )
        ok &= exact
        role = "figure" if name == NATIVE else "anchor"
        print(
            f"  {role}: {name:29s} {lines / wall:10,.0f} lines/s "
            f"({totals['packets'] / wall:,.0f} fence records/s), "
            f"{cpu * 1e9 / lines:,.0f} ns CPU a line, wall {wall:.3f} s; "
            f"counts {'exact' if exact else 'WRONG'}"
        )
        took = runs[0]["took"]
        batches = took["native_batch"]
        print(
            f"    code path: chunk reader {took['chunk_reader']}, fence reader native batches "
            f"{'off' if batches > 1 << 40 else f'from {batches} records'}, "
            f"{took['batch_lines']:,} lines a poll at most; source counters "
            + json.dumps({k: v for k, v in sorted(c.items()) if v})
        )
    print(f"  native / per-line: {rates[NATIVE] / rates[PER_LINE]:.2f}x")
    same = len({json.dumps(r["per_surface"]) for rs in results.values() for r in rs}) == 1
    print("bytes and events per surface: " + ("identical" if same else "DIFFERENT"))
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
