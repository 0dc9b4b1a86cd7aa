"""Who wrote it: the workload a writer's pid belongs to, as far as the kernel can tell.

fanotify events carry the writer's pid (its thread-group id).  ``/proc/<pid>/comm`` names the
program and ``/proc/<pid>/cgroup`` the control group the process runs in, which is where
container runtimes and the kubelet put the workload's identity:

- cgroup v2 (one line ``0::<path>``) and v1 (``<id>:<controllers>:<path>``; the unified
  line is taken when it names more than the root, else ``name=systemd``, else the first
  controller that does);
- a container id: 64 hex digits as the runtimes name their scopes and directories
  (``docker-<id>.scope``, ``cri-containerd-<id>.scope``, ``crio-<id>.scope``,
  ``libpod-<id>.scope``, ``/docker/<id>``, ``/kubepods/.../<id>``);
- a Kubernetes pod uid: ``pod<uid>`` in the path (``kubepods-besteffort-pod<uid>.slice``
  with ``_`` for ``-`` under the systemd driver, ``/kubepods/burstable/pod<uid>/`` under
  cgroupfs), given back with dashes.

Evidence only, never a label: the cgroup path is the workload's own choice where it can make
cgroups (delegation), so it is escaped and bounded like every path.  Each pid is read once
and remembered (at most ``MEMORY`` pids, then forgotten all at once); a pid reused by another
process within that memory keeps the first one's answer, which is why a long-lived writer's
evidence is the reliable kind.  A pid that is gone by the time its event is counted gives
nothing (the fields are left out).
"""

from __future__ import annotations

import re
from typing import Any

MEMORY = 4096
MAX_CGROUP_CHARS = 256
MAX_FILE_BYTES = 16384  # /proc/<pid>/cgroup: a line per v1 hierarchy, a few hundred bytes

_CONTAINER = re.compile(
    r"(?:^|[/\-:])(?:docker|cri-containerd|containerd|crio|libpod|cri-o)?[-:]?([0-9a-f]{64})"
    r"(?:\.scope)?(?=/|$)"
)
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?"
    r"(?=/|$)"
)


def sanitize_comm(raw: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 else "?" for b in raw.strip()[:16])


def _shown(raw: str) -> str:
    text = "".join(
        c
        if " " <= c < "\x7f"
        else f"\\x{ord(c) - 0xDC00:02x}"
        if 0xDC80 <= ord(c) <= 0xDCFF
        else f"\\u{ord(c):04x}"
        for c in raw
    )
    if len(text) > MAX_CGROUP_CHARS:
        text = text[: MAX_CGROUP_CHARS // 2 - 2] + "..." + text[-(MAX_CGROUP_CHARS // 2 - 1) :]
    return text


def cgroup_path(text: str) -> str | None:
    """The cgroup path a ``/proc/<pid>/cgroup`` text names for the process (None: none)."""
    unified = systemd = other = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hid, controllers, path = parts
        if hid == "0" and not controllers:
            unified = path
        elif controllers == "name=systemd":
            systemd = path
        elif other is None and path != "/":
            other = path
    for path in (unified, systemd, other):
        if path is not None and path != "/":
            return path
    return unified or systemd


def workload_of(text: str) -> dict[str, str]:
    """Evidence fields from a ``/proc/<pid>/cgroup`` text: ``cgroup``, and ``container_id``
    and ``pod_uid`` where the path carries them (the innermost one)."""
    path = cgroup_path(text)
    if path is None:
        return {}
    out = {"cgroup": _shown(path)}
    ids = _CONTAINER.findall(path)
    if ids:
        out["container_id"] = ids[-1]
    pods = _POD.findall(path)
    if pods:
        out["pod_uid"] = pods[-1].replace("_", "-")
    return out


class Workloads:
    """pid -> the evidence fields naming its program and workload, each pid read once."""

    def __init__(self, proc: str = "/proc", memory: int = MEMORY) -> None:
        self.proc = proc
        self.memory = memory
        self._known: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._known)

    def of(self, pid: int) -> dict[str, Any]:
        """``comm``, ``cgroup``, ``container_id``, ``pod_uid`` (those that could be read).
        The same dict for every event of a pid: do not change it."""
        known = self._known.get(pid)
        if known is not None:
            return known
        info: dict[str, Any] = {}
        try:
            with open(f"{self.proc}/{pid}/comm", "rb") as f:
                comm = sanitize_comm(f.read(64))
            if comm:
                info["comm"] = comm
            with open(f"{self.proc}/{pid}/cgroup", "rb") as f:
                raw = f.read(MAX_FILE_BYTES)
            info.update(workload_of(raw.decode("utf-8", "surrogateescape")))
        except OSError:
            pass  # gone, or /proc hidden: what was read stays
        if len(self._known) >= self.memory:
            self._known.clear()
        self._known[pid] = info
        return info
