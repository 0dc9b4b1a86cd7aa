"""journald source: kernel records through ``journalctl``, for hosts where /dev/kmsg is closed
to us.

Runs ``journalctl -b -o json -f`` with the matches ``_TRANSPORT=kernel`` (what ``-k`` adds)
``+ _TRANSPORT=driver MESSAGE_ID=<journal missed>``: the second kind is journald's own note
"Missed N kernel messages", written when it fell behind /dev/kmsg, and is how loss becomes
visible here.  ``_TRANSPORT`` is set by journald, not by the sender, so neither can be faked.

Trust: journald files *every* /dev/kmsg record under ``_TRANSPORT=kernel``, including those
user space wrote to /dev/kmsg (checked on systemd 252: a ``<0>`` write arrives as
``_TRANSPORT=kernel``, ``SYSLOG_FACILITY=1``).  So a record is trusted only with kernel
transport *and* facility 0 -- the same proof as on /dev/kmsg.  Records failing it are still
emitted (untrusted) so the pipeline counts them as forged.

Position: ``{"cursor": <__CURSOR of the last entry counted>}``; a restart passes
``--after-cursor``, a first start ``-n 0`` (from the end).  journalctl exiting (journal
rotated away, journald restarted) marks the source down and restarts it with backoff.  A saved
cursor journalctl refuses (journal vacuumed, another machine's) is a gap of unknown size: the
source continues from the end and counts ``records_lost_unknown`` and ``cursor_resets``, which
raise the ``records_lost`` alarm with the gap stated as unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from alarm.collectors.base import SourceContext, SourceType, SourceUnavailable
from alarm.collectors.kernel.fence import FenceRead, FenceReader, KernelSettings
from alarm.collectors.kernel.formats import parse_journal_json
from alarm.collectors.kernel.records import KernelRecord
from alarm.events import Batch, Emit, SourceHealth
from alarm.jsontext import loads_json

# SD_MESSAGE_JOURNAL_MISSED: "Missed N kernel messages" (journald-kmsg.c).
MISSED_ID = "e9bf28e6e834481bb6f48f548ad13606"
MISSED_RE = re.compile(r"Missed (\d+) kernel messages")
READ_MAX = 1 << 20
STREAM_LIMIT = 4 << 20
INLINE_MAX = 16 * 1024


@dataclass(slots=True)
class JournalChunk:
    records: list[KernelRecord] = field(default_factory=list)
    lost: int = 0
    parse_errors: int = 0
    cursor: str | None = None


def parse_journal_chunk(data: bytes) -> JournalChunk:
    """Lines of ``journalctl -o json`` -> records, reported loss and the last cursor."""
    out = JournalChunk()
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            obj = loads_json(line)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
            cursor = obj.get("__CURSOR")
            transport = obj.get("_TRANSPORT")
            if transport == "driver":
                if obj.get("MESSAGE_ID") == MISSED_ID:
                    m = MISSED_RE.search(str(obj.get("MESSAGE", "")))
                    out.lost += int(m.group(1)) if m else 0
            elif transport == "kernel":
                rec = parse_journal_json(obj)
                if rec is not None:
                    out.records.append(rec)
        except ValueError:  # json.JSONDecodeError is a ValueError
            out.parse_errors += 1
            continue
        if isinstance(cursor, str):
            out.cursor = cursor
    return out


def read_journal_chunk(data: bytes, reader: FenceReader) -> tuple[JournalChunk, FenceRead]:
    chunk = parse_journal_chunk(data)
    return chunk, reader.read(chunk.records)


class JournaldCollector:
    def __init__(
        self,
        name: str = "journald",
        position: dict[str, Any] | None = None,
        journalctl: str = "journalctl",
        directory: str | None = None,
        retry_max: float = 30.0,
        prefixes: tuple[str, ...] = ("EGRESS_FENCE",),
        tick: float = 1.0,
        reader: FenceReader | None = None,
    ) -> None:
        """``reader``: what turns the records into write events (default: the fence reader
        for ``prefixes``)."""
        self.name = name
        self.reader = reader or FenceReader(tuple(prefixes), require_trusted=True, tick=tick)
        self.journalctl = journalctl
        self.directory = directory  # read journal files there (-D) instead of the system's
        self.retry_max = retry_max
        cursor = (position or {}).get("cursor")
        self.cursor: str | None = cursor if isinstance(cursor, str) else None
        self.health = SourceHealth(provenance_verified=True)
        self.restarts = 0

    def argv(self, exe: str) -> list[str]:
        args = [exe, "-b", "-o", "json", "--all", "-f"]
        if self.directory:
            args += ["-D", self.directory]
        if self.cursor:
            args += ["--no-tail", f"--after-cursor={self.cursor}"]
        else:
            args += ["-n", "0"]
        return [*args, "_TRANSPORT=kernel", "+", "_TRANSPORT=driver", f"MESSAGE_ID={MISSED_ID}"]

    async def run(self, emit: Emit) -> None:
        delay = min(1.0, self.retry_max)
        while True:
            exe = shutil.which(self.journalctl)
            if exe is None:
                raise SourceUnavailable(f"{self.journalctl!r} not found: cannot read the journal")
            delivered, err = await self._run_once(exe, emit)
            self.health.up = False
            self.restarts += 1
            if self.cursor and not delivered and "cursor" in err.lower():
                # The saved cursor is unusable (journal vacuumed, other machine): the gap
                # cannot be measured, so say so and continue from the end.
                self.cursor = None
                await emit(
                    Batch(
                        counts={"records_lost_unknown": 1, "cursor_resets": 1},
                        position={"cursor": None},
                    )
                )
            self.health.failed(f"journalctl exited: {err}", time.time())
            if delivered:
                delay = min(1.0, self.retry_max)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max)

    async def _run_once(self, exe: str, emit: Emit) -> tuple[bool, str]:
        """One journalctl process until it exits: (delivered anything, its last stderr line)."""
        proc = await asyncio.create_subprocess_exec(
            *self.argv(exe),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=STREAM_LIMIT,
        )
        assert proc.stdout is not None and proc.stderr is not None
        health = self.health
        health.up = True
        delivered = False
        tail = b""
        errors: deque[str] = deque(maxlen=3)

        async def read_stderr(stream: asyncio.StreamReader) -> None:
            # Read as it comes, so a chatty journalctl never blocks on a full stderr pipe.
            async for raw in stream:
                errors.append(raw.decode("utf-8", "replace").strip())

        err_task = asyncio.create_task(read_stderr(proc.stderr))
        try:
            while True:
                data = await proc.stdout.read(READ_MAX)
                if not data:
                    break
                data = tail + data if tail else data
                cut = data.rfind(b"\n") + 1
                data, tail = data[:cut], data[cut:]
                if not data:
                    continue
                if len(data) <= INLINE_MAX:
                    chunk, read = read_journal_chunk(data, self.reader)
                else:
                    chunk, read = await asyncio.to_thread(read_journal_chunk, data, self.reader)
                position = {"cursor": chunk.cursor} if chunk.cursor else None
                counts = {
                    "records_read": len(chunk.records),
                    "records_lost": chunk.lost,
                    "parse_errors": chunk.parse_errors + read.parse_errors,
                    "forged_records": read.forged,
                }
                last_ts = chunk.records[-1].ts if chunk.records else None
                await emit(
                    Batch(
                        read.events,
                        {k: n for k, n in counts.items() if n},
                        position,
                        watermark=last_ts,
                    )
                )
                if chunk.cursor:
                    self.cursor = chunk.cursor
                delivered = True
                health.caught_up = len(data) < READ_MAX
                if last_ts:
                    health.last_record_ts = last_ts
            await proc.wait()
            await err_task
            return delivered, f"status {proc.returncode}: {errors[-1] if errors else ''}"
        finally:
            err_task.cancel()
            health.up = False
            health.caught_up = False
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(proc.wait())


class JournaldSettings(KernelSettings):
    """``type: journald``: kernel records through journalctl, where /dev/kmsg is closed."""

    type: Literal["journald"]
    journal_directory: str | None = None  # read journal files there (-D) instead of the system's


def build(cfg: JournaldSettings, ctx: SourceContext) -> JournaldCollector:
    return JournaldCollector(
        name=cfg.name,
        position=ctx.position,
        directory=cfg.journal_directory,
        prefixes=tuple(cfg.prefixes),
        tick=ctx.tick,
    )


SOURCE = SourceType(
    "journald",
    JournaldSettings,
    build,
    kind="egress",
    counters={
        "cursor_resets": "Saved journal cursors journalctl refused (journal vacuumed): a gap of unknown size.",
    },
    forgeable=True,
)
