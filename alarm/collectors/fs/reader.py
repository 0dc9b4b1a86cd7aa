"""A thread that drains a notification descriptor (inotify or fanotify) as fast as the kernel
fills it, so the kernel's queue (``max_queued_events``) rarely overflows while the engine is
busy with a scan chunk.  Reads are stamped with the wall time they were read at (the events'
time) and queued in memory up to ``limit`` events; beyond that the thread stops reading, so the
kernel queue fills and overflows with its own overflow event, which the engine repairs with a
reconcile scan: memory stays bounded and nothing is lost silently.

After a read that emptied the queue it pauses ``COALESCE_SECONDS``: fewer wakeups of the reader
mean a cheaper write for the writer (bench/fs_writer_tax.py).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import os
import select
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

READ_SIZE = 1 << 18
# After a read that drained the queue, wait this long before the next: events queue (and
# identical ones merge) in the kernel without waking a reader, which is what an event costs
# the writer most (the wakeup in fsnotify).  At the default max_queued_events (16384) it would
# take over 3 million events a second to overflow in that time.
COALESCE_SECONDS = 0.005


PR_SET_NAME = 15
# Larger than any one event: fanotify's metadata and two directory handles (128 B each at
# most) with their names (255 B), inotify's header and a name.
MAX_EVENT_BYTES = 1024


def queued_bytes(fd: int) -> int:
    """What the kernel holds unread on a notification descriptor (FIONREAD: inotify(7), and
    fanotify's ioctl since Linux 2.6.37); -1 when it cannot say."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf, True)
    except OSError:
        return -1
    return buf[0]


def name_thread(name: str) -> None:
    """Give the calling thread ``name`` (15 bytes) in the kernel too (``top -H``, and
    /proc/<pid>/task/<tid>/comm, where bench/fs_watcher_cpu.py reads the fs threads' CPU)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class EventReader:
    def __init__(
        self,
        fd: int,
        parse: Callable[[bytes], list[Any]],
        notify: Callable[[], None],
        limit: int = 1 << 18,
        name: str = "fs-reader",
        coalesce: float = COALESCE_SECONDS,
    ) -> None:
        self.coalesce = coalesce
        self.fd = fd
        self.parse = parse
        self.notify = notify
        self.limit = limit
        self.chunks: deque[tuple[float, list[Any]]] = deque()
        self._drained: deque[bool] = deque()  # per chunk: its read left the kernel's queue empty
        self._busy = False  # between a read and its chunk being queued
        # Every event queued in the kernel before this time has been taken (by take()): a
        # drained read's time, or the time take() found nothing anywhere.
        self.through = 0.0
        self.queued = 0
        self.error: OSError | None = None
        self.reads = 0
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def failed(self) -> bool:
        """It stopped reading without being asked to (an error, or the thread died)."""
        started = self._thread.ident is not None
        return self.error is not None or (started and not self.alive and not self._stopping)

    def _run(self) -> None:
        name_thread(self._thread.name)
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        try:
            while not self._stopping:
                with self._room:
                    while self.queued >= self.limit and not self._stopping:
                        self._room.wait(0.5)
                if self._stopping:
                    return
                ready = poller.poll()
                if self._stopping:
                    return
                if any(
                    fd == self.fd and ev & (select.POLLERR | select.POLLNVAL) for fd, ev in ready
                ):
                    raise OSError("notification descriptor failed")
                with self._lock:
                    self._busy = True
                try:
                    data = os.read(self.fd, READ_SIZE)
                except BlockingIOError:
                    with self._lock:
                        self._busy = False
                    continue
                if not data:
                    raise OSError("notification descriptor closed")
                read_at = time.time()
                # A read with room left for the largest event found the queue empty; only a
                # full one asks the kernel (one ioctl) whether more is waiting.
                drained = len(data) + MAX_EVENT_BYTES <= READ_SIZE or queued_bytes(self.fd) == 0
                events = self.parse(data)
                with self._lock:
                    self.chunks.append((read_at, events))
                    self._drained.append(drained)
                    self.queued += len(events)
                    self.reads += 1
                    self._busy = False
                self.notify()
                if len(data) < READ_SIZE // 2 and self.coalesce:
                    time.sleep(self.coalesce)
        except OSError as exc:
            self.error = exc
            self.notify()

    def take(self, max_events: int) -> tuple[list[tuple[float, list[Any]]], bool]:
        """Chunks holding up to about ``max_events`` events; and whether more are queued."""
        out = []
        n = 0
        now = time.time()
        with self._lock:
            while self.chunks and n < max_events:
                ts, events = self.chunks.popleft()
                if self._drained.popleft():
                    self.through = ts
                out.append((ts, events))
                n += len(events)
            self.queued -= n
            more = bool(self.chunks)
            if not more and not self._busy and queued_bytes(self.fd) == 0:
                self.through = now
            self._room.notify_all()
        return out, more

    def pending(self) -> bool:
        return bool(self.chunks)

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        with self._room:
            self._room.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
