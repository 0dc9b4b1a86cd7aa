"""``type: file``: fence records from text kernel logs (kern.log, saved dmesg or kmsg dumps),
followed like ``tail -F`` by the tailer (tail.py).  A file cannot prove who wrote a line, so
its records are never rejected as forged and the source exports
``capalarm_source_provenance_verified 0``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from alarm.collectors.base import SourceContext
from alarm.collectors.kernel import formats
from alarm.collectors.kernel.fence import FenceRead, FenceReader
from alarm.collectors.kernel.kmsg import boot_wall_time
from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.settings import FileSettings
from alarm.collectors.kernel.tail import ChunkReader, FileTailCollector, ParseLines, TailBatch
from alarm.events import Batch, Emit, SourceHealth


def kernel_line_parser(
    fmt: str, boot_wall: float = 0.0, year: int | None = None
) -> Callable[[str], KernelRecord | None]:
    """A line parser for a format; 'auto' decides per line, since a file can mix forms.
    Kernel uptime stamps (dmesg, kmsg) are put on the wall clock with ``boot_wall``; RFC 3164
    stamps get ``year`` (default: this year)."""
    year = year or time.gmtime().tm_year

    def dmesg(line: str) -> KernelRecord:
        rec = formats.parse_dmesg_line(line)
        return replace(rec, ts=rec.ts + boot_wall)

    def kmsg(line: str) -> KernelRecord:
        return formats.parse_kmsg_record(line, boot_wall)

    def syslog(line: str) -> KernelRecord | None:
        return formats.parse_syslog_line(line, year)

    if fmt == "kmsg":
        return kmsg
    if fmt == "dmesg":
        return dmesg
    if fmt == "syslog":
        return syslog

    def auto(line: str) -> KernelRecord | None:
        head = line[:1]
        if head.isdigit() and "," in line[:12]:
            return kmsg(line)
        if head in "[<":
            return dmesg(line)
        return syslog(line)

    return auto


def fence_chunk_reader(
    reader: FenceReader, fmt: str, boot_wall: float, year: int
) -> ChunkReader | None:
    """The tailer's chunk reader: a poll's lines through the native scanner, read as
    ``kernel_line_parser(fmt, boot_wall, year)`` and the fence reader would read them one by
    one (None where the scanner was not built or a prefix is not ASCII)."""
    if not reader.can_read_chunks(fmt):
        return None

    def read_chunk(data: bytes, parse_lines: ParseLines) -> tuple[FenceRead, float]:
        return reader.read_chunk(data, fmt, year, boot_wall, parse_lines)

    return read_chunk


class FileSource:
    """The tailer, with each poll's records read into write events in its worker thread."""

    def __init__(
        self, tailer: FileTailCollector, reader: FenceReader, chunks: ChunkReader | None = None
    ):
        self.name = tailer.name
        self.tailer = tailer
        self.reader = reader
        tailer.reader = reader.read
        tailer.chunk_reader = chunks
        tailer.health.mode = "file"  # the kernel backend used, as kmsg and journald name theirs

    @property
    def health(self) -> SourceHealth:
        return self.tailer.health

    async def run(self, emit: Emit) -> None:
        async def hand_over(tb: TailBatch) -> None:
            read: FenceRead = tb.read
            counts = dict(tb.counts)
            if read is not None:
                counts["parse_errors"] = counts.get("parse_errors", 0) + read.parse_errors
            await emit(
                Batch(
                    read.events if read is not None else None,
                    {k: n for k, n in counts.items() if n},
                    tb.position,
                    # Mid-backlog: events are in up to the last line read.  Caught up: up to
                    # now (the pipeline takes a caught-up source to be at "now").
                    watermark=tb.last_ts or None,
                )
            )

        await self.tailer.run(hand_over)


def build(cfg: FileSettings, ctx: SourceContext) -> FileSource:
    boot_wall, year = boot_wall_time(), time.gmtime().tm_year
    reader = FenceReader(tuple(cfg.prefixes), False, ctx.tick)
    chunks = fence_chunk_reader(reader, cfg.format, boot_wall, year)
    tailer = FileTailCollector(
        name=cfg.name,
        paths=list(cfg.paths),
        line_parser=kernel_line_parser(cfg.format, boot_wall, year),
        position=ctx.position,
        poll_interval=cfg.poll_interval,
        # Read natively, a poll's lines cost a few MB/s of C: the byte budget (4 MiB) bounds
        # a poll, not a line count meant for Python objects per line.
        batch_lines=1 << 20 if chunks is not None else 5000,
        start_at_end_for_new_files=cfg.start_at_end,
    )
    return FileSource(tailer, reader, chunks)
