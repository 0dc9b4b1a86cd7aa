"""inotify(7) through libc: the lower layer the fs source watches trees with.

watchdog is not used: its inotify emitter drops ``IN_Q_OVERFLOW`` without a word (watchdog
issue #654), so a queue overflow would silently lose writes, and it walks a new tree in Python
one ``add_watch`` at a time while holding its own lock (#878).  Here the overflow is an event
like any other (the engine counts it and reconciles), ``ENOSPC`` from ``inotify_add_watch``
(``max_user_watches`` reached) and ``EACCES`` come back as ``OSError`` with their errno, and the
caller decides (poll that subtree, count it).

The kernel interface (man 7 inotify): ``read`` returns whole ``struct inotify_event`` records
``{int wd; uint32_t mask; uint32_t cookie; uint32_t len; char name[len];}``, the name NUL-padded;
``IN_Q_OVERFLOW`` arrives with ``wd == -1``.  A rename inside the watched set is an
``IN_MOVED_FROM``/``IN_MOVED_TO`` pair with the same non-zero cookie, usually adjacent.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from alarm.collectors.fs import dirscan

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# What a watched directory reports.  IN_CLOSE_WRITE as well as IN_MODIFY: writes through
# mmap(2) raise no IN_MODIFY, only the close.  IN_EXCL_UNLINK: no events for children after
# they were unlinked (nothing to count there).  IN_DONT_FOLLOW/IN_ONLYDIR: a symlink swapped
# in for the directory is never followed.
WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)

_HEADER = struct.Struct("iIII")

RawEvent = tuple[int, int, int, bytes]  # (wd, mask, cookie, name)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


class Inotify:
    """One inotify instance (non-blocking, close-on-exec)."""

    def __init__(self) -> None:
        self._libc = _libc()
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)} (fs.inotify.max_user_instances?)")
        self.fd = fd

    def add_watch(self, path: bytes, mask: int = WATCH_MASK) -> int:
        wd = self._libc.inotify_add_watch(self.fd, path, mask)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return wd

    def rm_watch(self, wd: int) -> None:
        # EINVAL: the kernel already dropped it (directory deleted, file system unmounted).
        self._libc.inotify_rm_watch(self.fd, wd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def parse(data: bytes) -> list[RawEvent]:
    """Split what one ``read`` returned into events (names keep their raw bytes); in C
    where the extension was built (dirscan.py)."""
    native = dirscan.inotify_events(data)
    if native is not None:
        return native
    return parse_py(data)


def parse_py(data: bytes) -> list[RawEvent]:
    """:func:`parse` in Python."""
    out: list[RawEvent] = []
    off, end = 0, len(data)
    unpack = _HEADER.unpack_from
    size = _HEADER.size
    while off + size <= end:
        wd, mask, cookie, length = unpack(data, off)
        off += size
        name = data[off : off + length].rstrip(b"\0") if length else b""
        off += length
        out.append((wd, mask, cookie, name))
    return out


def read_available(fd: int, size: int = 1 << 18) -> bytes:
    """One non-blocking read; b"" when nothing is queued."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return b""
    except OSError as exc:
        if exc.errno == errno.EINTR:
            return b""
        raise
