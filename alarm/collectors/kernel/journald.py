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

Sight: ``journalctl -f`` with no journal to read (journald not running, ``Storage=none``, a
user outside ``systemd-journal``) prints "No journal files were found." and runs for ever,
seeing nothing.  So before it starts, the collector looks for a system journal file it can
open (``/run/log/journal``, ``/var/log/journal``, or ``-D``'s directory), and also reads
journalctl's own complaint; either way the source is *blind* (``health.blind``, the reason in
one line; ``up`` false: not ready) until a kernel record arrives or a journal file becomes
readable (checked every ``sight_recheck`` s, then journalctl is started again to open it).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import re
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from alarm.collectors.base import SourceContext, SourceUnavailable
from alarm.collectors.kernel.fence import FenceRead, FenceReader
from alarm.collectors.kernel.formats import parse_journal_json
from alarm.collectors.kernel.records import KernelRecord
from alarm.collectors.kernel.settings import JournaldSettings
from alarm.events import Batch, Emit, SourceHealth
from alarm.jsontext import loads_json
from alarm.sanitize import sanitize

# SD_MESSAGE_JOURNAL_MISSED: "Missed N kernel messages" (journald-kmsg.c).
MISSED_ID = "e9bf28e6e834481bb6f48f548ad13606"
MISSED_RE = re.compile(r"Missed (\d+) kernel messages")
READ_MAX = 1 << 20
STREAM_LIMIT = 4 << 20
INLINE_MAX = 16 * 1024
# Where journald keeps the journal: volatile, then persistent (journalctl's own search path).
SYSTEM_JOURNAL_DIRS = ("/run/log/journal", "/var/log/journal")
SIGHT_RECHECK = 30.0  # while blind, how often a journal file is looked for again (s)
# What journalctl says, on stderr, when it has nothing to read (it runs on regardless).
NO_JOURNAL = ("No journal files were",)
BLIND_TEXT_LIMIT = 300


def _can_read(path: str) -> bool:
    # os.access is not enough: ACLs and capabilities decide, as for journalctl's own open.
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


def journal_sight(directory: str | None, roots: tuple[str, ...] = SYSTEM_JOURNAL_DIRS) -> str:
    """Why journalctl has no journal file to read kernel records from, in one line; "" when
    it has one.  Without ``directory`` only *system* journals count: the kernel's records are
    there, never in a user's journal (``user-1000.journal``), which a user outside
    ``systemd-journal`` can read and which would make journalctl look busy."""
    where = (directory,) if directory else roots
    pattern = "*.journal*" if directory else "system*.journal*"
    existing = [d for d in where if os.path.isdir(d)]
    if not existing:
        missing = f"neither {' nor '.join(where)} exists" if len(where) > 1 else f"no {where[0]}"
        return f"no journal: {missing} (journald not running here?)"
    unlistable = [d for d in existing if not os.access(d, os.R_OK | os.X_OK)]
    files = [
        f
        for d in existing
        for f in glob.glob(os.path.join(glob.escape(d), pattern))
        + glob.glob(os.path.join(glob.escape(d), "*", pattern))
    ]
    if any(_can_read(f) for f in files):
        return ""
    if files or unlistable:
        denied = ", ".join(unlistable) if unlistable and not files else "its files"
        return (
            f"cannot read the journal in {' or '.join(existing)}: permission denied on "
            f"{denied} (run as root or in group systemd-journal)"
        )
    return (
        f"no journal files in {' or '.join(existing)} (journald not running here, or Storage=none)"
    )


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
        journal_roots: tuple[str, ...] = SYSTEM_JOURNAL_DIRS,
        blind_prefix: str = "",
        sight_recheck: float = SIGHT_RECHECK,
    ) -> None:
        """``reader``: what turns the records into write events (default: the fence reader
        for ``prefixes``).  ``journal_roots``: where the system journal is looked for (without
        ``directory``).  ``blind_prefix``: said before why the journal cannot be read (the
        auto source says why it is not reading /dev/kmsg instead)."""
        self.name = name
        self.reader = reader or FenceReader(tuple(prefixes), require_trusted=True, tick=tick)
        self.journalctl = journalctl
        self.directory = directory  # read journal files there (-D) instead of the system's
        self.retry_max = retry_max
        cursor = (position or {}).get("cursor")
        self.cursor: str | None = cursor if isinstance(cursor, str) else None
        self.health = SourceHealth(provenance_verified=True, mode="journald")
        self.restarts = 0
        self.journal_roots = journal_roots
        self.blind_prefix = blind_prefix
        self.sight_recheck = sight_recheck
        self._blind = ""  # what this collector set health.blind to ("": nothing)
        self._reported = ""  # the last reason recorded as an error (not again each restart)
        self._reopen = False  # the follower was stopped to open a journal that appeared

    def _set_blind(self, why: str) -> None:
        """Say why the journal cannot be read ("" : it can).  Only what this collector said
        is cleared (the egress canary may have its own reason)."""
        health = self.health
        message = sanitize(self.blind_prefix + why, BLIND_TEXT_LIMIT) if why else ""
        if message:
            health.up = False
            if health.blind in ("", self._blind):
                health.blind = message
            if message != self._reported:  # the source_down alarm says why, too
                health.failed(message, time.time())
                self._reported = message
        elif self._blind and health.blind == self._blind:
            health.blind = ""
        self._blind = message

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
                why = f"{self.journalctl!r} not found: cannot read the journal"
                self._set_blind(why)
                raise SourceUnavailable(why)
            self._set_blind(journal_sight(self.directory, self.journal_roots))
            delivered, err = await self._run_once(exe, emit)
            if self._reopen:  # stopped on purpose, to open a journal that appeared
                self._reopen = False
                continue
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
        health.up = not self._blind  # running, but not reading anything while blind
        delivered = False
        tail = b""
        errors: deque[str] = deque(maxlen=3)

        async def read_stderr(stream: asyncio.StreamReader) -> None:
            # Read as it comes, so a chatty journalctl never blocks on a full stderr pipe.
            async for raw in stream:
                line = raw.decode("utf-8", "replace").strip()
                errors.append(line)
                if line.startswith(NO_JOURNAL) and not self._blind:  # keep the finer reason
                    self._set_blind(f"journalctl: {line}")

        async def recheck_sight() -> None:
            # journalctl -f does not open journal files created after it started: once one
            # can be read, stop it so that the run loop starts it again.
            while True:
                await asyncio.sleep(self.sight_recheck)
                if self._blind and not journal_sight(self.directory, self.journal_roots):
                    self._reopen = True
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    return

        err_task = asyncio.create_task(read_stderr(proc.stderr))
        sight_task = asyncio.create_task(recheck_sight())
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
                        forged_sample=read.forged_sample,
                    )
                )
                if chunk.cursor:
                    self.cursor = chunk.cursor
                    if self._blind:  # a journal entry read: it can see after all
                        self._set_blind("")
                    health.up = True
                delivered = True
                health.caught_up = len(data) < READ_MAX
                if last_ts:
                    health.last_record_ts = last_ts
            await proc.wait()
            await err_task
            return delivered, f"status {proc.returncode}: {errors[-1] if errors else ''}"
        finally:
            err_task.cancel()
            sight_task.cancel()
            health.up = False
            health.caught_up = False
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(proc.wait())


def build(cfg: JournaldSettings, ctx: SourceContext) -> JournaldCollector:
    return JournaldCollector(
        name=cfg.name,
        position=ctx.position,
        directory=cfg.journal_directory,
        prefixes=tuple(cfg.prefixes),
        tick=ctx.tick,
    )
