"""Which file system a tree is on (``/proc/self/mountinfo``, man 5 proc), to choose its mode:
network and FUSE file systems report no events for writes made elsewhere (inotify(7):
"Inotify reports only events that a user-space program triggers through the filesystem API
... remote events that occur on network filesystems are not caught"), so they are polled."""

from __future__ import annotations

from typing import NamedTuple

# File systems whose writes may come from other hosts, or that a FUSE daemon serves.
POLLED_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "afs",
        "virtiofs",
        "fuse",
        "fuseblk",
        "beegfs",
        "orangefs",
    }
)


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


class Mount(NamedTuple):
    point: str  # where it is mounted
    fstype: str
    root: str  # the directory of its file system mounted there ("/": the whole of it)


def mount_table(mountinfo: str = "/proc/self/mountinfo") -> list[Mount]:
    """Every mount, in mountinfo order (a later one hides an earlier one under it)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and len(fields) >= 5:
            fstype = right.split()[0] if right else ""
            out.append(Mount(_unescape(fields[4]), fstype, _unescape(fields[3])))
    return out


def mounts_inside(trees: list[str], mountinfo: str = "/proc/self/mountinfo") -> set[str]:
    """Mount points strictly inside any of ``trees`` (a file system mounted on a
    subdirectory: an inotify watch on the directory it covers sees nothing of it)."""
    out = set()
    for point, _type, _root in mount_table(mountinfo):
        for tree in trees:
            if point.startswith(tree.rstrip("/") + "/"):
                out.add(point)
    return out


def fs_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type of the file system ``path`` is on (the longest mount point above it)."""
    best, best_type = "", ""
    for point, type_, _root in mount_table(mountinfo):
        under = path == point or path.startswith(point.rstrip("/") + "/")
        if under and len(point) >= len(best):
            best, best_type = point, type_
    return best_type


def polled(fstype: str) -> bool:
    return fstype in POLLED_TYPES or fstype.startswith("fuse.")
