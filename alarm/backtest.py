"""Backtest: the service's pipeline on recorded input, with the input's own clock.

Each input file is replayed as a source: its batches go through ``Pipeline.apply`` exactly as
a live source's do, and ticks are evaluated with ``Pipeline.close_until`` as far as every input
has been read — the service's event-time rule with a simulated clock.  So a backtest previews
exactly what the service would have paged on the same records.  Each alert state change is
written as one JSON object per line.

Inputs are read in byte ranges by worker processes, a few ranges ahead of the pipeline, and
consumed in order: memory is bounded by the surfaces and their history, never by the length
of the input.  Kernel logs go through the fence scanner (native where built); write events
(JSON lines naming their surface) through the native reader (_eventscan.c: keys in any order,
each line it cannot read with certainty through json.loads), or where it was not built a bulk
regex with json.loads for chunks of other layouts.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from alarm.collectors.kernel.fastscan import FlowScan, scan_flows
from alarm.collectors.kernel.fence import flow_events
from alarm.collectors.kernel.formats import detect_format
from alarm.events import NAMED, Batch, KeyedSubjects, WriteEvents
from alarm.jsontext import loads_json
from alarm.kinds import KIND_NAMES
from alarm.pipeline import Pipeline
from alarm.sanitize import sanitize

if TYPE_CHECKING:  # the assembled model: importing it imports every source type's settings
    from alarm.config import Config

try:  # built by pip where a compiler is (setup.py); parse_events reads in Python without it
    from alarm import _eventscan as native_events
except ImportError:  # pragma: no cover - exercised where the extension was not built
    native_events = None

SPLIT_BYTES = 8 << 20
MIN_SPLIT = 1 << 20
UNDECLARED_REPORTED = 20  # undeclared surface names listed in the summary
# Parse errors located by file and line in the summary; the rest are only counted (finding
# one costs about two reads of its chunk, so the number is kept small).
PARSE_ERRORS_SHOWN = 5
PARSE_ERROR_TEXT = 120  # characters of a bad line shown
# A terminal's progress line is rewritten at most this often (seconds), and first shown only
# after this long: a short backtest prints nothing but its results.
PROGRESS_EVERY = 1.0
KERNEL_FORMATS = ("syslog", "kmsg", "dmesg", "journal-json")


class BacktestInputError(ValueError):
    """An input file that cannot be replayed: missing, unreadable, or of no known format."""


@dataclass(slots=True)
class Chunk:
    """What a worker read from one byte range."""

    lines: int = 0
    parse_errors: int = 0
    forged: int = 0
    records: int = 0
    scan: FlowScan | None = None  # kernel logs
    # Write events: subjects (kind or None, surface, contributor) and per-line columns.
    subjects: list[tuple[str | None, str, str]] = field(default_factory=list)
    subject: np.ndarray | None = None
    ts: np.ndarray | None = None
    nbytes: np.ndarray | None = None
    events: np.ndarray | None = None
    native: bool = False  # write events read by the native reader (_eventscan.c)
    handed_back: int = 0  # write-event lines read by json.loads (the rest: native or regex)


# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """A worker's start: keep the memory of each range read for the next one.  glibc maps
    a buffer this large afresh on every read and unmaps it when freed, so each 8 MB range
    cost ~2,000 page faults: reading a kern.log cost as much CPU as scanning it.  False
    where the C library has no such setting (not glibc)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # At most 32 MB (glibc's ceiling for the threshold): a range and the line it ends in.
    kept = mallopt(M_MMAP_THRESHOLD, min(3 * SPLIT_BYTES, 32 << 20))
    return bool(kept and mallopt(M_TRIM_THRESHOLD, 8 * SPLIT_BYTES))


def read_range(path: str, start: int, end: int) -> bytes:
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


def scan_kernel_range(
    path: str,
    start: int,
    end: int,
    fmt: str,
    prefixes: tuple[str, ...],
    tick: float,
    year: int,
    locate_errors: int = 0,
) -> Chunk:
    """Worker: the fence records of one byte range of a kernel log, summed per flow and tick
    (and where its first ``locate_errors`` parse errors are, where that is cheap)."""
    data = read_range(path, start, end)
    scan = scan_flows(data, fmt, prefixes, tick, year, locate_errors=locate_errors)
    return Chunk(
        lines=scan.lines,
        parse_errors=scan.parse_errors,
        forged=scan.forged,
        records=scan.records,
        scan=scan,
    )


# The layout capalarm and its benchmarks write, read by a bulk regex where no native reader
# was built; any other line goes through json.loads.  A line the regex matches is read as
# json.loads reads it: JSON numbers only (no leading zeros, ASCII digits), counts of at most
# 19 digits (int() refuses past 4300), strings without control characters, the characters
# str.splitlines splits at, or invalid escapes.
_NUM = r"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
_COUNT = r"(0|[1-9][0-9]{0,18})"
_CHARS = r'(?:[^"\\\x00-\x1f\x85\u2028\u2029]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*'
_STR = rf'"({_CHARS})"'
_QUOTED = rf'("{_CHARS}")'  # with its quotes: "kind": "" is "", not absent
_EVENT_LINE = re.compile(
    rf'^\{{"ts": ?{_NUM}, ?"surface": ?{_STR}, ?"bytes": ?{_COUNT}(?:, ?"events": ?{_COUNT})?'
    rf'(?:, ?"kind": ?{_QUOTED})?(?:, ?"contributor": ?{_STR})?\}}\r?$',
    re.MULTILINE,
)


# What a write event may say: unix seconds from 1970 to the year 5138 (a tick's arithmetic
# stays exact there, and a hostile 1e30 would otherwise stall the simulated clock), and counts
# that fit the int64 columns.
MAX_TS = 1e11
MAX_COUNT = 2**62

Row = tuple[float, str | None, str, str, int, int]  # ts, kind, surface, contributor, bytes, events


def _plausible(row: Row) -> bool:
    ts, _, _, _, nbytes, events = row
    return 0.0 <= ts < MAX_TS and 0 <= nbytes <= MAX_COUNT and 0 <= events <= MAX_COUNT


def _unescape(text: str) -> str:
    return json.loads(f'"{text}"') if "\\" in text else text


def _json_float(text: str) -> float:
    """float() of a JSON number as json.loads gives it: an int's -0 is 0."""
    value = float(text)
    return value if value or "." in text or "e" in text or "E" in text else 0.0


def parse_events(data: bytes) -> Chunk:
    """Write events of one chunk of complete lines into columns.  Each line is read as
    ``json.loads`` reads it (``_parse_events_slowly``): ``ts``, ``surface``, ``bytes`` (0 if
    absent), ``events`` (1), ``kind`` (None), ``contributor`` ("") in any order; a line that
    is not one, or names an implausible time or count, is a parse error.  The native reader
    (_eventscan.c) reads the lines it can read with certainty and hands each other line back
    to ``_read_line_slowly``; without it, a bulk regex reads the layout of _EVENT_LINE and the
    chunk goes through json.loads if any line is not of that layout."""
    if native_events is not None:
        lines, errors, handed_back, subjects, subject, ts, nbytes, events = (
            native_events.scan_events(data, _read_line_slowly)
        )
        chunk = Chunk(lines=lines, parse_errors=errors, records=len(ts) // 8)
        chunk.native = True
        chunk.handed_back = handed_back
        chunk.subjects = subjects
        chunk.subject = np.frombuffer(subject, dtype=np.int64)
        chunk.ts = np.frombuffer(ts, dtype=np.float64)
        chunk.nbytes = np.frombuffer(nbytes, dtype=np.int64)
        chunk.events = np.frombuffer(events, dtype=np.int64)
        return chunk
    text = data.decode("utf-8", "replace")
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    matches = _EVENT_LINE.findall(text)
    rows: list[Row] = [
        (
            _json_float(ts),
            _unescape(kind[1:-1]) if kind else None,
            _unescape(s),
            _unescape(c),
            int(b),
            int(e or 1),
        )
        for ts, s, b, e, kind, c in matches
    ]
    # Each line (split at \n, as the regex reads it) a match or blank: the regex read them all.
    blank = sum(1 for line in text.split("\n")[:lines] if not line.strip())
    errors = 0
    slow = len(matches) + blank != lines
    if slow:
        rows, errors = _parse_events_slowly(text)
    valid = [row for row in rows if _plausible(row)]
    errors += len(rows) - len(valid)
    rows = valid
    chunk = Chunk(lines=lines, parse_errors=errors, records=len(rows))
    chunk.handed_back = lines - blank if slow else 0
    index: dict[tuple[str | None, str, str], int] = {}
    subject = np.empty(len(rows), dtype=np.int64)
    for i, (_, kind, surface, contributor, _, _) in enumerate(rows):
        key = (kind, surface, contributor)
        j = index.get(key)
        if j is None:
            j = index[key] = len(index)
        subject[i] = j
    chunk.subjects = list(index)
    chunk.subject = subject
    chunk.ts = np.array([r[0] for r in rows], dtype=np.float64)
    chunk.nbytes = np.array([r[4] for r in rows], dtype=np.int64)
    chunk.events = np.array([r[5] for r in rows], dtype=np.int64)
    return chunk


def _read_line_slowly(line: bytes) -> tuple[list[Row], int]:
    """A line the native reader hands back (with its newline): its plausible rows and its
    parse errors, as the chunk's Python reader counts them."""
    rows, errors = _parse_events_slowly(line.decode("utf-8", "replace"))
    valid = [row for row in rows if _plausible(row)]
    return valid, errors + len(rows) - len(valid)


def _parse_events_slowly(text: str) -> tuple[list[Row], int]:
    rows = []
    errors = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = loads_json(line)
            ts = float(obj["ts"])
            surface = str(obj["surface"])
            nbytes = int(obj.get("bytes", 0))
            events = int(obj.get("events", 1))
            kind = obj.get("kind")
            contributor = obj.get("contributor")
            row = (
                ts,
                None if kind is None else str(kind),
                surface,
                "" if contributor is None else str(contributor),
                nbytes,
                events,
            )
        # RecursionError: str() of a name nested too deeply to print.
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError):
            errors += 1
            continue
        rows.append(row)
    return rows, errors


def _ranges(size: int, parts: int) -> Iterator[tuple[int, int]]:
    step = max(MIN_SPLIT, min(SPLIT_BYTES, -(-size // max(parts, 1))))
    for start in range(0, size, step):
        yield start, min(size, start + step)


def input_format(path: str) -> str:
    """The format of an input file, or BacktestInputError naming it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            sample = [line.rstrip("\n") for _, line in zip(range(50), fh, strict=False)]
    except FileNotFoundError:
        raise BacktestInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BacktestInputError(f"{path}: is a directory") from None
    except OSError as exc:
        raise BacktestInputError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return detect_format(sample)
    except ValueError:
        raise BacktestInputError(
            f"{path}: not a known input format (kmsg dump, dmesg, syslog kern.log, journalctl "
            "-o json, or write-event JSON lines)"
        ) from None


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
    late_events: int = 0
    unknown_surface_events: int = 0
    # Surfaces named by write events that the config does not declare (counted unclassified).
    undeclared_surfaces: dict[str, int] = field(default_factory=dict)
    # Bytes counted per surface ("kind/name"), every declared surface and each unclassified.
    surface_bytes: dict[str, int] = field(default_factory=dict)
    scanner: str = ""
    json_lines: int = 0  # write-event lines read by json.loads, not the native reader or regex
    # Kernel-log lines the native scanner handed back to the regex path (or json.loads).
    handed_back: int = 0
    # The first PARSE_ERRORS_SHOWN parse errors: {"file", "line" (from 1), "text"}.
    parse_error_lines: list[dict[str, Any]] = field(default_factory=list)
    # Per input: its format, the path that read it ("native": every line native;
    # "native+regex" / "native+python": some lines handed back; "regex" / "python": none
    # read natively), its lines and how many of them were handed back.
    files: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__}
        d["lines_per_second"] = self.lines / self.seconds if self.seconds else 0.0
        return d


class Replay:
    """One input file as a source: its chunks, read a few ahead by the pool, in order."""

    def __init__(self, name: str, path: str, fmt: str, pool: ProcessPoolExecutor, ahead: int):
        self.name = name
        self.path = path
        self.fmt = fmt
        self.pool = pool
        self.ahead = ahead
        self.watermark = -math.inf

    def chunks(
        self,
        config: Config,
        prefixes: tuple[str, ...],
        year: int,
        errors_wanted: Callable[[], int] = lambda: 0,
    ) -> Iterator[tuple[int, int, Chunk]]:
        """(start, end, chunk) of each byte range, in order.  ``errors_wanted``: how many
        parse errors the summary still lists, when a range is handed to a worker (once it
        lists enough, workers no longer look for them)."""
        size = Path(self.path).stat().st_size
        parts = list(_ranges(size, self.ahead))
        pending: deque[tuple[int, int, Future[Chunk]]] = deque()
        for start, end in parts:
            if self.fmt in KERNEL_FORMATS:
                fut = self.pool.submit(
                    scan_kernel_range,
                    self.path,
                    start,
                    end,
                    self.fmt,
                    prefixes,
                    config.tick,
                    year,
                    errors_wanted(),
                )
            else:
                fut = self.pool.submit(_parse_events_range, self.path, start, end)
            pending.append((start, end, fut))
            if len(pending) > self.ahead:
                first, last, done = pending.popleft()
                yield first, last, done.result()
        while pending:
            first, last, done = pending.popleft()
            yield first, last, done.result()


def _lines(data: bytes) -> list[bytes]:
    """``data`` cut after each "\n" (as the readers count lines; not at "\r")."""
    parts = data.split(b"\n")
    out = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def locate_parse_errors(data: bytes, errors_of: Callable[[bytes], int], want: int) -> list[int]:
    """Indexes of up to ``want`` lines of ``data`` that are parse errors: the readers count
    errors without saying where (the native ones in C), so halves are read again until each
    error is one line.  About log2(lines) reads of ever smaller parts per error found."""
    lines = _lines(data)
    found: list[int] = []
    stack = [(0, len(lines), errors_of(data))]
    while stack and len(found) < want:
        lo, hi, n = stack.pop()
        if n <= 0 or lo >= hi:
            continue
        if hi - lo == 1:
            found.append(lo)
            continue
        mid = (lo + hi) // 2
        left = errors_of(b"".join(lines[lo:mid]))
        stack.append((mid, hi, n - left))  # popped after the left half: in line order
        stack.append((lo, mid, left))
    return found


def _errors_counter(
    fmt: str, prefixes: tuple[str, ...], tick: float, year: int
) -> Callable[[bytes], int]:
    if fmt in KERNEL_FORMATS:
        return lambda data: scan_flows(data, fmt, prefixes, tick, year).parse_errors
    return lambda data: parse_events(data).parse_errors


class Progress:
    """How far a backtest has got, on one line of a terminal (rewritten in place, cleared at
    the end).  Nothing unless ``stream`` is a terminal: a redirected stderr holds only the
    summary.  Rewritten at most every ``every`` seconds, and only once ``every`` seconds have
    passed."""

    def __init__(
        self,
        stream: IO[str] | None,
        total_bytes: int,
        every: float = PROGRESS_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        isatty = getattr(stream, "isatty", None)
        self.stream = stream if isatty is not None and isatty() else None
        self.total = total_bytes
        self.every = every
        self.clock = clock
        self.last = clock()
        self.shown = False

    def update(
        self, path: str, index: int, files: int, done: int, lines: int, changes: int
    ) -> None:
        if self.stream is None:
            return
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        share = done / self.total * 100 if self.total else 100.0
        self.stream.write(
            f"\rcapalarm: backtest: {share:.0f}% of {self.total / 1e6:,.1f} MB (file {index}/"
            f"{files} {Path(path).name}), {lines:,} lines, {changes:,} alert changes\x1b[K"
        )
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.stream is not None and self.shown:
            self.stream.write("\r\x1b[K")  # the summary that follows starts on a clean line
            self.stream.flush()


def _parse_events_range(path: str, start: int, end: int) -> Chunk:
    return parse_events(read_range(path, start, end))


def chunk_batch(chunk: Chunk, fmt: str, tick: float) -> Batch:
    counts = {
        "records_read": chunk.records,
        "parse_errors": chunk.parse_errors,
        "forged_records": chunk.forged,
    }
    counts = {k: n for k, n in counts.items() if n}
    if chunk.scan is not None:
        ev = flow_events(chunk.scan, tick)
        # The start of the newest tick seen: of a counted record, or of any other record
        # read (forged ones: a file of nothing else must still move the clock, or no tick
        # is ever evaluated and the forged-records alert never fires).
        starts = [float(chunk.scan.ticks.max()) * tick] if ev is not None else []
        if chunk.scan.max_ts > 0:
            starts.append(math.floor(chunk.scan.max_ts / tick) * tick)
        return Batch(
            ev,
            counts,
            watermark=max(starts) if starts else None,
            forged_sample=chunk.scan.forged_sample,
        )
    if chunk.ts is None or not len(chunk.ts):
        return Batch(None, counts)
    subjects = KeyedSubjects(
        keys=[(kind, surface) for kind, surface, _ in chunk.subjects],
        contributors=[c for _, _, c in chunk.subjects],
    )
    assert chunk.subject is not None and chunk.nbytes is not None and chunk.events is not None
    ev = WriteEvents(NAMED, subjects, chunk.subject, chunk.ts, chunk.nbytes, chunk.events)
    return Batch(ev, counts, watermark=float(chunk.ts.max()))


def run_backtest(
    config: Config,
    inputs: list[str],
    out: IO[str],
    workers: int | None = None,
    year: int | None = None,
    progress_stream: IO[str] | None = None,
    progress_every: float = PROGRESS_EVERY,
) -> BacktestSummary:
    """``progress_stream``: where a terminal shows how far the replay has got (nothing if it
    is not a terminal)."""
    t0 = time.perf_counter()
    tick = config.tick
    year = year or time.gmtime().tm_year
    formats = [(path, input_format(path)) for path in inputs]
    prefixes = tuple(
        dict.fromkeys(p for s in config.sources for p in getattr(s, "prefixes", ()))
    ) or ("EGRESS_FENCE",)
    # Kernel inputs replay as the config's first kernel source (so `source:` selectors
    # apply); write events name their surfaces.
    kernel_name = next(
        (s.name for s in config.sources if getattr(s, "prefixes", None) is not None), "kernel"
    )
    replays_named: dict[str, tuple[str, str]] = {}
    names = []
    for i, (_, fmt) in enumerate(formats):
        if fmt in KERNEL_FORMATS:
            name = kernel_name
            replays_named.setdefault(name, (fmt, "egress"))
        else:
            name = f"events{i}"
            replays_named[name] = ("events", "egress")
        names.append(name)
    live = {s.name for s in config.sources}
    backtest_config = config.model_copy(
        update={"sources": [s for s in config.sources if s.name in names]}
    )
    extra = {n: t for n, t in replays_named.items() if n not in live}
    # Write events may name any kind's surfaces (or undeclared ones of any kind).
    named = any(f not in KERNEL_FORMATS for _, f in formats)
    pipeline = Pipeline(
        backtest_config, extra, extra_kinds=KIND_NAMES if named else (), keep_history=False
    )
    summary = BacktestSummary(inputs=len(inputs))
    # Everything built so far (config models, the detector's arrays, imported modules) lives
    # as long as the replay: out of the collector's reach, the replay's own garbage is
    # collected without walking it again and again.
    gc.freeze()
    undeclared: Counter[str] = Counter()
    declared = {s.name for s in config.surfaces}
    workers = workers or os.cpu_count() or 1
    write = out.write
    last_end = -math.inf
    sizes = [Path(path).stat().st_size for path in inputs]
    progress = Progress(progress_stream, sum(sizes), progress_every)

    def errors_wanted() -> int:
        return PARSE_ERRORS_SHOWN - len(summary.parse_error_lines)

    with ProcessPoolExecutor(workers, initializer=keep_freed_memory) as pool:
        replays = [
            Replay(name, path, fmt, pool, ahead=max(2, workers))
            for name, (path, fmt) in zip(names, formats, strict=True)
        ]
        # Inputs are replayed one after another in the order given (rotated logs first);
        # ticks close as far as the input being read has got.
        for number, replay in enumerate(replays):
            kernel = replay.fmt in KERNEL_FORMATS
            slow = "regex" if kernel and replay.fmt != "journal-json" else "python"
            file = {"path": replay.path, "format": replay.fmt, "lines": 0, "handed_back": 0}
            native_chunks = slow_chunks = 0
            errors_of = _errors_counter(replay.fmt, prefixes, tick, year)
            for start, end, chunk in replay.chunks(config, prefixes, year, errors_wanted):
                if chunk.parse_errors and len(summary.parse_error_lines) < PARSE_ERRORS_SHOWN:
                    want = PARSE_ERRORS_SHOWN - len(summary.parse_error_lines)
                    located = chunk.scan.error_lines if chunk.scan is not None else None
                    if located is None:  # the worker could not say where: read it again
                        data = read_range(replay.path, start, end)
                        lines = _lines(data)
                        located = [
                            (i, lines[i]) for i in locate_parse_errors(data, errors_of, want)
                        ]
                    for i, line in located[:want]:
                        text = line.rstrip(b"\r\n").decode("utf-8", "replace")
                        summary.parse_error_lines.append(
                            {
                                "file": replay.path,
                                "line": file["lines"] + i + 1,
                                "text": sanitize(text, PARSE_ERROR_TEXT),
                            }
                        )
                summary.lines += chunk.lines
                summary.records += chunk.records
                summary.parse_errors += chunk.parse_errors
                summary.forged += chunk.forged
                native = chunk.scan.native if chunk.scan is not None else chunk.native
                back = chunk.scan.handed_back if chunk.scan is not None else chunk.handed_back
                native_chunks += native
                slow_chunks += not native
                file["lines"] += chunk.lines
                file["handed_back"] += back if native else chunk.lines
                if kernel:
                    summary.handed_back += back
                else:
                    summary.json_lines += back
                if chunk.subjects and chunk.subject is not None and chunk.events is not None:
                    per_subject = np.bincount(
                        chunk.subject, weights=chunk.events, minlength=len(chunk.subjects)
                    )
                    for (_, surface, _), n in zip(
                        chunk.subjects, per_subject.tolist(), strict=True
                    ):
                        if surface not in declared:
                            undeclared[surface] += int(n)
                batch = chunk_batch(chunk, replay.fmt, tick)
                pipeline.apply(replay.name, batch, None)
                if batch.events is not None and len(batch.events.ts):
                    last_end = max(last_end, float(batch.events.ts.max()))
                if chunk.scan is not None and chunk.scan.max_ts > 0:
                    last_end = max(last_end, chunk.scan.max_ts)
                if batch.watermark is not None:
                    _write(pipeline.close_until(batch.watermark), write, summary)
                progress.update(
                    replay.path,
                    number + 1,
                    len(replays),
                    sum(sizes[:number]) + end,
                    summary.lines,
                    summary.changes,
                )
            if not native_chunks:
                file["scanner"] = slow if slow_chunks else ""
            elif slow_chunks or file["handed_back"]:
                file["scanner"] = f"native+{slow}"
            else:
                file["scanner"] = "native"
            summary.files.append(file)
        # Write events keep their one-word name (their native reader hands single lines
        # back to json.loads, counted in json_lines); kernel logs say when lines went to the
        # regex path.
        paths: set[str] = set()
        for f in summary.files:
            parts = f["scanner"].split("+") if f["scanner"] else []
            paths.update(parts if f["format"] in KERNEL_FORMATS else parts[:1])
        summary.scanner = "+".join(sorted(paths, key=lambda p: (p != "native", p)))
    progress.close()
    if math.isfinite(last_end):
        # Run on past the last record long enough for spikes and budgets to resolve.
        holds = [config.unclassified_spike.resolve_hold, 60.0]
        holds += [
            h
            for s in config.surfaces
            for h in (s.spike.resolve_hold, s.effective_budget().resolve_hold)
        ]
        end = (math.floor(last_end / tick) + 1) * tick + (math.ceil(max(holds) / tick) + 2) * tick
        _write(pipeline.close_until(end), write, summary)
    summary.ticks = pipeline.ticks
    summary.late_events = sum(s.counters["late_events"] for s in pipeline.sources.values())
    summary.unknown_surface_events = pipeline.table.unknown_surface_events
    summary.undeclared_surfaces = dict(undeclared.most_common(UNDECLARED_REPORTED))
    table = pipeline.table
    summary.surface_bytes = {
        f"{kind}/{name}": int(table.bytes_total[i]) for i, (kind, name) in enumerate(table.keys)
    }
    summary.seconds = time.perf_counter() - t0
    return summary


def _write(results: list[Any], write: Any, summary: BacktestSummary) -> None:
    for result in results:
        for change in result.changes:
            write(json.dumps(change.to_dict(), separators=(",", ":")) + "\n")
            summary.changes += 1


def main_backtest(
    config: Config, inputs: list[str], output: str | None, workers: int | None
) -> int:
    """``capalarm backtest``: exit 2 naming the input that cannot be replayed."""
    try:
        for path in inputs:
            input_format(path)
    except BacktestInputError as exc:
        print(f"capalarm: backtest: {exc}", file=sys.stderr)
        return 2
    try:
        out: IO[str] = sys.stdout if output in (None, "-") else open(output, "w")  # noqa: SIM115
    except OSError as exc:
        print(f"capalarm: backtest: cannot write {output}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        summary = run_backtest(config, inputs, out, workers, progress_stream=sys.stderr)
        out.flush()
    except BacktestInputError as exc:
        print(f"capalarm: backtest: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a closed pipe (`| head`), an input gone bad
        if exc.filename is None:  # the writes carry no file name, opening an input does
            where = "standard output" if out is sys.stdout else output
            print(f"capalarm: backtest: cannot write {where}: {exc.strerror}", file=sys.stderr)
            if out is sys.stdout:  # or the interpreter's last flush reports it again
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        else:
            print(f"capalarm: backtest: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    finally:
        if out is not sys.stdout:
            with contextlib.suppress(OSError):  # what failed to write was reported above
                out.close()
    report = summary.to_dict()
    print(json.dumps({"backtest": report}), file=sys.stderr)
    if summary.undeclared_surfaces:
        names = ", ".join(sorted(summary.undeclared_surfaces))
        print(
            f"capalarm: backtest: {summary.unknown_surface_events} events name surfaces the config "
            f"does not declare ({names}); they were counted as unclassified",
            file=sys.stderr,
        )
    return 0
