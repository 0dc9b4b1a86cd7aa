"""How many bytes an entry holds, for counting (docs/fs-source.md, "What bytes written means").

- A regular file counts its size, unless it is sparse: then its data bytes.  A file looks
  sparse when its allocated bytes (``st_blocks * 512``, stat(2)) are under half its size and
  at least ``SPARSE_SLACK`` below it (small files whose data lives in the inode, such as ext4
  inline data, report no blocks and must not look sparse).  Such a file's data is then
  measured with ``lseek(SEEK_DATA/SEEK_HOLE)`` (man 2 lseek), which reports holes exactly and
  counts compressed or not-yet-allocated data as data (ZFS reports few blocks until its
  transaction group commits; a file system without hole support reports the whole file as
  data), so a file of holes does not inflate the count and a dense file is never undercounted.
- A symlink counts its own size (``lstat``: the length of its target); it is never followed.
- Directories, FIFOs, sockets and device nodes count 0 bytes (their creation still counts as
  one event).
"""

from __future__ import annotations

import os
import stat

from alarm.collectors.fs.dirscan import EntryStat

SPARSE_SLACK = 64 * 1024
MAX_EXTENTS = 4096  # SEEK_DATA/SEEK_HOLE steps before falling back to allocated bytes
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
NOATIME = getattr(os, "O_NOATIME", 0)


def looks_sparse(size: int, blocks: int) -> bool:
    allocated = blocks * 512
    return allocated * 2 < size and size - allocated >= SPARSE_SLACK


def data_bytes(path: bytes, dev: int, ino: int, size: int, allocated: int) -> int:
    """Bytes of data (not holes) in the file at ``path``, which must still be (dev, ino);
    ``allocated`` when it cannot be told."""
    try:
        fd = os.open(path, OPEN_FLAGS | NOATIME)
    except PermissionError:
        try:
            fd = os.open(path, OPEN_FLAGS)  # O_NOATIME needs ownership or CAP_FOWNER
        except OSError:
            return allocated
    except OSError:
        return allocated
    try:
        st = os.fstat(fd)
        if st.st_dev != dev or st.st_ino != ino or not stat.S_ISREG(st.st_mode):
            return allocated
        data = 0
        pos = 0
        for _ in range(MAX_EXTENTS):
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after pos
                return data
            end = os.lseek(fd, start, os.SEEK_HOLE)
            data += end - start
            if end >= size:
                return min(data, size)
            pos = end
        return max(allocated, data)
    finally:
        os.close(fd)


def measure(path: bytes, st: os.stat_result | EntryStat) -> tuple[int, bool]:
    """(bytes to count, sparse?) for the entry at ``path`` as ``lstat`` saw it."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        size = st.st_size
        if looks_sparse(size, st.st_blocks):
            return data_bytes(path, st.st_dev, st.st_ino, size, st.st_blocks * 512), True
        return size, False
    if stat.S_ISLNK(mode):
        return st.st_size, False
    return 0, False
