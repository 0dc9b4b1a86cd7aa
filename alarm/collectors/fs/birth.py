"""When an inode was born: ``statx(2)`` ``stx_btime``, to tell a new file on a reused inode
number from the file that had it.

File systems give a freed inode number to the next file at once (ext4, tmpfs and xfs all do).
A file deleted while nobody looked — during a restart's outage, between two poll rounds, in
a queue overflow — and a new file created on its number look, to a scan, like the old file
grown or rewritten: its growth would count instead of its size.  The birth time settles it:
a file born after the old file's last measured mtime is another file (its btime is set when
the inode is allocated, from the same clock as the mtime, and no process can change it).

``statx`` (man 2 statx, glibc 2.28) reports ``STATX_BTIME`` in ``stx_mask`` where the file
system records it (ext4, xfs, btrfs, tmpfs); elsewhere (NFS, most FUSE) :meth:`born_ns`
returns None and the caller keeps the old reading.  ``AT_SYMLINK_NOFOLLOW``: a symlink is
never followed; ``AT_STATX_DONT_SYNC``: a network file system is not asked to sync.
"""

from __future__ import annotations

import ctypes
import struct

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_STATX_DONT_SYNC = 0x4000
STATX_INO = 0x100
STATX_BTIME = 0x800
STATX_SIZE = 256  # sizeof(struct statx), linux/stat.h
# struct statx: stx_mask at 0, stx_ino at 32, stx_btime (tv_sec i64, tv_nsec u32) at 80.
_MASK = struct.Struct("<I")
_INO = struct.Struct("<Q")
_TIMESTAMP = struct.Struct("<qI")
OFFSET_INO = 32
OFFSET_BTIME = 80


class Births:
    """Birth times of inodes by path (one buffer; used from the engine's thread only)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._statx = getattr(libc, "statx", None)
        if self._statx is not None:
            self._statx.argtypes = [
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_uint,
                ctypes.c_void_p,
            ]
        self._buf = ctypes.create_string_buffer(STATX_SIZE)

    def born_ns(self, path: bytes, ino: int) -> int | None:
        """The birth time (ns) of the inode at ``path`` if it is still ``ino``; None when the
        file system does not record it or the path is no longer that inode."""
        if self._statx is None:
            return None
        flags = AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC
        if self._statx(AT_FDCWD, path, flags, STATX_INO | STATX_BTIME, self._buf) != 0:
            return None
        raw = self._buf.raw
        (mask,) = _MASK.unpack_from(raw, 0)
        if not mask & STATX_BTIME or _INO.unpack_from(raw, OFFSET_INO)[0] != ino:
            return None
        sec, nsec = _TIMESTAMP.unpack_from(raw, OFFSET_BTIME)
        return sec * 1_000_000_000 + nsec
