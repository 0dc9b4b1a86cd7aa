"""The /dev/kmsg drain: a tiny child process that only moves records from the kernel ring
buffer into a pipe.

Why a separate process: the kernel ring buffer holds only about a thousand fence records, so at
100k records/s a reader has ~10 ms of slack.  The service's event loop, the parser and the
pipeline would all eat into that; a process whose loop is ``os.read`` + ``list.append`` keeps up
and, being a separate process, gets its own core and its own priority (SCHED_FIFO when
permitted, see ``main``; nice -10 otherwise).

Stream written to stdout (the parent's pipe), newline separated:

* kmsg records exactly as read (``PRI,SEQ,USEC,FLAGS;text`` plus any `` KEY=value``
  continuation lines; the kernel escapes newlines inside the text, so every line that starts
  with a digit opens a record);
* control lines starting with ``!`` (never the first byte of a kmsg line):
  ``!lost N CAUSE LASTSEQ`` -- N records up to SEQ LASTSEQ are missing right here in the
  sequence, written just before the record that follows the gap; ``!warn TEXT``;
  ``!ready`` once the starting point is fixed (with ``--from end``: the backlog is skipped).

Loss is counted here, where it happens, from the kernel's own sequence numbers: a reader
overrun (``read`` fails with EPIPE and the kernel skips to the oldest record still kept), a gap
at the resume point, and records this process had to drop because the parent fell more than
``--limit`` bytes behind.  The steady-state loop parses nothing: the SEQ field is only read
around a gap, so keeping up costs one ``read`` per record.

Runs as ``python -m alarm.collectors.kernel.kmsg_drain --path /dev/kmsg --from end|start|SEQ``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import os
import select
import signal
import stat
import sys
import time
from collections import deque

RECORD_MAX = 8192  # CONSOLE_EXT_LOG_MAX: the kernel's largest /dev/kmsg record
BLOCK = 64 * 1024  # records are joined into blocks of about this size before queueing
FLUSH_EVERY = 256  # records between write attempts while the kernel keeps us busy
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = 1031
PR_SET_PDEATHSIG = 1
START_SKIP_SECONDS = 0.2  # "--from end": stop discarding the backlog after this long
# Waiting for more: printk wakes readers through a *lazy* irq_work, i.e. at the next timer
# tick (4 ms at HZ=250) -- a third of the ring's slack at 100k records/s.  While records are
# flowing we therefore also wake on a 1 ms timer; after this many empty timeouts in a row
# (~0.2 s of silence) we go back to waiting for the kernel's wakeup alone.
ACTIVE_POLL_MS = 1
IDLE_AFTER = 200


def record_seq(rec: bytes) -> int:
    """SEQ of a raw kmsg record; only called around gaps, never per record."""
    return int(rec.split(b",", 2)[1])


class Drain:
    def __init__(self, kfd: int, out: int, limit: int, watch_fd: int | None = None) -> None:
        self.kfd = kfd
        self.out = out
        self.limit = limit
        self.watch_fd = watch_fd  # the parent's stdin pipe: any event on it means "stop"
        self.current: list[bytes] = []  # records not yet joined into a block
        self.current_bytes = 0
        self.blocks: deque[bytes | memoryview] = deque()  # joined, waiting for the pipe
        self.queued = 0  # bytes in blocks + current
        self.dropped = 0  # records dropped since the last report (parent too slow)
        self.full = False
        self.last_dropped: bytes | None = None

    # -- output side --------------------------------------------------------------------
    def put(self, data: bytes) -> None:
        self.current.append(data)
        self.current_bytes += len(data)
        self.queued += len(data)
        if self.current_bytes >= BLOCK:
            self.seal()

    def seal(self) -> None:
        if self.current:
            self.blocks.append(b"".join(self.current))
            self.current.clear()
            self.current_bytes = 0

    def flush(self) -> None:
        """Write as much as the pipe takes without blocking."""
        self.seal()
        blocks = self.blocks
        while blocks:
            head = blocks[0]
            try:
                n = os.write(self.out, head)
            except BlockingIOError:
                break
            self.queued -= n
            if n == len(head):
                blocks.popleft()
            else:
                blocks[0] = memoryview(head)[n:]
                break
        if self.full and self.queued < self.limit // 2:
            # Hysteresis: report the drop once there is room again, at the point of the gap.
            self.full = False
            last = record_seq(self.last_dropped) if self.last_dropped else -1
            self.put(b"!lost %d drain_full %d\n" % (self.dropped, last))
            self.dropped = 0

    def lost(self, n: int, cause: str, last_seq: int) -> None:
        """Report ``n`` records missing, the last of them being ``last_seq``."""
        if n > 0:
            self.put(b"!lost %d %s %d\n" % (n, cause.encode(), last_seq))

    # -- input side ---------------------------------------------------------------------
    def run(self, expected: int | None, skip_until: float | None) -> None:
        """``expected``: the next SEQ wanted (resume), or None.  ``skip_until``: discard the
        backlog until the reader catches up or this monotonic time passes ("--from end")."""
        kfd, read, put = self.kfd, os.read, self.put
        skipping = expected is not None or skip_until is not None
        overrun = False
        last: bytes | None = None  # last record read (forwarded or skipped); SEQ parsed lazily
        poller = select.poll()
        poller.register(kfd, select.POLLIN)
        if self.watch_fd is not None:
            poller.register(self.watch_fd, select.POLLIN)
        n = 0
        idle = 0  # empty short polls in a row
        while True:
            try:
                rec = read(kfd, RECORD_MAX)
            except BlockingIOError:
                if skip_until is not None:
                    # Caught up with the backlog: this is the end we start from.
                    skipping, skip_until = False, None
                    expected = record_seq(last) + 1 if last is not None else None
                    put(b"!ready\n")
                self.flush()
                if not self.wait(poller, ACTIVE_POLL_MS if idle < IDLE_AFTER else None):
                    idle += 1
                n = 0
                continue
            except BrokenPipeError:
                # EPIPE: the kernel overwrote records we had not read yet and moved us to the
                # oldest one it still keeps.  The next record's SEQ tells how many are gone.
                if not overrun and not skipping and last is not None:
                    expected = record_seq(last) + 1
                overrun = True
                continue
            if not rec:
                return  # EOF: kmsg never gives one; only a test's stand-in does
            idle = 0
            if skipping:
                seq = record_seq(rec)
                if skip_until is not None:
                    if time.monotonic() < skip_until:
                        last, overrun = rec, False
                        continue
                    # Never caught up within the time allowed: start with this record.
                    skipping, skip_until, expected = False, None, seq
                    put(b"!ready\n")
                elif expected is not None and seq < expected:
                    last = rec
                    continue
                skipping = False
                if expected is not None and seq > expected:
                    self.lost(seq - expected, "overrun" if overrun else "resume", seq - 1)
                overrun = False
            elif overrun:
                overrun = False
                if expected is None:
                    put(b"!warn overrun before the first record: size unknown\n")
                else:
                    seq = record_seq(rec)
                    self.lost(seq - expected, "overrun", seq - 1)
            last = rec
            if self.full or self.queued >= self.limit:
                self.full = True  # the parent is far behind: drop, count, report later
                self.dropped += 1
                self.last_dropped = rec
            else:
                put(rec)
            n += 1
            if n >= FLUSH_EVERY:
                n = 0
                self.flush()

    def wait(self, poller: select.poll, timeout_ms: int | None) -> bool:
        """Sleep until kmsg has data, the pipe has room or ``timeout_ms``; False on timeout."""
        if self.blocks:
            poller.register(self.out, select.POLLOUT)
        else:
            # Unregistered fds are not polled; ignore "not registered".
            with contextlib.suppress(KeyError):
                poller.unregister(self.out)
        events = poller.poll(timeout_ms)
        for fd, ev in events:
            if fd == self.watch_fd:
                raise SystemExit(0)  # the parent closed our stdin or died
            if fd == self.out and ev & (select.POLLERR | select.POLLHUP):
                raise SystemExit(0)  # nobody reads the stream any more
        return bool(events)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when the parent exits (and cover the race where it already did)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # stdin EOF and EPIPE on stdout still end us
    if parent and os.getppid() != parent:
        sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kmsg_drain")
    ap.add_argument("--path", default="/dev/kmsg")
    ap.add_argument("--from", dest="start", default="end", help="end, start, or the last SEQ seen")
    ap.add_argument("--nice", type=int, default=-10)
    ap.add_argument("--rt", type=int, default=1, help="SCHED_FIFO priority; 0: nice only")
    ap.add_argument("--limit", type=int, default=256 << 20, help="bytes buffered before dropping")
    ap.add_argument("--parent", type=int, default=0)
    args = ap.parse_args(argv)
    die_with_parent(args.parent)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # parent gone: just die
    # A service manager stopping capalarm signals the whole process group (systemd's default
    # KillMode): the drain must outlive that signal long enough for the parent to shut down
    # in order; it still dies with the parent (PDEATHSIG, stdin EOF, EPIPE).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = sys.stdout.fileno()
    warns: list[bytes] = []
    try:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    except OSError as exc:
        warns.append(b"!warn cannot set nice %d: %s\n" % (args.nice, exc.strerror.encode()))
    if args.rt > 0:
        # Measured on a 2-core VM loaded by other jobs, 100k records/s for 3 s: nice -10 alone
        # lost 12-25% (busy nice-0 tasks keep the CPU for the rest of their slice), SCHED_FIFO
        # alone 1-10%, SCHED_FIFO with the 1 ms poll above 0.  It sleeps whenever it has caught up, and the kernel's RT
        # throttling keeps 5% of each CPU for everyone else even under an endless flood.
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.rt))
        except OSError as exc:
            warns.append(b"!warn no SCHED_FIFO, nice only: %s\n" % exc.strerror.encode())
    # Not a pipe (manual runs) or above pipe-max-size: the default size still works.
    with contextlib.suppress(OSError):
        fcntl.fcntl(out, F_SETPIPE_SZ, PIPE_SIZE)
    os.set_blocking(out, False)
    kfd = os.open(args.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    watch = 0 if stat.S_ISFIFO(os.fstat(0).st_mode) else None
    drain = Drain(kfd, out, args.limit, watch)
    for w in warns:
        drain.put(w)
    expected: int | None = None
    skip_until: float | None = None
    if args.start == "end":
        # Read (and discard) the backlog instead of SEEK_END, so that the SEQ we start from is
        # known and an overrun right at the start is still counted exactly.
        os.lseek(kfd, 0, os.SEEK_SET)
        skip_until = time.monotonic() + START_SKIP_SECONDS
    elif args.start == "start":
        os.lseek(kfd, 0, os.SEEK_SET)
    else:
        os.lseek(kfd, 0, os.SEEK_SET)  # SEEK_SET on kmsg = oldest record still kept
        expected = int(args.start) + 1
    if skip_until is None:
        drain.put(b"!ready\n")  # reading from a fixed point: whatever comes next is ours
    try:
        drain.run(expected, skip_until)
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            return 0
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
