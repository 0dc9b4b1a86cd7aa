"""/dev/kmsg source: the kernel's own fence records, with proof of origin and exact loss.

Two processes.  ``alarm.collectors.kernel.kmsg_drain`` (a child at SCHED_FIFO 1 when allowed, else
nice -10) does nothing but read one record per ``read`` and push them, framed as lines, into a
1 MiB pipe, buffering in its own memory when we are slow; it counts every gap in the kernel's sequence numbers and says so
in-band (``!lost N CAUSE LASTSEQ``).  This side, on the event loop, splits the stream, parses
records (in a worker thread for big chunks) and emits batches.

Trust: user space may write to /dev/kmsg, but the kernel rewrites facility 0 ("kern") to 1
("user") for such writes, so ``facility == 0`` proves the kernel wrote the record.  Every
record carries that verdict in ``trusted``; the fence reader (fence.py) counts a fence record
without it as forged, never as traffic.

Time: kmsg timestamps are the kernel's ``local_clock`` in microseconds since boot, which tracks
CLOCK_MONOTONIC (here within ~1 ms), so wall time = (now - monotonic now) + usec / 1e6.

Position: ``{"boot_id": <kernel boot id>, "seq": <last SEQ counted>}``.  Resuming in the same
boot re-reads the ring buffer from its oldest record, skips SEQ <= seq and counts the gap if
the kernel already overwrote what came next.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from alarm.collectors.base import SourceContext, SourceUnavailable
from alarm.collectors.kernel.fence import FenceRead, FenceReader
from alarm.collectors.kernel.formats import parse_kmsg_record
from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.settings import KmsgSettings
from alarm.events import Batch, Emit, SourceHealth

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
READ_MAX = 1 << 20  # one pipe's worth per read
STREAM_LIMIT = 4 << 20  # asyncio buffer before it stops reading (the drain buffers beyond)
INLINE_MAX = 16 * 1024  # parse smaller chunks on the loop; a thread hop costs more
DRAIN_BUFFER = 256 << 20


def boot_id() -> str:
    with open(BOOT_ID_PATH) as f:
        return f.read().strip()


def boot_wall_time() -> float:
    """Unix time of boot, in the kmsg clock's terms (see module docstring)."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass(slots=True)
class Chunk:
    """What one piece of the drain stream contained."""

    records: list[KernelRecord] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)  # cause -> records
    warnings: list[str] = field(default_factory=list)
    ready: bool = False
    parse_errors: int = 0
    last_seq: int | None = None
    last_ts: float = 0.0


def parse_chunk(data: bytes, boot_wall: float, prev_seq: int | None) -> Chunk:
    """Split drain output into records and control lines.  ``prev_seq`` is the SEQ counted
    before this chunk; a SEQ jump the drain did not report is counted as ``unexplained`` loss,
    so a bug in the drain cannot lose records silently either."""
    out = Chunk(last_seq=prev_seq)
    records = out.records
    lost = out.lost
    prev = prev_seq
    for line in data.split(b"\n"):
        if not line or line[0] == 0x20:  # blank, or a " KEY=value" continuation line
            continue
        if line[0] == 0x21:  # "!": control line from the drain
            parts = line[1:].decode("ascii", "replace").split()
            if parts[:1] == ["lost"] and len(parts) >= 3:
                lost[parts[2]] = lost.get(parts[2], 0) + int(parts[1])
                if len(parts) >= 4:
                    prev = int(parts[3])
            elif parts[:1] == ["ready"]:
                out.ready = True
            elif parts[:1] == ["warn"]:
                out.warnings.append(" ".join(parts[1:])[:200])
            continue
        try:
            rec = parse_kmsg_record(line, boot_wall)
        except ValueError:
            out.parse_errors += 1
            continue
        seq = rec.seq
        if seq is not None:
            if prev is not None and seq != prev + 1 and seq > prev:
                lost["unexplained"] = lost.get("unexplained", 0) + seq - prev - 1
            prev = seq
        records.append(rec)
    out.last_seq = prev
    if records:
        out.last_ts = records[-1].ts
    return out


def read_chunk(
    data: bytes, boot_wall: float, prev_seq: int | None, reader: FenceReader
) -> tuple[Chunk, FenceRead]:
    """A piece of the drain stream, split and read into write events (in a worker thread for
    big pieces)."""
    chunk = parse_chunk(data, boot_wall, prev_seq)
    return chunk, reader.read(chunk.records)


class KmsgCollector:
    def __init__(
        self,
        name: str = "kmsg",
        path: str = "/dev/kmsg",
        position: dict[str, Any] | None = None,
        start_at_end: bool = True,
        nice: int = -10,
        buffer_limit: int = DRAIN_BUFFER,
        realtime: int = 1,
        prefixes: tuple[str, ...] = ("EGRESS_FENCE",),
        tick: float = 1.0,
        reader: FenceReader | None = None,
    ) -> None:
        """``reader``: what turns the records into write events (default: the fence reader
        for ``prefixes``); called in a worker thread for big chunks."""
        self.name = name
        self.reader = reader or FenceReader(tuple(prefixes), require_trusted=True, tick=tick)
        self.path = path
        self.start_at_end = start_at_end
        self.nice = nice
        self.buffer_limit = buffer_limit
        self.realtime = realtime  # drain's SCHED_FIFO priority (0: nice only); see kmsg_drain
        self.position: dict[str, Any] | None = dict(position) if position else None
        self.health = SourceHealth(provenance_verified=True, mode="kmsg")
        self.drain_pid: int | None = None  # exposed for tests (SIGSTOP) and benches
        # Set once the drain has fixed its starting point: what is logged after this is read.
        self.ready = asyncio.Event()

    def _start_arg(self, current_boot: str) -> str:
        pos = self.position
        if pos and pos.get("boot_id") == current_boot and isinstance(pos.get("seq"), int):
            return str(pos["seq"])
        return "end" if self.start_at_end else "start"

    def _check_readable(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise SourceUnavailable(
                f"cannot read {self.path}: {exc.strerror} (needs root or CAP_SYSLOG; "
                "use the journald source instead)"
            ) from exc
        os.close(fd)

    async def run(self, emit: Emit) -> None:
        self._check_readable()
        current_boot = boot_id()
        start = self._start_arg(current_boot)
        prev_seq = int(start) if start.isdigit() else None
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "alarm.collectors.kernel.kmsg_drain",
            "--path",
            self.path,
            "--from",
            start,
            "--nice",
            str(self.nice),
            "--rt",
            str(self.realtime),
            "--limit",
            str(self.buffer_limit),
            "--parent",
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,  # never written: EOF tells the drain we are gone
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=STREAM_LIMIT,
        )
        self.drain_pid = proc.pid
        assert proc.stdout is not None
        health = self.health
        tail = b""
        try:
            while True:
                data = await proc.stdout.read(READ_MAX)
                if not data:
                    await self._drain_died(proc)
                if tail:
                    data = tail + data
                cut = data.rfind(b"\n") + 1
                data, tail = data[:cut], data[cut:]
                if not data:
                    continue
                boot_wall = boot_wall_time()
                if len(data) <= INLINE_MAX:
                    chunk, read = read_chunk(data, boot_wall, prev_seq, self.reader)
                else:
                    chunk, read = await asyncio.to_thread(
                        read_chunk, data, boot_wall, prev_seq, self.reader
                    )
                position = self.position
                if chunk.last_seq is not None and chunk.last_seq != prev_seq:
                    position = {"boot_id": current_boot, "seq": chunk.last_seq}
                counts = {
                    "records_read": len(chunk.records),
                    "parse_errors": chunk.parse_errors + read.parse_errors,
                    "forged_records": read.forged,
                    "records_lost": sum(chunk.lost.values()),
                    **{f"lost_{cause}": n for cause, n in chunk.lost.items()},
                }
                # A read that filled the buffer may have more behind it: until one does not,
                # events are in up to the last record read, not up to now.
                caught_up = len(data) < READ_MAX
                await emit(
                    Batch(
                        read.events,
                        {k: n for k, n in counts.items() if n},
                        position if position is not self.position else None,
                        watermark=chunk.last_ts or None,
                        forged_sample=read.forged_sample,
                    )
                )
                prev_seq = chunk.last_seq
                self.position = position
                health.caught_up = caught_up and health.up
                if chunk.last_ts:
                    health.last_record_ts = chunk.last_ts
                if chunk.ready:
                    # Up only once the drain holds its read position: before that, records
                    # the kernel logs may fall before where a start-at-end reader begins.
                    health.up = True
                    health.caught_up = caught_up
                    self.ready.set()
                for w in chunk.warnings:
                    health.failed(f"drain: {w}", time.time())
        finally:
            health.up = False
            health.caught_up = False
            self.ready.clear()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(proc.wait())

    async def _drain_died(self, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        err = b""
        if proc.stderr is not None:
            err = await proc.stderr.read()
        detail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"kmsg drain exited with status {rc}: {detail[0][:300]}")


def build(cfg: KmsgSettings, ctx: SourceContext) -> KmsgCollector:
    return KmsgCollector(
        name=cfg.name,
        path=cfg.kmsg_path,
        position=ctx.position,
        start_at_end=cfg.start_at_end,
        nice=cfg.nice,
        prefixes=tuple(cfg.prefixes),
        tick=ctx.tick,
    )
