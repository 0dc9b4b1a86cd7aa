"""Real kernel fence traffic for tests and benches: a throwaway network namespace whose nft
output chain logs (and counts) matching packets with a test-unique prefix.

    with fence_netns(ports=(9911,)) as ns:
        sent = ns.udp(10, payload=100)     # 10 packets, LEN= 128 each
        ns.counter()                       # (packets, bytes) the kernel matched, from nft

Every namespace gets its own prefix (``CAPALARM_TEST t<hex>``, see :func:`unique_prefix`), so
concurrent tests never count each other's records: filter records by ``ns.prefix``.  The kernel
log is the host's: a capalarm running on the same host with the default prefix
(``EGRESS_FENCE``) would count real records the tests log as writes and injected look-alikes as
forgeries, and page.  So nothing written here starts with a prefix that capalarm's default
configuration reads; :func:`inject_kmsg` and :func:`fence_netns` refuse one.  Sockets are created inside the namespace
by a short-lived thread that ``setns``-es itself (a socket stays in the namespace it was
created in), so the test process never changes its own namespace.

Needs root, ``ip`` (iproute2) and ``nft`` (nftables); :func:`require_kernel` skips otherwise, or
fails when ``CI=true`` (CI must run these).

A workload of its own for ``socket cgroupv2`` rules: :func:`workload_cgroup` makes a cgroup v2
group (``capalarm-<pid>-<hex>.slice/<name>.scope``) on the host's cgroup2 mount, and
:meth:`FenceNetns.nft` loads rules that name it.  nft resolves a ``socket cgroupv2`` path as
``/sys/fs/cgroup/<path>`` (the inode of that directory is the cgroup id the rule holds), so the
path is relative to /sys/fs/cgroup, not to the cgroup2 root: ``unified/...`` on a hybrid
layout, and it cannot resolve under ``ip netns exec``, which mounts a fresh /sys without them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from alarm.collectors.fs.mounts import mount_table

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
IPV4_UDP_OVERHEAD = 28  # IPv4 header 20 + UDP header 8: LEN= is the IP total length
IPV4_ICMP_OVERHEAD = 28  # IPv4 header 20 + ICMP echo header 8
KMSG = "/dev/kmsg"
# The prefix capalarm reads when a config names none (alarm/default.yaml, the kmsg, journald
# and file sources): no test may write a record the host's own capalarm would count.
DEFAULT_FENCE_PREFIX = "EGRESS_FENCE"
# Records the tests make start with this instead.
TEST_PREFIX = "CAPALARM_TEST"


def unique_prefix(tag: str = "t") -> str:
    """A log prefix of this test run's own: ``CAPALARM_TEST <tag><hex>``."""
    return f"{TEST_PREFIX} {tag}{secrets.token_hex(4)}"


def refuse_default_prefix(text: str) -> None:
    """Raise if ``text`` (a log prefix or a record) starts like a record a capalarm with the
    default configuration on this host would read."""
    if text.lstrip().startswith(DEFAULT_FENCE_PREFIX):
        raise ValueError(
            f"{text[:40]!r}: starts with the default fence prefix {DEFAULT_FENCE_PREFIX!r}; "
            f"tests write to the host's kernel log with a prefix of their own ({TEST_PREFIX})"
        )


def kernel_missing() -> str | None:
    """Why real-kernel tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, nftables, /dev/kmsg)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"needs {tool!r} (apt-get install iproute2 nftables)"
    if not os.access(KMSG, os.R_OK | os.W_OK):
        return f"cannot read and write {KMSG}"
    return None


def require_kernel() -> None:
    """Skip the calling test when the kernel parts are unavailable; fail instead under CI."""
    import pytest

    reason = kernel_missing()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    res = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in_netns(name: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread that has entered netns ``name``; the thread then ends, so
    no thread of the caller is ever left in another namespace."""
    box: dict[str, object] = {}

    def body() -> None:
        try:
            _setns(f"/run/netns/{name}")
            box["ok"] = fn()
        except BaseException as exc:
            box["err"] = exc

    t = threading.Thread(target=body, name=f"netns-{name}")
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]  # type: ignore[misc]
    return box["ok"]  # type: ignore[return-value]


def icmp_checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


@dataclass(frozen=True, slots=True)
class Sent:
    packets: int
    bytes: int  # sum of IP total lengths, i.e. of the LEN= the kernel logs


@dataclass(slots=True)
class FenceNetns:
    name: str
    prefix: str  # without the trailing space the rule adds
    ports: tuple[int, ...]
    protos: tuple[str, ...]

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (for subprocesses such as bench senders)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def socket(self, family: int, kind: int, proto: int = 0) -> socket.socket:
        return run_in_netns(self.name, lambda: socket.socket(family, kind, proto))

    def udp(self, count: int, payload: int = 100, port: int | None = None) -> Sent:
        """``count`` UDP datagrams of ``payload`` bytes to 127.0.0.1:port.  A bound receiver
        that is never read takes them, so the kernel sends no ICMP errors back."""
        port = self.ports[0] if port is None else port
        rx = self.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx = self.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            rx.bind(("127.0.0.1", port))
            data = b"x" * payload
            for _ in range(count):
                tx.sendto(data, ("127.0.0.1", port))
        finally:
            tx.close()
            rx.close()
        return Sent(count, count * (IPV4_UDP_OVERHEAD + payload))

    def icmp_echo(self, count: int, payload: int = 56) -> Sent:
        """``count`` ICMP echo requests to 127.0.0.1 (raw socket, so the size is exact)."""
        s = self.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        try:
            for i in range(count):
                body = b"p" * payload
                hdr = struct.pack("!BBHHH", 8, 0, 0, 0x4341, i & 0xFFFF)
                hdr = struct.pack("!BBHHH", 8, 0, icmp_checksum(hdr + body), 0x4341, i & 0xFFFF)
                s.sendto(hdr + body, ("127.0.0.1", 0))
        finally:
            s.close()
        return Sent(count, count * (IPV4_ICMP_OVERHEAD + payload))

    def tcp(self, nbytes: int, port: int | None = None) -> None:
        """One TCP connection carrying ``nbytes`` to 127.0.0.1:port.  Segmentation, handshake
        and options decide how many packets the kernel logs: use :meth:`counter` for the
        exact packet and byte counts."""
        port = self.ports[0] if port is None else port
        srv = self.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.bind(("127.0.0.1", port))
        srv.listen(1)

        def sink() -> None:
            conn, _ = srv.accept()
            with conn:
                while conn.recv(1 << 16):
                    pass

        t = threading.Thread(target=sink)
        t.start()
        cli = self.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            cli.connect(("127.0.0.1", port))
            cli.sendall(b"y" * nbytes)
        finally:
            cli.close()
            t.join(10)
            srv.close()

    def nft(self, script: str) -> str:
        """Run an nft script (``nft -f -``) in the namespace, e.g. ``insert rule inet fence out
        ...`` to put a rule before the catch-all ones.  Started from a thread that entered the
        namespace, not by ``ip netns exec``: that mounts a fresh /sys for the namespace, with
        nothing under /sys/fs/cgroup, where nft looks up ``socket cgroupv2`` paths."""
        return run_in_netns(self.name, lambda: _run(["nft", "-f", "-"], stdin=script + "\n"))

    def counter(self, log_prefix: str | None = None) -> Sent:
        """Packets and bytes the fence rules matched, from the nft counters (skb length =
        IP total length for locally generated IPv4 packets); only the rules that log with
        ``log_prefix`` (without the trailing space) when given."""
        doc = json.loads(_run(self.exec_argv(["nft", "-j", "list", "table", "inet", "fence"])))
        packets = nbytes = 0
        for item in doc.get("nftables", []):
            exprs = item.get("rule", {}).get("expr", [])
            if log_prefix is not None and not any(
                e.get("log", {}).get("prefix") == log_prefix + " " for e in exprs
            ):
                continue
            for expr in exprs:
                if "counter" in expr:
                    packets += expr["counter"]["packets"]
                    nbytes += expr["counter"]["bytes"]
        return Sent(packets, nbytes)


def _rules(prefix: str, ports: tuple[int, ...], protos: tuple[str, ...]) -> list[str]:
    port_set = "{ " + ", ".join(str(p) for p in ports) + " }"
    log = f'counter log prefix "{prefix} "'
    rules = []
    for proto in protos:
        if proto in ("udp", "tcp"):
            rules.append(f"add rule inet fence out {proto} dport {port_set} {log}")
        elif proto == "icmp":
            rules.append(f"add rule inet fence out icmp type echo-request {log}")
        else:
            raise ValueError(f"proto must be udp, tcp or icmp, not {proto!r}")
    return rules


def sweep_stale_netns() -> list[str]:
    """Delete ``capalarm-<pid>-*`` namespaces whose creating process is gone (a test killed
    by a timeout never reaches its cleanup).  The pid in the name makes this safe to run
    while other tests hold their own namespaces."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir("/run/netns"):
            parts = name.split("-")
            if len(parts) != 3 or parts[0] != "capalarm" or not parts[1].isdigit():
                continue
            if os.path.exists(f"/proc/{parts[1]}"):
                continue
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            removed.append(name)
    return removed


@contextlib.contextmanager
def fence_netns(
    prefix: str | None = None,
    ports: Sequence[int] = (9911,),
    proto: str | Sequence[str] = ("udp", "tcp", "icmp"),
) -> Iterator[FenceNetns]:
    """A fresh netns (``capalarm-<pid>-<hex>``) with lo up and an nft output rule per protocol
    that counts and logs matching packets with ``prefix`` (default: a unique
    ``CAPALARM_TEST t<hex>``; never one starting with ``EGRESS_FENCE``).  Sets ``net.netfilter.nf_log_all_netns=1`` (needed for logging
    from non-initial namespaces) and leaves it set: other tests running meanwhile need it."""
    protos = (proto,) if isinstance(proto, str) else tuple(proto)
    prefix = prefix or unique_prefix()
    refuse_default_prefix(prefix)
    name = f"capalarm-{os.getpid()}-{secrets.token_hex(3)}"
    sweep_stale_netns()
    with open("/proc/sys/net/netfilter/nf_log_all_netns", "w") as f:
        f.write("1\n")
    _run(["ip", "netns", "add", name])
    try:
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        script = [
            "add table inet fence",
            "add chain inet fence out { type filter hook output priority 0; policy accept; }",
            *_rules(prefix, tuple(ports), protos),
        ]
        _run(["ip", "netns", "exec", name, "nft", "-f", "-"], stdin="\n".join(script) + "\n")
        yield FenceNetns(name, prefix, tuple(ports), protos)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


# nft(8) looks up a ``socket cgroupv2`` path here, whatever is mounted where: nftables'
# src/datatype.c, cgroupv2_type_parse, stat()s "/sys/fs/cgroup/<path>" and keeps st_ino, which
# on cgroup2 is the cgroup id the kernel compares with the ancestor at ``level`` of the sending
# socket's cgroup.  A cgroup2 mount elsewhere (a private one, say) is not read.
NFT_CGROUP_DIR = "/sys/fs/cgroup"


def cgroup2_mount() -> tuple[str, str] | None:
    """(mount point, root within the hierarchy) of a cgroup2 mount that nft can see, i.e. at or
    under /sys/fs/cgroup (``/sys/fs/cgroup`` on a unified layout, ``/sys/fs/cgroup/unified`` on
    a hybrid one), from /proc/self/mountinfo (the last one listed: a later mount hides an
    earlier one under it); None when there is none."""
    found = None
    for point, fstype, root in mount_table():
        if fstype == "cgroup2" and (
            point == NFT_CGROUP_DIR or point.startswith(NFT_CGROUP_DIR + "/")
        ):
            found = point, root
    return found


def require_cgroup2() -> None:
    """:func:`require_kernel`, and a cgroup2 mount nft can resolve paths on: skip without one,
    fail when ``CI=true``."""
    import pytest

    require_kernel()
    if cgroup2_mount() is not None:
        return
    reason = f"no cgroup2 mounted at or under {NFT_CGROUP_DIR} (nft resolves cgroupv2 paths there)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


@dataclass(frozen=True, slots=True)
class WorkloadCgroup:
    dir: str  # its directory on the cgroup2 mount
    path: str  # as a ``socket cgroupv2`` rule names it: relative to /sys/fs/cgroup
    level: int  # its depth in the cgroup2 hierarchy: the rule's ``level``

    def add(self, pid: int) -> None:
        """Move process ``pid`` into the group (sockets it creates afterwards are the group's)."""
        with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
            f.write(f"{pid}\n")


def _own_cgroup_dir(point: str, root: str) -> str:
    """This process's cgroup2 directory on the mount (the mount point if it cannot tell)."""
    with open("/proc/self/cgroup") as f:
        own = next((ln[3:].strip() for ln in f if ln.startswith("0::")), "/")
    if root != "/" or not os.path.isdir(point + own):
        return point
    return os.path.normpath(point + own)


def _remove_cgroups(top: str, home: str) -> None:
    """Move every process out of ``top`` and its descendants into ``home`` (SIGKILL one that
    cannot be moved), then remove them, deepest first (bounded wait for exiting processes)."""
    dirs = [d for d, _, _ in os.walk(top, topdown=False)]
    for d in dirs:
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
            for pid in pids:
                try:
                    with open(os.path.join(home, "cgroup.procs"), "w") as f:
                        f.write(f"{pid}\n")
                except ProcessLookupError:
                    pass
                except OSError:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while True:
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY: a killed process has not left yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


def sweep_stale_cgroups() -> list[str]:
    """Remove ``capalarm-<pid>-*.slice`` groups whose creating process is gone (as
    :func:`sweep_stale_netns` does for namespaces)."""
    found = cgroup2_mount()
    if found is None:
        return []
    point, root = found
    removed = []
    for name in os.listdir(point):
        parts = name.removesuffix(".slice").split("-")
        if not name.endswith(".slice") or len(parts) != 3 or parts[0] != "capalarm":
            continue
        if not parts[1].isdigit() or os.path.exists(f"/proc/{parts[1]}"):
            continue
        with contextlib.suppress(OSError):
            _remove_cgroups(os.path.join(point, name), _own_cgroup_dir(point, root))
            removed.append(name)
    return removed


@contextlib.contextmanager
def workload_cgroup(name: str = "agent-17") -> Iterator[WorkloadCgroup]:
    """A cgroup v2 group ``capalarm-<pid>-<hex>.slice/<name>.scope`` on the cgroup2 mount nft
    can see (:func:`cgroup2_mount`; :func:`require_cgroup2` first), as a sandbox runtime would
    make one per workload.  On leaving, its processes are moved back to this process's cgroup
    and the groups removed, whatever happened."""
    found = cgroup2_mount()
    if found is None:
        raise RuntimeError(f"no cgroup2 mounted at or under {NFT_CGROUP_DIR}")
    point, root = found
    sweep_stale_cgroups()
    top = os.path.join(point, f"capalarm-{os.getpid()}-{secrets.token_hex(3)}.slice")
    scope = os.path.join(top, f"{name}.scope")
    os.mkdir(top)
    try:
        os.mkdir(scope)
        depth = len([p for p in root.split("/") if p]) + 2  # the mount's root, slice, scope
        yield WorkloadCgroup(scope, os.path.relpath(scope, NFT_CGROUP_DIR), depth)
    finally:
        _remove_cgroups(top, _own_cgroup_dir(point, root))


def inject_kmsg(text: str, level: int | None = 4) -> None:
    """Write a record to /dev/kmsg from user space, as a workload trying to forge fence lines
    would.  ``level`` becomes a ``<N>`` prefix; the kernel turns facility 0 ("kern") into 1
    ("user") for writes, so even ``<0>``/``<4>`` come out as PRI 8/12, never facility 0.
    Refuses text a capalarm with the default prefix would read (see the module's docstring)."""
    refuse_default_prefix(text)
    head = f"<{level}>" if level is not None else ""
    fd = os.open(KMSG, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, (head + text.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)


def forged_fence(prefix: str, length: int, dport: int = 9911) -> str:
    """A fence line in the kernel's exact format, for injection."""
    return (
        f"{prefix} IN= OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN={length} TOS=0x00 PREC=0x00 "
        f"TTL=64 ID=1 DF PROTO=UDP SPT=40000 DPT={dport} LEN={length - 20} "
    )
