"""Backtest: replay recorded input on its own timestamps, as fast as the CPU allows, and write
the alert state changes that would have happened, one JSON object per line.

Kernel logs are split into byte ranges scanned in parallel worker processes (parse, classify
and aggregate per tick and surface); the detector then runs sequentially over every tick in
the covered time range — quiet ticks included, since they matter to baselines and budgets.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from alarm.classify import EgressClassifier, contributor_name
from alarm.config import Config, SurfaceConfig
from alarm.fastscan import FlowScan, scan_flows
from alarm.pipeline import Pipeline

TickSurface = tuple[int, str, str]  # tick index, kind, surface
CONTRIBUTORS_PER_CELL = 10
SPLIT_BYTES = 16 << 20


@dataclass(slots=True)
class ChunkResult:
    cells: dict[TickSurface, list[int]] = field(default_factory=dict)  # -> [bytes, events]
    contributors: dict[TickSurface, dict[str, int]] = field(default_factory=dict)
    lines: int = 0
    fence_records: int = 0
    parse_errors: int = 0
    forged: int = 0

    def merge(self, other: ChunkResult) -> None:
        for key, (b, e) in other.cells.items():
            cell = self.cells.get(key)
            if cell is None:
                self.cells[key] = [b, e]
            else:
                cell[0] += b
                cell[1] += e
        for key, contrib in other.contributors.items():
            mine = self.contributors.setdefault(key, {})
            for c, b in contrib.items():
                mine[c] = mine.get(c, 0) + b
            if len(mine) > 4 * CONTRIBUTORS_PER_CELL:
                self.contributors[key] = dict(
                    heapq.nlargest(CONTRIBUTORS_PER_CELL, mine.items(), key=lambda kv: kv[1])
                )
        self.lines += other.lines
        self.fence_records += other.fence_records
        self.parse_errors += other.parse_errors
        self.forged += other.forged


def _read_range(path: str, start: int, end: int) -> bytes:
    """The complete lines that begin in [start, end)."""
    with open(path, "rb") as fh:
        if start > 0:
            fh.seek(start - 1)
            if fh.read(1) != b"\n":
                fh.readline()  # the line in progress belongs to the previous range
        begin = fh.tell()
        if begin >= end:
            return b""
        data = fh.read(end - begin)
        if data and not data.endswith(b"\n"):
            data += fh.readline()
    return data


def scan_range(
    path: str,
    start: int,
    end: int,
    fmt: str,
    prefixes: tuple[str, ...],
    surfaces: list[dict],
    tick: float,
    year: int,
) -> ChunkResult:
    """Worker: parse, classify and aggregate one byte range of a kernel log."""
    classifier = EgressClassifier([SurfaceConfig.model_validate(s) for s in surfaces])
    scan = scan_flows(_read_range(path, start, end), fmt, prefixes, tick, year)
    return aggregate_scan(scan, classifier)


def aggregate_scan(scan: FlowScan, classifier: EgressClassifier) -> ChunkResult:
    """Classify a chunk's flows and sum them per tick and surface, with each cell's top
    contributors.  Classification and contributor names are computed once per flow
    identity; the per-cell sums are numpy group-bys."""
    result = ChunkResult(
        lines=scan.lines,
        parse_errors=scan.parse_errors,
        forged=scan.forged,
        fence_records=scan.records,
    )
    if not len(scan.ids):
        return result
    surface_names, surface_of = classifier.classify_columns(scan)
    n_surfaces = len(surface_names)
    # Cells: (tick, surface).
    cell_key = scan.ticks * n_surfaces + surface_of[scan.ids]
    cells, cell_idx = np.unique(cell_key, return_inverse=True)
    # float64 sums are exact below 2**53 bytes per cell.
    cell_bytes = np.bincount(cell_idx, weights=scan.nbytes, minlength=len(cells))
    cell_packets = np.bincount(cell_idx, weights=scan.packets, minlength=len(cells))
    keys = [
        (int(c // n_surfaces), "egress", surface_names[int(c % n_surfaces)]) for c in cells.tolist()
    ]
    for key, b, n in zip(keys, cell_bytes.tolist(), cell_packets.tolist(), strict=True):
        result.cells[key] = [int(b), int(n)]
    # Contributors (destination, port, protocol): bytes per (cell, contributor), the top
    # CONTRIBUTORS_PER_CELL of each cell; names are formatted for those only.
    n_protos = max(len(scan.protos), 1)
    contrib_of = (scan.id_dst * 100_001 + scan.id_dpt + 1) * n_protos + scan.id_proto
    contribs, contrib_idx = np.unique(contrib_of, return_inverse=True)
    pair = cell_idx * len(contribs) + contrib_idx[scan.ids]
    pairs, pair_idx = np.unique(pair, return_inverse=True)
    pair_bytes = np.bincount(pair_idx, weights=scan.nbytes, minlength=len(pairs))
    pair_cell = pairs // len(contribs)
    order = np.lexsort((-pair_bytes, pair_cell))
    rank = np.arange(len(order)) - np.searchsorted(pair_cell[order], pair_cell[order])
    top = order[rank < CONTRIBUTORS_PER_CELL]
    for c, k, b in zip(
        pair_cell[top].tolist(),
        contribs[pairs[top] % len(contribs)].tolist(),
        pair_bytes[top].tolist(),
        strict=True,
    ):
        rest, proto = divmod(k, n_protos)
        dst, dpt = divmod(rest, 100_001)
        name = contributor_name(scan.dsts[dst], None if dpt == 0 else dpt - 1, scan.protos[proto])
        result.contributors.setdefault(keys[c], {})[name] = int(b)
    return result


def _scan_events(path: str, tick: float) -> ChunkResult:
    """Generic write events: {"ts", "surface", "bytes", "events"[, "kind", "contributor"]}."""
    result = ChunkResult()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            result.lines += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ts = float(obj["ts"])
                surface = str(obj["surface"])
                nbytes = int(obj.get("bytes", 0))
                events = int(obj.get("events", 1))
                kind = str(obj.get("kind", "egress"))
                if nbytes < 0 or events < 0 or ts != ts:
                    raise ValueError("negative or NaN")
            except (ValueError, TypeError, KeyError, AttributeError):
                result.parse_errors += 1
                continue
            contributor = obj.get("contributor")
            _add(
                result,
                (int(ts // tick), kind, surface),
                nbytes,
                events,
                None if contributor is None else str(contributor),
            )
            result.fence_records += 1
    return result


def _add(
    result: ChunkResult, key: TickSurface, nbytes: int, events: int, contributor: str | None
) -> None:
    cell = result.cells.get(key)
    if cell is None:
        result.cells[key] = [nbytes, events]
    else:
        cell[0] += nbytes
        cell[1] += events
    if contributor is not None:
        contrib = result.contributors.setdefault(key, {})
        contrib[contributor] = contrib.get(contributor, 0) + nbytes


def _ranges(path: str, size: int, parts: int) -> Iterator[tuple[int, int]]:
    step = max(1 << 20, min(SPLIT_BYTES, -(-size // max(parts, 1))))
    for start in range(0, size, step):
        yield start, min(size, start + step)


def detect_file_format(path: str) -> str:
    from alarm.kernel_formats import detect_format

    with open(path, encoding="utf-8", errors="replace") as fh:
        sample = [line.rstrip("\n") for _, line in zip(range(50), fh, strict=False)]
    return detect_format(sample)


@dataclass(slots=True)
class BacktestSummary:
    inputs: int = 0
    lines: int = 0
    records: int = 0
    parse_errors: int = 0
    forged: int = 0
    ticks: int = 0
    changes: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__}
        d["lines_per_second"] = self.lines / self.seconds if self.seconds else 0.0
        return d


def run_backtest(
    config: Config,
    inputs: list[str],
    out: IO[str],
    workers: int | None = None,
    year: int | None = None,
) -> BacktestSummary:
    t0 = time.perf_counter()
    tick = config.tick
    year = year or time.gmtime().tm_year
    prefixes = tuple(dict.fromkeys(p for s in config.sources for p in s.prefixes)) or (
        "EGRESS_FENCE",
    )
    surfaces = [s.model_dump() for s in config.surfaces]
    total = ChunkResult()
    workers = workers or os.cpu_count() or 1
    kinds = {"egress"}
    with ProcessPoolExecutor(workers) as pool:
        futures = []
        for path in inputs:
            fmt = detect_file_format(path)
            if fmt == "events-jsonl":
                part = _scan_events(path, tick)
                kinds |= {k for _, k, _ in part.cells}
                total.merge(part)
            elif fmt == "journal-json":
                # Journal exports are small: scanned entry by entry in this process.
                scan = scan_flows(Path(path).read_bytes(), fmt, prefixes, tick, year)
                total.merge(aggregate_scan(scan, EgressClassifier(config.surfaces)))
            else:
                size = Path(path).stat().st_size
                for start, end in _ranges(path, size, workers):
                    futures.append(
                        pool.submit(
                            scan_range, path, start, end, fmt, prefixes, surfaces, tick, year
                        )
                    )
        for fut in futures:
            total.merge(fut.result())

    pipeline = Pipeline(config, kinds_in_use=sorted(kinds & {"egress", "fs", "registry"}))
    summary = BacktestSummary(
        inputs=len(inputs),
        lines=total.lines,
        records=total.fence_records,
        parse_errors=total.parse_errors,
        forged=total.forged,
    )
    by_tick: dict[int, list[TickSurface]] = {}
    for key in total.cells:
        by_tick.setdefault(key[0], []).append(key)
    if by_tick:
        first, last = min(by_tick), max(by_tick)
        # Run on past the last record long enough for spikes and budgets to resolve.
        holds = [config.unclassified_spike.resolve_hold, 30.0]
        holds += [
            h
            for s in config.surfaces
            for h in (s.spike.resolve_hold, s.effective_budget().resolve_hold)
        ]
        tail = math.ceil(max(holds) / tick) + 2
        write = out.write
        for idx in range(first, last + 1 + tail):
            for key in by_tick.get(idx, ()):
                nbytes, events = total.cells[key]
                contrib = total.contributors.get(key)
                if contrib:
                    for c, b in contrib.items():
                        pipeline.table.add(key[1], key[2], b, 0, c)
                    pipeline.table.add(key[1], key[2], nbytes - sum(contrib.values()), events, None)
                else:
                    pipeline.table.add(key[1], key[2], nbytes, events, None)
            result = pipeline.close_tick((idx + 1) * tick, tick)
            summary.ticks += 1
            for change in result.changes:
                write(json.dumps(change.to_dict(), separators=(",", ":")) + "\n")
                summary.changes += 1
    summary.seconds = time.perf_counter() - t0
    return summary


def main_backtest(
    config: Config, inputs: list[str], output: str | None, workers: int | None
) -> int:
    out: IO[str] = sys.stdout if output in (None, "-") else open(output, "w")  # noqa: SIM115
    try:
        summary = run_backtest(config, inputs, out, workers)
    finally:
        if out is not sys.stdout:
            out.close()
    print(json.dumps({"backtest": summary.to_dict()}), file=sys.stderr)
    return 0
