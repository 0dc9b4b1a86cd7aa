"""fanotify(7) through libc: one mark per file system, events naming the directory and entry,
and the pid of the process that wrote.

Interface (man 2 fanotify_init, man 2 fanotify_mark, man 7 fanotify):

- ``fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_DFID_NAME, O_RDONLY)`` needs CAP_SYS_ADMIN for a
  file-system mark.  ``FAN_REPORT_DFID_NAME`` (``FAN_REPORT_DIR_FID | FAN_REPORT_NAME``, Linux
  5.9) makes every event carry the file handle of the directory and the entry's name instead of
  an open descriptor, so create, delete and rename are reported (descriptor mode cannot).
- ``fanotify_mark(FAN_MARK_ADD | FAN_MARK_FILESYSTEM, mask, AT_FDCWD, path)`` marks the whole
  file system holding ``path``: no per-directory watches, no watch limit, no window in which a
  new subdirectory is unwatched.  The file system must be able to encode file handles (ext4,
  xfs, btrfs, tmpfs do; proc, many FUSE file systems do not: EOPNOTSUPP/ENODEV/EXDEV).
- ``FAN_RENAME`` (Linux 5.17) reports a rename as one event with the old and the new
  directory/name (info types ``FAN_EVENT_INFO_TYPE_OLD_DFID_NAME``/``NEW_DFID_NAME``), so no
  cookie pairing is needed.
- An event is ``struct fanotify_event_metadata {u32 event_len; u8 vers; u8 reserved;
  u16 metadata_len; u64 mask; s32 fd; s32 pid;}`` followed by info records ``{u8 info_type;
  u8 pad; u16 len; __kernel_fsid_t fsid; struct file_handle handle; [char name[]]}``, where
  ``struct file_handle {u32 handle_bytes; s32 handle_type; u8 f_handle[];}``.
- ``FAN_Q_OVERFLOW`` arrives when the group's queue (``fs.fanotify.max_queued_events`` at
  ``fanotify_init`` time) was full.

A directory is identified by ``fsid + struct file_handle`` (the bytes the event carries), which
``name_to_handle_at(2)`` gives for a directory we know, so events map to known directories
without a system call; unknown ones are resolved with ``open_by_handle_at(2)`` (needs
CAP_DAC_READ_SEARCH) and ``/proc/self/fd``.
"""

from __future__ import annotations

import ctypes
import os
import struct

from alarm.collectors.fs import dirscan

FAN_CLOEXEC = 0x00000001
FAN_NONBLOCK = 0x00000002
FAN_CLASS_NOTIF = 0x00000000
FAN_REPORT_DIR_FID = 0x00000400
FAN_REPORT_NAME = 0x00000800
FAN_REPORT_DFID_NAME = FAN_REPORT_DIR_FID | FAN_REPORT_NAME

FAN_MARK_ADD = 0x00000001
FAN_MARK_FILESYSTEM = 0x00000100

FAN_MODIFY = 0x00000002
FAN_ATTRIB = 0x00000004
FAN_CLOSE_WRITE = 0x00000008
FAN_CREATE = 0x00000100
FAN_DELETE = 0x00000200
FAN_Q_OVERFLOW = 0x00004000
FAN_RENAME = 0x10000000
FAN_ONDIR = 0x40000000

MARK_MASK = (
    FAN_MODIFY | FAN_ATTRIB | FAN_CLOSE_WRITE | FAN_CREATE | FAN_DELETE | FAN_RENAME | FAN_ONDIR
)

INFO_DFID_NAME = 2
INFO_OLD_DFID_NAME = 10
INFO_NEW_DFID_NAME = 12

AT_FDCWD = -100
MAX_HANDLE_SZ = 128
METADATA_VERSION = 3

_META = struct.Struct("<IBBHQii")
_INFO = struct.Struct("<BBH")
_HANDLE = struct.Struct("<Ii")

# (mask, pid, dir key, name, new dir key, new name); the new_* are set for FAN_RENAME only.
RawEvent = tuple[int, int, bytes, bytes, bytes, bytes]


class _FileHandle(ctypes.Structure):
    _fields_ = [
        ("handle_bytes", ctypes.c_uint32),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * MAX_HANDLE_SZ),
    ]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_mark.argtypes = [
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    libc.name_to_handle_at.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.POINTER(_FileHandle),
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
    ]
    libc.open_by_handle_at.argtypes = [ctypes.c_int, ctypes.POINTER(_FileHandle), ctypes.c_int]
    return libc


def _errno_error(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def fsid_bytes(path: bytes) -> bytes:
    """The file system id as fanotify reports it: glibc's ``statvfs.f_fsid`` is
    ``f_fsid.__val[0] | __val[1] << 32`` of statfs(2), i.e. the same 8 bytes little-endian."""
    return struct.pack("<Q", os.statvfs(path).f_fsid & 0xFFFFFFFFFFFFFFFF)


class Fanotify:
    """One notification group reporting directory handles and names."""

    def __init__(self) -> None:
        self._libc = _libc()
        fd = self._libc.fanotify_init(
            FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_DFID_NAME,
            os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC,
        )
        if fd < 0:
            raise _errno_error("fanotify_init")
        self.fd = fd
        # fsid -> a directory on that file system, opened only while resolving a handle: a
        # descriptor held open would keep the file system busy (no unmount).
        self.mount_paths: dict[bytes, bytes] = {}

    def mark_filesystem(self, path: bytes) -> bytes:
        """Mark the file system holding ``path``; returns its fsid."""
        if self._libc.fanotify_mark(
            self.fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, MARK_MASK, AT_FDCWD, path
        ):
            raise _errno_error("fanotify_mark")
        fsid = fsid_bytes(path)
        self.mount_paths[fsid] = path
        return fsid

    def handle_key(self, path: bytes, fsid: bytes) -> bytes:
        """The key events carry for the directory ``path``: fsid + struct file_handle."""
        fh = _FileHandle()
        fh.handle_bytes = MAX_HANDLE_SZ
        mount_id = ctypes.c_int()
        if self._libc.name_to_handle_at(
            AT_FDCWD, path, ctypes.byref(fh), ctypes.byref(mount_id), 0
        ):
            raise _errno_error("name_to_handle_at")
        raw = bytes(fh.f_handle[: fh.handle_bytes])
        return fsid + _HANDLE.pack(fh.handle_bytes, fh.handle_type) + raw

    def resolve(self, key: bytes) -> bytes | None:
        """The current path of the directory a key names, or None (gone, or not resolvable)."""
        mount_path = self.mount_paths.get(key[:8])
        if mount_path is None or len(key) < 16:
            return None
        nbytes, htype = _HANDLE.unpack_from(key, 8)
        if nbytes > MAX_HANDLE_SZ or len(key) != 16 + nbytes:
            return None
        fh = _FileHandle()
        fh.handle_bytes = nbytes
        fh.handle_type = htype
        ctypes.memmove(fh.f_handle, key[16:], nbytes)
        try:
            # Not O_PATH: open_by_handle_at(2) takes the mount descriptor with fdget(), which
            # refuses O_PATH descriptors (EBADF), so every unknown directory went unresolved
            # and every event of the rest of the file system was resolved again.
            mount_fd = os.open(mount_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fd = self._libc.open_by_handle_at(mount_fd, ctypes.byref(fh), os.O_PATH | os.O_CLOEXEC)
        finally:
            os.close(mount_fd)
        if fd < 0:
            return None  # ESTALE: the directory is gone
        try:
            return os.readlink(f"/proc/self/fd/{fd}".encode())
        except OSError:
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        self.mount_paths.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _info_record(data: bytes, off: int, length: int) -> tuple[bytes, bytes]:
    """(dir key, name) of a DFID_NAME-type info record starting at ``off``."""
    body = off + _INFO.size
    nbytes = _HANDLE.unpack_from(data, body + 8)[0]
    key_end = body + 16 + nbytes
    key = data[body:key_end]
    name = data[key_end : off + length].split(b"\0", 1)[0]
    return key, name


def parse(data: bytes) -> tuple[list[RawEvent], int]:
    """Events of one ``read``; returns (events, malformed records skipped).  In C where the
    extension was built (dirscan.py): :func:`parse_py` is what it does."""
    native = dirscan.fanotify_events(data)
    if native is not None:
        return native
    return parse_py(data)


def parse_py(data: bytes) -> tuple[list[RawEvent], int]:
    """:func:`parse` in Python."""
    out: list[RawEvent] = []
    bad = 0
    off, end = 0, len(data)
    while off + _META.size <= end:
        event_len, vers, _r, meta_len, mask, fd, pid = _META.unpack_from(data, off)
        if event_len < _META.size or off + event_len > end or vers != METADATA_VERSION:
            bad += 1
            break
        if fd >= 0:  # not in FID mode: a descriptor we must not leak
            os.close(fd)
        key = name = new_key = new_name = b""
        rec = off + meta_len
        stop = off + event_len
        while rec + _INFO.size <= stop:
            info_type, _pad, length = _INFO.unpack_from(data, rec)
            if length < _INFO.size or rec + length > stop:
                bad += 1
                break
            if info_type in (INFO_DFID_NAME, INFO_OLD_DFID_NAME):
                key, name = _info_record(data, rec, length)
            elif info_type == INFO_NEW_DFID_NAME:
                new_key, new_name = _info_record(data, rec, length)
            rec += length
        out.append((mask, pid, key, name, new_key, new_name))
        off += event_len
    return out, bad
