"""Kernel log lines from text files (syslog's kern.log, saved dmesg output), followed like
``tail -F``.

Semantics follow mtail's file stream (google/mtail, internal/tailer/logstream/filestream.go),
with the differences noted:

- Files are polled every ``poll_interval``; the globs are expanded again on every poll, so files
  that appear later are followed from their first byte.
- A file is identified by (st_dev, st_ino), not by its name, and its descriptor stays open.  So
  a file renamed to a name the globs still match (``kern.log*`` and ``kern.log.1``) is followed
  on, never read twice; a file renamed out of the globs or deleted is read to its end through
  the open descriptor (lines written after the rename but before we noticed included), its
  unterminated last line is flushed, and only then is the new file at its old path read from
  offset 0.  That is a rotation (the ``rotations`` counter).
- copytruncate: the same file is smaller than our read offset, or its first bytes changed (a
  truncate that was followed by more writes than we had read; mtail misses that case).  We
  count ``truncations`` and restart at offset 0.  What was written between our last read
  and the truncation cannot be known; we count one possible loss in ``records_lost`` when
  we know the file held bytes we had not read (a buffered partial line, or a size seen past our
  offset), see docs/file-source.md.  mtail flushes the partial line; we drop it, because its
  end is gone and a half line must never be counted.
- A line longer than ``max_line_bytes`` is skipped up to its newline without being buffered
  (``parse_errors`` and ``oversized_lines``).
- Positions: ``{"files": {path: {"dev", "ino", "fingerprint", "fp_len", "offset"}}}`` where
  ``fingerprint`` is the SHA-256 of the file's first ``fp_len`` (<= 1024) bytes and ``offset``
  is the end of the last complete line consumed.  A restart resumes every file whose identity
  and fingerprint still match, wherever it now is (the globs' matches and the names next to the
  saved path that start with its name, e.g. ``kern.log.1``), and reads the rest from 0.

Trust: ``health.provenance_verified`` is always False.  A text file cannot prove that a line came
from the kernel: anything that can write to the file (or to syslog) can write a look-alike.

Threads: the blocking reads, ``line_parser`` and ``reader`` (which must therefore be
thread-safe), run in a worker thread, one poll at a time; all file state belongs to that one
poll.  Each poll's counter deltas travel in the batch with its position, so they are applied
(and saved) together.

The tailer knows files, not fence records (mtail's tailer apart from its programs): it hands a
:class:`TailBatch` of parsed records to ``emit``; the file source (file.py) reads them into
write events with ``reader`` inside the same worker call.  With a ``chunk_reader`` the lines
are not parsed one by one: each poll's complete lines go to it as one chunk of bytes (the
file source's native scanner), and it hands the lines it cannot read back to the line
parser through a callback; positions, rotation, truncation and partial lines are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import os
import stat
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from alarm.collectors.kernel.records import KernelRecord
from alarm.events import SourceHealth

HEAD_BYTES = 1024  # fingerprint length: enough to tell logs apart, cheap to re-read every poll
READ_CHUNK = 64 * 1024
NEWLINE = ord("\n")
POLL_READ_BUDGET = 4 << 20  # bytes read per poll: bounds one worker call's time and memory
MAX_FILES = 1024  # open descriptors, whatever the globs match
SIBLINGS_MAX = 256  # names looked at next to a saved path when finding a rotated file
PATH_MEMORY = 4096  # path -> last file seen there, for counting rotations
# Rotated logs that logrotate compressed are new inodes full of binary: never follow them.
COMPRESSED_SUFFIXES = (".gz", ".xz", ".bz2", ".zst", ".lz4", ".zip", ".Z")

Ident = tuple[int, int]  # (st_dev, st_ino)
LineParser = Callable[[str], KernelRecord | None]
# Lines (each with its newline) -> their records, parsed by line_parser and counted as the
# per-line path counts them (parse errors, newest record time).
ParseLines = Callable[[bytes], list[KernelRecord]]
# (complete lines of one poll, the per-line path for what it does not read itself) ->
# (what ``reader`` would have made of the poll's records, newest record time it read).
ChunkReader = Callable[[bytes, ParseLines], tuple[Any, float]]


@dataclass(slots=True)
class TailBatch:
    """What one poll hands over: records, what ``reader`` made of them, the poll's counter
    deltas and the position after it."""

    records: list[KernelRecord]
    read: Any
    counts: dict[str, int]
    position: dict[str, Any]
    more: bool  # the poll's budget ran out with data left
    last_ts: float


TailEmit = Callable[[TailBatch], Awaitable[None]]


def _fingerprint(head: bytes) -> str:
    return hashlib.sha256(head).hexdigest()


@dataclass(slots=True)
class _File:
    """One followed file.  ``pending`` holds bytes read but not consumed: complete lines not yet
    handed over (when a poll's budget ran out) and then at most one partial line."""

    fd: int
    path: str
    ident: Ident
    read_pos: int  # next byte to read
    head: bytes  # the file's first <= HEAD_BYTES bytes, as last seen
    fp: str  # _fingerprint(head)
    pending: bytearray = field(default_factory=bytearray)
    skipping: bool = False  # inside an oversized line (or a line cut by start-at-end)
    skip_from: int = 0  # where that line starts: the offset saved while skipping
    last_stat: tuple[int, int] = (-1, -1)  # (size, mtime_ns) at the last check
    seen_size: int = 0  # size at the last check
    draining: bool = False  # left the globs: read to the end, then close
    after: Ident | None = None  # the rotated file at our path, to be finished before us

    @property
    def consumed(self) -> int:
        """Offset after the last complete line handed over: what a restart resumes from."""
        return self.skip_from if self.skipping else self.read_pos - len(self.pending)


@dataclass(slots=True)
class _Poll:
    """What one poll found.  Counter deltas are applied after the batch is emitted."""

    records: list[KernelRecord] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)  # complete lines, for chunk_reader
    lines_left: int = 0
    bytes_left: int = 0
    read: int = 0
    parse_errors: int = 0
    lost: int = 0
    truncations: int = 0
    rotations: int = 0
    extra: dict[str, int] = field(default_factory=dict)
    last_ts: float = 0.0
    last_error: str = ""
    position: dict[str, Any] = field(default_factory=dict)
    more: bool = False  # the budget ran out with data left: poll again without sleeping
    read_result: Any = None  # what the tailer's reader made of the records

    def counts(self) -> dict[str, int]:
        counts = {
            "records_read": self.read,
            "parse_errors": self.parse_errors,
            "records_lost": self.lost,
            "truncations": self.truncations,
            "rotations": self.rotations,
            **self.extra,
        }
        return {k: n for k, n in counts.items() if n}

    def count(self, key: str, n: int = 1) -> None:
        self.extra[key] = self.extra.get(key, 0) + n

    def error(self, msg: str) -> None:
        self.last_error = msg[:500]


class FileTailCollector:
    """Follows text log files and hands their lines, parsed by ``line_parser``, to ``emit``.

    ``provenance_verified`` is always False: a file cannot prove a line came from the kernel.
    See the module docstring for rotation, truncation, oversized lines and positions.
    """

    def __init__(
        self,
        name: str,
        paths: list[str],
        line_parser: LineParser,
        position: dict[str, Any] | None = None,
        poll_interval: float = 0.25,
        max_line_bytes: int = 1 << 20,
        batch_lines: int = 5000,
        start_at_end_for_new_files: bool = False,
        reader: Callable[[list[KernelRecord]], Any] | None = None,
        chunk_reader: ChunkReader | None = None,
    ) -> None:
        if max_line_bytes < 1 or batch_lines < 1:
            raise ValueError("max_line_bytes and batch_lines must be positive")
        self.name = name
        self.paths = list(paths)
        self.line_parser = line_parser
        self.reader = reader
        self.chunk_reader = chunk_reader
        self.poll_interval = poll_interval
        self.max_line_bytes = max_line_bytes
        self.batch_lines = batch_lines
        self.start_at_end_for_new_files = start_at_end_for_new_files
        self.health = SourceHealth(provenance_verified=False)
        # Counts since this process started (each poll's deltas also travel in its batch).
        self.totals: Counter[str] = Counter()
        # Last position emitted (or the one given): a rerun of ``run`` resumes from it.
        self.position: dict[str, Any] | None = position
        self._files: dict[Ident, _File] = {}
        self._path_ident: dict[str, Ident] = {}
        self._restored = False
        self._cold = True  # before the first poll ever (not reset by close)
        self._inflight: asyncio.Future[_Poll] | None = None

    # -- event loop side ---------------------------------------------------------------
    async def run(self, emit: TailEmit) -> None:
        self.health.up = True
        try:
            while True:
                if not await self.poll(emit):
                    await asyncio.sleep(self.poll_interval)
        finally:
            self.health.up = False
            self.health.caught_up = False
            await self.close()

    async def poll(self, emit: TailEmit) -> bool:
        """One poll: read what the files hold now, emit at most one batch (only when there are
        records or the position moved).  True when more data is ready right away."""
        if self._inflight is not None:
            # A cancelled poll's reads were never emitted: start over from the position.
            await self.close()
        fut = asyncio.ensure_future(asyncio.to_thread(self._poll_files))
        self._inflight = fut
        try:
            # Shielded: if we are cancelled, the worker still owns the descriptors until it
            # returns; close() waits for it.
            res = await asyncio.shield(fut)
        finally:
            if fut.done():
                self._inflight = None
        counts = res.counts()
        if res.records or counts or res.position != self.position:
            batch = TailBatch(
                res.records, res.read_result, counts, res.position, res.more, res.last_ts
            )
            try:
                await emit(batch)
            except BaseException:
                # Not counted (or not known to be): forget what we read past the position.
                await self.close()
                raise
            self.position = res.position
        self._apply(res)
        return res.more

    async def close(self) -> None:
        """Close every descriptor.  The next ``run``/``poll`` resumes from ``self.position``
        (the last emitted), so what was read but not emitted is read again, not lost."""
        inflight = self._inflight
        if inflight is not None and not inflight.done():
            try:
                await asyncio.wait([inflight])  # the worker uses the descriptors until it returns
            except asyncio.CancelledError:
                # Cancelled again while waiting: reset once the worker is done, unless a later
                # close() got there first.
                inflight.add_done_callback(
                    lambda _f: self._reset() if self._inflight is inflight else None
                )
                raise
        self._reset()

    def _reset(self) -> None:
        """Forget all file state.  Only when no worker is running."""
        for f in self._files.values():
            with contextlib.suppress(OSError):
                os.close(f.fd)
        self._files = {}
        self._path_ident = {}
        self._restored = False
        self._inflight = None

    def _apply(self, res: _Poll) -> None:
        self.totals.update(res.counts())
        h = self.health
        # max: reading an old rotated file must not make the source look stale.
        h.last_record_ts = max(h.last_record_ts, res.last_ts)
        h.caught_up = not res.more
        if res.last_error:
            h.failed(res.last_error, time.time())

    # -- worker thread -----------------------------------------------------------------
    def _poll_files(self) -> _Poll:
        res = _Poll(lines_left=self.batch_lines, bytes_left=POLL_READ_BUDGET)
        matches = self._scan(res)
        if not self._restored:
            self._restore(matches, res)
            self._restored = True
        by_ident: dict[Ident, str] = {}
        for path, st in matches.items():
            by_ident.setdefault((st.st_dev, st.st_ino), path)
        for f in self._files.values():
            if f.ident in by_ident:
                f.path = by_ident[f.ident]
                f.draining = False
            else:
                f.draining = True  # renamed out of the globs or deleted: finish it

        # Old files first, so a rotated file is finished before its successor starts.
        for f in sorted(self._files.values(), key=lambda f: (not f.draining, f.path)):
            if f.after is not None:
                if f.after in self._files:
                    continue  # its predecessor at this path is not finished yet
                f.after = None
            # Lines left over from the last poll's budget come first; then pending holds at
            # most a partial line, which is what a truncation check may throw away.
            self._take_lines(f, res)
            if res.lines_left <= 0 or res.bytes_left <= 0:
                res.more = True
                break
            # Draining files too: a truncated file can be renamed away before we look.
            self._check_replaced(f, res)
            if self._pump(f, res) and f.draining and res.lines_left > 0:
                self._finish(f, res)

        # New files are opened even when the budget is spent or their predecessor is still being
        # finished: holding the descriptor is what keeps them readable if they are rotated
        # away again before we get to read them.
        predecessor = {f.path: f.ident for f in self._files.values() if f.draining}
        for path, st in matches.items():
            ident = (st.st_dev, st.st_ino)
            if ident in self._files or by_ident[ident] != path:
                continue
            if len(self._files) >= MAX_FILES:
                res.count("files_not_followed")
                res.error(f"more than {MAX_FILES} files match; not following {path}")
                break
            prev = self._path_ident.get(path)
            # Start at the end only for files found on the collector's very first poll (and not
            # at a saved path): a file that appears later is new, all of it.
            at_end = self._cold and prev is None and self.start_at_end_for_new_files
            f = self._open(path, at_end, res)
            if f is None:
                continue
            if prev is not None and prev != f.ident:
                res.rotations += 1  # a new file where another one was
            self._files[f.ident] = f
            f.after = predecessor.get(path)
            if f.after is None and res.lines_left > 0 and res.bytes_left > 0:
                self._pump(f, res)
            else:
                res.more = True

        for path, st in matches.items():
            ident = (st.st_dev, st.st_ino)
            if ident in self._files:  # a file not followed yet must still count as new
                self._remember(path, ident)
        res.position = self._position()
        self._cold = False
        if self.chunk_reader is not None:
            data = b"".join(res.chunks)
            res.chunks = []
            if data:
                res.read_result, ts = self.chunk_reader(data, lambda b: self._parse_lines(b, res))
                res.last_ts = max(res.last_ts, ts)
        elif self.reader is not None:
            res.read_result = self.reader(res.records)
        return res

    def _parse_lines(self, block: bytes, res: _Poll) -> list[KernelRecord]:
        """What a chunk reader hands back, through the line parser (already counted read)."""
        start = len(res.records)
        for raw in block.split(b"\n")[:-1]:
            self._parse(raw, res)
        return res.records[start:]

    def _scan(self, res: _Poll) -> dict[str, os.stat_result]:
        """Regular files matching the globs now, in a stable order."""
        found: dict[str, os.stat_result] = {}
        for pattern in self.paths:
            for path in sorted(glob.glob(pattern)):
                if path in found or path.endswith(COMPRESSED_SUFFIXES):
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # gone between glob and stat
                if stat.S_ISREG(st.st_mode):
                    found[path] = st
        return found

    def _remember(self, path: str, ident: Ident) -> None:
        self._path_ident.pop(path, None)
        self._path_ident[path] = ident
        if len(self._path_ident) > PATH_MEMORY:
            del self._path_ident[next(iter(self._path_ident))]

    def _open(self, path: str, at_end: bool, res: _Poll) -> _File | None:
        try:
            # O_NONBLOCK: if the path became a FIFO since stat, open must not wait for a writer.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            res.error(f"{path}: {exc.strerror}")
            return None
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            if not stat.S_ISREG(st.st_mode) or ident in self._files:
                os.close(fd)
                return None
            head = os.pread(fd, HEAD_BYTES, 0)
            f = _File(fd, path, ident, 0, head, _fingerprint(head))
            f.last_stat = (st.st_size, st.st_mtime_ns)
            f.seen_size = st.st_size
            if at_end:
                self._seek_to_last_line(f, st.st_size)
            return f
        except OSError as exc:
            os.close(fd)
            res.error(f"{path}: {exc.strerror}")
            return None

    @staticmethod
    def _seek_to_last_line(f: _File, size: int) -> None:
        """Start at the end, but at a line start: a line being written is read whole."""
        n = min(size, READ_CHUNK)
        tail = os.pread(f.fd, n, size - n)
        nl = tail.rfind(b"\n")
        if nl >= 0:
            f.read_pos = size - n + nl + 1
        elif n < size:  # a line longer than we look back: skip its rest
            f.read_pos = f.skip_from = size
            f.skipping = True
        # else: the whole file is one unterminated line; read it from 0

    def _check_replaced(self, f: _File, res: _Poll) -> None:
        """copytruncate (or a rewrite in place): smaller than our read offset, or its first
        bytes changed.  Only re-read the head when size or mtime moved."""
        try:
            st = os.fstat(f.fd)
        except OSError as exc:
            res.error(f"{f.path}: {exc.strerror}")
            return
        key = (st.st_size, st.st_mtime_ns)
        if key == f.last_stat:
            return
        prev_size = f.seen_size
        f.last_stat = key
        f.seen_size = st.st_size
        try:
            head = os.pread(f.fd, HEAD_BYTES, 0)
        except OSError as exc:
            res.error(f"{f.path}: {exc.strerror}")
            return
        if st.st_size >= f.read_pos and head.startswith(f.head):
            if head != f.head:
                f.head, f.fp = head, _fingerprint(head)
            return
        res.truncations += 1
        # Known unread bytes: a partial line whose end is gone, or a size we saw past what we
        # read.  Lines written between our last read and the truncation leave no trace.
        if (f.pending and not f.skipping) or prev_size > f.read_pos:
            res.lost += 1
            res.count("truncation_possible_loss")
        f.pending.clear()
        f.skipping = False
        f.read_pos = 0
        f.head, f.fp = head, _fingerprint(head)

    def _pump(self, f: _File, res: _Poll) -> bool:
        """Hand over complete lines and read on, within the poll's budget.  True at EOF."""
        while True:
            self._take_lines(f, res)
            if res.lines_left <= 0 or res.bytes_left <= 0:
                res.more = True
                return False
            try:
                data = os.pread(f.fd, READ_CHUNK, f.read_pos)
            except OSError as exc:
                res.error(f"{f.path}: {exc.strerror}")
                return True
            if not data:
                return True
            f.read_pos += len(data)
            res.bytes_left -= len(data)
            self._append(f, data, res)

    def _append(self, f: _File, data: bytes, res: _Poll) -> None:
        """Add a chunk to ``pending`` (which holds no complete line now) without ever letting a
        line grow past ``max_line_bytes`` in memory."""
        if f.skipping:
            nl = data.find(b"\n")
            if nl < 0:
                return
            f.skipping = False
            data = data[nl + 1 :]
        nl = data.find(b"\n")
        if nl < 0:
            if len(f.pending) + len(data) > self.max_line_bytes:
                self._oversized(res)
                f.skip_from = f.read_pos - len(data) - len(f.pending)
                f.skipping = True
                f.pending.clear()
            else:
                f.pending += data
            return
        if len(f.pending) + nl > self.max_line_bytes:
            self._oversized(res)
            f.pending.clear()
            data = data[nl + 1 :]
        f.pending += data

    def _oversized(self, res: _Poll) -> None:
        res.read += 1
        res.parse_errors += 1
        res.count("oversized_lines")

    def _take_lines(self, f: _File, res: _Poll) -> None:
        if self.chunk_reader is not None:
            self._take_block(f, res)
            return
        buf = f.pending
        start = 0
        limit = self.max_line_bytes
        while res.lines_left > 0:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            if nl - start > limit:  # possible when max_line_bytes < READ_CHUNK
                self._oversized(res)
            else:
                self._line(buf[start:nl], res)
            res.lines_left -= 1
            start = nl + 1
        if start:
            del buf[:start]

    def _take_block(self, f: _File, res: _Poll) -> None:
        """``_take_lines`` for a chunk reader: the complete lines (within the poll's line
        budget) as one block of bytes, without a Python step per line."""
        buf = f.pending
        end = buf.rfind(b"\n") + 1
        if not end or res.lines_left <= 0:
            return
        with memoryview(buf) as view:
            # numpy counts the newlines ~9x faster than bytes.count (a byte at a time), and
            # the block is copied once (buf[:end] copied it, then bytes() again): together
            # about a tenth of following a kern.log.
            n = int(np.count_nonzero(np.frombuffer(view, np.uint8, end) == NEWLINE))
            if n > res.lines_left:
                n, end = res.lines_left, 0
                for _ in range(n):
                    end = buf.find(b"\n", end) + 1
            block = bytes(view[:end])
        del buf[:end]
        res.lines_left -= n
        if end > self.max_line_bytes:  # a line in it may be over the limit
            kept = []
            for line in block.split(b"\n")[:-1]:
                if len(line) > self.max_line_bytes:
                    self._oversized(res)
                else:
                    kept.append(line + b"\n")
            block = b"".join(kept)
            n = len(kept)
        res.read += n
        res.chunks.append(block)

    def _line(self, raw: bytes | bytearray, res: _Poll) -> None:
        res.read += 1
        self._parse(raw, res)

    def _parse(self, raw: bytes | bytearray, res: _Poll) -> None:
        text = raw.decode("utf-8", errors="replace")
        try:
            rec = self.line_parser(text)
        except ValueError:
            res.parse_errors += 1
            return
        except Exception as exc:  # a parser bug must not stop the source; count and say so
            res.parse_errors += 1
            res.count("parser_exceptions")
            res.error(f"line_parser: {type(exc).__name__}: {exc}")
            return
        if rec is not None:  # None: not a kernel line; the pipeline never sees it
            res.records.append(rec)
            res.last_ts = max(res.last_ts, rec.ts)

    def _finish(self, f: _File, res: _Poll) -> None:
        """The file left the globs and we read it to its end: flush its unterminated last line
        (the file will not grow any more, as far as we will ever see) and let it go."""
        if f.pending and not f.skipping:
            if len(f.pending) > self.max_line_bytes:
                self._oversized(res)
            elif self.chunk_reader is not None:
                res.read += 1
                res.chunks.append(bytes(f.pending) + b"\n")
            else:
                self._line(bytes(f.pending), res)
            res.lines_left -= 1
            f.pending.clear()
        with contextlib.suppress(OSError):
            os.close(f.fd)
        del self._files[f.ident]

    def _position(self) -> dict[str, Any]:
        files: dict[str, Any] = {}
        # Followed files own their path; a draining file whose old name was taken meanwhile
        # gets a unique key (a restart then finds it by identity, if at all).
        ordered = sorted(self._files.values(), key=lambda f: (f.draining, f.path))
        for f in ordered:
            key = f.path if f.path not in files else f"{f.path}#{f.ident[0]}:{f.ident[1]}"
            files[key] = {
                "dev": f.ident[0],
                "ino": f.ident[1],
                "fingerprint": f.fp,
                "fp_len": len(f.head),
                "offset": f.consumed,
            }
        return {"files": files}

    # -- restart -------------------------------------------------------------------------
    def _restore(self, matches: dict[str, os.stat_result], res: _Poll) -> None:
        """Reopen the files of the saved position wherever they are now."""
        saved = self.position.get("files") if isinstance(self.position, dict) else None
        if not isinstance(saved, dict):
            return
        candidates = dict(matches)
        for key in saved:
            base = key if os.path.exists(key) or "#" not in key else key.rsplit("#", 1)[0]
            candidates.update(_siblings(base))
        where: dict[Ident, str] = {}
        for path, st in candidates.items():
            ident = (st.st_dev, st.st_ino)
            # Prefer a name the globs match: that file is followed on, not just finished.
            if ident not in where or (path in matches and where[ident] not in matches):
                where[ident] = path
        for key, entry in saved.items():
            try:
                ident = (int(entry["dev"]), int(entry["ino"]))
                fp, fp_len, offset = (
                    str(entry["fingerprint"]),
                    int(entry["fp_len"]),
                    int(entry["offset"]),
                )
            except (KeyError, TypeError, ValueError):
                res.count("position_invalid")
                continue
            base = key.rsplit("#", 1)[0] if "#" in key and not os.path.exists(key) else key
            self._remember(base, ident)  # a different file there now is a rotation
            path = where.get(ident)
            if ident in self._files:  # the same file saved twice: once is enough
                continue
            f = self._resume(path, ident, fp, fp_len, offset, res) if path else None
            if f is not None:
                f.draining = path not in matches
                self._files[ident] = f
            elif path == base:
                res.truncations += 1  # same file, other first bytes: rewritten while stopped
            else:
                # Deleted or compressed while we were stopped: whatever it got after our offset
                # is unknown, maybe nothing.
                res.count("resume_file_missing")
                res.error(f"{key}: saved file not found; resuming with what is there now")

    def _resume(
        self, path: str, ident: Ident, fp: str, fp_len: int, offset: int, res: _Poll
    ) -> _File | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            res.error(f"{path}: {exc.strerror}")
            return None
        try:
            st = os.fstat(fd)
            head = os.pread(fd, fp_len, 0) if fp_len > 0 else b""
            if (st.st_dev, st.st_ino) != ident or len(head) != fp_len or _fingerprint(head) != fp:
                os.close(fd)
                return None
            head = os.pread(fd, HEAD_BYTES, 0)
        except OSError as exc:
            os.close(fd)
            res.error(f"{path}: {exc.strerror}")
            return None
        f = _File(fd, path, ident, offset, head, _fingerprint(head))
        f.last_stat = (st.st_size, st.st_mtime_ns)
        f.seen_size = st.st_size
        if st.st_size < offset:  # truncated while we were stopped
            res.truncations += 1
            f.read_pos = 0
        return f


def _siblings(path: str) -> dict[str, os.stat_result]:
    """Regular files next to ``path`` whose names start with its name (kern.log.1,
    kern.log-20260701): where logrotate puts the file that was at ``path``."""
    directory, base = os.path.split(path)
    out: dict[str, os.stat_result] = {}
    if not base:
        return out
    try:
        with os.scandir(directory or ".") as it:
            for entry in it:
                name = entry.name
                if not name.startswith(base) or name.endswith(COMPRESSED_SUFFIXES):
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[os.path.join(directory, name)] = st
                    if len(out) >= SIBLINGS_MAX:
                        break
    except OSError:
        pass
    return out
